#include "bench/s3_bench.h"

#include <atomic>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/histogram.h"
#include "objstore/object_store.h"
#include "objstore/s3_store.h"

namespace weir::bench {

namespace {

double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// Runs `threads` workers calling op(thread, i) until `seconds` pass; returns
// the elapsed seconds. Latency of each op goes to `latency`.
template <typename Op>
double RunFor(int threads, double seconds, Histogram& latency, std::atomic<uint64_t>& failures, Op op) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  const TimePoint t0 = Now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const TimePoint s = Now();
        if (!op(t, i)) {
          failures.fetch_add(1);
          continue;
        }
        latency.Record(static_cast<uint64_t>(std::chrono::nanoseconds(Now() - s).count()));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& w : workers) w.join();
  return std::chrono::duration<double>(Now() - t0).count();
}

}  // namespace

Status RunS3Bench(const S3BenchOptions& o) {
  if (o.store.empty()) return InvalidArgument("--object-store is required");
  if (o.object_bytes < 1 || o.range_bytes < 1 || o.range_bytes > o.object_bytes) {
    return InvalidArgument("need 1 <= --range-bytes <= --object-bytes");
  }
  WEIR_ASSIGN_OR_RETURN(std::shared_ptr<objstore::ObjectStore> store, objstore::OpenObjectStore(o.store));
  std::string data(o.object_bytes, '\0');
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  const std::string run = std::to_string(std::random_device{}());
  nlohmann::json out;
  out["store"] = store->Describe();
  out["object_bytes"] = o.object_bytes;
  std::atomic<uint64_t> failures{0};

  // PUTs: every worker writes new keys; each level's objects are deleted after it.
  for (int n : o.inflight) {
    if (n < 1 || n > 1024) return InvalidArgument("--inflight values must be 1..1024");
    Histogram latency;
    std::atomic<uint64_t> puts{0};
    std::vector<std::vector<std::string>> keys(static_cast<size_t>(n));
    const double elapsed = RunFor(n, o.step_s, latency, failures, [&](int t, uint64_t i) {
      std::string key = "bench-" + run + "/put/" + std::to_string(n) + "/" + std::to_string(t) + "/" + std::to_string(i);
      if (!store->Put(key, data).ok()) return false;
      keys[static_cast<size_t>(t)].push_back(std::move(key));
      puts.fetch_add(1);
      return true;
    });
    nlohmann::json step;
    step["inflight"] = n;
    step["puts_per_s"] = static_cast<double>(puts.load()) / elapsed;
    step["mb_per_s"] = static_cast<double>(puts.load() * o.object_bytes) / 1e6 / elapsed;
    step["p50_ms"] = Ms(latency.Quantile(0.5));
    step["p99_ms"] = Ms(latency.Quantile(0.99));
    out["put"].push_back(step);
    for (const auto& k : keys) store->DeleteMany(k).IgnoreError();
  }

  // Ranged GETs over a few objects written first.
  constexpr int kObjects = 4;
  for (int i = 0; i < kObjects; ++i) {
    WEIR_RETURN_IF_ERROR(store->Put("bench-" + run + "/get/" + std::to_string(i), data));
  }
  Histogram latency;
  std::atomic<uint64_t> reads{0};
  const uint64_t max_offset = o.object_bytes - o.range_bytes;
  const double elapsed = RunFor(o.range_inflight, o.range_s, latency, failures, [&](int t, uint64_t i) {
    const uint64_t h = (static_cast<uint64_t>(t) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
    const uint64_t offset = max_offset == 0 ? 0 : (h % (max_offset + 1));
    auto r = store->Get("bench-" + run + "/get/" + std::to_string(h % kObjects), objstore::ByteRange{offset, o.range_bytes});
    if (!r.ok() || r->size() != o.range_bytes) return false;
    reads.fetch_add(1);
    return true;
  });
  std::vector<std::string> get_keys;
  for (int i = 0; i < kObjects; ++i) get_keys.push_back("bench-" + run + "/get/" + std::to_string(i));
  store->DeleteMany(get_keys).IgnoreError();
  out["get_range"] = {{"inflight", o.range_inflight},
                      {"range_bytes", o.range_bytes},
                      {"reads_per_s", static_cast<double>(reads.load()) / elapsed},
                      {"mb_per_s", static_cast<double>(reads.load() * o.range_bytes) / 1e6 / elapsed},
                      {"p50_ms", Ms(latency.Quantile(0.5))},
                      {"p99_ms", Ms(latency.Quantile(0.99))}};
  out["failures"] = failures.load();
  if (auto* s3 = dynamic_cast<objstore::S3Store*>(store.get())) {
    const objstore::S3Metrics& m = s3->metrics();
    uint64_t retries = 0;
    for (const auto& r : m.retries) retries += r.load();
    out["retries"] = retries;
    out["connections_opened"] = m.connections_opened.load();
  }
  std::cout << out.dump() << std::endl;
  if (failures.load() > 0) return Internal("{} operations failed during the benchmark", failures.load());
  return Status::Ok();
}

}  // namespace weir::bench
