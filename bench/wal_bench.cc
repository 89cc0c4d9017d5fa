#include "bench/wal_bench.h"

#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "objstore/fault_store.h"
#include "objstore/file_store.h"
#include "objstore/mem_store.h"
#include "objstore/s3_store.h"
#include "wal/record_batch.h"
#include "wal/slot_format.h"
#include "wal/writer.h"

namespace weir::bench {

namespace {

// One appender: a logical producer with its own stream, offsets and window of
// unacknowledged appends. Appenders are multiplexed over a few driver threads,
// as a server multiplexes connections over a few I/O threads.
struct Appender {
  std::atomic<int> inflight{0};
  std::atomic<uint64_t> failures{0};
  uint64_t stream = 0;
  int64_t next_offset = 0;
  std::vector<wal::Record> records;
};

// A driver thread: fills its appenders' windows, sleeps until an ack brings one
// of them down to its low-water mark.
struct Driver {
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  std::vector<Appender*> appenders;
};

}  // namespace

Status RunWalBench(const WalBenchOptions& o) {
  if (o.appenders < 1 || o.appenders > 4096) return InvalidArgument("--appenders must be 1..4096");
  if (o.inflight < 1 || o.inflight > 100000) return InvalidArgument("--inflight must be 1..100000");
  if (o.record_bytes < 1 || o.record_bytes > (4u << 20)) return InvalidArgument("--record-bytes must be 1..4194304");
  if (o.threads < 1 || o.threads > 256) return InvalidArgument("--threads must be 1..256");
  if (o.duration_s <= 0) return InvalidArgument("--duration must be positive");

  std::shared_ptr<objstore::ObjectStore> store;
  std::string temp_dir;
  if (o.store == "mem") {
    store = objstore::NewMemStore();
  } else if (o.store == "file") {
    std::string dir = o.dir;
    if (dir.empty()) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "weir-bench-XXXXXX").string();
      if (mkdtemp(tmpl.data()) == nullptr) return IOError("cannot create a temp dir for the file store");
      dir = temp_dir = tmpl;
    }
    WEIR_ASSIGN_OR_RETURN(store, objstore::OpenFileStore(dir));
  } else if (o.store.find("://") != std::string::npos) {
    WEIR_ASSIGN_OR_RETURN(store, objstore::OpenObjectStore(o.store));
  } else {
    return InvalidArgument("--store must be mem, file or an object store URI, got \"{}\"", o.store);
  }
  const std::shared_ptr<objstore::ObjectStore> s3_inner = store;  // before any fault wrapper
  if (o.put_latency_ms > 0) {
    objstore::FaultOptions fo;
    fo.put_latency = objstore::LatencySpec::Fixed(o.put_latency_ms);
    store = std::make_shared<objstore::FaultStore>(store, fo);
  }

  wal::WriterOptions wo;
  // A shared store (s3://) may hold earlier runs' slots: each run its own chain.
  const bool shared_store = o.store.find("://") != std::string::npos;
  wo.node = shared_store ? fmt::format("bench-{:08x}", std::random_device{}()) : "bench";
  wo.epoch = 1;
  wo.window = o.window;
  wo.slot_cap_bytes = o.slot_cap_bytes;
  wo.budget_bytes = o.budget_bytes;
  wo.linger = std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(o.linger_ms));
  WEIR_ASSIGN_OR_RETURN(auto writer, wal::Writer::Start(store, wo));

  int streams = o.streams > 0 ? o.streams : o.appenders;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> acked{0};
  // Stands in for settle + trim: deletes acknowledged slots so the store's
  // memory (mem://) or disk (file://) stays bounded during long runs.
  std::atomic<uint64_t> released_below{0};
  std::thread trimmer([&] {
    uint64_t next = 0;
    std::vector<std::string> keys;
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      uint64_t upto = released_below.load();
      keys.clear();
      for (; next < upto; ++next) keys.push_back(wal::SlotKey(wo.node, wo.epoch, next));
      if (!keys.empty()) store->DeleteMany(keys).IgnoreError();
    }
  });
  const int low_water = o.inflight / 2;
  const int driver_count = std::min(o.appenders, o.threads);
  std::vector<std::unique_ptr<Appender>> apps;
  std::vector<std::unique_ptr<Driver>> drivers;
  for (int d = 0; d < driver_count; ++d) drivers.push_back(std::make_unique<Driver>());
  std::mt19937_64 rng(1);
  for (int i = 0; i < o.appenders; ++i) {
    auto a = std::make_unique<Appender>();
    a->stream = static_cast<uint64_t>(i % streams);
    a->records.resize(1);
    a->records[0].key = "k" + std::to_string(i);
    a->records[0].value = std::string(o.record_bytes, '\0');
    for (char& c : *a->records[0].value) c = static_cast<char>(rng());
    drivers[static_cast<size_t>(i % driver_count)]->appenders.push_back(a.get());
    apps.push_back(std::move(a));
  }
  std::vector<std::thread> threads;
  for (int d = 0; d < driver_count; ++d) {
    threads.emplace_back([&, d] {
      Driver& drv = *drivers[static_cast<size_t>(d)];
      for (Appender* ap : drv.appenders) {
        ap->records[0].timestamp = WallMillis();
      }
      while (!stop.load(std::memory_order_relaxed)) {
        bool submitted = false;
        for (Appender* ap : drv.appenders) {
          Appender& a = *ap;
          while (a.inflight.load(std::memory_order_relaxed) < o.inflight && !stop.load(std::memory_order_relaxed)) {
            a.inflight.fetch_add(1, std::memory_order_relaxed);
            wal::EncodeOptions eo;
            eo.base_offset = a.next_offset++;
            a.records[0].timestamp = WallMillis();
            std::string batch;
            Status st = wal::EncodeRecordBatch(a.records, eo, &batch);
            auto done = [&a, &drv, &acked, &released_below, low_water](const Status& s, const wal::AckInfo& info) {
              (s.ok() ? acked : a.failures).fetch_add(1, std::memory_order_relaxed);
              // Slots release in order: every slot below this one is acknowledged.
              if (s.ok() && released_below.load(std::memory_order_relaxed) < info.seq) {
                released_below.store(info.seq, std::memory_order_relaxed);
              }
              if (a.inflight.fetch_sub(1, std::memory_order_relaxed) == low_water + 1) {
                std::lock_guard lk(drv.mu);
                if (drv.ready++ == 0) drv.cv.notify_one();
              }
            };
            if (st.ok()) st = writer->Append(a.stream, std::move(batch), std::move(done), Now() + std::chrono::seconds(60));
            if (!st.ok()) {
              a.failures.fetch_add(1);
              a.inflight.fetch_sub(1);
            }
            submitted = true;
          }
        }
        if (!submitted) {
          std::unique_lock lk(drv.mu);
          drv.cv.wait_for(lk, std::chrono::milliseconds(5), [&] { return drv.ready > 0 || stop.load(); });
          drv.ready = 0;
        }
      }
    });
  }

  auto& m = writer->metrics();
  auto sleep_s = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
  sleep_s(o.warmup_s);
  m.ack_latency_ns.Reset();
  uint64_t acked0 = acked.load(), slots0 = m.slots.load(), slot_bytes0 = m.slot_bytes.load();
  TimePoint t0 = Now();
  sleep_s(o.duration_s);
  uint64_t acked1 = acked.load(), slots1 = m.slots.load(), slot_bytes1 = m.slot_bytes.load();
  double elapsed = std::chrono::duration<double>(Now() - t0).count();
  double p50 = static_cast<double>(m.ack_latency_ns.Quantile(0.50)) / 1e6;
  double p99 = static_cast<double>(m.ack_latency_ns.Quantile(0.99)) / 1e6;
  double p999 = static_cast<double>(m.ack_latency_ns.Quantile(0.999)) / 1e6;

  stop.store(true);
  for (auto& d : drivers) {
    std::lock_guard lk(d->mu);
    d->cv.notify_all();
  }
  for (auto& t : threads) t.join();
  trimmer.join();
  writer->Close();
  if (shared_store) {
    // Remove what the trimmer left: the last slots of this run's chain.
    const std::string chain = "wal/" + wo.node + "/";
    for (auto page = store->List(chain); page.ok() && !page->objects.empty(); page = store->List(chain)) {
      std::vector<std::string> keys;
      for (const auto& obj : page->objects) keys.push_back(obj.key);
      if (!store->DeleteMany(keys).ok()) break;
    }
  }
  uint64_t failures = 0;
  for (auto& a : apps) failures += a->failures.load();
  if (!temp_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir, ec);
  }

  double appends = static_cast<double>(acked1 - acked0);
  double slots = static_cast<double>(slots1 - slots0);
  nlohmann::json j;
  j["appends_per_s"] = appends / elapsed;
  j["mb_per_s"] = appends * static_cast<double>(o.record_bytes) / 1e6 / elapsed;
  j["p50_ms"] = p50;
  j["p99_ms"] = p99;
  j["p999_ms"] = p999;
  j["puts_per_s"] = slots / elapsed;
  j["bytes_per_put"] = slots > 0 ? static_cast<double>(slot_bytes1 - slot_bytes0) / slots : 0.0;
  j["store"] = shared_store ? store->Describe() : o.store;  // no secrets
  j["ack_p50_over_put_p50"] = m.put_latency_ns.Quantile(0.5) > 0 ? p50 * 1e6 / static_cast<double>(m.put_latency_ns.Quantile(0.5)) : 0.0;
  if (auto* s3 = dynamic_cast<objstore::S3Store*>(s3_inner.get())) {
    // Raw HTTP PUT attempts, as the S3 client saw them.
    j["s3_put_p50_ms"] = static_cast<double>(s3->metrics().latency_ns[objstore::S3Metrics::kPut].Quantile(0.5)) / 1e6;
    j["s3_put_p99_ms"] = static_cast<double>(s3->metrics().latency_ns[objstore::S3Metrics::kPut].Quantile(0.99)) / 1e6;
  }
  j["put_latency_ms"] = o.put_latency_ms;
  j["appenders"] = o.appenders;
  j["inflight"] = o.inflight;
  j["threads"] = driver_count;
  j["record_bytes"] = o.record_bytes;
  j["failures"] = failures;
  j["stall_window"] = m.stall_window.load();
  j["put_p50_ms"] = static_cast<double>(m.put_latency_ns.Quantile(0.5)) / 1e6;
  j["put_mean_ms"] = m.put_latency_ns.count() ? static_cast<double>(m.put_latency_ns.sum()) / 1e6 / static_cast<double>(m.put_latency_ns.count()) : 0.0;
  j["ack_mean_ms"] = m.ack_latency_ns.count() ? static_cast<double>(m.ack_latency_ns.sum()) / 1e6 / static_cast<double>(m.ack_latency_ns.count()) : 0.0;
  j["put_p99_ms"] = static_cast<double>(m.put_latency_ns.Quantile(0.99)) / 1e6;
  j["slot_entries_p50"] = m.slot_entries.Quantile(0.5);
  auto mean_ms = [](const Histogram& h) {
    return h.count() ? static_cast<double>(h.sum()) / 1e6 / static_cast<double>(h.count()) : 0.0;
  };
  // Where the rest of an ack goes, per entry: waiting to be cut, and waiting
  // for earlier slots once its own is durable.
  j["cut_wait_mean_ms"] = mean_ms(m.cut_wait_ns);
  j["release_wait_mean_ms"] = mean_ms(m.release_wait_ns);
  j["stall_budget"] = m.stall_budget_uploads.load() + m.stall_budget_halted.load();
  std::cout << j.dump() << std::endl;
  if (failures > 0) return Internal("{} appends failed during the benchmark", failures);
  return Status::Ok();
}

}  // namespace weir::bench
