// `weir bench s3`: raw object-store throughput and latency on an s3:// (or any)
// store: PUTs of large objects at several concurrency levels, then ranged
// GETs. Prints one JSON line.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace weir::bench {

struct S3BenchOptions {
  std::string store;                 // object store URI, e.g. s3://bucket/bench?endpoint=...
  size_t object_bytes = 8u << 20;    // PUT size
  std::vector<int> inflight = {1, 8, 32};
  double step_s = 5;                 // seconds per PUT concurrency level
  size_t range_bytes = 64u << 10;    // ranged GET size
  int range_inflight = 16;
  double range_s = 5;
};

Status RunS3Bench(const S3BenchOptions& options);

}  // namespace weir::bench
