// `weir bench engine` and `weir bench recovery`: the stream engine's figures
// (metastore operations under sustained load, log-cache read latency, and
// recovery time against unsettled WAL bytes). Each prints one JSON line.
#pragma once

#include <string>

#include "base/status.h"

namespace weir::bench {

struct EngineBenchOptions {
  int streams = 64;
  int appenders = 16;
  size_t record_bytes = 1024;
  int batch = 10;            // records per append
  double duration_s = 10;
  double put_latency_ms = 0; // injected, mem:// store
  double rate = 0;            // appends per second in all (open loop); 0 = as fast as acks come
  size_t settle_min_kib = 1024;  // EngineOptions::settle_min_bytes
  double settle_max_delay_s = 10;
};
Status RunEngineBench(const EngineBenchOptions& options);

struct RecoveryBenchOptions {
  size_t unsettled_mib = 64;
  double get_latency_ms = 20;  // injected on every GET during recovery
  size_t record_bytes = 1024;
  int batch = 100;
};
Status RunRecoveryBench(const RecoveryBenchOptions& options);

}  // namespace weir::bench
