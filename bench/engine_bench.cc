#include "bench/engine_bench.h"

#include <algorithm>
#include <atomic>
#include <iostream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "log/engine.h"
#include "metastore/metastore.h"
#include "objstore/fault_store.h"
#include "objstore/mem_store.h"

namespace weir::bench {

namespace {
const std::string kBasin = "bench-basin";

std::vector<log::AppendRecord> MakeBatch(int n, size_t bytes, uint64_t tag) {
  std::vector<log::AppendRecord> out(static_cast<size_t>(n));
  for (auto& r : out) {
    r.body.assign(bytes, static_cast<char>('a' + tag % 26));
  }
  return out;
}

double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Status RunEngineBench(const EngineBenchOptions& o) {
  if (o.streams < 1 || o.appenders < 1 || o.batch < 1 || o.duration_s <= 0) {
    return InvalidArgument("streams, appenders, batch and duration must be positive");
  }
  // The fault store also counts PUTs and GETs (WAL slots and segments).
  objstore::FaultOptions fo;
  if (o.put_latency_ms > 0) fo.put_latency = objstore::LatencySpec::Fixed(o.put_latency_ms);
  auto counted = std::make_shared<objstore::FaultStore>(objstore::NewMemStore(), fo);
  std::shared_ptr<objstore::ObjectStore> store = counted;
  WEIR_ASSIGN_OR_RETURN(auto meta, metastore::OpenMetastore("sqlite://:memory:"));
  log::EngineOptions eo;
  eo.node = "bench";
  eo.settle_min_bytes = o.settle_min_kib << 10;
  eo.settle_max_delay = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.settle_max_delay_s));
  WEIR_ASSIGN_OR_RETURN(auto engine, log::Engine::Open(eo, store, meta));
  WEIR_RETURN_IF_ERROR(engine->CreateBasin(kBasin));
  for (int i = 0; i < o.streams; ++i) {
    WEIR_RETURN_IF_ERROR(engine->CreateStream(kBasin, "s" + std::to_string(i), {}).status());
  }

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> appends{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < o.appenders; ++t) {
    threads.emplace_back([&, t] {
      // Open loop at --rate: each thread its share, on a fixed schedule.
      const Duration every = o.rate > 0 ? std::chrono::duration_cast<Duration>(
                                              std::chrono::duration<double>(o.appenders / o.rate))
                                        : Duration::zero();
      TimePoint next = Now();
      for (uint64_t n = 0; !stop.load(); ++n) {
        if (o.rate > 0) {
          next += every;
          std::this_thread::sleep_until(next);
        }
        std::string stream = "s" + std::to_string((static_cast<uint64_t>(t) + n * 7) % static_cast<uint64_t>(o.streams));
        auto out = engine->Append(kBasin, stream, MakeBatch(o.batch, o.record_bytes, n));
        (out.status.ok() ? appends : failures).fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // warm-up: the first settles
  const auto& c = meta->counters();
  uint64_t ops0 = c.reads.load() + c.writes.load(), tx0 = c.transactions.load(), a0 = appends.load();
  uint64_t cycles0 = engine->metrics().settle_cycles.load();
  const auto& fc = counted->counters();
  uint64_t puts0 = fc.puts.load(), gets0 = fc.gets.load(), segs0 = engine->metrics().segments_written.load();
  TimePoint t0 = Now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
  double elapsed = Seconds(Now() - t0);
  uint64_t ops = c.reads.load() + c.writes.load() - ops0, tx = c.transactions.load() - tx0;
  uint64_t appended = appends.load() - a0, cycles = engine->metrics().settle_cycles.load() - cycles0;
  uint64_t puts = fc.puts.load() - puts0, gets = fc.gets.load() - gets0;
  uint64_t segments = engine->metrics().segments_written.load() - segs0;

  // Reads of the 1,000 most recent records of a stream, while appends go on.
  std::vector<double> read_ms;
  for (int i = 0; i < 200; ++i) {
    TimePoint r0 = Now();
    auto r = engine->Read(kBasin, "s0", log::ReadStart{log::ReadStart::kTailOffset, 1000}, 1000, 16 << 20);
    if (!r.ok()) return r.status();
    read_ms.push_back(Seconds(Now() - r0) * 1000);
  }
  stop = true;
  for (auto& t : threads) t.join();
  engine->Close();
  std::sort(read_ms.begin(), read_ms.end());

  nlohmann::json j;
  j["streams"] = o.streams;
  j["appenders"] = o.appenders;
  j["appends_per_s"] = static_cast<double>(appended) / elapsed;
  j["records_per_s"] = static_cast<double>(appended) * o.batch / elapsed;
  j["metastore_ops_per_s"] = static_cast<double>(ops) / elapsed;
  j["metastore_tx_per_s"] = static_cast<double>(tx) / elapsed;
  j["settle_cycles_per_s"] = static_cast<double>(cycles) / elapsed;
  // Object-store requests (WAL slots and segments) per GiB of record bodies.
  const double gib = static_cast<double>(appended) * o.batch * static_cast<double>(o.record_bytes) / (1u << 30);
  j["puts_per_s"] = static_cast<double>(puts) / elapsed;
  j["segment_puts_per_s"] = static_cast<double>(segments) / elapsed;
  j["gets_per_s"] = static_cast<double>(gets) / elapsed;
  j["puts_per_gib"] = gib > 0 ? static_cast<double>(puts) / gib : 0;
  j["settle_min_kib"] = o.settle_min_kib;
  j["rate"] = o.rate;
  j["read_1000_recent_p50_ms"] = read_ms[read_ms.size() / 2];
  j["read_1000_recent_p99_ms"] = read_ms[(read_ms.size() * 99 + 99) / 100 - 1];  // nearest rank
  j["failures"] = failures.load();
  std::cout << j.dump() << std::endl;
  return failures.load() == 0 ? Status::Ok() : Internal("{} appends failed", failures.load());
}

Status RunRecoveryBench(const RecoveryBenchOptions& o) {
  if (o.unsettled_mib < 1 || o.batch < 1) return InvalidArgument("unsettled-mib and batch must be positive");
  auto mem = objstore::NewMemStore();
  WEIR_ASSIGN_OR_RETURN(auto meta, metastore::OpenMetastore("sqlite://:memory:"));
  log::EngineOptions eo;
  eo.node = "bench";
  eo.settle_interval = Duration::zero();
  eo.settle_on_close = false;
  uint64_t records = 0;
  {
    WEIR_ASSIGN_OR_RETURN(auto engine, log::Engine::Open(eo, mem, meta));
    WEIR_RETURN_IF_ERROR(engine->CreateBasin(kBasin));
    for (int i = 0; i < 16; ++i) WEIR_RETURN_IF_ERROR(engine->CreateStream(kBasin, "s" + std::to_string(i), {}).status());
    // Fill the WAL from 16 threads so slots group-commit as they would in service.
    std::atomic<uint64_t> bytes{0}, failures{0};
    const uint64_t target = static_cast<uint64_t>(o.unsettled_mib) << 20;
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        while (bytes.load() < target) {
          auto out = engine->Append(kBasin, "s" + std::to_string(t), MakeBatch(o.batch, o.record_bytes, 1));
          if (!out.status.ok()) {
            failures.fetch_add(1);
            return;
          }
          bytes.fetch_add(o.record_bytes * static_cast<size_t>(o.batch));
        }
      });
    }
    for (auto& t : threads) t.join();
    if (failures.load() > 0) return Internal("appends failed while filling the WAL");
    records = bytes.load() / o.record_bytes;
    engine->Close();
  }
  size_t slots = 0;
  uint64_t slot_bytes = 0;
  for (std::string after;;) {
    WEIR_ASSIGN_OR_RETURN(auto p, mem->List("wal/", after, 1000));
    for (const auto& obj : p.objects) {
      ++slots;
      slot_bytes += obj.size;
    }
    if (p.next_start_after.empty()) break;
    after = p.next_start_after;
  }
  objstore::FaultOptions fo;
  fo.get_latency = objstore::LatencySpec::Fixed(o.get_latency_ms);
  auto slow = std::make_shared<objstore::FaultStore>(mem, fo);
  TimePoint t0 = Now();
  WEIR_ASSIGN_OR_RETURN(auto engine, log::Engine::Open(eo, slow, meta));
  double recovery_s = Seconds(Now() - t0);
  uint64_t recovered = 0;
  for (int i = 0; i < 16; ++i) {
    WEIR_ASSIGN_OR_RETURN(uint64_t tail, engine->CheckTail(kBasin, "s" + std::to_string(i)));
    recovered += tail;
  }
  engine->Close();
  if (recovered != records) return Internal("recovered {} records, wrote {}", recovered, records);
  nlohmann::json j;
  j["unsettled_mib"] = o.unsettled_mib;
  j["slots"] = slots;
  j["slot_mib"] = static_cast<double>(slot_bytes) / (1 << 20);
  j["get_latency_ms"] = o.get_latency_ms;
  j["recovery_s"] = recovery_s;
  j["records"] = recovered;
  std::cout << j.dump() << std::endl;
  return Status::Ok();
}

}  // namespace weir::bench
