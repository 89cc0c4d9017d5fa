// `weir bench wal`: drives the WAL writer directly with N concurrent
// appenders and prints one JSON line of throughput and ack latency.
#pragma once

#include <string>

#include "base/status.h"

namespace weir::bench {

struct WalBenchOptions {
  std::string store = "mem";  // mem | file | an object store URI (s3://...)
  std::string dir;            // file store directory (default: a fresh temp dir, removed after)
  double put_latency_ms = 0;  // injected fixed PUT latency (FaultStore), 0 = none
  int appenders = 16;
  int inflight = 32;          // unacknowledged appends each appender keeps in flight
  int threads = 2;            // driver threads the appenders are multiplexed over
  int streams = 0;            // distinct streams (0 = one per appender)
  size_t record_bytes = 1024;
  double duration_s = 10;
  double warmup_s = 1;
  double linger_ms = 0;
  int window = 8;
  size_t slot_cap_bytes = 8u << 20;
  size_t budget_bytes = 256u << 20;
};

// Runs the benchmark and prints the JSON result line to stdout.
Status RunWalBench(const WalBenchOptions& options);

}  // namespace weir::bench
