// FaultStore: a decorator that injects latency, errors, timeouts and ambiguous
// PUTs in front of any ObjectStore, for tests and benchmarks. Owned by its
// shared_ptr holders, as the store it wraps; thread-safe. The fault decisions
// come from one seeded PRNG, so the same sequence of calls under the same seed
// sees the same faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "objstore/object_store.h"

namespace weir::objstore {

// A latency distribution: fixed (p99_ms <= p50_ms) or log-normal fitted to p50/p99.
struct LatencySpec {
  double p50_ms = 0;
  double p99_ms = 0;
  static LatencySpec Fixed(double ms) { return {ms, ms}; }
};

struct FaultOptions {
  uint64_t seed = 1;
  LatencySpec put_latency;
  LatencySpec get_latency;  // applies to Get, Head, List
  // Per-PUT probabilities (0..1), decided in this order:
  double put_error_rate = 0;      // not applied; kUnavailable
  double put_timeout_rate = 0;    // not applied; kTimeout
  double put_ambiguous_rate = 0;  // applied to the inner store, then reported as kTimeout
  double get_error_rate = 0;      // Get/Head/List fail with kUnavailable
};

struct FaultCounters {
  std::atomic<uint64_t> puts{0}, put_errors{0}, put_timeouts{0}, put_ambiguous{0};
  std::atomic<uint64_t> gets{0}, get_errors{0};
};

class FaultStore : public ObjectStore {
 public:
  FaultStore(std::shared_ptr<ObjectStore> inner, FaultOptions options);
  ~FaultStore() override;

  // Same defaults as ObjectStore, so calls through a FaultStore& compile too.
  Status Put(std::string_view key, std::string_view data, const PutOptions& options = {}) override;
  Status PutParts(std::string_view key, std::span<const std::string_view> parts,
                  const PutOptions& options = {}) override;
  Result<std::string> Get(std::string_view key, std::optional<ByteRange> range = std::nullopt) override;
  Result<ObjectInfo> Head(std::string_view key) override;
  Result<ListPage> List(std::string_view prefix, std::string_view start_after = {},
                        size_t max_keys = 1000) override;
  Status Delete(std::string_view key) override;
  Status DeleteMany(std::span<const std::string> keys) override;
  std::string Describe() const override;
  std::string Location() const override { return inner_->Location(); }
  std::string Identity() const override { return inner_->Identity(); }
  // The inner store's, unless PUT latency is injected: then the default.
  size_t PreferredParallelPuts() const override;

  // Replaces the options (rates, latencies); the PRNG stream continues.
  void SetOptions(const FaultOptions& options);
  const FaultCounters& counters() const { return counters_; }
  ObjectStore& inner() { return *inner_; }

 private:
  struct Impl;
  // Draws a PUT fault and applies it around `put` (the inner store's write).
  template <typename PutFn>
  Status FaultyPut(std::string_view key, PutFn&& put);
  // Counts a read, sleeps its latency, and maybe fails it (kUnavailable).
  Status ReadFault(std::string_view op, std::string_view key);
  std::shared_ptr<ObjectStore> inner_;
  std::unique_ptr<Impl> impl_;
  FaultCounters counters_;
};

}  // namespace weir::objstore
