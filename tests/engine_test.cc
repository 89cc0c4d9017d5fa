// The stream engine: sequencing, conditions, producers, timestamps, commands,
// reads, recovery and halts.
#include "log/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "objstore/fault_store.h"
#include "objstore/mem_store.h"
#include "hooked_metastore.h"
#include "test_support.h"
#include "test_util.h"
#include "wal/compression.h"
#include "wal/fence.h"
#include "wal/quorum_store.h"
#include "log/engine_internal.h"
#include "log/segment_format.h"
#include "metastore/sql_metastore.h"
#include "wal/slot_format.h"
#include "wal/writer.h"

namespace weir::log {
namespace {

using namespace std::chrono_literals;
using metastore::StreamConfig;
using metastore::TimestampingMode;

const std::string kBasin = "test-basin";

std::vector<AppendRecord> Bodies(std::initializer_list<std::string> bodies) {
  std::vector<AppendRecord> out;
  for (const auto& b : bodies) {
    AppendRecord r;
    r.body = b;
    out.push_back(std::move(r));
  }
  return out;
}

AppendRecord Command(const std::string& name, const std::string& body) {
  AppendRecord r;
  r.headers.push_back(wal::RecordHeader{"", name});
  r.body = body;
  return r;
}

std::string Be64(uint64_t v) {
  std::string s;
  PutBE64(&s, v);
  return s;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = objstore::NewMemStore();
    auto meta = metastore::OpenMetastore("sqlite://:memory:");
    ASSERT_TRUE(meta.ok()) << meta.status().ToString();
    meta_ = *meta;
    Start();
    ASSERT_TRUE(engine_->CreateBasin(kBasin).ok());
    ASSERT_TRUE(engine_->CreateStream(kBasin, "s", StreamConfig{}).ok());
  }

  void Start(std::shared_ptr<objstore::ObjectStore> store = nullptr) {
    auto e = Engine::Open(Options(), store ? store : store_, meta_);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
  }

  EngineOptions Options() const {
    EngineOptions o;
    o.node = node_;
    o.node_live_window = node_live_window_;
    o.settle_interval = Duration::zero();  // tests settle by hand
    o.settle_on_close = settle_on_close_;
    o.merge_interval = Duration::zero();  // tests merge by hand
    o.heartbeat_interval = Duration::zero();  // at start only (tests count metastore transactions)
    o.merge_min_age = merge_min_age_;
    o.merge_small_bytes = merge_small_bytes_;
    o.merge_parts_per_pass = merge_parts_per_pass_;
    o.settle_min_bytes = settle_min_bytes_;
    o.settle_max_delay = settle_max_delay_;
    o.max_streams = max_streams_;
    o.retention_streams_per_txn = retention_streams_per_txn_;
    o.load_page_streams = load_page_streams_;
    o.load_page_segments = load_page_segments_;
    o.wal.retry_initial = 1ms;
    o.wal.retry_max = 5ms;
    o.log_cache_bytes = cache_bytes_;
    o.max_unsettled_bytes = max_unsettled_bytes_;
    o.max_unsettled_batches = max_unsettled_batches_;
    o.admission_timeout = admission_timeout_;
    if (wal_budget_ > 0) {
      o.wal.budget_bytes = wal_budget_;
      o.wal.slot_cap_bytes = std::min(o.wal.slot_cap_bytes, wal_budget_ / 4);
    }
    return o;
  }

  void Restart() {
    engine_->Close();
    engine_.reset();
    Start();
  }

  // Restarts the engine over a store whose PUTs the test can hold.
  std::shared_ptr<testing::GatedStore> RestartGated() {
    auto gated = std::make_shared<testing::GatedStore>(store_);
    engine_->Close();
    engine_.reset();
    Start(gated);
    return gated;
  }

  // Restarts the engine over a store that counts its calls (GETs, PUTs).
  std::shared_ptr<objstore::FaultStore> RestartCounted() {
    auto counted = std::make_shared<objstore::FaultStore>(store_, objstore::FaultOptions{});
    engine_->Close();
    engine_.reset();
    Start(counted);
    return counted;
  }

  // Starts an append of "x" to "s" whose slot (slot 0 of this epoch) `gated`
  // holds; returns the slot's key once its PUT waits there.
  std::string AppendHeldAtSlotZero(testing::GatedStore& gated, std::promise<AppendOutcome>* pending) {
    const std::string slot0 = wal::SlotKey("n1", engine_->epoch(), 0);
    gated.Gate(slot0);
    engine_->AppendAsync(kBasin, "s", Bodies({"x"}), {},
                         [pending](AppendOutcome o) { pending->set_value(std::move(o)); });
    EXPECT_TRUE(gated.WaitBlocked(slot0));
    return slot0;
  }

  // Halts the WAL writer: an append of "x" to "s" is held in slot 0 while
  // someone (a successor, say) poisons that slot, then let go. Returns the
  // append's outcome, once the halt is handled.
  AppendOutcome AppendIntoPoisonedSlotZero(testing::GatedStore& gated) {
    const uint64_t epoch = engine_->epoch();
    std::promise<AppendOutcome> pending;
    const std::string slot0 = AppendHeldAtSlotZero(gated, &pending);
    EXPECT_TRUE(wal::Fence(*store_, wal::ChainRef{"n1", epoch}, 0, 4242).ok());
    gated.Open(slot0);
    return pending.get_future().get();
  }

  // A table of `buckets` bucket streams in kBasin, each configured `config`.
  Status CreateTable(const std::string& name, uint32_t buckets, const StreamConfig& config) {
    metastore::TableInfo t;
    t.basin = kBasin;
    t.name = name;
    t.bucket_count = buckets;
    return engine_->CreateTable(t, config).status();
  }

  // Restarts the engine over a metastore the test can hook (and optionally a
  // store of its own).
  std::shared_ptr<testing::HookedMetastore> RestartHooked(std::shared_ptr<objstore::ObjectStore> store = nullptr) {
    auto hooked = std::make_shared<testing::HookedMetastore>(meta_);
    engine_->Close();
    engine_.reset();
    auto e = Engine::Open(Options(), store ? store : store_, hooked);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (e.ok()) engine_ = std::move(*e);
    return hooked;
  }

  // Every record from `from` to the tail: a read stops after
  // Engine::kMaxSegmentsPerRead segments (a settle every few ms makes many
  // small ones), so this reads on from where each read ended.
  std::vector<std::string> ReadAll(const std::string& stream, uint64_t from = 0) {
    std::vector<std::string> out;
    for (;;) {
      auto r = engine_->Read(kBasin, stream, ReadStart{ReadStart::kOffset, from}, 1000, 1 << 20);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return out;
      for (auto& rec : r->records) out.push_back(rec.record.value.value_or("<null>"));
      if (r->records.empty() || r->records.back().offset + 1 >= r->tail) return out;
      from = r->records.back().offset + 1;
    }
  }

  std::shared_ptr<objstore::ObjectStore> store_;
  std::shared_ptr<metastore::Metastore> meta_;
  std::unique_ptr<Engine> engine_;
  size_t cache_bytes_ = 64 << 20;
  uint64_t max_unsettled_bytes_ = uint64_t{4} << 30;
  uint64_t max_unsettled_batches_ = 2'000'000;
  Duration admission_timeout_ = std::chrono::seconds(10);
  size_t wal_budget_ = 0;  // 0: the WAL's default
  size_t merge_small_bytes_ = 1 << 20;
  Duration merge_min_age_ = Duration::zero();
  size_t retention_streams_per_txn_ = 100;
  size_t load_page_streams_ = 1000;
  size_t load_page_segments_ = 10000;
  size_t merge_parts_per_pass_ = 2048;
  size_t settle_min_bytes_ = 1 << 20;
  Duration settle_max_delay_ = std::chrono::seconds(10);
  size_t max_streams_ = 100'000;
  bool settle_on_close_ = true;
  std::string node_ = "n1";
  Duration node_live_window_ = std::chrono::seconds(20);
};

size_t CountKeys(objstore::ObjectStore& store, const std::string& prefix) {
  auto page = store.List(prefix, "", 1000);
  return page.ok() ? page->objects.size() : 0;
}

// ForEachParallel's threads come from one allowance for the process: many
// callers at once (fetch workers, each reading many partitions, settle) start
// no more than kMaxParallelThreads between them, and every item still runs.
TEST(ForEachParallelTest, ThreadsStartedAreCappedProcessWide) {
  constexpr size_t kCallers = 40, kItems = 8;
  static_assert(kCallers * (kItems - 1) > kMaxParallelThreads, "they would start more without the allowance");
  std::atomic<size_t> running{0}, peak{0}, done{0};
  std::atomic<size_t> peak_started{0};
  std::vector<std::thread> callers;
  for (size_t c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      ForEachParallel(kItems, kItems, "test-parallel", [&](size_t) {
        const size_t now = ++running;
        for (size_t p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
        }
        const size_t started = ParallelThreadsRunning();
        for (size_t p = peak_started.load(); started > p && !peak_started.compare_exchange_weak(p, started);) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        --running;
        ++done;
      });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(done.load(), kCallers * kItems);
  EXPECT_LE(peak_started.load(), kMaxParallelThreads);
  EXPECT_LE(peak.load(), kCallers + kMaxParallelThreads);
  EXPECT_EQ(ParallelThreadsRunning(), 0u);
  // Nested calls (each may start threads of its own) all finish, and give every thread back.
  std::atomic<size_t> inner{0};
  ForEachParallel(4, 4, "test-outer", [&](size_t) {
    ForEachParallel(4, 4, "test-inner", [&](size_t) { ++inner; });
  });
  EXPECT_EQ(inner.load(), 16u);
  EXPECT_EQ(ParallelThreadsRunning(), 0u);
}

TEST_F(EngineTest, NamesAreValidated) {
  EXPECT_EQ(engine_->CreateBasin("short").code(), Code::kInvalidArgument);
  EXPECT_EQ(engine_->CreateBasin("Upper-case-basin").code(), Code::kInvalidArgument);
  EXPECT_EQ(engine_->CreateBasin("-leading-hyphen").code(), Code::kInvalidArgument);
  EXPECT_EQ(engine_->CreateBasin(kBasin).code(), Code::kAlreadyExists);
  EXPECT_EQ(engine_->CreateStream(kBasin, "", StreamConfig{}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(engine_->CreateStream(kBasin, "s", StreamConfig{}).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(engine_->CreateStream("no-such-basin", "s", StreamConfig{}).status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->Append(kBasin, "missing", Bodies({"x"})).status.code(), Code::kNotFound);
}

TEST_F(EngineTest, ABasinCanCreateMissingStreamsWithItsDefaults) {
  metastore::BasinConfig config;
  config.create_stream_on_append = true;
  config.default_stream_config.retention_age_s = 0;
  config.default_stream_config.timestamping = metastore::TimestampingMode::kArrival;
  ASSERT_TRUE(engine_->CreateBasin("auto-basin", "", config).ok());
  // Appends never create (they must not block on the metastore): the front-end asks first.
  EXPECT_EQ(engine_->Append("auto-basin", "fresh", Bodies({"x"})).status.code(), Code::kNotFound);
  EXPECT_FALSE(engine_->HasStream("auto-basin", "fresh"));
  ASSERT_OK_AND_ASSIGN(bool made, engine_->CreateIfConfigured("auto-basin", "fresh", Engine::AutoCreate::kOnAppend));
  EXPECT_TRUE(made);
  EXPECT_TRUE(engine_->HasStream("auto-basin", "fresh"));
  auto a = engine_->Append("auto-basin", "fresh", Bodies({"x", "y"}));
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.ack.end_offset, 2u);
  ASSERT_OK_AND_ASSIGN(StreamSummary s, engine_->GetStream("auto-basin", "fresh"));
  EXPECT_EQ(s.info.config.retention_age_s, 0);
  EXPECT_EQ(s.info.config.timestamping, metastore::TimestampingMode::kArrival);
  EXPECT_EQ(s.info.config.storage_class, StreamConfig{}.storage_class);
  EXPECT_EQ(engine_->Append("auto-basin", "fresh", Bodies({"z"})).ack.start_offset, 2u);

  // On read only when the basin says so; the default basin creates nothing.
  ASSERT_OK_AND_ASSIGN(bool created, engine_->CreateIfConfigured("auto-basin", "r", Engine::AutoCreate::kOnRead));
  EXPECT_FALSE(created);
  EXPECT_EQ(engine_->GetStream("auto-basin", "r").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->Append(kBasin, "missing", Bodies({"x"})).status.code(), Code::kNotFound);
  EXPECT_EQ(engine_->GetStream(kBasin, "missing").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->Append("no-such-basin", "x", Bodies({"x"})).status.code(), Code::kNotFound);

  config.create_stream_on_read = true;
  ASSERT_TRUE(engine_->ReconfigureBasin("auto-basin", config).ok());
  ASSERT_OK_AND_ASSIGN(created, engine_->CreateIfConfigured("auto-basin", "r", Engine::AutoCreate::kOnRead));
  EXPECT_TRUE(created);
  EXPECT_EQ(*engine_->CheckTail("auto-basin", "r"), 0u);
  // An existing stream counts as created (a racing create won).
  ASSERT_OK_AND_ASSIGN(created, engine_->CreateIfConfigured("auto-basin", "r", Engine::AutoCreate::kOnRead));
  EXPECT_TRUE(created);
  // Racing auto-creates: every caller finds the stream registered, and one
  // stream takes every append.
  for (int i = 0; i < 10; ++i) {
    const std::string name = "race-" + std::to_string(i);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        auto r = engine_->CreateIfConfigured("auto-basin", name, Engine::AutoCreate::kOnAppend);
        if (r.ok() && *r && engine_->Append("auto-basin", name, Bodies({"r"})).status.ok()) ready++;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ready.load(), 4) << name;
    EXPECT_EQ(*engine_->CheckTail("auto-basin", name), 4u) << name;
  }
}

TEST_F(EngineTest, AppendsGetDenseOffsetsAndReadBack) {
  auto a = engine_->Append(kBasin, "s", Bodies({"a", "b", "c"}));
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.ack.start_offset, 0u);
  EXPECT_EQ(a.ack.end_offset, 3u);
  EXPECT_EQ(a.ack.tail, 3u);
  EXPECT_FALSE(a.ack.duplicated);
  auto b = engine_->Append(kBasin, "s", Bodies({"d"}));
  EXPECT_EQ(b.ack.start_offset, 3u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(ReadAll("s", 2), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 4u);
  auto past = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 5}, 10, 1000);
  EXPECT_EQ(past.status().code(), Code::kOutOfRange);
  auto tail2 = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTailOffset, 2}, 10, 1000);
  ASSERT_TRUE(tail2.ok());
  ASSERT_EQ(tail2->records.size(), 2u);
  EXPECT_EQ(tail2->records[0].offset, 2u);
  auto limited = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 2, 1000);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->records.size(), 2u);
}

TEST_F(EngineTest, LimitsAreEnforcedAndChangeNothing) {
  std::vector<AppendRecord> many(1001);
  EXPECT_EQ(engine_->Append(kBasin, "s", std::move(many)).status.code(), Code::kInvalidArgument);
  auto big = Bodies({std::string(1 << 20, 'x')});
  EXPECT_EQ(engine_->Append(kBasin, "s", std::move(big)).status.code(), Code::kInvalidArgument);
  EXPECT_EQ(engine_->Append(kBasin, "s", {}).status.code(), Code::kInvalidArgument);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 0u);
}

TEST_F(EngineTest, MatchSeqNumMissRejectsOnlyThatBatch) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  AppendOptions o;
  o.match_seq_num = 0;
  auto miss = engine_->Append(kBasin, "s", Bodies({"b"}), o);
  EXPECT_EQ(miss.status.code(), Code::kPreconditionFailed);
  ASSERT_TRUE(miss.seq_num_mismatch.has_value());
  EXPECT_EQ(*miss.seq_num_mismatch, 1u);
  o.match_seq_num = 1;
  auto hit = engine_->Append(kBasin, "s", Bodies({"b"}), o);
  ASSERT_TRUE(hit.status.ok());
  EXPECT_EQ(hit.ack.start_offset, 1u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
}

TEST_F(EngineTest, FenceCommandSetsTheTokenAndTrimAdvancesTheTrimPoint) {
  std::vector<AppendRecord> batch;
  batch.push_back(Command("fence", "tok-1"));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(batch)).status.ok());
  auto miss = engine_->Append(kBasin, "s", Bodies({"x"}), AppendOptions{std::nullopt, "wrong", std::nullopt});
  EXPECT_EQ(miss.status.code(), Code::kPreconditionFailed);
  ASSERT_TRUE(miss.fencing_token_mismatch.has_value());
  EXPECT_EQ(*miss.fencing_token_mismatch, "tok-1");
  auto ok = engine_->Append(kBasin, "s", Bodies({"x", "y", "z"}), AppendOptions{std::nullopt, "tok-1", std::nullopt});
  ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(2)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim), AppendOptions{std::nullopt, "tok-1", std::nullopt})
                  .status.ok());
  auto info = engine_->GetStream(kBasin, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->trim_point, 2u);
  EXPECT_EQ(info->fencing_token, "tok-1");
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 100, 1 << 20);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->records.front().offset, 2u);
  // Bad commands are rejected and change nothing.
  std::vector<AppendRecord> bad;
  bad.push_back(Command("trim", "short"));
  EXPECT_EQ(engine_->Append(kBasin, "s", std::move(bad), AppendOptions{std::nullopt, "tok-1", std::nullopt}).status.code(),
            Code::kInvalidArgument);
  std::vector<AppendRecord> unknown;
  unknown.push_back(Command("explode", ""));
  EXPECT_EQ(engine_->Append(kBasin, "s", std::move(unknown), AppendOptions{std::nullopt, "tok-1", std::nullopt}).status.code(),
            Code::kInvalidArgument);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 5u);
}

TEST_F(EngineTest, IdempotentProducers) {
  auto pid = engine_->AllocateProducerId();
  ASSERT_TRUE(pid.ok());
  AppendOptions o;
  o.producer = ProducerRef{*pid, 0, 0};
  auto first = engine_->Append(kBasin, "s", Bodies({"a", "b"}), o);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  auto retry = engine_->Append(kBasin, "s", Bodies({"a", "b"}), o);
  ASSERT_TRUE(retry.status.ok());
  EXPECT_TRUE(retry.ack.duplicated);
  EXPECT_EQ(retry.ack.start_offset, first.ack.start_offset);
  EXPECT_EQ(retry.ack.end_offset, first.ack.end_offset);
  o.producer->seq = 5;  // gap: expected 2
  EXPECT_EQ(engine_->Append(kBasin, "s", Bodies({"c"}), o).status.code(), Code::kOutOfRange);
  o.producer->seq = 2;
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"c"}), o).status.ok());
  // A new epoch starts at 0 and fences the old one.
  AppendOptions e1;
  e1.producer = ProducerRef{*pid, 1, 0};
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"d"}), e1).status.ok());
  o.producer->seq = 3;
  auto stale = engine_->Append(kBasin, "s", Bodies({"e"}), o);
  EXPECT_EQ(stale.status.code(), Code::kFenced);
  EXPECT_TRUE(stale.producer_fenced);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b", "c", "d"}));
}

TEST_F(EngineTest, AProducerRetryIsADuplicateWhateverItsConditionsSayNow) {
  auto pid = engine_->AllocateProducerId();
  ASSERT_TRUE(pid.ok());
  AppendOptions o;
  o.producer = ProducerRef{*pid, 0, 0};
  o.match_seq_num = 0;
  o.fencing_token = "";
  auto batch = [] {
    auto b = Bodies({"a", "b"});
    for (auto& r : b) r.timestamp_ms = 1000;
    return b;
  };
  auto first = engine_->Append(kBasin, "s", batch(), o);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  // The tail has moved past match_seq_num and a fence has landed since; the
  // retry (its ack was lost) still gets the original offsets, not a 412.
  std::vector<AppendRecord> cmd;
  cmd.push_back(Command("fence", "t2"));
  cmd.back().timestamp_ms = 5000;
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(cmd), AppendOptions{}).status.ok());
  auto retry = engine_->Append(kBasin, "s", batch(), o);
  ASSERT_TRUE(retry.status.ok()) << retry.status.ToString();
  EXPECT_TRUE(retry.ack.duplicated);
  EXPECT_EQ(retry.ack.start_offset, 0u);
  EXPECT_EQ(retry.ack.end_offset, 2u);
  EXPECT_EQ(retry.ack.last_timestamp_ms, 1000);
  EXPECT_EQ(retry.ack.tail, 3u);  // the stream's tail now, and its timestamp
  EXPECT_EQ(retry.ack.tail_timestamp_ms, 5000);
  // A new batch of the same producer is held to them.
  o.producer->seq = 2;
  auto next = engine_->Append(kBasin, "s", Bodies({"c"}), o);
  EXPECT_EQ(next.status.code(), Code::kPreconditionFailed);
  EXPECT_TRUE(next.fencing_token_mismatch.has_value());
}

TEST_F(EngineTest, ProducerWindowKeepsFiveBatches) {
  AppendOptions o;
  o.producer = ProducerRef{77, 0, 0};
  for (int i = 0; i < 7; ++i) {
    o.producer->seq = i;
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"v" + std::to_string(i)}), o).status.ok());
  }
  o.producer->seq = 2;  // the 5 newest are 2..6
  auto dup = engine_->Append(kBasin, "s", Bodies({"v2"}), o);
  ASSERT_TRUE(dup.status.ok());
  EXPECT_TRUE(dup.ack.duplicated);
  EXPECT_EQ(dup.ack.start_offset, 2u);
  o.producer->seq = 1;  // fell out of the window: cannot be told from out of order
  EXPECT_EQ(engine_->Append(kBasin, "s", Bodies({"v1"}), o).status.code(), Code::kOutOfRange);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 7u) << "neither the duplicate nor the refusal appended";
}

TEST_F(EngineTest, TimestampModes) {
  StreamConfig require;
  require.timestamping = TimestampingMode::kClientRequire;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "req", require).ok());
  EXPECT_EQ(engine_->Append(kBasin, "req", Bodies({"x"})).status.code(), Code::kInvalidArgument);
  auto recs = Bodies({"x", "y"});
  recs[0].timestamp_ms = 1000;
  recs[1].timestamp_ms = 500;  // goes backwards: clamped to stay monotonic
  auto a = engine_->Append(kBasin, "req", std::move(recs));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.ack.first_timestamp_ms, 1000);
  EXPECT_EQ(a.ack.last_timestamp_ms, 1000);

  StreamConfig arrival;
  arrival.timestamping = TimestampingMode::kArrival;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "arr", arrival).ok());
  auto r2 = Bodies({"x"});
  r2[0].timestamp_ms = 5;
  int64_t before = WallMillis();
  auto b = engine_->Append(kBasin, "arr", std::move(r2));
  ASSERT_TRUE(b.status.ok());
  EXPECT_GE(b.ack.first_timestamp_ms, before);

  // Client-prefer caps future timestamps at arrival.
  auto r3 = Bodies({"x"});
  r3[0].timestamp_ms = WallMillis() + 3600 * 1000;
  auto c = engine_->Append(kBasin, "s", std::move(r3));
  ASSERT_TRUE(c.status.ok());
  EXPECT_LE(c.ack.first_timestamp_ms, WallMillis());
}

TEST_F(EngineTest, ReadFromTimestamp) {
  for (int64_t ts : {100, 200, 300}) {
    auto r = Bodies({"t" + std::to_string(ts)});
    r[0].timestamp_ms = ts;
    ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(r)).status.ok());
  }
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 150}, 10, 1000);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->records.size(), 2u);
  EXPECT_EQ(r->records[0].offset, 1u);
}

TEST_F(EngineTest, TailingReadWaitsForTheNextAck) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(engine_->Append(kBasin, "s", Bodies({"b"})).status.ok());
  });
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 1}, 10, 1000, Now() + 60s);
  writer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].record.value, "b");
  // With nothing new, a wait ends empty at its deadline.
  auto none = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 2}, 10, 1000, Now() + 20ms);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->records.empty());
  EXPECT_EQ(none->tail, 2u);
}

TEST_F(EngineTest, EvictedBatchesAreReadFromTheirWalSlot) {
  cache_bytes_ = 4096;
  Restart();
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({std::string(500, static_cast<char>('a' + i % 26))})).status.ok());
  }
  auto all = ReadAll("s");
  ASSERT_EQ(all.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], std::string(500, static_cast<char>('a' + i % 26)));
}

// A full log cache drops the oldest batches across streams, so tailing
// readers find the newest in memory: it used to empty streams in id order
// (newest batches included) and not cache a batch acknowledged while full.
TEST_F(EngineTest, AFullLogCacheDropsTheOldestBatchesAcrossStreams) {
  cache_bytes_ = 4096;
  settle_on_close_ = false;
  auto gated = RestartGated();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "later", StreamConfig{}).ok());  // a higher id than "s"
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "later", Bodies({std::string(400, 'l')})).status.ok());
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({std::string(400, 's')})).status.ok());
  }
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"newest of s"})).status.ok());
  ASSERT_TRUE(engine_->Append(kBasin, "later", Bodies({"newest of later"})).status.ok());
  // The eviction thread catches up.
  for (int i = 0; i < 3000 && engine_->cached_bytes() > 4096; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_LE(engine_->cached_bytes(), 4096u);
  const int gets = gated->gets("wal/");
  for (const char* name : {"s", "later"}) {
    // The last three batches of each stream are in memory.
    auto r = engine_->Read(kBasin, name, ReadStart{ReadStart::kOffset, 10}, 1000, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->records.size(), 3u) << name;
    EXPECT_EQ(r->records.back().record.value.value_or(""), std::string("newest of ") + name);
  }
  EXPECT_EQ(gated->gets("wal/"), gets) << "a tailing read went to the WAL store";
  // The oldest were dropped and come back from their slots.
  auto all = ReadAll("s");
  ASSERT_EQ(all.size(), 13u);
  EXPECT_EQ(all.front(), std::string(400, 's'));
  EXPECT_GT(gated->gets("wal/"), gets);
}

// Batches no longer in the log cache are read back from their slots a run at
// a time (a stream's batches in a slot are adjacent), not one GET per batch:
// with 1 KiB Kafka batches on S3 that was one ~15 ms GET per KiB, serially,
// and settle could not catch up.
TEST_F(EngineTest, BatchesOutOfTheCacheAreReadBackOneGetPerSlot) {
  cache_bytes_ = 4096;
  settle_on_close_ = false;
  auto gated = RestartGated();
  // Slot 0 held: the 200 appends after it gather in the few slots behind it.
  std::promise<AppendOutcome> first;
  const std::string slot0 = AppendHeldAtSlotZero(*gated, &first);
  std::vector<std::promise<AppendOutcome>> done(200);
  for (size_t i = 0; i < done.size(); ++i) {
    engine_->AppendAsync(kBasin, "s", Bodies({std::string(100, static_cast<char>('a' + i % 26))}), {},
                         [&done, i](AppendOutcome o) { done[i].set_value(std::move(o)); });
  }
  gated->Open(slot0);
  ASSERT_TRUE(first.get_future().get().status.ok());
  for (auto& d : done) ASSERT_TRUE(d.get_future().get().status.ok());
  const int slots = static_cast<int>(CountKeys(*store_, "wal/n1/"));
  ASSERT_LT(slots, 50);

  // A restart replays them with the cache full: nearly all must be read back.
  auto counting = RestartGated();
  int gets = counting->gets("wal/");
  auto all = ReadAll("s");
  ASSERT_EQ(all.size(), 201u);
  for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(all[i + 1], std::string(100, static_cast<char>('a' + i % 26)));
  EXPECT_LE(counting->gets("wal/") - gets, slots) << "the read";
  gets = counting->gets("wal/");
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_LE(counting->gets("wal/") - gets, slots) << "settle";
  EXPECT_GT(engine_->metrics().settle_reread_bytes.load(), 100u * 150);
  all = ReadAll("s");  // from the segment now
  ASSERT_EQ(all.size(), 201u);
  EXPECT_EQ(all[200], std::string(100, static_cast<char>('a' + 199 % 26)));
}

// A read waiting at the tail is woken by an append that also trims past what
// it appended: it returns nothing below the new log start.
TEST_F(EngineTest, AWaitingReadReturnsNothingAnAppendTrimmedAsItWokeIt) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  auto read = std::async(std::launch::async, [&] {
    return engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 2}, 100, 1 << 20, Now() + 30s);
  });
  std::this_thread::sleep_for(100ms);  // the read waits (if not yet, it reads after the trim: the same)
  std::vector<AppendRecord> batch = Bodies({"x"});
  batch.push_back(Command("trim", Be64(4)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(batch)).status.ok());
  auto r = read.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& rec : r->records) EXPECT_GE(rec.offset, 4u) << "below the trim point";
}

// A read near the end of a large segment fetches what it returns (and the
// index), not the whole object, even when the reader allows many MiB.
TEST_F(EngineTest, AReadNearTheEndOfALargeSegmentDoesNotFetchItWhole) {
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({std::string(1000000, static_cast<char>('a' + i))})).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto counting = RestartGated();  // nothing cached: the read goes to the segment
  const uint64_t before = counting->got_bytes();
  auto r = engine_->ReadBatches(kBasin, "s", 11, 16u << 20);  // as a Kafka fetch of 16 MiB
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->batches.size(), 1u);
  EXPECT_EQ(testing::ValueOf(*r->batches[0]), std::string(1000000, 'l'));
  EXPECT_LT(counting->got_bytes() - before, 3u << 20);
}

// A read starting at a large segment's last record counts only that record's
// share of the segment against its limits, and goes on into the next one
// (it counted the whole segment, and returned the one record).
TEST_F(EngineTest, AReadStartingLateInASegmentGoesOnIntoTheNext) {
  for (char c : {'a', 'b'}) {
    std::vector<AppendRecord> records(100);
    for (auto& r : records) r.body = std::string(1000, c);
    ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(records)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());  // a segment of about 100 KB each
  }
  for (bool restarted : {false, true}) {
    if (restarted) Restart();  // nothing cached: the read goes to the segments
    auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 99}, 1000, 64 << 10);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_GT(r->records.size(), 40u) << "restarted: " << restarted;
    EXPECT_LE(r->records.size(), (64u << 10) / 1000);
    for (size_t i = 0; i < r->records.size(); ++i) {
      EXPECT_EQ(r->records[i].offset, 99 + i);
      EXPECT_EQ(r->records[i].record.value.value_or(""), std::string(1000, i == 0 ? 'a' : 'b'));
    }
  }
}

// A reader paging through a large segment (read by range) GETs its footer
// and index once: each later page is one GET, of its own bytes.
TEST_F(EngineTest, PagesOfALargeSegmentAfterTheFirstAreOneGetEach) {
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({std::string(1000000, static_cast<char>('a' + i))})).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto counting = RestartGated();  // nothing cached: the reads go to the segment
  const int before = counting->gets("seg/");
  for (uint64_t from = 0; from < 12; ++from) {
    auto r = engine_->ReadBatches(kBasin, "s", from, 1);  // a page of one batch, as a REST read of 1,000 records
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_FALSE(r->batches.empty()) << from;
    EXPECT_EQ(testing::ValueOf(*r->batches[0]), std::string(1000000, static_cast<char>('a' + from)));
  }
  EXPECT_EQ(counting->gets("seg/") - before, 12 + 2) << "footer and index once, then one GET a page";
}

TEST_F(EngineTest, RecoveryRestoresOffsetsTokensTrimAndProducers) {
  AppendOptions p;
  p.producer = ProducerRef{9, 0, 0};
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"}), p).status.ok());
  std::vector<AppendRecord> cmds;
  cmds.push_back(Command("fence", "tok"));
  cmds.push_back(Command("trim", Be64(1)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(cmds)).status.ok());
  p.producer->seq = 2;
  p.fencing_token = "tok";
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"c"}), p).status.ok());
  uint64_t epoch = engine_->epoch();
  Restart();
  EXPECT_GT(engine_->epoch(), epoch);
  auto info = engine_->GetStream(kBasin, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tail, 5u);
  EXPECT_EQ(info->fencing_token, "tok");
  EXPECT_EQ(info->trim_point, 1u);
  // The producer window survived: a retry of the last batch is a duplicate.
  auto dup = engine_->Append(kBasin, "s", Bodies({"c"}), p);
  ASSERT_TRUE(dup.status.ok()) << dup.status.ToString();
  EXPECT_TRUE(dup.ack.duplicated);
  EXPECT_EQ(dup.ack.start_offset, 4u);
  p.producer->seq = 3;
  auto next = engine_->Append(kBasin, "s", Bodies({"d"}), p);
  ASSERT_TRUE(next.status.ok());
  EXPECT_EQ(next.ack.start_offset, 5u);
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 100, 1 << 20);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->records.size(), 5u);  // offsets 1..5 (0 is trimmed)
  EXPECT_EQ(r->records.back().record.value, "d");
  // And again: two epochs to replay.
  Restart();
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 6u);
}

TEST_F(EngineTest, DuplicateOfAPendingBatchWaitsForItsDurability) {
  auto gated = RestartGated();
  uint64_t epoch = engine_->epoch();
  const std::string slot0 = wal::SlotKey("n1", epoch, 0);
  gated->Gate(slot0);
  AppendOptions p;
  p.producer = ProducerRef{5, 0, 0};
  std::promise<AppendOutcome> first, second;
  engine_->AppendAsync(kBasin, "s", Bodies({"x"}), p, [&](AppendOutcome o) { first.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  engine_->AppendAsync(kBasin, "s", Bodies({"x"}), p, [&](AppendOutcome o) { second.set_value(std::move(o)); });
  auto f2 = second.get_future();
  EXPECT_EQ(f2.wait_for(50ms), std::future_status::timeout) << "duplicate acknowledged before the original";
  gated->Open(slot0);
  auto a = first.get_future().get();
  auto b = f2.get();
  ASSERT_TRUE(a.status.ok());
  ASSERT_TRUE(b.status.ok());
  EXPECT_FALSE(a.ack.duplicated);
  EXPECT_TRUE(b.ack.duplicated);
  EXPECT_EQ(a.ack.start_offset, b.ack.start_offset);
}

// As S2: a conditional append refused for a tail or fencing token that a
// pending append makes is answered once that append is durable (the 412
// names a state that exists), or with its failure.
TEST_F(EngineTest, ARefusalNamingAPendingStateWaitsForIt) {
  auto gated = RestartGated();
  uint64_t epoch = engine_->epoch();
  const std::string slot0 = wal::SlotKey("n1", epoch, 0);
  gated->Gate(slot0);
  std::promise<AppendOutcome> first, refused;
  engine_->AppendAsync(kBasin, "s", Bodies({"x"}), {}, [&](AppendOutcome o) { first.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  AppendOptions stale;
  stale.match_seq_num = 0;  // the pending append moved it to 1
  engine_->AppendAsync(kBasin, "s", Bodies({"y"}), stale, [&](AppendOutcome o) { refused.set_value(std::move(o)); });
  auto f = refused.get_future();
  EXPECT_EQ(f.wait_for(50ms), std::future_status::timeout) << "refused for a tail not yet durable";
  gated->Open(slot0);
  ASSERT_TRUE(first.get_future().get().status.ok());
  auto r = f.get();
  EXPECT_EQ(r.status.code(), Code::kPreconditionFailed) << r.status.ToString();
  ASSERT_TRUE(r.seq_num_mismatch.has_value());
  EXPECT_EQ(*r.seq_num_mismatch, 1u);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 1u);

  // The pending append fails (its stream is deleted before it is durable):
  // the refusal gets that failure, not a tail that never existed.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "d", StreamConfig{}).ok());
  const std::string slot1 = wal::SlotKey("n1", epoch, 1);
  gated->Gate(slot1);
  std::promise<AppendOutcome> doomed, refused2;
  engine_->AppendAsync(kBasin, "d", Bodies({"x"}), {}, [&](AppendOutcome o) { doomed.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot1));
  AppendOptions fenced;
  fenced.fencing_token = "not-the-token";
  engine_->AppendAsync(kBasin, "d", Bodies({"y"}), fenced, [&](AppendOutcome o) { refused2.set_value(std::move(o)); });
  auto f2 = refused2.get_future();
  EXPECT_EQ(f2.wait_for(50ms), std::future_status::timeout);
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "d").ok());
  gated->Open(slot1);
  EXPECT_EQ(doomed.get_future().get().status.code(), Code::kNotFound);
  auto r2 = f2.get();
  EXPECT_EQ(r2.status.code(), Code::kNotFound) << r2.status.ToString();
  EXPECT_FALSE(r2.fencing_token_mismatch.has_value());
}

TEST_F(EngineTest, PoisonedEpochResumesInTheNextEpochWithoutErrors) {
  auto gated = RestartGated();
  uint64_t epoch = engine_->epoch();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());  // slot 0
  const std::string slot1 = wal::SlotKey("n1", epoch, 1);
  gated->Gate(slot1);
  std::promise<AppendOutcome> pending;
  engine_->AppendAsync(kBasin, "s", Bodies({"b"}), {}, [&](AppendOutcome o) { pending.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot1));
  // Someone fences our live epoch without taking the node over.
  auto fence = wal::Fence(*store_, wal::ChainRef{"n1", epoch}, 0, 4242);
  ASSERT_TRUE(fence.ok());
  EXPECT_EQ(fence->cut, 1u);
  gated->Open(slot1);
  auto o = pending.get_future().get();
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(o.ack.start_offset, 1u);
  EXPECT_EQ(engine_->epoch(), epoch + 1);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
  Restart();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
}

TEST_F(EngineTest, AHaltRidesOutAMetastoreThatFailsForAWhile) {
  // The metastore fails the mint after a halt (busy, unreachable): the node
  // is not superseded, so it asks again and resumes; nothing fails.
  auto gated = std::make_shared<testing::GatedStore>(store_);
  auto hooked = RestartHooked(gated);
  ASSERT_TRUE(engine_);
  std::atomic<int> refusals{0};
  hooked->fail_mint = [&]() -> Status {
    return refusals.fetch_add(1) < 2 ? Unavailable("the metastore is busy") : Status::Ok();
  };
  const uint64_t epoch = engine_->epoch();
  auto o = AppendIntoPoisonedSlotZero(*gated);
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_GE(refusals.load(), 3);
  EXPECT_EQ(engine_->epoch(), epoch + 1);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"x"}));
}

// The mint after a halt lands, but its answer is lost (a remote metastore's
// connection drops): asked again, the metastore says the epoch moved on. The
// node row names this process as its minter, so the node is still its own:
// it resumes rather than taking itself for superseded. Here the metastore
// also stays away for a while: the row cannot be read at once, and the next
// mints are refused until it can.
TEST_F(EngineTest, AHaltWhoseMintAnswerWasLostKeepsTheNode) {
  auto gated = std::make_shared<testing::GatedStore>(store_);
  auto hooked = RestartHooked(gated);
  ASSERT_TRUE(engine_);
  std::atomic<int> lost{0}, unread{0};
  hooked->lose_mint_answer = [&]() -> Status {
    return lost.fetch_add(1) == 0 ? Unavailable("the connection to the metastore was reset") : Status::Ok();
  };
  hooked->fail_get_node = [&]() -> Status {
    return unread.fetch_add(1) < 2 ? Unavailable("the metastore is away") : Status::Ok();
  };
  const uint64_t epoch = engine_->epoch();
  auto o = AppendIntoPoisonedSlotZero(*gated);
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_GE(lost.load(), 1);
  EXPECT_GE(unread.load(), 3);
  EXPECT_FALSE(engine_->superseded());
  EXPECT_EQ(engine_->epoch(), epoch + 1);
  EXPECT_TRUE(engine_->Append(kBasin, "s", Bodies({"y"})).status.ok());
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"x", "y"}));
}

// The mint after a halt lands, and a successor mints the epoch after it
// before the halt's garbage probe: the successor may hold our chain's slots
// from the cut on (it fenced, replayed, perhaps settled and deleted them), so
// the halt deletes none of them and resumes nothing into an epoch the
// successor has fenced too; the append in the halted slot fails as unknown.
TEST_F(EngineTest, AHaltSupersededAfterItsMintResumesNothing) {
  auto gated = std::make_shared<testing::GatedStore>(store_);
  auto hooked = RestartHooked(gated);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  std::atomic<int> reads{0};
  hooked->fail_get_node = [&]() -> Status {
    if (reads.fetch_add(1) == 0) {
      auto node = meta_->GetNode("n1");
      EXPECT_TRUE(node.ok() && node->epoch == epoch + 1);
      if (node.ok()) {
        EXPECT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());  // the successor
      }
    }
    return Status::Ok();
  };
  auto o = AppendIntoPoisonedSlotZero(*gated);
  EXPECT_EQ(o.status.code(), Code::kUnavailable) << o.status.ToString();
  EXPECT_GE(reads.load(), 1);
  EXPECT_TRUE(engine_->superseded());
  EXPECT_FALSE(store_->Head(wal::SlotKey("n1", epoch + 1, 0)).ok()) << "resumed into the fenced epoch";
  EXPECT_FALSE(engine_->Append(kBasin, "s", Bodies({"y"})).status.ok());
  settle_on_close_ = false;
}

// The other way round: the mint after a halt fails without landing, and a
// successor mints the next epoch meanwhile. The row names another minter: the
// node is the successor's, and the appends in the halted slot fail.
TEST_F(EngineTest, AHaltWhoseMintFailedWhileASuccessorMintedIsSuperseded) {
  auto gated = std::make_shared<testing::GatedStore>(store_);
  auto hooked = RestartHooked(gated);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  std::atomic<int> failed{0};
  hooked->fail_mint = [&]() -> Status {
    if (failed.fetch_add(1) == 0) {
      EXPECT_TRUE(meta_->MintEpoch("n1", epoch, 8, 12345).ok());  // the successor's
      return Unavailable("the connection to the metastore was reset");
    }
    return Status::Ok();
  };
  auto o = AppendIntoPoisonedSlotZero(*gated);
  EXPECT_EQ(o.status.code(), Code::kFenced) << o.status.ToString();
  EXPECT_GE(failed.load(), 2);
  EXPECT_TRUE(engine_->superseded());
  EXPECT_EQ(engine_->epoch(), epoch);
}

// Another writer's slot at our epoch's key (the fence counts it as
// committed, so the cut lands past the slot our PUT found taken): the append
// in that slot fails, rather than waiting for ever on a writer left halted.
TEST_F(EngineTest, AForeignSlotAtTheHaltedKeyFailsTheAppendsInIt) {
  auto gated = std::make_shared<testing::GatedStore>(store_);
  engine_->Close();
  engine_.reset();
  Start(gated);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  std::promise<AppendOutcome> pending;
  const std::string slot0 = AppendHeldAtSlotZero(*gated, &pending);
  wal::SlotBuilder foreign;
  ASSERT_OK(store_->Put(slot0, foreign.Finish(epoch, 0, 4242)));
  gated->Open(slot0);
  auto future = pending.get_future();
  ASSERT_EQ(future.wait_for(60s), std::future_status::ready) << "the append was left waiting";
  auto o = future.get();
  EXPECT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), Code::kCorruption) << o.status.ToString();
  // The WAL is abandoned: admission refuses at once (a ticket with no room)
  // rather than telling appends to wait out the admission timeout.
  auto ticket = engine_->TryAdmission(100, 1);
  ASSERT_NE(ticket, nullptr);
  EXPECT_FALSE(ticket->has_room());
}

// Another writer's slots at our epoch's keys 0 and 1, while our PUT of slot
// 0 is still out (a retry, say): slot 1's PUT finds its key taken and the
// chain halts there. The fence counts slot 0 as committed, but it holds the
// other writer's records: the append in it is not acknowledged as ours.
TEST_F(EngineTest, AForeignSlotBelowTheHaltedOneIsNotAcknowledgedAsOurs) {
  auto gated = std::make_shared<testing::GatedStore>(store_);
  engine_->Close();
  engine_.reset();
  Start(gated);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  std::promise<AppendOutcome> first;
  const std::string slot0 = AppendHeldAtSlotZero(*gated, &first);
  wal::SlotBuilder foreign;
  ASSERT_OK(store_->Put(slot0, foreign.Finish(epoch, 0, 4242)));
  ASSERT_OK(store_->Put(wal::SlotKey("n1", epoch, 1), foreign.Finish(epoch, 1, 4242)));
  std::promise<AppendOutcome> second;
  engine_->AppendAsync(kBasin, "s", Bodies({"y"}), {}, [&second](AppendOutcome o) { second.set_value(std::move(o)); });
  auto second_future = second.get_future();
  ASSERT_EQ(second_future.wait_for(60s), std::future_status::ready) << "the append in slot 1 was left waiting";
  EXPECT_FALSE(second_future.get().status.ok());
  auto first_future = first.get_future();
  const bool answered = first_future.wait_for(5s) == std::future_status::ready;
  gated->Open(slot0);
  ASSERT_TRUE(answered || first_future.wait_for(60s) == std::future_status::ready) << "the append was left waiting";
  const AppendOutcome o = first_future.get();
  EXPECT_FALSE(o.status.ok()) << "acknowledged at " << o.ack.start_offset << " in another writer's slot";
  settle_on_close_ = false;
}

TEST_F(EngineTest, AnUnreadableObjectAtTheHaltedKeyFailsTheAppendsInIt) {
  // The fence cannot walk past it: the halt fails what it cannot
  // acknowledge instead of retrying the fence for ever.
  auto gated = std::make_shared<testing::GatedStore>(store_);
  engine_->Close();
  engine_.reset();
  Start(gated);
  ASSERT_TRUE(engine_);
  std::promise<AppendOutcome> pending;
  const std::string slot0 = AppendHeldAtSlotZero(*gated, &pending);
  ASSERT_OK(store_->Put(slot0, std::string(200, 'x')));
  gated->Open(slot0);
  auto future = pending.get_future();
  ASSERT_EQ(future.wait_for(60s), std::future_status::ready) << "the append was left waiting";
  auto o = future.get();
  EXPECT_EQ(o.status.code(), Code::kUnavailable) << o.status.ToString();  // it may have landed
  // Nothing more is taken.
  EXPECT_FALSE(engine_->Append(kBasin, "s", Bodies({"later"})).status.ok());
  settle_on_close_ = false;
}

// A store whose deletes of the keys in `refused` fail and delete nothing.
// `refused` is set before the store is used.
class RefusedDeletesStore : public testing::GatedStore {
 public:
  using GatedStore::GatedStore;
  std::set<std::string> refused;
  Status Delete(std::string_view key) override {
    if (refused.count(std::string(key)) != 0) return Unavailable("delete refused");
    return GatedStore::Delete(key);
  }
  Status DeleteMany(std::span<const std::string> keys) override {
    for (const auto& k : keys) {
      if (refused.count(k) != 0) return Unavailable("delete refused");
    }
    return GatedStore::DeleteMany(keys);
  }
};

// HandleHalt's garbage probe, and what a restart replays after a resume.
// Slot 0 of epoch E lands; slot 1's PUT is held while slots 2..4 land behind
// it; someone fences E (slot 1 is missing: poisoned, cut 1); the held PUT
// meets the poison and the chain halts at 1. While the halt is handled (just
// before its mint) one more append is pooled. The halt deletes slots 2..4
// (they landed past the cut: garbage), keeps the poison, and re-publishes
// the appends of slots 1..4 and the pooled one into E+1 from seq 0. A restart
// with nothing settled replays E up to its poison, then E+1 from seq 0: each
// append exactly once, at the offset it was acknowledged with.
class HaltPastACutTest : public EngineTest {
 protected:
  // Runs the halt over `gated` (the engine restarts on it), then appends g;
  // *epoch is E. Every append must be acknowledged at its offset.
  void HaltAndResume(std::shared_ptr<testing::GatedStore> gated, uint64_t* epoch_out) {
    settle_on_close_ = false;  // the restart replays everything from the WAL
    auto hooked = RestartHooked(gated);
    ASSERT_TRUE(engine_);
    const uint64_t epoch = engine_->epoch();
    *epoch_out = epoch;
    auto a = engine_->Append(kBasin, "s", Bodies({"a"}));  // slot 0
    ASSERT_TRUE(a.status.ok()) << a.status.ToString();
    ASSERT_EQ(a.ack.start_offset, 0u);
    ASSERT_TRUE(store_->Head(Key(epoch, 0)).ok());
    const std::vector<std::string> values = {"b", "c", "d", "e", "f"};
    std::vector<std::promise<AppendOutcome>> outcomes(values.size());
    auto append = [&](size_t i) {
      engine_->AppendAsync(kBasin, "s", Bodies({values[i]}), {},
                           [&outcomes, i](AppendOutcome o) { outcomes[i].set_value(std::move(o)); });
    };
    gated->Gate(Key(epoch, 1));
    std::shared_ptr<void> open_gate(nullptr, [&](void*) { gated->Open(Key(epoch, 1)); });
    append(0);
    ASSERT_TRUE(gated->WaitBlocked(Key(epoch, 1)));
    // c, d and e each ride a slot of their own (each is appended once the one
    // before has landed), which lands behind the held slot 1.
    for (size_t i = 1; i <= 3; ++i) {
      append(i);
      const std::string k = Key(epoch, i + 1);
      for (int t = 0; t < 6000 && !store_->Head(k).ok(); ++t) std::this_thread::sleep_for(10ms);
      ASSERT_TRUE(store_->Head(k).ok()) << k;
    }
    auto fence = wal::Fence(*store_, wal::ChainRef{"n1", epoch}, 0, 4242);
    ASSERT_TRUE(fence.ok()) << fence.status().ToString();
    ASSERT_EQ(fence->cut, 1u);
    hooked->before_mint = [&] { append(4); };  // pooled while the writer is halted
    gated->Open(Key(epoch, 1));
    for (size_t i = 0; i < values.size(); ++i) {
      auto future = outcomes[i].get_future();
      ASSERT_EQ(future.wait_for(60s), std::future_status::ready) << values[i] << " was left waiting";
      AppendOutcome o = future.get();
      ASSERT_TRUE(o.status.ok()) << values[i] << ": " << o.status.ToString();
      EXPECT_EQ(o.ack.start_offset, i + 1) << values[i];
    }
    hooked->before_mint = nullptr;
    EXPECT_EQ(engine_->epoch(), epoch + 1);
    // The committed slot and the poison stay.
    EXPECT_TRUE(store_->Head(Key(epoch, 0)).ok());
    auto poison = store_->Head(Key(epoch, 1));
    ASSERT_TRUE(poison.ok()) << poison.status().ToString();
    EXPECT_EQ(poison->size, wal::kEnvelopeSize) << "slot 1 should hold the poison";
    EXPECT_TRUE(store_->Head(Key(epoch + 1, 0)).ok()) << "re-published from seq 0 of the next epoch";
    auto g = engine_->Append(kBasin, "s", Bodies({"g"}));
    ASSERT_TRUE(g.status.ok()) << g.status.ToString();
    EXPECT_EQ(g.ack.start_offset, 6u);
    EXPECT_EQ(ReadAll("s"), kWant);
  }

  // A restart (nothing settled) reads each append once, at its offset.
  void RestartReadsEachAppendOnce() {
    Restart();
    ASSERT_TRUE(engine_);
    EXPECT_EQ(CountKeys(*store_, "seg/"), 0u) << "nothing was to be settled: the restart replays the WAL";
    auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tail, kWant.size());
    ASSERT_EQ(r->records.size(), kWant.size());
    for (size_t i = 0; i < kWant.size(); ++i) {
      EXPECT_EQ(r->records[i].offset, i);
      EXPECT_EQ(r->records[i].record.value.value_or("<null>"), kWant[i]) << "offset " << i;
    }
    EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), kWant.size());
  }

  static std::string Key(uint64_t epoch, uint64_t seq) { return wal::SlotKey("n1", epoch, seq); }
  const std::vector<std::string> kWant = {"a", "b", "c", "d", "e", "f", "g"};
};

TEST_F(HaltPastACutTest, AHaltDeletesTheSlotsPastItsCutAndARestartReplaysEachAppendOnce) {
  uint64_t epoch = 0;
  HaltAndResume(std::make_shared<testing::GatedStore>(store_), &epoch);
  if (HasFatalFailure()) return;
  for (uint64_t seq = 2; seq <= 4; ++seq) {
    EXPECT_EQ(store_->Head(Key(epoch, seq)).status().code(), Code::kNotFound)
        << "slot " << seq << " landed past the cut and is garbage";
  }
  RestartReadsEachAppendOnce();
}

// The same when the halt could not delete the garbage (its deletes failed):
// slots 2..4 of E stay beside their appends' copies in E+1, and a restart
// (and another after it) still replays each append once.
TEST_F(HaltPastACutTest, GarbageTheHaltCouldNotDeleteIsNotReplayed) {
  const uint64_t next_epoch = engine_->epoch() + 1;  // RestartHooked mints it
  auto refusing = std::make_shared<RefusedDeletesStore>(store_);
  for (uint64_t seq = 2; seq <= 4; ++seq) refusing->refused.insert(Key(next_epoch, seq));
  uint64_t epoch = 0;
  HaltAndResume(refusing, &epoch);
  if (HasFatalFailure()) return;
  ASSERT_EQ(epoch, next_epoch);
  for (uint64_t seq = 2; seq <= 4; ++seq) {
    EXPECT_TRUE(store_->Head(Key(epoch, seq)).ok()) << "slot " << seq << " should still be there";
  }
  RestartReadsEachAppendOnce();
  if (HasFatalFailure()) return;
  RestartReadsEachAppendOnce();
}

// The superseded path with a slot below the halt still uploading: slot 0
// landed but its PUT has not returned when a successor starts (its walk
// finds slot 0 and poisons slot 1). Slot 1's PUT meets the poison; the halt
// finds the node superseded and abandons from slot 1, which marks slot 0
// durable: its append is acknowledged while its PUT is still held (the
// successor replayed it), slot 1's fails. The successor, and a restart after
// both, read exactly the acknowledged append.
TEST_F(EngineTest, ASupersededHaltAcknowledgesALandedSlotBelowItWhosePutIsStillHeld) {
  settle_on_close_ = false;  // the last restart replays the WAL
  auto gated = RestartGated();
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  const std::string s0 = wal::SlotKey("n1", epoch, 0), s1 = wal::SlotKey("n1", epoch, 1);
  gated->Gate(s0, /*after_apply=*/true);
  gated->Gate(s1);
  std::shared_ptr<void> open_gates(nullptr, [&](void*) {
    gated->Open(s0);
    gated->Open(s1);
  });
  std::promise<AppendOutcome> first, second;
  engine_->AppendAsync(kBasin, "s", Bodies({"a"}), {}, [&](AppendOutcome o) { first.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(s0));
  ASSERT_TRUE(store_->Head(s0).ok());  // landed; the PUT has not returned
  engine_->AppendAsync(kBasin, "s", Bodies({"b"}), {}, [&](AppendOutcome o) { second.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(s1));
  auto next = Engine::Open(Options(), store_, meta_);  // mints E+1, replays slot 0, poisons slot 1
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  auto poison = store_->Head(s1);
  ASSERT_TRUE(poison.ok());
  ASSERT_EQ(poison->size, wal::kEnvelopeSize);
  gated->Open(s1);
  auto f2 = second.get_future();
  ASSERT_EQ(f2.wait_for(60s), std::future_status::ready) << "the halt was not handled";
  AppendOutcome o2 = f2.get();
  EXPECT_EQ(o2.status.code(), Code::kFenced) << o2.status.ToString();
  // Slot 0's acknowledgement goes out before slot 1's failure.
  auto f1 = first.get_future();
  ASSERT_EQ(f1.wait_for(0s), std::future_status::ready) << "slot 0 (below the cut) was not acknowledged";
  AppendOutcome o1 = f1.get();
  ASSERT_TRUE(o1.status.ok()) << o1.status.ToString();
  EXPECT_EQ(o1.ack.start_offset, 0u);
  EXPECT_TRUE(gated->WaitBlocked(s0, 0s)) << "slot 0's PUT is still held";
  EXPECT_TRUE(engine_->superseded());
  EXPECT_EQ(engine_->epoch(), epoch);
  auto r = (*next)->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].offset, 0u);
  EXPECT_EQ(r->records[0].record.value, "a");
  gated->Open(s0);
  engine_->Close();
  engine_.reset();
  (*next)->Close();
  next->reset();
  Start();
  ASSERT_TRUE(engine_);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 1u);
}

// Slot `garbled`'s first PUT lands and answers an error (the answer was
// lost), and ranged reads of it (every one, or the first `reads`) answer
// bytes that are no envelope (a proxy's page): the writer's retry meets 412,
// cannot read the envelope, and halts the chain there (as at another
// writer's slot).
class UnreadableSlotStore : public testing::GatedStore {
 public:
  using GatedStore::GatedStore;
  void Garble(std::string key, int reads = std::numeric_limits<int>::max()) {
    std::lock_guard lk(mu_);
    garbled_ = std::move(key);
    garbled_reads_left_ = reads;
  }
  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& o = {}) override {
    Status st = GatedStore::Put(key, data, o);
    if (st.ok() && IsGarbled(key) && !lost_.exchange(true)) return Unavailable("the answer was lost");
    return st;
  }
  Result<std::string> Get(std::string_view key, std::optional<objstore::ByteRange> r = std::nullopt) override {
    if (r && IsGarbled(key) && TakeGarbledRead()) return std::string("<html>502 Bad Gateway</html>");
    return GatedStore::Get(key, r);
  }

 private:
  bool IsGarbled(std::string_view key) {
    std::lock_guard lk(mu_);
    return !garbled_.empty() && key == garbled_;
  }
  bool TakeGarbledRead() {
    std::lock_guard lk(mu_);
    if (garbled_reads_left_ == 0) return false;
    --garbled_reads_left_;
    return true;
  }
  std::mutex mu_;
  std::string garbled_;
  int garbled_reads_left_ = 0;
  std::atomic<bool> lost_{false};
};

// The superseded path with a slot below the halt that has NOT landed: slot
// 0's PUT is held before it reaches the store while slot 1 halts the chain
// at an occupant that is no poison (another writer's flight; or our own
// slot, landed with its answer lost, whose envelope reads back garbled). A
// successor mints and fences before the halt's mint: its walk finds slot 0
// missing, so it poisons slot 0 and never replays it. Slot 0's append must
// then not be acknowledged: nothing holds it.
class SupersededHaltTest : public EngineTest, public ::testing::WithParamInterface<bool> {};

// The superseded path used to abandon from the writer's halted slot, taking
// every slot below it for committed, which holds only when the halt met the
// successor's poison: here it acknowledged "a" at offset 0, which neither
// the successor nor any restart has. Now each slot not yet released is read.
TEST_P(SupersededHaltTest, NoAppendOfASlotBelowTheHaltThatNeverLandedIsAcknowledged) {
  const bool foreign = GetParam();
  settle_on_close_ = false;  // the last restart replays the WAL
  auto gated = std::make_shared<UnreadableSlotStore>(store_);
  auto hooked = RestartHooked(gated);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  const std::string s0 = wal::SlotKey("n1", epoch, 0), s1 = wal::SlotKey("n1", epoch, 1);
  gated->Gate(s0);
  std::shared_ptr<void> open_gate(nullptr, [&](void*) { gated->Open(s0); });
  std::promise<AppendOutcome> first, second;
  engine_->AppendAsync(kBasin, "s", Bodies({"a"}), {}, [&](AppendOutcome o) { first.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(s0));
  if (foreign) {
    wal::SlotBuilder other;
    ASSERT_OK(store_->Put(s1, other.Finish(epoch, 1, 4242)));
  } else {
    gated->Garble(s1);
  }
  // The successor starts just before the halt's mint.
  std::unique_ptr<Engine> next;
  hooked->before_mint = [&] {
    auto e = Engine::Open(Options(), store_, meta_);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (e.ok()) next = std::move(*e);
  };
  engine_->AppendAsync(kBasin, "s", Bodies({"b"}), {}, [&](AppendOutcome o) { second.set_value(std::move(o)); });
  auto f2 = second.get_future();
  ASSERT_EQ(f2.wait_for(60s), std::future_status::ready) << "the halt was not handled";
  AppendOutcome o2 = f2.get();
  EXPECT_EQ(o2.status.code(), Code::kFenced) << o2.status.ToString();
  ASSERT_TRUE(next);
  EXPECT_TRUE(engine_->superseded());
  auto poison = store_->Head(s0);
  ASSERT_TRUE(poison.ok()) << poison.status().ToString();
  EXPECT_EQ(poison->size, wal::kEnvelopeSize) << "the successor poisoned slot 0";
  gated->Open(s0);  // its PUT meets the poison
  auto f1 = first.get_future();
  ASSERT_EQ(f1.wait_for(60s), std::future_status::ready);
  AppendOutcome o1 = f1.get();
  auto r = next->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->records.empty());
  EXPECT_FALSE(o1.status.ok()) << "\"a\" was acknowledged at offset " << o1.ack.start_offset
                               << ", but its slot holds the successor's poison";
  engine_->Close();
  engine_.reset();
  next->Close();
  next.reset();
  Start();
  ASSERT_TRUE(engine_);
  EXPECT_EQ(ReadAll("s"), std::vector<std::string>{});
}

// Our own slot whose PUT landed with its answer lost and whose envelope then
// read back garbled until the writer halted, and reads fine at the fence:
// the fence walks past it. It used to be taken for another writer's slot, so
// the appends in it (committed: every restart replays them) were failed as
// corrupt, and the writer took no more appends. Now the slot is read back as
// ours, acknowledged, and the writer resumes past it.
TEST_F(EngineTest, AHaltAtOurOwnSlotThatReadBackGarbledResumesPastIt) {
  settle_on_close_ = false;  // the restart replays the WAL
  auto garbling = std::make_shared<UnreadableSlotStore>(store_);
  engine_->Close();
  engine_.reset();
  Start(garbling);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  garbling->Garble(wal::SlotKey("n1", epoch, 0), wal::Writer::kUnreadableEnvelopeReads);
  AppendOutcome a = engine_->Append(kBasin, "s", Bodies({"a"}), {});
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.ack.start_offset, 0u);
  EXPECT_GT(engine_->epoch(), epoch) << "the halt was handled in a new epoch";
  AppendOutcome b = engine_->Append(kBasin, "s", Bodies({"b"}), {});
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_EQ(b.ack.start_offset, 1u);
  Restart();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
}

// The same slot when a successor holds the node by the time the halt is
// handled: the successor's walk takes our slot (a flight, with none missing
// below it), so its append was failed as "not written" (Fenced) though every
// later owner replays it. Now the slot is read back as ours and acknowledged.
TEST_F(EngineTest, ASupersededHaltAtOurOwnLandedSlotIsAcknowledged) {
  settle_on_close_ = false;
  auto garbling = std::make_shared<UnreadableSlotStore>(store_);
  auto hooked = RestartHooked(garbling);
  ASSERT_TRUE(engine_);
  const uint64_t epoch = engine_->epoch();
  garbling->Garble(wal::SlotKey("n1", epoch, 0), wal::Writer::kUnreadableEnvelopeReads);
  std::unique_ptr<Engine> next;
  hooked->before_mint = [&] {
    auto e = Engine::Open(Options(), store_, meta_);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (e.ok()) next = std::move(*e);
  };
  AppendOutcome a = engine_->Append(kBasin, "s", Bodies({"a"}), {});
  ASSERT_TRUE(next);
  EXPECT_TRUE(engine_->superseded());
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.ack.start_offset, 0u);
  AppendOutcome b = engine_->Append(kBasin, "s", Bodies({"b"}), {});
  EXPECT_EQ(b.status.code(), Code::kFenced) << b.status.ToString();
  engine_->Close();
  engine_.reset();
  auto r = next->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u) << "the successor replays our slot";
  EXPECT_EQ(r->records[0].record.value, "a");
  next->Close();
  next.reset();
}

INSTANTIATE_TEST_SUITE_P(ForeignOrUnreadable, SupersededHaltTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "AnotherWritersFlight" : "AnUnreadableEnvelope";
                         });

TEST_F(EngineTest, ASettleCommitThatLandedUnseenIsRecognised) {
  // The metastore applies a settle commit but answers a failure: its answer
  // was lost (a timeout), or its COMMIT's fsync failed (SQLite replays it at
  // the next open). Settle reads the checkpoint back, counts the round as
  // done, and never deletes the segment the metastore now names.
  for (Status failure : {Timeout("the answer was lost"), IOError("fsync failed")}) {
    SCOPED_TRACE(failure.ToString());
    auto hooked = RestartHooked();
    ASSERT_TRUE(engine_);
    ASSERT_TRUE(engine_->CreateStream(kBasin, "landed", StreamConfig{}).ok());
    ASSERT_TRUE(engine_->Append(kBasin, "landed", Bodies({"a", "b"})).status.ok());
    const uint64_t cycles = engine_->metrics().settle_cycles.load();
    std::atomic<int> lost{1};
    hooked->after_commit_settle = [&](Status st) { return st.ok() && lost.fetch_sub(1) > 0 ? failure : st; };
    EXPECT_TRUE(engine_->SettleNow().ok());
    ASSERT_TRUE(engine_->Append(kBasin, "landed", Bodies({"c"})).status.ok());
    EXPECT_TRUE(engine_->SettleNow().ok());  // the next round expects the new checkpoint
    EXPECT_EQ(engine_->metrics().settle_cycles.load() - cycles, 2u);
    settle_on_close_ = false;
    Restart();
    EXPECT_EQ(ReadAll("landed"), (std::vector<std::string>{"a", "b", "c"}));
    ASSERT_TRUE(engine_->DeleteStream(kBasin, "landed").ok());
  }
}

TEST_F(EngineTest, AStartLoadsEveryStreamWithAFewPagedReadsNotARoundTripPerStream) {
  // Streams with several segments each, one with none, one deleted: the
  // start reads rows and segments a page at a time, across streams.
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) {
    names.push_back("many-" + std::to_string(i));
    ASSERT_TRUE(engine_->CreateStream(kBasin, names.back(), StreamConfig{}).ok());
  }
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 1; i < names.size(); ++i) {
      ASSERT_TRUE(engine_->Append(kBasin, names[i], Bodies({names[i] + "." + std::to_string(round)})).status.ok());
    }
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  ASSERT_TRUE(engine_->DeleteStream(kBasin, names[5]).ok());
  ASSERT_TRUE(engine_->Append(kBasin, names[7], Bodies({"unsettled"})).status.ok());  // replayed from the WAL
  settle_on_close_ = false;
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  EXPECT_EQ(hooked->get_stream_by_id_calls.load(), 0);
  EXPECT_EQ(hooked->find_segments_calls.load(), 0);
  EXPECT_EQ(hooked->list_streams_by_id_calls.load(), 1);
  EXPECT_EQ(hooked->list_segments_calls.load(), 1);
  EXPECT_EQ(hooked->list_stream_states_calls.load(), 1);
  auto check = [&] {
    EXPECT_TRUE(ReadAll(names[0]).empty());
    EXPECT_EQ(engine_->GetStream(kBasin, names[5]).status().code(), Code::kNotFound);
    for (size_t i = 1; i < names.size(); ++i) {
      if (i == 5) continue;
      std::vector<std::string> want;
      for (int round = 0; round < 3; ++round) want.push_back(names[i] + "." + std::to_string(round));
      if (i == 7) want.push_back("unsettled");
      EXPECT_EQ(ReadAll(names[i]), want) << names[i];
    }
  };
  check();
  // Pages of 2 streams and 3 segments: every boundary falls inside a
  // stream's segments or between streams, and all is found once.
  ASSERT_TRUE(engine_->SettleNow().ok());
  load_page_streams_ = 2;
  load_page_segments_ = 3;
  hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  // 12 rows (the fixture's "s" too): 6 full pages, then an empty one.
  EXPECT_EQ(hooked->list_streams_by_id_calls.load(), 7);
  EXPECT_EQ(hooked->list_stream_states_calls.load(), 7);
  EXPECT_EQ(hooked->list_segments_calls.load(), 11);       // 31 segments (10 x 3, and 1): 11 pages
  check();
}

TEST_F(EngineTest, ASettleCommitThatFailedOnIoAndDidNotLandKeepsItsSegments) {
  // Not landed as this process sees it, but SQLite may replay it at the next
  // open: the segments stay, and the next round commits them.
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  std::atomic<int> failing{1};
  hooked->fail_commit_settle = [&] { return failing.fetch_sub(1) > 0 ? IOError("fsync failed") : Status::Ok(); };
  EXPECT_FALSE(engine_->SettleNow().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u) << "a segment the metastore may name was deleted";
  EXPECT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
}

// Segment objects written for stream `name` of kBasin.
size_t SegmentObjects(metastore::Metastore& meta, objstore::ObjectStore& store, const std::string& name) {
  auto info = meta.GetStream(kBasin, name);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  return info.ok() ? CountKeys(store, fmt::format("seg/{:020}/", info->id)) : 0;
}

TEST_F(EngineTest, ABackgroundRoundLeavesSmallStreamsToGatherAndAStartReplaysThem) {
  settle_on_close_ = false;  // restarts replay the WAL
  // The big stream holds settle_min_bytes and settles; the small one waits,
  // keeping the checkpoint (and the WAL slots from there) where its first
  // batch is. A start replays those slots: the small stream's records come
  // back, the big stream's settled ones are not applied twice.
  settle_min_bytes_ = 4096;
  settle_max_delay_ = std::chrono::hours(1);
  Restart();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "big", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "small", StreamConfig{}).ok());
  const std::string kilo(1000, 'k');
  std::vector<std::string> big;
  ASSERT_TRUE(engine_->Append(kBasin, "small", Bodies({"s1"})).status.ok());
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 5; ++i) {
      big.push_back(fmt::format("{}-{}-{}", round, i, kilo));
      ASSERT_TRUE(engine_->Append(kBasin, "big", Bodies({big.back()})).status.ok());
    }
    ASSERT_TRUE(engine_->Append(kBasin, "small", Bodies({fmt::format("s{}", round + 2)})).status.ok());
    ASSERT_TRUE(engine_->SettleDue().ok());
    EXPECT_EQ(SegmentObjects(*meta_, *store_, "big"), static_cast<size_t>(round + 1));
    EXPECT_EQ(SegmentObjects(*meta_, *store_, "small"), 0u);
    EXPECT_EQ(engine_->metrics().settle_waiting_streams.load(), 1u);
  }
  // The checkpoint stayed at the small stream's first slot: its slots, and
  // every later one, are still there.
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->checkpoint, (metastore::ChainPosition{engine_->epoch(), 0}));
  EXPECT_GE(CountKeys(*store_, "wal/n1/"), 13u);
  EXPECT_EQ(ReadAll("small"), (std::vector<std::string>{"s1", "s2", "s3"}));

  Restart();
  EXPECT_EQ(ReadAll("small"), (std::vector<std::string>{"s1", "s2", "s3"}));
  EXPECT_EQ(ReadAll("big"), big);
  // What a start replayed was acknowledged before it, for how long is not
  // known: the first round settles it. Then the slots go.
  ASSERT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "small"), 1u);
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "big"), 2u);
  EXPECT_EQ(engine_->unsettled_bytes(), 0u);
  Restart();
  EXPECT_EQ(ReadAll("small"), (std::vector<std::string>{"s1", "s2", "s3"}));
  EXPECT_EQ(ReadAll("big"), big);
}

TEST_F(EngineTest, AHaltWalksItsEpochFromTheReleasedSlotNotFromAFarCheckpoint) {
  settle_on_close_ = false;  // restarts replay the WAL
  // Sixty acknowledged slots wait to settle, so the checkpoint stays at the
  // first. A halt (another writer's object at our next slot) fences its
  // epoch from the released position: a GET or so, not one per waiting slot.
  settle_max_delay_ = std::chrono::hours(1);
  auto counted = RestartCounted();
  ASSERT_TRUE(engine_);
  std::vector<std::string> want;
  for (int i = 0; i < 60; ++i) {
    want.push_back(std::to_string(i));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({want.back()})).status.ok());
  }
  ASSERT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(engine_->metrics().settle_waiting_streams.load(), 1u);
  const uint64_t epoch = engine_->epoch();
  ASSERT_TRUE(wal::Fence(*store_, wal::ChainRef{"n1", epoch}, 60, 4242).ok());  // poisons slot 60
  const uint64_t gets = counted->counters().gets.load();
  want.push_back("after the halt");
  auto o = engine_->Append(kBasin, "s", Bodies({want.back()}));
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(engine_->epoch(), epoch + 1);
  EXPECT_LT(counted->counters().gets.load() - gets, 40u) << "the halt walked the slots below the released one";
  EXPECT_EQ(ReadAll("s"), want);
  Restart();
  EXPECT_EQ(ReadAll("s"), want);
}

TEST_F(EngineTest, CreatesPastMaxStreamsAreRefusedAndChangeNothing) {
  // "s" is one; streams, tables' buckets and added buckets all count, and a
  // refused create leaves nothing behind. Streams stored always load.
  max_streams_ = 4;
  Restart();
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(engine_->CreateStream(kBasin, name, StreamConfig{}).ok());
  auto refused = engine_->CreateStream(kBasin, "d", StreamConfig{});
  EXPECT_EQ(refused.status().code(), Code::kQuotaExhausted) << refused.status().ToString();
  EXPECT_FALSE(refused.status().retryable());
  EXPECT_EQ(meta_->GetStream(kBasin, "d").status().code(), Code::kNotFound);
  EXPECT_EQ(CreateTable("t", 1, StreamConfig{}).code(), Code::kQuotaExhausted);
  EXPECT_EQ(meta_->GetTable(kBasin, "t").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->CheckStreamRoom(1, "one more").code(), Code::kQuotaExhausted);
  EXPECT_EQ(engine_->metrics().stream_creates_refused.load(), 2u);  // a check is no create
  // A name that exists needs no room: its create is kAlreadyExists, as
  // below the limit (a request token's retry is answered as a success).
  EXPECT_EQ(engine_->CreateStream(kBasin, "a", StreamConfig{}).status().code(), Code::kAlreadyExists);

  ASSERT_TRUE(engine_->DeleteStream(kBasin, "a").ok());
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "b").ok());
  EXPECT_TRUE(engine_->CheckStreamRoom(2, "two more").ok());
  EXPECT_EQ(CreateTable("t", 3, StreamConfig{}).code(), Code::kQuotaExhausted);
  ASSERT_TRUE(CreateTable("t", 1, StreamConfig{}).ok());
  EXPECT_TRUE(engine_->CheckStreamRoom(1, "one more").ok());
  EXPECT_EQ(engine_->AddTableBuckets(kBasin, "t", 3).status().code(), Code::kQuotaExhausted);
  auto table = meta_->GetTable(kBasin, "t");
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->bucket_count, 1u);
  ASSERT_TRUE(engine_->AddTableBuckets(kBasin, "t", 2).ok());
  EXPECT_EQ(engine_->stream_count(), 4u);
  EXPECT_EQ(CreateTable("t", 1, StreamConfig{}).code(), Code::kAlreadyExists);
  ASSERT_TRUE(engine_->Append(kBasin, "c", Bodies({"kept"})).status.ok());

  max_streams_ = 2;
  Restart();
  EXPECT_EQ(engine_->stream_count(), 4u);
  EXPECT_EQ(ReadAll("c"), (std::vector<std::string>{"kept"}));
  EXPECT_EQ(engine_->CreateStream(kBasin, "e", StreamConfig{}).status().code(), Code::kQuotaExhausted);
}

TEST_F(EngineTest, AWaitingStreamSettlesOnceItsOldestRecordIsOld) {
  settle_max_delay_ = std::chrono::milliseconds(50);
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(engine_->SettleDue().ok());
  // Unless this thread slept 50 ms since the append, "a" waits; either way it
  // settles once 50 ms have passed.
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  ASSERT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "s"), 1u);
  EXPECT_EQ(engine_->metrics().settle_waiting_streams.load(), 0u);
  EXPECT_EQ(engine_->unsettled_bytes(), 0u);
}

TEST_F(EngineTest, ALogCacheOverAQuarterFullSettlesTheStreamsCachingMost) {
  settle_on_close_ = false;  // restarts replay the WAL
  // 64 KiB of cache: over 16 KiB cached, the streams caching most settle
  // until those left cache at most 8 KiB.
  cache_bytes_ = 64 << 10;
  settle_max_delay_ = std::chrono::hours(1);
  Restart();
  const std::string kilo(1000, 'k');
  for (const char* name : {"most", "more", "less"}) ASSERT_TRUE(engine_->CreateStream(kBasin, name, StreamConfig{}).ok());
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(engine_->Append(kBasin, "most", Bodies({kilo})).status.ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(engine_->Append(kBasin, "more", Bodies({kilo})).status.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Append(kBasin, "less", Bodies({kilo})).status.ok());
  ASSERT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "most"), 1u);
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "more"), 1u);
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "less"), 0u);
  EXPECT_EQ(engine_->metrics().settle_waiting_streams.load(), 1u);
  // Under a quarter: the rest waits.
  ASSERT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "less"), 0u);
  Restart();
  EXPECT_EQ(ReadAll("less").size(), 3u);
  EXPECT_EQ(ReadAll("more").size(), 6u);
  EXPECT_EQ(ReadAll("most").size(), 12u);
}

TEST_F(EngineTest, AnAmbiguousSettleCommitThatLeftTheCheckpointIsToldByItsSegments) {
  settle_on_close_ = false;  // restarts replay the WAL
  // A round whose checkpoint stays (a stream waits at it) cannot be told
  // landed by the checkpoint: its segments tell. Landed with the answer
  // lost: the round counts, the next one goes on. Not landed (a failure
  // before the commit, as the process sees an I/O error): the round fails,
  // its batches stay, and the next round settles them.
  settle_min_bytes_ = 4096;
  settle_max_delay_ = std::chrono::hours(1);
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->CreateStream(kBasin, "big", StreamConfig{}).ok());
  const std::string kilo(1000, 'k');
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"waits"})).status.ok());
  std::vector<std::string> big;
  auto append_big = [&] {
    for (int i = 0; i < 5; ++i) {
      big.push_back(fmt::format("{}-{}", big.size(), kilo));
      ASSERT_TRUE(engine_->Append(kBasin, "big", Bodies({big.back()})).status.ok());
    }
  };
  append_big();
  std::atomic<int> lost{1};
  hooked->after_commit_settle = [&](Status st) { return st.ok() && lost.fetch_sub(1) > 0 ? Timeout("lost") : st; };
  EXPECT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "big"), 1u);
  append_big();
  std::atomic<int> failing{1};
  hooked->fail_commit_settle = [&] { return failing.fetch_sub(1) > 0 ? IOError("fsync failed") : Status::Ok(); };
  EXPECT_FALSE(engine_->SettleDue().ok());
  EXPECT_EQ(failing.load(), 0);
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "big"), 2u) << "a segment the metastore may name was deleted";
  EXPECT_EQ(ReadAll("big"), big);
  EXPECT_TRUE(engine_->SettleDue().ok());
  append_big();
  EXPECT_TRUE(engine_->SettleDue().ok());
  EXPECT_EQ(SegmentObjects(*meta_, *store_, "big"), 3u);
  Restart();
  EXPECT_EQ(ReadAll("big"), big);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"waits"}));
}

TEST_F(EngineTest, ASettleRoundBetweenADeleteAndItsForgetLeavesNoSegmentObject) {
  // The round commits after the metastore's delete (its rows are skipped)
  // but before the engine forgets the stream: the segment it wrote is in
  // memory only, and the delete removes it too.
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->CreateStream(kBasin, "gone", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "gone", Bodies({"a", "b"})).status.ok());
  int settled_between = 0;
  const auto settle_between = [&] {
    const uint64_t written = engine_->metrics().segments_written.load();
    EXPECT_TRUE(engine_->SettleNow().ok());
    if (engine_->metrics().segments_written.load() > written) settled_between++;
  };
  hooked->after_delete_stream = settle_between;
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "gone").ok());
  EXPECT_EQ(settled_between, 1) << "no segment was written between the delete and the forget";
  EXPECT_EQ(CountKeys(*store_, "seg/"), 0u) << "a segment no row names was left behind";

  metastore::TableInfo t;
  t.basin = kBasin;
  t.name = "dropped";
  t.bucket_count = 2;
  t.config = "{}";
  ASSERT_TRUE(engine_->CreateTable(t, StreamConfig{}).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "dropped/0", Bodies({"x"})).status.ok());
  ASSERT_TRUE(engine_->Append(kBasin, "dropped/1", Bodies({"y"})).status.ok());
  settled_between = 0;
  hooked->after_delete_stream = settle_between;
  ASSERT_TRUE(engine_->DeleteTable(kBasin, "dropped").ok());
  EXPECT_GE(settled_between, 1) << "no segment was written between the delete and the forget";
  EXPECT_EQ(CountKeys(*store_, "seg/"), 0u) << "a segment no row names was left behind";
  EXPECT_EQ(engine_->GetStream(kBasin, "dropped/0").status().code(), Code::kNotFound);
}

TEST_F(EngineTest, ATakeoverLeavesItsPredecessorNoStreamToCreateWhileItStarts) {
  // The old process of n1 keeps serving while a new one starts: after the new
  // one has minted its epoch and listed the streams, and before its fence,
  // the old one is asked to create a stream and append to it. The create is
  // refused (retryable): a stream made then would be one the new process
  // never loaded, its appends acknowledged by nobody who serves it.
  auto hooked = std::make_shared<testing::HookedMetastore>(meta_);
  bool hooked_ran = false;
  hooked->after_list_stream_states = [&] {
    hooked_ran = true;
    EXPECT_EQ(engine_->CreateStream(kBasin, "born-late", StreamConfig{}).status().code(), Code::kUnavailable);
    EXPECT_FALSE(engine_->Append(kBasin, "born-late", Bodies({"lost"})).status.ok());
  };
  auto next = Engine::Open(Options(), store_, hooked);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(hooked_ran) << "the start listed no stream states";
  EXPECT_EQ(meta_->GetStream(kBasin, "born-late").status().code(), Code::kNotFound);
  // Created through the new process, it is there at once.
  ASSERT_TRUE((*next)->CreateStream(kBasin, "born-late", StreamConfig{}).ok());
  ASSERT_TRUE((*next)->Append(kBasin, "born-late", Bodies({"kept"})).status.ok());
  auto r = (*next)->Read(kBasin, "born-late", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].record.value, "kept");
  (*next)->Close();
}

TEST_F(EngineTest, ASegmentOfAStreamDeletedDuringItsSettleIsDeleted) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->CreateStream(kBasin, "doomed", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "doomed", Bodies({"a"})).status.ok());
  // The round has written the segment; the stream goes before the commit.
  hooked->before_commit_settle = [&] { ASSERT_TRUE(engine_->DeleteStream(kBasin, "doomed").ok()); };
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 0u);
}

TEST_F(EngineTest, ATakeoverFencesAPredecessorThatSettlesWhileItStarts) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  // The old process of node n1 keeps running while a new one starts, and
  // settles (moving the checkpoint, deleting the slots below it) between the
  // new one's first look at the node and its mint.
  auto hooked = std::make_shared<testing::HookedMetastore>(meta_);
  hooked->before_mint = [&] {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"b"})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  };
  auto next = Engine::Open(Options(), store_, hooked);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  // The old process is fenced: what it appends now is never acknowledged.
  auto late = engine_->Append(kBasin, "s", Bodies({"c"}));
  EXPECT_FALSE(late.status.ok()) << "acknowledged by a superseded node at offset " << late.ack.start_offset;
  EXPECT_FALSE(late.producer_fenced) << late.status.ToString();  // a retryable failure, not the producer's
  auto r = (*next)->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> got;
  for (auto& rec : r->records) got.push_back(rec.record.value.value_or("<null>"));
  EXPECT_EQ(got, (std::vector<std::string>{"a", "b"}));
  (*next)->Close();
}

TEST_F(EngineTest, ASupersededNodeHaltsWithoutTouchingItsSuccessorsSlots) {
  for (const char* v : {"a", "b", "c"}) ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({v})).status.ok());
  const uint64_t epoch = engine_->epoch();
  auto next = Engine::Open(Options(), store_, meta_);  // fences our epoch after slot 2
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  // The successor's first settle round took slot 0 alone and deleted it;
  // slots 1 and 2 wait for its next round.
  ASSERT_TRUE(store_->Delete(wal::SlotKey("n1", epoch, 0)).ok());
  // The old process's next slot finds the successor's poison and halts.
  auto late = engine_->Append(kBasin, "s", Bodies({"late"}));
  EXPECT_FALSE(late.status.ok()) << "acknowledged by a superseded node at offset " << late.ack.start_offset;
  // It neither poisons below its successor's poison nor deletes the slots
  // its successor still has to settle.
  EXPECT_EQ(store_->Head(wal::SlotKey("n1", epoch, 0)).status().code(), Code::kNotFound);
  EXPECT_TRUE(store_->Head(wal::SlotKey("n1", epoch, 1)).ok());
  EXPECT_TRUE(store_->Head(wal::SlotKey("n1", epoch, 2)).ok());
  ASSERT_TRUE((*next)->SettleNow().ok());
  auto r = (*next)->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> got;
  for (auto& rec : r->records) got.push_back(rec.record.value.value_or("<null>"));
  EXPECT_EQ(got, (std::vector<std::string>{"a", "b", "c"}));
  (*next)->Close();
}

TEST_F(EngineTest, AnAppendDurableOnlyAfterItsStreamWasDeletedIsNotAcknowledged) {
  auto gated = RestartGated();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "doomed", StreamConfig{}).ok());
  const std::string slot0 = wal::SlotKey("n1", engine_->epoch(), 0);
  gated->Gate(slot0);
  std::promise<AppendOutcome> got;
  engine_->AppendAsync(kBasin, "doomed", Bodies({"x"}), {}, [&](AppendOutcome o) { got.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "doomed").ok());
  gated->Open(slot0);
  AppendOutcome o = got.get_future().get();
  // The record is in no stream a reader (or replay) can find.
  EXPECT_EQ(o.status.code(), Code::kNotFound) << o.status.ToString();
}

TEST_F(EngineTest, AnAppendWaitingForPoolRoomDoesNotHoldUpReleases) {
  // Appends to one stream fill the pool while its first slot is held; the
  // next one waits for room. When the slot lands, its release must get the
  // stream (its callbacks take the stream lock) and free room for the
  // waiter, not wait with it until the admission timeout (a 429).
  wal_budget_ = 256 << 10;
  auto gated = RestartGated();
  const std::string slot0 = wal::SlotKey("n1", engine_->epoch(), 0);
  gated->Gate(slot0);
  EXPECT_FALSE(engine_->AdmissionMayWait(1024));
  std::mutex mu;
  std::vector<Status> results;
  auto record = [&](AppendOutcome o) {
    std::lock_guard lk(mu);
    results.push_back(o.status);
  };
  const auto body = Bodies({std::string(20 << 10, 'x')});
  engine_->AppendAsync(kBasin, "s", body, {}, record);
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  const int kMore = 30;  // 600 KiB: more than the budget while slot 0 is held
  std::thread appender([&] {
    for (int i = 0; i < kMore; ++i) engine_->AppendAsync(kBasin, "s", body, {}, record);
  });
  auto& wal_metrics = engine_->wal().metrics();
  for (int i = 0; i < 6000 && wal_metrics.stall_budget_uploads.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GT(wal_metrics.stall_budget_uploads.load(), 0u);  // the appender does wait for room
  EXPECT_TRUE(engine_->AdmissionMayWait(1024));  // front-ends move appends off their I/O threads now
  gated->Open(slot0);
  appender.join();
  engine_->Close();
  ASSERT_EQ(results.size(), static_cast<size_t>(kMore + 1));
  for (const Status& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(wal_metrics.admission_timeouts.load(), 0u);
  engine_.reset();
  Start();
  EXPECT_EQ(ReadAll("s").size(), static_cast<size_t>(kMore + 1));
}

TEST_F(EngineTest, DeleteStreamWakesReadersAndForgetsTheName) {
  std::thread deleter([&] {
    std::this_thread::sleep_for(30ms);
    EXPECT_TRUE(engine_->DeleteStream(kBasin, "s").ok());
  });
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 100, Now() + 60s);
  deleter.join();
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->GetStream(kBasin, "s").status().code(), Code::kNotFound);
  EXPECT_TRUE(engine_->CreateStream(kBasin, "s", StreamConfig{}).ok());
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 0u);
}

TEST_F(EngineTest, ReadFromTimestampFindsRecordsPastTheFirstPage) {
  // 5000 records of 1 KB at times 1000.. settled (5 MB, past the window one
  // segment read covers), then one in the WAL: a lookup by time with a small
  // page must scan on to its record.
  for (int i = 0; i < 5000; i += 100) {
    std::vector<AppendRecord> recs(100);
    for (int j = 0; j < 100; ++j) {
      recs[j].body = std::string(1000, static_cast<char>('a' + j));
      recs[j].timestamp_ms = 1000 + i + j;
    }
    ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(recs)).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto tail = Bodies({"late"});
  tail[0].timestamp_ms = 9000;
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(tail)).status.ok());
  for (uint64_t ts : {1000u, 3500u, 5999u, 6000u, 9000u}) {
    auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, ts}, 1, 4096);
    ASSERT_TRUE(r.ok()) << ts;
    ASSERT_EQ(r->records.size(), 1u) << ts;
    EXPECT_EQ(r->records[0].offset, ts >= 6000 ? 5000u : ts - 1000) << ts;
  }
  auto none = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 9001}, 1, 4096);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->records.empty());
}

TEST_F(EngineTest, AReadByTimeWithATinyLimitFetchesASegmentOnceNotOncePerBatch) {
  // 700 batches of one 100-byte record at times 1000.. in one segment of
  // about 120 KB (two time-index entries). Time 1380 sits near the end of
  // the first index gap: a lookup with a 1-byte limit must not fetch the
  // segment again for each of the ~380 older batches it passes over.
  for (int i = 0; i < 700; ++i) {
    std::vector<AppendRecord> rec(1);
    rec[0].body = std::string(100, 'v');
    rec[0].timestamp_ms = 1000 + i;
    ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(rec)).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());
  // And a stream of ten one-record segments: the first that holds a late
  // enough record answers, the nine after it are not fetched.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "small", StreamConfig{}).ok());
  for (int i = 0; i < 10; ++i) {
    std::vector<AppendRecord> rec(1);
    rec[0].body = "r";
    rec[0].timestamp_ms = 1000 + i;
    ASSERT_TRUE(engine_->Append(kBasin, "small", std::move(rec)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  auto counted = RestartCounted();
  uint64_t before = counted->counters().gets.load();
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 1380}, 1, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].offset, 380u);
  EXPECT_LE(counted->counters().gets.load() - before, 2u);
  before = counted->counters().gets.load();
  r = engine_->Read(kBasin, "small", ReadStart{ReadStart::kTimestamp, 1000}, 1, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].offset, 0u);
  EXPECT_EQ(counted->counters().gets.load() - before, 1u);
}

// A store whose next `failures` DeleteMany calls fail before deleting anything.
class FailingDeletesStore : public testing::GatedStore {
 public:
  using GatedStore::GatedStore;
  std::atomic<int> failures{0};
  Status DeleteMany(std::span<const std::string> keys) override {
    if (failures.load() > 0) {
      failures.fetch_sub(1);
      return Unavailable("the store is busy");
    }
    return GatedStore::DeleteMany(keys);
  }
};

// Settled slots whose deletes failed stayed until the next start's sweep
// (each round deleted only its own); the next round deletes them too.
TEST_F(EngineTest, SettledSlotsWhoseDeletesFailedAreDeletedByTheNextRound) {
  auto failing = std::make_shared<FailingDeletesStore>(store_);
  engine_->Close();
  engine_.reset();
  Start(failing);
  ASSERT_TRUE(engine_);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a" + std::to_string(i)})).status.ok());
  const size_t before = CountKeys(*store_, "wal/n1/");
  ASSERT_GE(before, 3u);
  failing->failures = 1;
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(failing->failures.load(), 0) << "the round deleted its slots";
  EXPECT_GE(CountKeys(*store_, "wal/n1/"), before) << "the failed delete deleted nothing";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"b" + std::to_string(i)})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  // Every slot below the checkpoint is gone; only the last released slot may remain.
  EXPECT_LE(CountKeys(*store_, "wal/n1/"), 1u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a0", "a1", "a2", "b0", "b1", "b2"}));
}

// Segment objects whose deletes failed (a store refusing deletes for a
// while) stayed, unreferenced, until the next start's sweep, and were
// counted as deleted: a trim's, a deleted stream's. Each retention pass
// tries them again; only deletes done are counted.
TEST_F(EngineTest, SegmentsWhoseDeletesFailedAreDeletedByTheNextRetentionPass) {
  auto failing = std::make_shared<FailingDeletesStore>(store_);
  engine_->Close();
  engine_.reset();
  Start(failing);
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->CreateStream(kBasin, "gone", StreamConfig{}).ok());
  for (const char* stream : {"s", "gone"}) {
    ASSERT_TRUE(engine_->Append(kBasin, stream, Bodies({"a", "b"})).status.ok());
    ASSERT_OK(engine_->SettleNow());
  }
  ASSERT_EQ(CountKeys(*store_, "seg/"), 2u);
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(2)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  failing->failures = 2;  // the trim's delete, then the stream's
  ASSERT_OK(engine_->ApplyRetention());
  ASSERT_OK(engine_->DeleteStream(kBasin, "gone"));
  EXPECT_EQ(failing->failures.load(), 0);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 2u) << "the failed deletes deleted nothing";
  const auto& m = engine_->metrics();
  EXPECT_EQ(m.segments_deleted.load(), 0u);
  EXPECT_EQ(m.segment_delete_failures.load(), 2u);
  EXPECT_EQ(m.segments_undeleted.load(), 2);
  // Still refused: kept for the pass after.
  failing->failures = 1;
  ASSERT_OK(engine_->ApplyRetention());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 2u);
  EXPECT_EQ(m.segments_undeleted.load(), 2);
  ASSERT_OK(engine_->ApplyRetention());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 0u) << "unreferenced segments were left behind";
  EXPECT_EQ(m.segments_undeleted.load(), 0);
  EXPECT_EQ(m.segments_deleted.load(), 1u);  // the trim's; the deleted stream's is not retention's
  EXPECT_EQ(m.segment_delete_failures.load(), 3u);
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);  // the trim command
  EXPECT_EQ(r->records[0].offset, 2u);
}

// DESIGN §2.8: the metastore is off the append path. Appends of every kind
// (plain, by an idempotent producer, with match_seq_num, with a fencing
// token; retries and misses too) read and write nothing there; their settle
// is one transaction.
TEST_F(EngineTest, AppendsOfEveryKindDoNotTouchTheMetastore) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine_->CreateStream(kBasin, "m" + std::to_string(i), StreamConfig{}).ok());
  auto id = engine_->AllocateProducerId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  std::vector<AppendRecord> fence;
  fence.push_back(Command("fence", "tok"));
  ASSERT_TRUE(engine_->Append(kBasin, "m4", std::move(fence)).status.ok());
  const auto& c = meta_->counters();
  const uint64_t reads = c.reads.load(), writes = c.writes.load(), tx = c.transactions.load();
  std::vector<uint64_t> tails(5, 0);
  tails[4] = 1;
  int32_t seq = 0;
  for (int i = 0; i < 1000; ++i) {
    const int k = i % 5;
    const std::string name = "m" + std::to_string(k);
    AppendOptions o;
    if (k == 1) o.producer = ProducerRef{*id, 0, seq};
    if (k == 2) o.match_seq_num = tails[2];
    if (k == 3 && i % 10 == 3) o.match_seq_num = tails[3] + 7;  // a miss
    if (k == 4) o.fencing_token = i % 20 == 4 ? "other" : "tok";  // some misses
    auto r = engine_->Append(kBasin, name, Bodies({"x" + std::to_string(i)}), o);
    const bool miss = (k == 3 && i % 10 == 3) || (k == 4 && i % 20 == 4);
    ASSERT_EQ(r.status.ok(), !miss) << i << ": " << r.status.ToString();
    if (!miss) ++tails[static_cast<size_t>(k)];
    if (k == 1) {
      // Its retry is a duplicate, answered with its offsets.
      auto again = engine_->Append(kBasin, name, Bodies({"x" + std::to_string(i)}), o);
      ASSERT_TRUE(again.status.ok()) << again.status.ToString();
      EXPECT_TRUE(again.ack.duplicated);
      ++seq;
    }
  }
  EXPECT_EQ(c.reads.load(), reads) << "metastore reads by appends";
  EXPECT_EQ(c.writes.load(), writes) << "metastore writes by appends";
  EXPECT_EQ(c.transactions.load(), tx);
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(c.transactions.load(), tx + 1) << "one transaction settles them all";
  for (int k = 0; k < 5; ++k) EXPECT_EQ(*engine_->CheckTail(kBasin, "m" + std::to_string(k)), tails[static_cast<size_t>(k)]);
}

TEST_F(EngineTest, SettleMovesSlotsIntoSegmentsInOneTransaction) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine_->CreateStream(kBasin, "m" + std::to_string(i), StreamConfig{}).ok());
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(engine_->Append(kBasin, "m" + std::to_string(i), Bodies({"r" + std::to_string(round), "x"})).status.ok());
    }
  }
  EXPECT_GT(CountKeys(*store_, "wal/n1/"), 0u);
  uint64_t tx = meta_->counters().transactions.load();
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(meta_->counters().transactions.load(), tx + 1) << "one metastore transaction per settle cycle";
  EXPECT_EQ(engine_->metrics().segments_written.load(), 5u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 5u);
  // Every slot below the checkpoint is gone; only the last released slot may remain.
  EXPECT_LE(CountKeys(*store_, "wal/n1/"), 1u);
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(meta_->counters().transactions.load(), tx + 1) << "nothing new: no transaction";
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ReadAll("m" + std::to_string(i)), (std::vector<std::string>{"r0", "x", "r1", "x", "r2", "x"}));
  }
  auto state = meta_->GetStreamState(engine_->GetStream(kBasin, "m0")->info.id);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->settled_offset, 6u);
}

// A batch's CRC does not cover its baseOffset: a segment damaged there must
// read as corruption, not as records at other offsets (which a read from an
// offset then drops without a word).
TEST_F(EngineTest, ASegmentWithABatchAtTheWrongOffsetIsCorruption) {
  // The segment object of stream `name` (its only one).
  auto segment_of = [&](const std::string& name) {
    auto id = engine_->GetStream(kBasin, name);
    EXPECT_TRUE(id.ok());
    auto segs = meta_->FindSegments(id->info.id, 0, 10);
    EXPECT_TRUE(segs.ok() && segs->size() == 1u);
    return segs.ok() && segs->size() == 1u ? segs->front().object_key : std::string();
  };
  // Sets the baseOffset of batch `n` of `key` to `base`.
  auto damage = [&](const std::string& key, size_t n, uint64_t base) {
    std::string object = *store_->Get(key);
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) at += 12 + LoadBE32(object.data() + at + 8);
    StoreBE32(object.data() + at, static_cast<uint32_t>(base >> 32));
    StoreBE32(object.data() + at + 4, static_cast<uint32_t>(base));
    ASSERT_OK(store_->Put(key, object));
  };
  auto read_from = [&](const std::string& name, uint64_t from, size_t max_bytes) {
    return engine_->Read(kBasin, name, ReadStart{ReadStart::kOffset, from}, 1000, max_bytes).status().code();
  };
  // Small: the segment is read whole.
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"c"})).status.ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"d", "e"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  const std::string small = segment_of("s");
  ASSERT_FALSE(small.empty());
  damage(small, 1, 0);
  EXPECT_EQ(read_from("s", 0, 1 << 20), Code::kCorruption);
  EXPECT_EQ(read_from("s", 3, 1 << 20), Code::kCorruption);

  // Large: read by range (footer, index, then a window of data).
  ASSERT_TRUE(engine_->CreateStream(kBasin, "big", StreamConfig{}).ok());
  const std::string big(900u << 10, 'x');
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine_->Append(kBasin, "big", Bodies({big})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  const std::string large = segment_of("big");
  ASSERT_FALSE(large.empty());
  ASSERT_EQ(read_from("big", 1, 1000), Code::kOk);
  damage(large, 1, 0);
  EXPECT_EQ(read_from("big", 1, 1000), Code::kCorruption);
  damage(large, 1, uint64_t{0x7ffffffffffffff0});
  EXPECT_EQ(read_from("big", 1, 1000), Code::kCorruption);
  EXPECT_EQ(read_from("big", 0, 4u << 20), Code::kCorruption);
}

// A segment past 8 MiB is read by range, where its data CRC is not checked:
// a batch whose length was damaged must not end the read quietly (a Kafka
// fetch then went on with the next segment's records, past a gap, with no
// error), and a damaged record byte must fail its batch's CRC.
TEST_F(EngineTest, ALargeSegmentReadByRangeServesNoGapAndNoDamagedBatch) {
  ASSERT_TRUE(engine_->CreateStream(kBasin, "big", StreamConfig{}).ok());
  const std::string big(900u << 10, 'x');
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(engine_->Append(kBasin, "big", Bodies({big})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->Append(kBasin, "big", Bodies({"after-0", "after-1"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto id = engine_->GetStream(kBasin, "big");
  ASSERT_TRUE(id.ok());
  ASSERT_OK_AND_ASSIGN(auto segs, meta_->FindSegments(id->info.id, 0, 10));
  ASSERT_EQ(segs.size(), 2u);
  ASSERT_GT(segs[0].size_bytes, 8u << 20);
  const std::string key = segs[0].object_key;
  const std::string good = *store_->Get(key);
  // The offsets a whole read from 0 returns, batch by batch (contiguous, or
  // the read failed).
  auto read_all = [&]() -> Result<std::vector<uint64_t>> {
    WEIR_ASSIGN_OR_RETURN(BatchReadResult r, engine_->ReadBatches(kBasin, "big", 0, 32u << 20));
    std::vector<uint64_t> bases;
    for (const auto& b : r.batches) bases.push_back(LoadBE64(b->data()));
    return bases;
  };
  ASSERT_OK_AND_ASSIGN(auto all, read_all());
  EXPECT_EQ(all, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  auto at_batch = [&](size_t n) {
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) at += 12 + LoadBE32(good.data() + at + 8);
    return at;
  };
  for (const bool length : {true, false}) {
    SCOPED_TRACE(length ? "a damaged length" : "a damaged record byte");
    std::string object = good;
    if (length) {
      object[at_batch(6) + 9] ^= 0x10;  // batchLength of the batch at offset 6
    } else {
      object[at_batch(7) + 500] ^= 0x01;  // a record byte of the batch at offset 7
    }
    ASSERT_OK(store_->Put(key, object));
    auto got = read_all();
    std::string served;
    for (uint64_t base : got.ok() ? *got : std::vector<uint64_t>{}) served += std::to_string(base) + " ";
    EXPECT_EQ(got.status().code(), Code::kCorruption) << "served batches at " << served;
  }
  ASSERT_OK(store_->Put(key, good));
  EXPECT_TRUE(read_all().ok());
}

// A quorum WAL store (Express) whose first holder of a slot has a damaged
// copy: a batch read back by range (out of the cache) fails its CRC and is
// read again from the whole slot, which the quorum store takes from a
// holder whose copy is intact; settle goes on.
TEST_F(EngineTest, AnUnsettledBatchWhoseQuorumCopyIsDamagedIsReadFromAnother) {
  engine_->Close();
  engine_.reset();
  std::vector<std::shared_ptr<objstore::ObjectStore>> copies;
  for (int i = 0; i < 3; ++i) copies.push_back(objstore::NewMemStore());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<wal::QuorumStore> quorum, wal::QuorumStore::Open(copies, {}));
  store_ = objstore::NewMemStore();
  auto meta = metastore::OpenMetastore("sqlite://:memory:");
  ASSERT_TRUE(meta.ok());
  meta_ = *meta;
  EngineOptions o = Options();
  o.wal_store = quorum;
  o.log_cache_bytes = 4096;
  auto opened = Engine::Open(o, store_, meta_);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  engine_ = std::move(*opened);
  ASSERT_TRUE(engine_->CreateBasin(kBasin).ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "s", StreamConfig{}).ok());
  std::vector<std::string> want;
  for (int i = 0; i < 5; ++i) {
    want.push_back("rec-" + std::to_string(i) + "-" + std::string(2000, static_cast<char>('a' + i)));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({want.back()})).status.ok());
  }
  // Damage the first record's value in store 0's copy of its slot.
  const std::string slot = wal::SlotKey("n1", engine_->epoch(), 0);
  std::string copy = *copies[0]->Get(slot);
  const size_t at = copy.find("rec-0-");
  ASSERT_NE(at, std::string::npos);
  copy[at + 100] ^= 0x01;
  ASSERT_OK(copies[0]->Put(slot, copy));
  EXPECT_EQ(ReadAll("s"), want);
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(ReadAll("s"), want);
}

// A reader that goes on reading (a read session) pins the stream its first
// read found: a stream deleted and created again under the name is another,
// and its records are not the next ones of the first.
TEST_F(EngineTest, AReadPinnedToAStreamEndsWhenItsNameNamesANewOne) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"old-0", "old-1"})).status.ok());
  auto first = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1, 1 << 20);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const uint64_t id = first->stream_id;
  EXPECT_EQ(id, engine_->GetStream(kBasin, "s")->info.id);
  auto more = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 1}, 10, 1 << 20, std::nullopt, id);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(more->records.size(), 1u);
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "s").ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "s", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"new-0", "new-1", "new-2"})).status.ok());
  EXPECT_EQ(engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 2}, 10, 1 << 20, std::nullopt, id)
                .status()
                .code(),
            Code::kNotFound);
  EXPECT_EQ(engine_->WatchTail(kBasin, "s", 3, [] {}, id).status().code(), Code::kNotFound);
  // Unpinned, the name reads the new stream.
  auto fresh = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->stream_id, id);
  EXPECT_EQ(fresh->records.size(), 3u);
}

TEST_F(EngineTest, RecoveryReplaysUnsettledSlotsOnTopOfSettledState) {
  AppendOptions p;
  p.producer = ProducerRef{3, 0, 0};
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"}), p).status.ok());
  std::vector<AppendRecord> fence;
  fence.push_back(Command("fence", "t1"));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(fence)).status.ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"c"}), AppendOptions{std::nullopt, "t1", std::nullopt}).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  // These stay in the WAL: the engine stops without a final settle.
  p.producer->seq = 2;
  p.fencing_token = "t1";
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"d"}), p).status.ok());
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(1)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim), AppendOptions{std::nullopt, "t1", std::nullopt}).status.ok());
  settle_on_close_ = false;
  Restart();
  auto info = engine_->GetStream(kBasin, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tail, 6u);
  EXPECT_EQ(info->fencing_token, "t1");
  EXPECT_EQ(info->trim_point, 1u);
  auto dup = engine_->Append(kBasin, "s", Bodies({"d"}), p);  // the last producer batch, from the WAL
  ASSERT_TRUE(dup.status.ok()) << dup.status.ToString();
  EXPECT_TRUE(dup.ack.duplicated);
  EXPECT_EQ(dup.ack.start_offset, 4u);
  p.producer->seq = 0;  // the first producer batch, from the settled state
  auto dup0 = engine_->Append(kBasin, "s", Bodies({"a", "b"}), p);
  ASSERT_TRUE(dup0.status.ok());
  EXPECT_TRUE(dup0.ack.duplicated);
  EXPECT_EQ(dup0.ack.start_offset, 0u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"b", "t1", "c", "d", std::string(Be64(1))}));
  // Settling the replayed slots and restarting again changes nothing visible.
  ASSERT_TRUE(engine_->SettleNow().ok());
  Restart();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"b", "t1", "c", "d", std::string(Be64(1))}));
  EXPECT_EQ(CountKeys(*store_, "seg/"), 2u);
}

TEST_F(EngineTest, ATrimCommandTrimsThroughItselfButNotPast) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(1000)));  // past the tail: capped just after the command
  trim.push_back(Command("fence", ""));         // a later record of the same append stays
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 3u);
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].offset, 3u);
  // Replay applies the same rule.
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 3u);
}

TEST_F(EngineTest, ATrimHidesNothingUntilItIsDurable) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  auto gated = RestartGated();
  const std::string slot0 = wal::SlotKey("n1", engine_->epoch(), 0);
  gated->Gate(slot0);
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(2)));
  std::promise<AppendOutcome> acked;
  engine_->AppendAsync(kBasin, "s", std::move(trim), {}, [&](AppendOutcome o) { acked.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  // Pending (it could still fail, or be lost in a crash): nothing is hidden yet.
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 0u);
  gated->Open(slot0);
  auto o = acked.get_future().get();
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(o.ack.log_start, 2u);
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 2u);
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->records.size(), 1u);  // the trim command itself, at offset 2
  EXPECT_EQ(r->records[0].offset, 2u);
}

TEST_F(EngineTest, TrimToMovesTheStartWithoutARecordAndSurvivesReplayAndSettle) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b", "c", "d"})).status.ok());
  EXPECT_EQ(engine_->TrimTo(kBasin, "s", 5).status().code(), Code::kOutOfRange);  // past the tail
  EXPECT_EQ(engine_->TrimTo(kBasin, "missing", 0).status().code(), Code::kNotFound);
  ASSERT_OK_AND_ASSIGN(uint64_t start, engine_->TrimTo(kBasin, "s", 2));
  EXPECT_EQ(start, 2u);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 4u);  // no record was added
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"c", "d"}));
  ASSERT_OK_AND_ASSIGN(start, engine_->TrimTo(kBasin, "s", 1));  // lower: no change
  EXPECT_EQ(start, 2u);
  // A trim command to a lower point afterwards does not lower it either.
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(1)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 2u);
  // Unsettled: replay keeps it (the metastore holds it).
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 2u);
  EXPECT_EQ(ReadAll("s").size(), 3u);  // c, d and the command record
  // Settled, then trimmed further, then settled again and restarted.
  ASSERT_OK(engine_->SettleNow());
  ASSERT_OK(engine_->TrimTo(kBasin, "s", 4).status());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"e"})).status.ok());
  ASSERT_OK(engine_->SettleNow());
  Restart();
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->trim_point, 4u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{Be64(1), "e"}));  // the trim command, then e
}

// A delete whose answer was lost while its commit was still in flight (a
// remote metastore finishing a COMMIT its client gave up on): the read-back
// waits for that commit, so it sees the row gone and the stream is
// forgotten, instead of staying to acknowledge appends settle would skip.
// A create likewise: the stream it made is loaded, not left unfindable.
TEST_F(EngineTest, AReadBackAfterALostAnswerWaitsForTheCommitInFlight) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  const uint64_t id = engine_->GetStream(kBasin, "s")->info.id;
  const metastore::EpochCheck by{node_, engine_->epoch()};
  hooked->fail_delete = [] { return Unavailable("the connection broke during COMMIT"); };
  hooked->commit_in_flight = [&] { ASSERT_TRUE(meta_->DeleteStream(id, by).ok()); };
  EXPECT_TRUE(engine_->DeleteStream(kBasin, "s").ok());  // the row is gone: as on success
  EXPECT_EQ(hooked->commit_in_flight, nullptr) << "the read-back did not wait";
  EXPECT_EQ(engine_->Append(kBasin, "s", Bodies({"x"})).status.code(), Code::kNotFound);
  hooked->fail_delete = nullptr;

  hooked->fail_create = [] { return Unavailable("the connection broke during COMMIT"); };
  metastore::StreamInfo row;
  row.basin = kBasin;
  row.name = "c";
  hooked->commit_in_flight = [&] {
    auto created = meta_->CreateStream(row, by);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    row = *created;
  };
  auto created = engine_->CreateStream(kBasin, "c", StreamConfig{});
  EXPECT_EQ(hooked->commit_in_flight, nullptr) << "the read-back did not wait";
  EXPECT_FALSE(created.ok()) << "another's create (not this call's time and config) is not claimed";
  hooked->fail_create = nullptr;
  EXPECT_TRUE(engine_->Append(kBasin, "c", Bodies({"x"})).status.ok()) << "the stream it found is loaded";
}

// A config change whose answer was lost: memory takes what the metastore
// holds (once a commit in flight has ended), so retention never goes on
// deleting by an age the stored config no longer has. While it cannot be
// read, retention leaves the stream alone.
TEST_F(EngineTest, AConfigChangeWhoseAnswerWasLostTakesTheStoredConfig) {
  auto hooked = RestartHooked();
  StreamConfig expiring;
  expiring.retention_age_s = 60;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "r", expiring).ok());
  auto old_record = Bodies({"old"});
  old_record[0].timestamp_ms = WallMillis() - 3'600'000;
  ASSERT_TRUE(engine_->Append(kBasin, "r", std::move(old_record)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());  // a segment of its own, expired by 60 s
  ASSERT_TRUE(engine_->Append(kBasin, "r", Bodies({"new"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  const uint64_t id = engine_->GetStream(kBasin, "r")->info.id;
  const metastore::EpochCheck by{node_, engine_->epoch()};
  StreamConfig keep = expiring;
  keep.retention_age_s = 0;  // kept for ever

  // Landed while the read-back waited: memory has it.
  hooked->fail_update_config = [] { return Unavailable("the connection broke during COMMIT"); };
  hooked->commit_in_flight = [&] { ASSERT_TRUE(meta_->UpdateStreamConfig(id, keep, by).ok()); };
  EXPECT_FALSE(engine_->ReconfigureStream(kBasin, "r", keep).ok());
  EXPECT_EQ(hooked->commit_in_flight, nullptr) << "the read-back did not wait";
  EXPECT_EQ(engine_->GetStream(kBasin, "r")->info.config.retention_age_s, 0);
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(ReadAll("r"), (std::vector<std::string>{"old", "new"}));

  // Landed, and the metastore cannot say: retention waits until it can.
  hooked->fail_update_config = nullptr;
  ASSERT_TRUE(engine_->ReconfigureStream(kBasin, "r", expiring).ok());
  hooked->map_update_config_answer = [](Status) { return Unavailable("the answer was lost"); };
  hooked->fail_await_commits = [] { return Unavailable("the metastore is away"); };
  EXPECT_FALSE(engine_->ReconfigureStream(kBasin, "r", keep).ok());
  EXPECT_EQ(engine_->GetStream(kBasin, "r")->info.config.retention_age_s, 60);
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(ReadAll("r"), (std::vector<std::string>{"old", "new"})) << "retention went by a config it did not know";
  hooked->map_update_config_answer = nullptr;
  hooked->fail_await_commits = nullptr;
  ASSERT_TRUE(engine_->ApplyRetention().ok());  // reads it now: kept for ever
  EXPECT_EQ(engine_->GetStream(kBasin, "r")->info.config.retention_age_s, 0);
  EXPECT_EQ(ReadAll("r"), (std::vector<std::string>{"old", "new"}));

  // Refused (nothing changed): memory keeps its config without a read-back.
  const int awaits = hooked->await_commits_calls.load();
  hooked->fail_update_config = [] { return InvalidArgument("refused"); };
  EXPECT_FALSE(engine_->ReconfigureStream(kBasin, "r", expiring).ok());
  EXPECT_EQ(hooked->await_commits_calls.load(), awaits);
  hooked->fail_update_config = nullptr;
  // And a change that did not land: the old config stays, and retention
  // goes by it again.
  ASSERT_TRUE(engine_->ReconfigureStream(kBasin, "r", expiring).ok());
  hooked->fail_update_config = [] { return Unavailable("the metastore is away"); };
  EXPECT_FALSE(engine_->ReconfigureStream(kBasin, "r", keep).ok());
  hooked->fail_update_config = nullptr;
  EXPECT_EQ(engine_->GetStream(kBasin, "r")->info.config.retention_age_s, 60);
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(ReadAll("r"), (std::vector<std::string>{"new"}));
}

// A trim stored with its answer lost: the caller gets the error, and memory
// takes the stored trim point (reads no longer return what a restart would
// drop); if it cannot be read back, memory keeps the lower one.
TEST_F(EngineTest, ATrimWhoseAnswerWasLostTakesTheStoredTrimPoint) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "t", {}).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "t", Bodies({"a", "b", "c", "d"})).status.ok());
  hooked->map_raise_trim_answer = [](Status) { return Unavailable("the connection broke during COMMIT"); };
  EXPECT_EQ(engine_->TrimTo(kBasin, "t", 1).status().code(), Code::kUnavailable);
  EXPECT_EQ(ReadAll("t"), (std::vector<std::string>{"b", "c", "d"}));
  hooked->fail_get_stream_state = [] { return Unavailable("the metastore is away"); };
  EXPECT_EQ(engine_->TrimTo(kBasin, "t", 2).status().code(), Code::kUnavailable);
  EXPECT_EQ(ReadAll("t"), (std::vector<std::string>{"b", "c", "d"})) << "memory keeps what it knows";
  hooked->fail_get_stream_state = nullptr;
  hooked->map_raise_trim_answer = nullptr;
  ASSERT_TRUE(engine_->TrimTo(kBasin, "t", 3).ok());
  EXPECT_EQ(ReadAll("t"), (std::vector<std::string>{"d"}));
  RestartHooked();
  EXPECT_EQ(ReadAll("t"), (std::vector<std::string>{"d"}));
}

// Retention deletes a chunk of streams at a time: a retention raised (and
// acknowledged) while earlier chunks were deleted keeps what it keeps in
// the chunks after (each chunk's cuts are taken again, under the config lock).
TEST_F(EngineTest, ARetentionRaisedWhileEarlierChunksAreDeletedKeepsItsRecords) {
  retention_streams_per_txn_ = 1;
  auto gated = std::make_shared<testing::GatedStore>(store_);
  RestartHooked(gated);
  StreamConfig expiring;
  expiring.retention_age_s = 60;
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(engine_->CreateStream(kBasin, name, expiring).ok());
    auto old_record = Bodies({"old"});
    old_record[0].timestamp_ms = WallMillis() - 3'600'000;
    ASSERT_TRUE(engine_->Append(kBasin, name, std::move(old_record)).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());  // a segment each, expired by 60 s
  for (const char* name : {"a", "b"}) ASSERT_TRUE(engine_->Append(kBasin, name, Bodies({"new"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  StreamConfig keep = expiring;
  keep.retention_age_s = 0;  // kept for ever
  // Once the first chunk's rows are gone (its objects being deleted), both
  // streams are kept for ever: the one whose chunk comes second keeps "old".
  bool changed = false;
  gated->BeforeDeleteMany([&] {
    for (const char* name : {"a", "b"}) EXPECT_TRUE(engine_->ReconfigureStream(kBasin, name, keep).ok());
    changed = true;
  });
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  ASSERT_TRUE(changed);
  std::vector<std::string> a = ReadAll("a"), b = ReadAll("b");
  EXPECT_EQ(a.size() + b.size(), 3u) << "a: " << a.size() << ", b: " << b.size()
                                     << ": retention deleted by the age it read before the change";
}

// While a stream's config is unknown (a change whose answer was lost, and
// the metastore could not be read back): trims still apply, nothing
// expires, an empty stream is not deleted by the age memory holds, and a
// new change is refused (retryable) while the stored config is read again.
TEST_F(EngineTest, AStreamWhoseConfigIsUnknownIsOnlyTrimmedAndRefusesChanges) {
  auto hooked = RestartHooked();
  StreamConfig soon;
  soon.retention_age_s = 60;
  soon.delete_on_empty_min_age_s = 1;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "u", soon).ok());
  for (const char* body : {"a", "b"}) {
    auto recs = Bodies({body});
    recs[0].timestamp_ms = WallMillis() - 3'600'000;
    ASSERT_TRUE(engine_->Append(kBasin, "u", std::move(recs)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());  // a segment each, both past 60 s
  }
  StreamConfig later = soon;
  later.retention_age_s = 0;
  later.delete_on_empty_min_age_s = 86'400;
  hooked->map_update_config_answer = [](Status) { return Unavailable("the answer was lost"); };
  hooked->fail_await_commits = [] { return Unavailable("the metastore is away"); };
  EXPECT_FALSE(engine_->ReconfigureStream(kBasin, "u", later).ok());  // landed: stored is `later`
  hooked->map_update_config_answer = nullptr;
  ASSERT_TRUE(engine_->TrimTo(kBasin, "u", 1).ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(ReadAll("u"), (std::vector<std::string>{"b"})) << "the trim applies; nothing expires";
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
  ASSERT_TRUE(engine_->TrimTo(kBasin, "u", 2).ok());  // empty now
  std::this_thread::sleep_for(1100ms);                  // past the delete_on_empty age memory holds
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "u").ok()) << "deleted by an age the stored config no longer has";
  EXPECT_EQ(CountKeys(*store_, "seg/"), 0u);

  Status refused = engine_->ReconfigureStream(kBasin, "u", soon);
  EXPECT_EQ(refused.code(), Code::kUnavailable) << refused.ToString();
  hooked->fail_await_commits = nullptr;
  refused = engine_->ReconfigureStream(kBasin, "u", soon);  // refused once more, reading the stored config
  EXPECT_EQ(refused.code(), Code::kUnavailable) << refused.ToString();
  EXPECT_EQ(engine_->GetStream(kBasin, "u")->info.config.delete_on_empty_min_age_s, 86'400);
  EXPECT_TRUE(engine_->ReconfigureStream(kBasin, "u", later).ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "u").ok());
}

// A delete that landed in the metastore with its answer lost: the stream
// must not stay in memory acknowledging appends whose rows settle skips (and
// a restart then drops). It is forgotten once the metastore says the row is
// gone; while that cannot be known, appends are refused.
TEST_F(EngineTest, ADeleteWhoseAnswerWasLostLeavesNoStreamThatAcksAppends) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  hooked->map_delete_answer = [](Status) { return Unavailable("the answer was lost"); };
  hooked->fail_get_stream_by_id = [] { return Unavailable("the metastore is away"); };
  EXPECT_FALSE(engine_->DeleteStream(kBasin, "s").ok());
  auto refused = engine_->Append(kBasin, "s", Bodies({"x"}));
  EXPECT_EQ(refused.status.code(), Code::kUnavailable) << refused.status.ToString();
  // A retry learns the row is gone (kNotFound): forgotten, as on success.
  hooked->map_delete_answer = nullptr;
  hooked->fail_get_stream_by_id = nullptr;
  EXPECT_TRUE(engine_->DeleteStream(kBasin, "s").ok());
  EXPECT_EQ(engine_->Append(kBasin, "s", Bodies({"x"})).status.code(), Code::kNotFound);

  // Without a retry, the next retention pass learns it: gone (forgotten) or
  // there (appendable again). A table's buckets likewise (a retried delete
  // would find no table).
  for (bool landed : {true, false}) {
    ASSERT_TRUE(engine_->CreateStream(kBasin, "r", StreamConfig{}).ok());
    ASSERT_TRUE(CreateTable("rt", 1, StreamConfig{}).ok());
    hooked->map_delete_answer = [landed](Status st) { return landed ? Unavailable("the answer was lost") : st; };
    hooked->fail_get_stream_by_id = [] { return Unavailable("the metastore is away"); };
    if (!landed) hooked->fail_delete = [] { return Unavailable("the metastore is away"); };
    EXPECT_FALSE(engine_->DeleteStream(kBasin, "r").ok());
    EXPECT_FALSE(engine_->DeleteTable(kBasin, "rt").ok());
    EXPECT_EQ(engine_->Append(kBasin, "r", Bodies({"x"})).status.code(), Code::kUnavailable);
    EXPECT_EQ(engine_->Append(kBasin, "rt/0", Bodies({"x"})).status.code(), Code::kUnavailable);
    hooked->map_delete_answer = nullptr;
    hooked->fail_get_stream_by_id = nullptr;
    hooked->fail_delete = nullptr;
    ASSERT_TRUE(engine_->ApplyRetention().ok());
    const Code expected = landed ? Code::kNotFound : Code::kOk;
    EXPECT_EQ(engine_->Append(kBasin, "r", Bodies({"x"})).status.code(), expected) << landed;
    EXPECT_EQ(engine_->Append(kBasin, "rt/0", Bodies({"x"})).status.code(), expected) << landed;
    if (!landed) {
      ASSERT_TRUE(engine_->DeleteStream(kBasin, "r").ok());
      ASSERT_TRUE(engine_->DeleteTable(kBasin, "rt").ok());
    }
  }

  // When the metastore can say at once, the first call already forgets it.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "t", StreamConfig{}).ok());
  hooked->map_delete_answer = [](Status) { return Unavailable("the answer was lost"); };
  EXPECT_TRUE(engine_->DeleteStream(kBasin, "t").ok());
  EXPECT_EQ(engine_->Append(kBasin, "t", Bodies({"x"})).status.code(), Code::kNotFound);

  // A delete that did not land leaves the stream as it was.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "u", StreamConfig{}).ok());
  hooked->map_delete_answer = nullptr;
  ASSERT_TRUE(CreateTable("tbl", 1, StreamConfig{}).ok());
  EXPECT_FALSE(engine_->DeleteStream(kBasin, "tbl/0").ok());  // refused: a table's bucket
  EXPECT_TRUE(engine_->Append(kBasin, "tbl/0", Bodies({"kept"})).status.ok());

  // DeleteTable and delete_on_empty likewise.
  hooked->map_delete_answer = [](Status) { return Unavailable("the answer was lost"); };
  EXPECT_TRUE(engine_->DeleteTable(kBasin, "tbl").ok());
  EXPECT_EQ(engine_->Append(kBasin, "tbl/0", Bodies({"x"})).status.code(), Code::kNotFound);
  StreamConfig soon;
  soon.delete_on_empty_min_age_s = 1;
  ASSERT_TRUE(engine_->ReconfigureStream(kBasin, "u", soon).ok());
  std::this_thread::sleep_for(1100ms);
  // While retention asks whether its delete landed, appends stay refused: one
  // acknowledged then would be lost with the row.
  std::optional<Status> during;
  hooked->fail_get_stream_by_id = [&] {
    if (!during) during = engine_->Append(kBasin, "u", Bodies({"x"})).status;
    return Status::Ok();
  };
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  hooked->fail_get_stream_by_id = nullptr;
  ASSERT_TRUE(during.has_value());
  EXPECT_EQ(during->code(), Code::kUnavailable) << during->ToString();
  EXPECT_EQ(engine_->Append(kBasin, "u", Bodies({"x"})).status.code(), Code::kNotFound);
  hooked->map_delete_answer = nullptr;
  EXPECT_EQ(meta_->GetStream(kBasin, "u").status().code(), Code::kNotFound);
}

// A second start of the node with WAL options the writer refuses fails
// before it mints an epoch: the running process is not fenced.
TEST_F(EngineTest, BadWalOptionsAreRefusedBeforeTheNodeIsTakenOver) {
  auto before = meta_->GetNode("n1");
  ASSERT_TRUE(before.ok());
  EngineOptions bad = Options();
  bad.wal.slot_cap_bytes = 8 << 20;
  bad.wal.budget_bytes = 4 << 20;  // less than one slot
  auto e = Engine::Open(bad, store_, meta_);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kInvalidArgument) << e.status().ToString();
  bad = Options();
  bad.wal.window = 0;
  EXPECT_EQ(Engine::Open(bad, store_, meta_).status().code(), Code::kInvalidArgument);
  auto after = meta_->GetNode("n1");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->epoch, before->epoch) << "a refused start minted an epoch";
  auto ack = engine_->Append(kBasin, "s", Bodies({"still-served"}));
  EXPECT_TRUE(ack.status.ok()) << ack.status.ToString();
}

// A process whose node epoch a successor minted deletes nothing: the
// successor serves those streams (and would acknowledge appends to a stream
// whose rows settle then skips). Nor does it create or change anything.
TEST_F(EngineTest, ASupersededProcessChangesNoStreamOrTable) {
  ASSERT_TRUE(CreateTable("tbl", 1, StreamConfig{}).ok());
  // A front-end's callback, cleared (the front-end went away): it never runs.
  std::atomic<int> cleared{0};
  engine_->OnSuperseded([&cleared] { ++cleared; });
  engine_->OnSuperseded(nullptr);
  // Still current: a basin that holds streams is its own refusal, not "superseded".
  EXPECT_EQ(engine_->DeleteBasin(kBasin).code(), Code::kPreconditionFailed);
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, 8).ok());  // a successor started
  // Not a conflict of the client's making: retryable (elsewhere).
  EXPECT_EQ(engine_->DeleteStream(kBasin, "s").code(), Code::kUnavailable);
  EXPECT_TRUE(engine_->superseded());  // the refusal told it: its streams are the successor's
  EXPECT_EQ(cleared.load(), 0);
  EXPECT_EQ(engine_->DeleteTable(kBasin, "tbl").code(), Code::kUnavailable);
  EXPECT_TRUE(meta_->GetStream(kBasin, "s").ok());
  EXPECT_TRUE(meta_->GetTable(kBasin, "tbl").ok());
  EXPECT_TRUE(meta_->GetStream(kBasin, "tbl/0").ok());
  // Nor creates or reconfigures what the successor would not know of.
  EXPECT_EQ(engine_->CreateStream(kBasin, "late", StreamConfig{}).status().code(), Code::kUnavailable);
  EXPECT_EQ(CreateTable("late-t", 1, StreamConfig{}).code(), Code::kUnavailable);
  // Changes of its streams are refused before the metastore is asked.
  EXPECT_EQ(engine_->AddTableBuckets(kBasin, "tbl", 2).status().code(), Code::kFenced);
  StreamConfig changed;
  changed.retention_age_s = 77;
  EXPECT_EQ(engine_->ReconfigureStream(kBasin, "s", changed).code(), Code::kFenced);
  EXPECT_EQ(engine_->ReconfigureTable(kBasin, "tbl", "{}", [&](const StreamConfig&) { return changed; }).code(),
            Code::kFenced);
  EXPECT_EQ(meta_->GetStream(kBasin, "late").status().code(), Code::kNotFound);
  EXPECT_EQ(meta_->GetTable(kBasin, "late-t").status().code(), Code::kNotFound);
  EXPECT_EQ(meta_->GetTable(kBasin, "tbl")->bucket_count, 1u);
  EXPECT_NE(meta_->GetStream(kBasin, "s")->config.retention_age_s, 77);
  EXPECT_EQ(engine_->GetStream(kBasin, "s").status().code(), Code::kFenced);
  // Nor basins.
  ASSERT_TRUE(meta_->CreateBasin(metastore::BasinInfo{"empty-basin", 1}, {}).ok());
  EXPECT_EQ(engine_->CreateBasin("late-basin").code(), Code::kUnavailable);
  metastore::BasinConfig on_append;
  on_append.create_stream_on_append = true;
  EXPECT_EQ(engine_->ReconfigureBasin(kBasin, on_append).code(), Code::kUnavailable);
  EXPECT_EQ(engine_->DeleteBasin("empty-basin").code(), Code::kUnavailable);
  EXPECT_EQ(meta_->GetBasin("late-basin").status().code(), Code::kNotFound);
  EXPECT_FALSE(meta_->GetBasin(kBasin)->config.create_stream_on_append);
  EXPECT_TRUE(meta_->GetBasin("empty-basin").ok());
}

TEST_F(EngineTest, ACreateWhoseAnswerWasLostLeavesAUsableStream) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  // The create landed, its answer was lost: the engine finds its row and loads it.
  hooked->map_create_answer = [](Status) { return Unavailable("the answer was lost"); };
  auto created = engine_->CreateStream(kBasin, "fresh", StreamConfig{});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->name, "fresh");
  EXPECT_TRUE(engine_->Append(kBasin, "fresh", Bodies({"a"})).status.ok());
  ASSERT_TRUE(CreateTable("tbl", 2, StreamConfig{}).ok());
  EXPECT_TRUE(engine_->Append(kBasin, "tbl/1", Bodies({"a"})).status.ok());
  auto grown = engine_->AddTableBuckets(kBasin, "tbl", 3);
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  EXPECT_EQ(grown->bucket_count, 3u);
  EXPECT_TRUE(engine_->Append(kBasin, "tbl/2", Bodies({"a"})).status.ok());

  // A create that did not land stays a failure and leaves nothing behind.
  hooked->map_create_answer = nullptr;
  hooked->fail_create = [] { return Unavailable("the metastore is away"); };
  EXPECT_EQ(engine_->CreateStream(kBasin, "never", StreamConfig{}).status().code(), Code::kUnavailable);
  EXPECT_EQ(engine_->Append(kBasin, "never", Bodies({"a"})).status.code(), Code::kNotFound);
  EXPECT_EQ(CreateTable("never-t", 1, StreamConfig{}).code(), Code::kUnavailable);
  hooked->fail_create = nullptr;

  // A create that landed but whose stream cannot be loaded fails (it did
  // not make a usable stream); the next create of the name loads it.
  hooked->map_create_answer = [](Status) { return Unavailable("the answer was lost"); };
  hooked->fail_get_stream_state = [] { return Unavailable("the metastore is away"); };
  EXPECT_EQ(engine_->CreateStream(kBasin, "unloadable", StreamConfig{}).status().code(), Code::kUnavailable);
  EXPECT_EQ(engine_->Append(kBasin, "unloadable", Bodies({"a"})).status.code(), Code::kNotFound);
  hooked->map_create_answer = nullptr;
  hooked->fail_get_stream_state = nullptr;
  EXPECT_EQ(engine_->CreateStream(kBasin, "unloadable", StreamConfig{}).status().code(), Code::kAlreadyExists);
  EXPECT_TRUE(engine_->Append(kBasin, "unloadable", Bodies({"a"})).status.ok());

  // When the row cannot be looked up either, the create fails; the next
  // create of that name (kAlreadyExists) loads it.
  hooked->map_create_answer = [](Status) { return Unavailable("the answer was lost"); };
  hooked->fail_get_stream = [] { return Unavailable("the metastore is away"); };
  EXPECT_EQ(engine_->CreateStream(kBasin, "late", StreamConfig{}).status().code(), Code::kUnavailable);
  EXPECT_EQ(engine_->Append(kBasin, "late", Bodies({"a"})).status.code(), Code::kNotFound);
  hooked->map_create_answer = nullptr;
  hooked->fail_get_stream = nullptr;
  EXPECT_EQ(engine_->CreateStream(kBasin, "late", StreamConfig{}).status().code(), Code::kAlreadyExists);
  EXPECT_TRUE(engine_->Append(kBasin, "late", Bodies({"a"})).status.ok());

  // Everything survives a restart with the records acknowledged above.
  Restart();
  ASSERT_TRUE(engine_);
  for (const char* name : {"fresh", "tbl/1", "tbl/2", "late"}) {
    auto got = engine_->GetStream(kBasin, name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_EQ(got->tail, 1u) << name;
  }
}

TEST_F(EngineTest, DeleteOnEmptyDeletesAStreamOnceEmptyAndQuietForItsMinAge) {
  StreamConfig later;
  later.delete_on_empty_min_age_s = 3600;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "eph", later).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "eph", Bodies({"a", "b"})).status.ok());
  // A table's bucket streams are the table's, whatever their config says.
  StreamConfig soon;
  soon.delete_on_empty_min_age_s = 1;
  ASSERT_TRUE(CreateTable("tbl", 2, soon).ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "never", StreamConfig{}).ok());  // empty, but 0 = never

  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "eph").ok());  // not empty, too young
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(100)));
  ASSERT_TRUE(engine_->Append(kBasin, "eph", std::move(trim)).status.ok());
  EXPECT_EQ(engine_->GetStream(kBasin, "eph")->trim_point, 3u);  // now empty
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "eph").ok());  // empty, but appended to within the hour

  ASSERT_TRUE(engine_->ReconfigureStream(kBasin, "eph", soon).ok());
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(engine_->GetStream(kBasin, "eph").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->Append(kBasin, "eph", Bodies({"x"})).status.code(), Code::kNotFound);
  EXPECT_EQ(meta_->GetStream(kBasin, "eph").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->metrics().empty_streams_deleted.load(), 1u);
  EXPECT_TRUE(engine_->GetStream(kBasin, "tbl/0").ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "tbl/1").ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "never").ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "s").ok());

  // A stream with a record is never deleted, however old.
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"kept"})).status.ok());
  ASSERT_TRUE(engine_->ReconfigureStream(kBasin, "s", soon).ok());
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"kept"}));
}

// A metastore that never saw this node (reset, or another deployment's) over
// a store that holds the node's WAL: starting would write epoch 1's slots
// where the old ones are, or replay them into new streams. It refuses.
TEST_F(EngineTest, AStoreHoldingThisNodesWalRefusesAMetastoreThatNeverSawTheNode) {
  settle_on_close_ = false;
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  engine_->Close();
  engine_.reset();
  auto fresh = metastore::OpenMetastore("sqlite://:memory:");
  ASSERT_TRUE(fresh.ok());
  auto e = Engine::Open(Options(), store_, *fresh);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kPreconditionFailed);
  EXPECT_NE(e.status().message().find("this node's WAL"), std::string::npos) << e.status().ToString();
  // The right metastore still starts, and has the record.
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
  // No WAL left (settled, its slots gone): the segments give it away.
  ASSERT_OK(engine_->SettleNow());
  engine_->Close();
  engine_.reset();
  auto wal = store_->List("wal/", "", 1000);
  ASSERT_TRUE(wal.ok());
  for (const auto& o : wal->objects) ASSERT_OK(store_->Delete(o.key));
  auto again = metastore::OpenMetastore("sqlite://:memory:");
  ASSERT_TRUE(again.ok());
  auto e3 = Engine::Open(Options(), store_, *again);
  ASSERT_FALSE(e3.ok());
  EXPECT_NE(e3.status().message().find("settled segments"), std::string::npos) << e3.status().ToString();
  settle_on_close_ = true;  // its Close then frees the metastore for n2
  Start();
  // A new node on the same store and metastore (which has streams) is
  // refused while n1 is live: each stream would have two sequencers.
  EngineOptions other = Options();
  other.node = "n2";
  auto refused = Engine::Open(other, store_, meta_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kPreconditionFailed) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("node n1 is live"), std::string::npos) << refused.status().ToString();
  // A start refused mints no epoch (each would cost the node's next start a fence).
  auto n2_state = meta_->GetNode("n2");
  ASSERT_TRUE(n2_state.ok()) << n2_state.status().ToString();
  EXPECT_EQ(n2_state->epoch, 0u);
  // Once n1 has stopped, it starts: n1's WAL and segments are not its business.
  engine_->Close();
  engine_.reset();
  auto e2 = Engine::Open(other, store_, meta_);
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();
  // Now n1 waits for n2 (a restart of n2 itself is not held up).
  auto n1_before = meta_->GetNode("n1");
  ASSERT_TRUE(n1_before.ok()) << n1_before.status().ToString();
  auto n1 = Engine::Open(Options(), store_, meta_);
  EXPECT_EQ(n1.status().code(), Code::kPreconditionFailed) << n1.status().ToString();
  auto n1_after = meta_->GetNode("n1");
  ASSERT_TRUE(n1_after.ok()) << n1_after.status().ToString();
  EXPECT_EQ(n1_after->epoch, n1_before->epoch);
  (*e2)->Close();
  e2->reset();
  e2 = Engine::Open(other, store_, meta_);
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();
  (*e2)->Close();
}

TEST_F(EngineTest, AStoreIsServedOnlyWithTheMetastoreItWasUsedWith) {
  // Two metastores over one store, both started before anything settled
  // (so neither's start-up check sees the other's data): stream ids and
  // epochs repeat across metastores, so each would take the other's
  // segments for garbage. The store names its metastore; the second is
  // refused.
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  auto marker = store_->Get("_weir/deployment");
  ASSERT_TRUE(marker.ok()) << marker.status().ToString();
  auto id = meta_->DeploymentId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*marker, fmt::format("{:016x}\n", *id));
  auto other_meta = metastore::OpenMetastore("sqlite://:memory:");
  ASSERT_TRUE(other_meta.ok());
  EngineOptions other = Options();
  other.node = "n2";
  auto refused = Engine::Open(other, store_, *other_meta);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kPreconditionFailed) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("another metastore"), std::string::npos) << refused.status().ToString();
  auto node = (*other_meta)->GetNode("n2");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->epoch, 0u) << "the refused start minted an epoch";
  // A store from before the marker (or whose marker was lost) is claimed
  // again by the metastore that serves it.
  engine_->Close();
  engine_.reset();
  ASSERT_OK(store_->Delete("_weir/deployment"));
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
  marker = store_->Get("_weir/deployment");
  ASSERT_TRUE(marker.ok()) << marker.status().ToString();
  EXPECT_EQ(*marker, fmt::format("{:016x}\n", *id));
}

// A store that holds nothing, not even its marker, while the metastore says
// records are in it (a mistyped bucket or prefix, a store emptied or made
// again) is refused: served, its fences moved the nodes' checkpoints past
// their WAL, and the next start on the right store deleted those slots as
// settled (acknowledged records lost).
TEST_F(EngineTest, AnEmptyStoreIsRefusedWhereTheMetastoreSaysRecordsAre) {
  settle_on_close_ = false;  // the close leaves the record in the WAL and the heartbeat set, as a kill
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  engine_->Close();
  engine_.reset();
  auto wrong = objstore::NewMemStore();
  auto refused = Engine::Open(Options(), wrong, meta_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kPreconditionFailed) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("holding records in its WAL"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(CountKeys(*wrong, ""), 0u) << "the refused start wrote to the empty store";
  // Another node, taking n1 over once its heartbeat is stale, likewise.
  EngineOptions other = Options();
  other.node = "n2";
  other.node_live_window = 5ms;
  std::this_thread::sleep_for(20ms);
  refused = Engine::Open(other, wrong, meta_);
  EXPECT_EQ(refused.status().code(), Code::kPreconditionFailed) << refused.status().ToString();
  EXPECT_EQ(CountKeys(*wrong, ""), 0u) << "the refused takeover wrote to the empty store";
  // The right store has the record; once it is settled, an empty store is
  // refused for the segments the metastore indexes.
  settle_on_close_ = true;
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
  engine_->Close();
  engine_.reset();
  refused = Engine::Open(Options(), objstore::NewMemStore(), meta_);
  EXPECT_EQ(refused.status().code(), Code::kPreconditionFailed) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("indexes segments"), std::string::npos) << refused.status().ToString();
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
}

// A start that must take over a dead node whose WAL is in another store
// than its own is refused before it mints an epoch: refused in the takeover
// (after the mint), it left its heartbeat and WAL store recorded, and every
// later start, of either node, was refused.
TEST_F(EngineTest, ATakeoverAcrossWalStoresIsRefusedBeforeTheStartChangesAnything) {
  engine_->Close();
  engine_.reset();
  settle_on_close_ = false;  // n1's close leaves its record in its WAL and its heartbeat set, as a kill
  auto wal = objstore::NewMemStore();
  EngineOptions n1 = Options();
  n1.wal_store = wal;
  ASSERT_OK_AND_ASSIGN(auto e1, Engine::Open(n1, store_, meta_));
  ASSERT_TRUE(e1->Append(kBasin, "s", Bodies({"a"})).status.ok());
  e1->Close();
  e1.reset();
  EngineOptions n2 = Options();
  n2.node = "n2";
  n2.node_live_window = 5ms;
  n2.settle_on_close = true;
  std::this_thread::sleep_for(20ms);  // n1's heartbeat is stale
  auto refused = Engine::Open(n2, store_, meta_);  // its WAL in the object store
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kPreconditionFailed) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("this start changed nothing"), std::string::npos)
      << refused.status().ToString();
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n2_state, meta_->GetNode("n2"));
  EXPECT_EQ(n2_state.epoch, 0u);
  EXPECT_EQ(store_->Get("_weir/wal-store/n2").status().code(), Code::kNotFound);
  // With n1's WAL store, n2 takes it over.
  n2.wal_store = wal;
  ASSERT_OK_AND_ASSIGN(engine_, Engine::Open(n2, store_, meta_));
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
  settle_on_close_ = true;
}

// A node that died (no Close) holds the metastore until its heartbeat is
// older than node_live_window; the heartbeat thread keeps a live one fresh.
TEST_F(EngineTest, ANodesHeartbeatKeepsOthersOutUntilItGoesStale) {
  engine_->Close();
  engine_.reset();
  EngineOptions beating = Options();
  beating.heartbeat_interval = 50ms;
  beating.node_live_window = 2s;
  auto n1 = Engine::Open(beating, store_, meta_);
  ASSERT_TRUE(n1.ok()) << n1.status().ToString();
  EngineOptions other = beating;
  other.node = "n2";
  // Past its first heartbeat's window: the thread has renewed it.
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(Engine::Open(other, store_, meta_).status().code(), Code::kPreconditionFailed);
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  (*n1)->Close();  // clears it
  n1->reset();
  // What a killed n1 leaves: its last heartbeat, live for the window, then stale.
  ASSERT_OK(meta_->Heartbeat("n1", node->epoch, 60'000));
  EXPECT_EQ(Engine::Open(other, store_, meta_).status().code(), Code::kPreconditionFailed);
  std::this_thread::sleep_for(20ms);
  other.node_live_window = 5ms;
  auto n2 = Engine::Open(other, store_, meta_);
  ASSERT_TRUE(n2.ok()) << n2.status().ToString();
  (*n2)->Close();
}

// A process whose node a later start took learns it from its next refused
// heartbeat, without appending or settling, and stops beating.
TEST_F(EngineTest, ARefusedHeartbeatTellsAProcessItWasSuperseded) {
  engine_->Close();
  engine_.reset();
  EngineOptions beating = Options();
  beating.heartbeat_interval = 20ms;
  auto first = Engine::Open(beating, store_, meta_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::this_thread::sleep_for(100ms);  // some beats, all taken
  EXPECT_FALSE((*first)->superseded());
  auto second = Engine::Open(Options(), store_, meta_);  // the same node: a restart while it runs
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  for (int i = 0; i < 6000 && !(*first)->superseded(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE((*first)->superseded());
  EXPECT_FALSE((*second)->superseded());
  (*first)->Close();
  (*second)->Close();
}

// Once a process knows another holds its node, it serves none of the
// node's streams (what it holds goes stale as soon as the successor
// appends): reads, tail checks, watches and appends are kFenced, and a read
// or watch waiting for the tail is woken to learn it.
TEST_F(EngineTest, ASupersededProcessServesNoReadsAndWakesItsWaiters) {
  engine_->Close();
  engine_.reset();
  EngineOptions beating = Options();
  beating.heartbeat_interval = 20ms;
  // Its settle backlog full (nothing settles here): an append would wait
  // for room that a superseded process never makes.
  beating.max_unsettled_batches = 1;
  beating.admission_timeout = std::chrono::minutes(2);
  // Front-end callbacks (OnSuperseded): declared before the engine, which may run them until it goes.
  std::atomic<int> replaced{0}, told{0}, late{0};
  ASSERT_OK_AND_ASSIGN(auto first, Engine::Open(beating, store_, meta_));
  ASSERT_TRUE(first->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(first->Append(kBasin, "s", Bodies({"a2"})).status.ok());
  // A long poll at the tail, and a watch of it: neither ends by itself for minutes.
  auto read = std::async(std::launch::async, [&] {
    return first->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 2}, 10, 1 << 20, Now() + std::chrono::minutes(3));
  });
  EXPECT_EQ(read.wait_for(200ms), std::future_status::timeout);  // it waits (if not yet, it will find the flag)
  auto fired = std::make_shared<std::promise<void>>();
  ASSERT_OK_AND_ASSIGN(uint64_t watch, first->WatchTail(kBasin, "s", 2, [fired] { fired->set_value(); }));
  ASSERT_NE(watch, 0u);
  // A front-end's callback runs once, when the process learns it; one
  // replaced before then never runs.
  first->OnSuperseded([&replaced] { ++replaced; });
  first->OnSuperseded([&told] { ++told; });
  EXPECT_EQ(told.load(), 0);
  ASSERT_OK_AND_ASSIGN(auto second, Engine::Open(Options(), store_, meta_));  // the same node
  EXPECT_EQ(read.wait_for(std::chrono::minutes(2)), std::future_status::ready) << "the waiting read was not woken";
  EXPECT_TRUE(first->superseded());
  for (int i = 0; i < 6000 && told.load() == 0; ++i) std::this_thread::sleep_for(10ms);  // it runs last
  EXPECT_EQ(told.load(), 1);
  EXPECT_EQ(replaced.load(), 0);
  // One set later runs at once.
  first->OnSuperseded([&late] { ++late; });
  EXPECT_EQ(late.load(), 1);
  EXPECT_EQ(told.load(), 1);
  EXPECT_EQ(read.get().status().code(), Code::kFenced);
  EXPECT_EQ(fired->get_future().wait_for(std::chrono::minutes(2)), std::future_status::ready);
  EXPECT_EQ(first->TailWatchCount(kBasin, "s"), 0u);
  EXPECT_EQ(first->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20).status().code(), Code::kFenced);
  EXPECT_EQ(first->ReadBatches(kBasin, "s", 0, 1 << 20).status().code(), Code::kFenced);
  EXPECT_EQ(first->Offsets(kBasin, "s").status().code(), Code::kFenced);
  EXPECT_EQ(first->CheckTail(kBasin, "s").status().code(), Code::kFenced);
  EXPECT_EQ(first->GetStream(kBasin, "s").status().code(), Code::kFenced);
  EXPECT_EQ(first->WatchTail(kBasin, "s", 1, [] {}).status().code(), Code::kFenced);
  EXPECT_EQ(first->Append(kBasin, "s", Bodies({"b"})).status.code(), Code::kFenced);
  // The successor serves the record, and appends after it.
  ASSERT_OK_AND_ASSIGN(auto tail, second->CheckTail(kBasin, "s"));
  EXPECT_EQ(tail, 2u);
  EXPECT_TRUE(second->Append(kBasin, "s", Bodies({"b"})).status.ok());
  first->Close();
  second->Close();
}

// A Close that leaves acknowledged records unsettled keeps its heartbeat
// (until it goes stale): another node would serve without them.
TEST_F(EngineTest, ACloseThatLeavesRecordsUnsettledKeepsTheHeartbeat) {
  settle_on_close_ = false;
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  engine_->Close();
  engine_.reset();
  EngineOptions other = Options();
  other.node = "n2";
  EXPECT_EQ(Engine::Open(other, store_, meta_).status().code(), Code::kPreconditionFailed);
  settle_on_close_ = true;
  Start();  // n1 again: replays and settles
  engine_->Close();
  engine_.reset();
  auto n2 = Engine::Open(other, store_, meta_);
  ASSERT_TRUE(n2.ok()) << n2.status().ToString();
  (*n2)->Close();
}

// A node that stopped with acknowledged records unsettled (its heartbeat
// left set) is taken over by the next node to start, whatever its id:
// nothing it acknowledged is lost, new appends follow its records, and it
// replays nothing twice when it starts again.
TEST_F(EngineTest, ANodeOfAnotherIdTakesOverADeadNodesUnsettledRecords) {
  settle_on_close_ = false;
  Restart();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "t", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_OK(engine_->SettleNow());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"b"})).status.ok());
  ASSERT_TRUE(engine_->Append(kBasin, "t", Bodies({"x", "y"})).status.ok());
  engine_->Close();
  engine_.reset();
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  ASSERT_GT(n1.heartbeat_ms, 0);
  std::this_thread::sleep_for(20ms);  // n1's heartbeat goes stale (past n2's window)
  node_ = "n2";
  node_live_window_ = 5ms;
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ReadAll("t"), (std::vector<std::string>{"x", "y"}));
  // n1 was recovered as its own next start would: a new epoch, its chain
  // settled to that epoch's start, its heartbeat cleared.
  ASSERT_OK_AND_ASSIGN(metastore::NodeState after, meta_->GetNode("n1"));
  EXPECT_EQ(after.epoch, n1.epoch + 1);
  EXPECT_EQ(after.checkpoint, (metastore::ChainPosition{n1.epoch + 1, 0}));
  EXPECT_EQ(after.heartbeat_ms, 0);
  // Its slots are settled, so deleted; the poison at the cut stays.
  const std::string slot0 = wal::SlotKey("n1", n1.epoch, 0);
  auto left = store_->List(slot0.substr(0, slot0.rfind('/') + 1), "", 1000);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  ASSERT_EQ(left->objects.size(), 1u);
  EXPECT_EQ(left->objects[0].key, wal::SlotKey("n1", n1.epoch, 3));
  EXPECT_EQ(left->objects[0].size, wal::kEnvelopeSize);
  auto c = engine_->Append(kBasin, "s", Bodies({"c"}));
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(c.ack.start_offset, 2u);
  // n2 stops with "c" unsettled too, and n1 comes back: it takes n2 over in
  // turn, and finds nothing of its own to replay.
  engine_->Close();
  engine_.reset();
  std::this_thread::sleep_for(20ms);
  node_ = "n1";
  settle_on_close_ = true;
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ReadAll("t"), (std::vector<std::string>{"x", "y"}));
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n2, meta_->GetNode("n2"));
  EXPECT_EQ(n2.heartbeat_ms, 0);
  // A node that stopped cleanly (its heartbeat cleared) is left alone.
  Restart();
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n2_again, meta_->GetNode("n2"));
  EXPECT_EQ(n2_again.epoch, n2.epoch);
}

// A node cut off from the metastore (its heartbeat stale) may still run:
// the takeover supersedes it, so it acknowledges and settles nothing more,
// and what it acknowledged before is served by its successor.
TEST_F(EngineTest, ATakeoverFencesTheNodeItTakesOverWhenItStillRuns) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  std::this_thread::sleep_for(20ms);
  EngineOptions other = Options();
  other.node = "n2";
  other.node_live_window = 5ms;
  auto n2 = Engine::Open(other, store_, meta_);
  ASSERT_TRUE(n2.ok()) << n2.status().ToString();
  auto late = engine_->Append(kBasin, "s", Bodies({"late"}));
  EXPECT_EQ(late.status.code(), Code::kFenced) << late.status.ToString();
  EXPECT_FALSE(engine_->SettleNow().ok());
  auto b = (*n2)->Append(kBasin, "s", Bodies({"b"}));
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_EQ(b.ack.start_offset, 1u);
  auto r = (*n2)->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 2u);
  EXPECT_EQ(r->records[0].record.value, "a");
  EXPECT_EQ(r->records[1].record.value, "b");
  (*n2)->Close();
}

// Stale nodes are taken over one after another: while the first is, a later
// one (cut off from the metastore, not yet superseded) may still commit a
// segment; the takeover's sweep must not take that segment for garbage.
TEST_F(EngineTest, ATakeoverSweepsNoSegmentALaterStaleNodeMayStillCommit) {
  engine_->Close();  // n1: a clean stop
  engine_.reset();
  auto hooked3 = std::make_shared<testing::HookedMetastore>(meta_);
  EngineOptions o3 = Options();
  o3.node = "n3";
  auto n3 = Engine::Open(o3, store_, hooked3);
  ASSERT_TRUE(n3.ok()) << n3.status().ToString();
  ASSERT_TRUE((*n3)->Append(kBasin, "s", Bodies({"a"})).status.ok());
  // n3's settle uploads its segment, then waits before committing it.
  std::promise<void> at_commit, release;
  hooked3->before_commit_settle = [&] {
    at_commit.set_value();
    release.get_future().wait();
  };
  std::future<Status> settled = std::async(std::launch::async, [&] { return (*n3)->SettleNow(); });
  bool released = false;
  struct ReleaseOnExit {  // before `settled` waits for n3's settle, whatever failed
    std::promise<void>& p;
    bool& done;
    ~ReleaseOnExit() {
      if (!done) p.set_value();
    }
  } release_on_exit{release, released};
  at_commit.get_future().wait();
  // n1 looks dead too (its heartbeat set by this build, then stale).
  std::this_thread::sleep_for(20ms);
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  ASSERT_OK(meta_->Heartbeat("n1", n1.epoch, 1));
  std::this_thread::sleep_for(20ms);
  // n2 starts: it takes n1 over (minting, replaying, sweeping), and n3's
  // commit lands just before n3's own takeover mints its epoch.
  auto hooked2 = std::make_shared<testing::HookedMetastore>(meta_);
  int mints = 0;
  hooked2->fail_mint = [&]() {
    if (++mints == 3) {  // n2's own, n1's, then n3's
      released = true;
      release.set_value();
      EXPECT_OK(settled.get());
    }
    return Status::Ok();
  };
  node_ = "n2";
  node_live_window_ = 5ms;
  auto n2 = Engine::Open(Options(), store_, hooked2);
  ASSERT_TRUE(n2.ok()) << n2.status().ToString();
  EXPECT_EQ(mints, 3);
  auto r = (*n2)->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].record.value, "a");
  (*n2)->Close();
  (*n3)->Close();
}

// A heartbeat an older build left (schema 6: no takeover flag) is not taken
// over: nodes of other ids may have served since without that node's records.
TEST_F(EngineTest, AHeartbeatAnOlderBuildLeftIsNotTakenOver) {
  settle_on_close_ = false;
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_OK(engine_->SettleNow());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"b"})).status.ok());
  engine_->Close();
  engine_.reset();
  auto sql = std::dynamic_pointer_cast<metastore::SqlMetastore>(meta_);
  ASSERT_NE(sql, nullptr);
  ASSERT_OK(sql->ExecForTest("UPDATE nodes SET takeover = 0"));  // as schema 6 left it
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  std::this_thread::sleep_for(20ms);
  node_ = "n2";
  node_live_window_ = 5ms;
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
  ASSERT_OK_AND_ASSIGN(metastore::NodeState after, meta_->GetNode("n1"));
  EXPECT_EQ(after.epoch, n1.epoch);
  EXPECT_EQ(after.heartbeat_ms, n1.heartbeat_ms);
}

// A takeover that fails fails the start: serving without the dead node's
// records would give their offsets to new appends. The heartbeat stays set,
// and the next start takes the node over.
TEST_F(EngineTest, AStartWhoseTakeoverFailsIsRefused) {
  settle_on_close_ = false;
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  engine_->Close();
  engine_.reset();
  std::this_thread::sleep_for(20ms);
  auto hooked = std::make_shared<testing::HookedMetastore>(meta_);
  int mints = 0;
  hooked->fail_mint = [&mints]() { return ++mints == 2 ? Unavailable("the metastore is busy") : Status::Ok(); };
  node_ = "n2";
  node_live_window_ = 5ms;
  settle_on_close_ = true;
  auto refused = Engine::Open(Options(), store_, hooked);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kUnavailable) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("taking over the unsettled WAL of node n1"), std::string::npos)
      << refused.status().ToString();
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  EXPECT_GT(n1.heartbeat_ms, 0);
  Start();  // n2 again (its own heartbeat, left by the failed start, never stops it)
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
}

// A table's bucket stream with delete_on_empty set (a reconfiguration can
// set it) is passed over by retention without asking the metastore, which
// would refuse it after appends to it were held off for the round trip.
TEST_F(EngineTest, DeleteOnEmptyPassesOverATablesBucketStreams) {
  auto hooked = RestartHooked();
  StreamConfig soon;
  soon.delete_on_empty_min_age_s = 1;
  ASSERT_TRUE(CreateTable("tbl", 1, soon).ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "tbl/1", soon).ok());  // a bucket's name, past the table's buckets
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "tbl/0").ok());
  EXPECT_EQ(engine_->GetStream(kBasin, "tbl/1").status().code(), Code::kNotFound);
  EXPECT_EQ(hooked->delete_empty_stream_calls.load(), 1) << "only the stream no table owns is asked for";
}

// While delete_on_empty deletes a stream, an append is refused as S2's
// stream_deletion_pending (nothing written), not as a plain unavailable.
TEST_F(EngineTest, AnAppendWhileDeleteOnEmptyDeletesTheStreamIsDeletionPending) {
  auto hooked = RestartHooked();
  StreamConfig soon;
  soon.delete_on_empty_min_age_s = 1;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "going", soon).ok());
  std::this_thread::sleep_for(1100ms);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> entered{false};
  hooked->fail_delete = [&entered, released] {
    entered = true;
    released.wait();
    return Status::Ok();
  };
  std::thread retention([&] { EXPECT_TRUE(engine_->ApplyRetention().ok()); });
  for (auto until = std::chrono::steady_clock::now() + 10s; !entered && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(entered.load());
  auto refused = engine_->Append(kBasin, "going", Bodies({"x"}));
  EXPECT_EQ(refused.status.code(), Code::kUnavailable) << refused.status.ToString();
  EXPECT_TRUE(refused.deletion_pending);
  release.set_value();
  retention.join();
  hooked->fail_delete = nullptr;
  EXPECT_EQ(engine_->GetStream(kBasin, "going").status().code(), Code::kNotFound);
  auto gone = engine_->Append(kBasin, "going", Bodies({"x"}));
  EXPECT_EQ(gone.status.code(), Code::kNotFound);
  EXPECT_FALSE(gone.deletion_pending);
}

TEST_F(EngineTest, DeleteOnEmptyDeletesNothingOnceTheNodeIsSuperseded) {
  StreamConfig soon;
  soon.delete_on_empty_min_age_s = 1;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "stale", soon).ok());
  std::this_thread::sleep_for(1100ms);
  // Another incarnation of this node minted the next epoch: this engine's
  // view may be stale, so the metastore refuses the deletion.
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_TRUE(engine_->GetStream(kBasin, "stale").ok());
  EXPECT_TRUE(meta_->GetStream(kBasin, "stale").ok());
  EXPECT_EQ(engine_->metrics().empty_streams_deleted.load(), 0u);
  // The refused deletion left the stream open for appends.
  EXPECT_TRUE(engine_->Append(kBasin, "stale", Bodies({"x"})).status.ok());
}

TEST_F(EngineTest, AReadOfManySmallSegmentsTakesOneGetEachAndAtMost32) {
  std::vector<std::string> all;
  for (int i = 0; i < 40; ++i) {
    all.push_back("r" + std::to_string(i));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());  // a segment per record
  }
  auto counted = RestartCounted();
  const uint64_t before = counted->counters().gets.load();
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->records.size(), 32u);  // Engine::kMaxSegmentsPerRead: the next read goes on
  EXPECT_EQ(counted->counters().gets.load() - before, 32u);  // a small segment is one GET
  std::vector<std::string> got;
  for (uint64_t from = 0; from < all.size();) {
    auto page = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, from}, 1000, 1 << 20);
    ASSERT_TRUE(page.ok() && !page->records.empty());
    for (auto& rec : page->records) got.push_back(rec.record.value.value_or("<null>"));
    from = page->records.back().offset + 1;
  }
  EXPECT_EQ(got, all);
}

// Reads every record of stream `name` page by page.
std::vector<std::string> ReadPaged(Engine& e, const std::string& name) {
  std::vector<std::string> got;
  for (uint64_t from = 0;;) {
    auto page = e.Read(kBasin, name, ReadStart{ReadStart::kOffset, from}, 1000, 1 << 20);
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    if (!page.ok() || page->records.empty()) return got;
    for (auto& rec : page->records) got.push_back(rec.record.value.value_or("<null>"));
    from = page->records.back().offset + 1;
  }
}

TEST_F(EngineTest, MergePassesThatRunOutOfBudgetTakeTheStreamsInTurn) {
  // "a" (the lower id) makes a new run of small segments before every pass,
  // as a busy stream does: a pass starting from the lowest id each time
  // would spend its whole budget there, and "b" would never be merged.
  merge_parts_per_pass_ = 6;  // a run of "a" (5 parts) fits, and leaves too little for "b" (4)
  Restart();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "a", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "b", StreamConfig{}).ok());
  auto settled = [&](const std::string& stream, int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(engine_->Append(kBasin, stream, Bodies({stream + std::to_string(i)})).status.ok());
      ASSERT_TRUE(engine_->SettleNow().ok());
    }
  };
  ASSERT_NO_FATAL_FAILURE(settled("a", 1));
  ASSERT_NO_FATAL_FAILURE(settled("b", 4));
  auto segments_of = [&](const std::string& stream) {
    auto info = engine_->GetStream(kBasin, stream);
    EXPECT_TRUE(info.ok());
    auto found = meta_->FindSegments(info.ok() ? info->info.id : 0, 0, 1000);
    EXPECT_TRUE(found.ok());
    return found.ok() ? found->size() : 0;
  };
  for (int pass = 0; pass < 3; ++pass) {
    ASSERT_NO_FATAL_FAILURE(settled("a", 4));
    ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  }
  EXPECT_EQ(segments_of("b"), 1u) << "b was never merged";
  EXPECT_EQ(ReadAll("b"), (std::vector<std::string>{"b0", "b1", "b2", "b3"}));
}

TEST_F(EngineTest, SmallSegmentsAreMergedIntoOne) {
  std::vector<std::string> all;
  auto append_settled = [&](int n) {
    for (int i = 0; i < n; ++i) {
      all.push_back("r" + std::to_string(all.size()));
      ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
      ASSERT_TRUE(engine_->SettleNow().ok());  // a segment per record
    }
  };
  append_settled(40);
  ASSERT_EQ(CountKeys(*store_, "seg/"), 40u);
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(engine_->metrics().segment_merges.load(), 1u);
  EXPECT_EQ(engine_->metrics().segments_merged.load(), 40u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  auto ts = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 0}, 1, 4096);
  ASSERT_TRUE(ts.ok() && ts->records.size() == 1);
  EXPECT_EQ(ts->records[0].offset, 0u);
  // More small segments join the merged one (still small); a restart reads
  // the index the merges left.
  append_settled(3);
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);  // the start's sweep found nothing to collect
}

// A row naming another stream's object (same offsets): the merge refuses
// it, as reads do, instead of stamping that stream's records with this one's id.
TEST_F(EngineTest, AMergeRefusesAPartThatHoldsAnotherStream) {
  ASSERT_TRUE(engine_->CreateStream(kBasin, "other", StreamConfig{}).ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"mine" + std::to_string(i)})).status.ok());
    ASSERT_TRUE(engine_->Append(kBasin, "other", Bodies({"theirs" + std::to_string(i)})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  auto first_segment = [&](const std::string& stream) {
    auto found = meta_->FindSegments(engine_->GetStream(kBasin, stream)->info.id, 0, 1);
    EXPECT_TRUE(found.ok() && found->size() == 1);
    return found.ok() && !found->empty() ? found->front() : metastore::SegmentInfo{};
  };
  const metastore::SegmentInfo mine = first_segment("s");
  const metastore::SegmentInfo theirs = first_segment("other");
  ASSERT_EQ(mine.start_offset, theirs.start_offset);
  ASSERT_EQ(mine.end_offset, theirs.end_offset);
  ASSERT_OK_AND_ASSIGN(std::string bytes, store_->Get(theirs.object_key));
  ASSERT_TRUE(store_->Put(mine.object_key, bytes).ok());
  Status merged = engine_->MergeSegmentsNow();
  EXPECT_EQ(merged.code(), Code::kCorruption) << merged.ToString();
  EXPECT_NE(merged.message().find("holds stream"), std::string::npos) << merged.ToString();
  ASSERT_OK_AND_ASSIGN(auto rows, meta_->FindSegments(mine.stream_id, 0, 10));
  EXPECT_EQ(rows.size(), 2u) << "the parts were replaced";
}

TEST_F(EngineTest, MergesSpanAtMostAnEighthOfTheRetentionAge) {
  // Retention judges a segment by its newest record: merging a quiet
  // stream's segments without end would keep its oldest records for ever.
  StreamConfig cfg;
  cfg.retention_age_s = 80;  // merged segments span at most 10 s
  ASSERT_TRUE(engine_->CreateStream(kBasin, "quiet", cfg).ok());
  const int64_t t0 = WallMillis() - 40'000;
  for (int64_t at : {0, 5'000, 12'000, 14'000}) {
    auto recs = Bodies({"at" + std::to_string(at)});
    recs[0].timestamp_ms = t0 + at;
    ASSERT_TRUE(engine_->Append(kBasin, "quiet", std::move(recs)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  ASSERT_EQ(CountKeys(*store_, "seg/"), 4u);
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(engine_->metrics().segment_merges.load(), 2u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 2u);
  // And the merged ones do not merge further.
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 2u);
  EXPECT_EQ(ReadPaged(*engine_, "quiet"), (std::vector<std::string>{"at0", "at5000", "at12000", "at14000"}));
}

TEST_F(EngineTest, AMergeSwapThatLandedUnseenIsRecognised) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  std::vector<std::string> all;
  for (int i = 0; i < 5; ++i) {
    all.push_back("r" + std::to_string(i));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  hooked->after_replace_segments = [](Status st) { return st.ok() ? Timeout("the answer was lost") : st; };
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(engine_->metrics().segment_merges.load(), 1u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);  // the parts went, the merged object stays
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
}

TEST_F(EngineTest, ASupersededMergeTakesNoRowsOfItsSuccessor) {
  // A successor settled [3, 5), which this process still holds unsettled:
  // its refused merge must not take those rows, or reads would return the
  // records twice (or fail on the successor's objects).
  std::vector<std::string> all;
  for (int i = 0; i < 5; ++i) {
    all.push_back("r" + std::to_string(i));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
    if (i < 3) {
      ASSERT_TRUE(engine_->SettleNow().ok());  // three small segments
    }
  }
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  auto next = meta_->MintEpoch("n1", node->epoch, node->window);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  auto id = meta_->GetStream(kBasin, "s");
  ASSERT_TRUE(id.ok());
  metastore::SegmentInfo theirs{id->id, 3, 5, 0, 0, "seg/successor-object", 100};
  ASSERT_TRUE(meta_->CommitSettle("n1", next->epoch, next->checkpoint, {next->epoch, 0}, {theirs}, {}).ok());
  EXPECT_FALSE(engine_->MergeSegmentsNow().ok());  // refused: the node is the successor's
  // It serves the stream no more, and the rows are as the successor left them.
  EXPECT_EQ(engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20).status().code(), Code::kFenced);
  ASSERT_OK_AND_ASSIGN(auto rows, meta_->FindSegments(id->id, 0, 100));
  ASSERT_EQ(rows.size(), 4u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i].start_offset, i);
    EXPECT_EQ(rows[i].end_offset, i + 1);
  }
  EXPECT_EQ(rows[3].object_key, theirs.object_key);
  settle_on_close_ = false;
}

// A merge pass whose swap lands but answers a timeout, and whose read-back
// fails too: memory keeps the parts, the metastore has the merged row.
void MergeWhoseSwapLandsUnseen(Engine& engine, testing::HookedMetastore& hooked) {
  hooked.after_replace_segments = [](Status st) { return st.ok() ? Timeout("the answer was lost") : st; };
  hooked.fail_find_segments = [] { return Unavailable("the metastore is away"); };
  EXPECT_FALSE(engine.MergeSegmentsNow().ok());
  hooked.after_replace_segments = nullptr;
  hooked.fail_find_segments = nullptr;
}

TEST_F(EngineTest, AMergeSwapNeverSeenToLandIsAdoptedByTheNextMergeOrRetention) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  std::vector<std::string> all;
  auto append_settled = [&](int n) {
    for (int i = 0; i < n; ++i) {
      all.push_back("r" + std::to_string(all.size()));
      ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
      ASSERT_TRUE(engine_->SettleNow().ok());
    }
  };
  append_settled(5);
  MergeWhoseSwapLandsUnseen(*engine_, *hooked);
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  // The next merge (its run now longer) finds the rows changed and takes the
  // metastore's; the one after it merges again.
  append_settled(2);
  EXPECT_FALSE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
}

TEST_F(EngineTest, RetentionAfterAnUnseenMergeSwapKeepsWhatTheMetastoreNames) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  StreamConfig cfg;
  cfg.retention_age_s = 3600;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "r", cfg).ok());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "r", Bodies({"v" + std::to_string(i)})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  MergeWhoseSwapLandsUnseen(*engine_, *hooked);
  // A trim below the second part: memory would drop the first part, the
  // metastore has one row spanning all four.
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(1)));
  ASSERT_TRUE(engine_->Append(kBasin, "r", std::move(trim)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  // Memory now has the merged row (which nothing removed) and the trim's
  // segment, as the metastore does: the next merge takes both at once.
  auto before = ReadPaged(*engine_, "r");
  EXPECT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(ReadPaged(*engine_, "r"), before);
  settle_on_close_ = false;
  Restart();
  EXPECT_EQ(ReadPaged(*engine_, "r"), before);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
}

// Runs `on_get` (once at a time) before a GET of a segment it names that
// still exists; forwards every call.
class HookedGetStore : public testing::GatedStore {
 public:
  using GatedStore::GatedStore;
  std::function<void()> on_get;
  std::set<std::string> keys;
  Result<std::string> Get(std::string_view key, std::optional<objstore::ByteRange> r = std::nullopt) override {
    if (on_get && keys.count(std::string(key)) != 0 && Head(key).ok() && !in_hook_.exchange(true)) {
      on_get();
      in_hook_ = false;
    }
    return GatedStore::Get(key, r);
  }

 private:
  std::atomic<bool> in_hook_{false};
};

// A read collects its segments, then fetches them; a merge that deletes
// some meanwhile sends it to look again. A pass merges run after run, so
// each look could lose to the next run: three such misses were reported as
// records lost from the store (500, DATA_LOSS, KAFKA_STORAGE_ERROR) though
// the fourth look would have read them all. Misses while the segments
// moved are races, not losses.
TEST_F(EngineTest, AReadRacingMergeAfterMergeIsNotALoss) {
  std::vector<std::string> all;
  auto twelve_parts = [&] {  // one record a segment
    for (int i = 0; i < 12; ++i) {
      all.push_back("r" + std::to_string(all.size()));
      ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
      ASSERT_TRUE(engine_->SettleNow().ok());
    }
  };
  ASSERT_NO_FATAL_FAILURE(twelve_parts());
  auto id = meta_->GetStream(kBasin, "s");
  ASSERT_TRUE(id.ok());
  ASSERT_OK_AND_ASSIGN(auto parts, meta_->FindSegments(id->id, 0, 100));
  ASSERT_EQ(parts.size(), 12u);
  uint64_t largest = 0;
  for (const auto& p : parts) largest = std::max(largest, p.size_bytes);
  // A run closes at four parts, and a pass merges one run.
  merge_small_bytes_ = 4 * (largest - kSegmentFooterSize - kSegmentIndexEntrySize) + kSegmentFooterSize +
                       kSegmentIndexEntrySize;
  merge_parts_per_pass_ = 4;
  auto hooked = std::make_shared<HookedGetStore>(store_);
  for (const auto& p : parts) hooked->keys.insert(p.object_key);
  engine_->Close();
  engine_.reset();
  Start(hooked);
  ASSERT_TRUE(engine_);
  int merges = 0;
  hooked->on_get = [&] {
    if (engine_->MergeSegmentsNow().ok()) ++merges;
  };
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> got;
  for (const auto& rec : r->records) got.push_back(rec.record.value.value_or("<null>"));
  EXPECT_EQ(got, all);
  EXPECT_GE(merges, 3) << "the read did not race three merges";
  hooked->on_get = nullptr;
  // The same for a Kafka fetch's read, over twelve new parts.
  ASSERT_NO_FATAL_FAILURE(twelve_parts());
  ASSERT_OK_AND_ASSIGN(auto more, meta_->FindSegments(id->id, 12, 100));
  ASSERT_EQ(more.size(), 12u);
  for (const auto& p : more) hooked->keys.insert(p.object_key);
  merges = 0;
  hooked->on_get = [&] {
    if (engine_->MergeSegmentsNow().ok()) ++merges;
  };
  auto batches = engine_->ReadBatches(kBasin, "s", 12, 1 << 20);
  ASSERT_TRUE(batches.ok()) << batches.status().ToString();
  EXPECT_EQ(batches->batches.size(), 12u);
  EXPECT_GE(merges, 3) << "the fetch did not race three merges";
  hooked->on_get = nullptr;
}

// A successor's merge or retention deletes what this process's memory still
// names: before this process learns it was superseded, a read that misses
// such an object is no loss of its records (not kCorruption).
TEST_F(EngineTest, AMissAfterASuccessorTookTheNodeIsNoLoss) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());  // a successor
  auto id = meta_->GetStream(kBasin, "s");
  ASSERT_TRUE(id.ok());
  ASSERT_OK_AND_ASSIGN(auto rows, meta_->FindSegments(id->id, 0, 10));
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_OK(store_->Delete(rows[0].object_key));  // its retention, say
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  // Nor is the stream missing (REST's 404, which clients take as final):
  // the reader is told the node is another process's now (503).
  EXPECT_EQ(r.status().code(), Code::kFenced) << r.status().ToString();
  auto batches = engine_->ReadBatches(kBasin, "s", 0, 1 << 20);
  EXPECT_EQ(batches.status().code(), Code::kFenced) << batches.status().ToString();
  settle_on_close_ = false;
}

// A miss the metastore cannot judge (it is unreachable when asked whether
// a successor took the node) is a retryable outage, not records lost.
TEST_F(EngineTest, AMissTheMetastoreCannotJudgeIsUnavailableNotLoss) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto id = meta_->GetStream(kBasin, "s");
  ASSERT_TRUE(id.ok());
  ASSERT_OK_AND_ASSIGN(auto rows, meta_->FindSegments(id->id, 0, 10));
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_OK(store_->Delete(rows[0].object_key));
  hooked->fail_get_node = [] { return Unavailable("injected: the metastore is unreachable"); };
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  hooked->fail_get_node = nullptr;
  // Once it answers (and no successor took the node), the loss is reported.
  r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  settle_on_close_ = false;
}

TEST_F(EngineTest, ASupersededNodeMergesNothing) {
  std::vector<std::string> all;
  for (int i = 0; i < 5; ++i) {
    all.push_back("r" + std::to_string(i));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  // A successor mints the node's next epoch (and is loading these rows).
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());
  EXPECT_EQ(engine_->MergeSegmentsNow().code(), Code::kPreconditionFailed);
  EXPECT_EQ(engine_->metrics().segment_merges.load(), 0u);
  // Its parts kept, and its merged object too: segment keys carry an epoch,
  // not the node id, so a start that took the node over (another id, at an
  // epoch of its own equal to ours) may write the same key, take its 412 for
  // an earlier attempt of its own and index it. The next start's sweep
  // decides.
  EXPECT_EQ(CountKeys(*store_, "seg/"), 6u) << "deleted what a successor may name";
  // It serves the stream no more; a successor serves every record.
  EXPECT_EQ(engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20).status().code(), Code::kFenced);
  ASSERT_OK_AND_ASSIGN(auto successor, Engine::Open(Options(), store_, meta_));
  EXPECT_EQ(ReadPaged(*successor, "s"), all);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 5u) << "the successor's start did not sweep it";
  successor->Close();
}

// Fails the first PUT of a key under `prefix` (retryable, nothing stored),
// then forwards every PUT.
class FailFirstPutStore : public testing::GatedStore {
 public:
  FailFirstPutStore(std::shared_ptr<objstore::ObjectStore> inner, std::string prefix)
      : GatedStore(std::move(inner)), prefix_(std::move(prefix)) {}
  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& o = {}) override {
    if (key.starts_with(prefix_) && !failed_.exchange(true)) return Unavailable("injected: {}", key);
    return GatedStore::Put(key, data, o);
  }
  bool failed() const { return failed_; }

 private:
  std::string prefix_;
  std::atomic<bool> failed_{false};
};

TEST_F(EngineTest, TheFinalSettleRetriesASegmentPutThatFailedOnce) {
  // Close's settle retries as any round does: one failed PUT does not leave
  // the heartbeat set (a clean stop turned into a crash's replay).
  auto failing = std::make_shared<FailFirstPutStore>(store_, "seg/");
  engine_->Close();
  engine_.reset();
  Start(failing);
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  engine_->Close();
  engine_.reset();
  EXPECT_TRUE(failing->failed());
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  EXPECT_EQ(n1.heartbeat_ms, 0) << "a segment PUT that failed once left the final settle undone";
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
}

TEST_F(EngineTest, TheFinalSettleReadsBackACommitWhoseAnswerWasLost) {
  // The commit lands but its answer is lost: the final settle asks the
  // metastore (it did not before, the engine being closed) and clears the
  // heartbeat once it knows.
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  std::atomic<int> lost{1};
  hooked->after_commit_settle = [&](Status st) {
    return st.ok() && lost.fetch_sub(1) > 0 ? Unavailable("injected: the answer was lost") : st;
  };
  engine_->Close();
  engine_.reset();
  EXPECT_EQ(lost.load(), 0);
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  EXPECT_EQ(n1.heartbeat_ms, 0) << "a commit whose answer was lost left the final settle unknown";
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
}

TEST_F(EngineTest, ASupersedingStartDuringRecoveryDoesNotRaceTheStreamsLoading) {
  // The heartbeat thread runs during recovery: a beat refused because
  // another start minted the next epoch walks the streams (MarkSuperseded)
  // while recovery is still loading them. (The ThreadSanitizer step reports
  // the race without the lock; here the start must end either way.)
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  engine_->Close();
  engine_.reset();
  auto hooked = std::make_shared<testing::HookedMetastore>(meta_);
  std::promise<void> asked;
  std::atomic<bool> told{false};
  hooked->fail_get_node = [&] {
    if (!told.exchange(true)) asked.set_value();
    return Status::Ok();
  };
  hooked->after_list_stream_states = [&] {
    auto node = meta_->GetNode("n1");
    ASSERT_TRUE(node.ok());
    ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());  // another start
    // The loading goes on once the refused beat has asked who holds the node.
    EXPECT_EQ(asked.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  };
  EngineOptions o = Options();
  o.heartbeat_interval = 1ms;
  auto opened = Engine::Open(o, store_, hooked);
  if (opened.ok()) {
    EXPECT_TRUE((*opened)->superseded());
    (*opened)->Close();
  }
  hooked->fail_get_node = nullptr;
  settle_on_close_ = false;
}

// A start superseded while it replays: the successor (minted after it)
// fenced the chain, settled and deleted its first slots, so this start's
// walk meets a deleted slot. The slots past it are the successor's to
// replay: this start deletes none of them as garbage, and fails.
TEST_F(EngineTest, AStartSupersededWhileItReplaysDeletesNoSlotItsSuccessorNeeds) {
  settle_on_close_ = false;
  Restart();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"r" + std::to_string(i)})).status.ok());
  const uint64_t epoch = engine_->epoch();
  engine_->Close();
  engine_.reset();
  for (uint64_t seq = 0; seq < 10; ++seq) ASSERT_TRUE(store_->Head(wal::SlotKey("n1", epoch, seq)).ok()) << seq;
  auto hooked = std::make_shared<testing::HookedMetastore>(meta_);
  hooked->after_list_stream_states = [&] {
    auto node = meta_->GetNode("n1");
    ASSERT_TRUE(node.ok());
    ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());  // the successor
    // ... which settled slots 0 to 4 and deleted them.
    for (uint64_t seq = 0; seq < 5; ++seq) ASSERT_TRUE(store_->Delete(wal::SlotKey("n1", epoch, seq)).ok());
  };
  auto opened = Engine::Open(Options(), store_, hooked);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Code::kFenced) << opened.status().ToString();
  for (uint64_t seq = 5; seq < 10; ++seq) {
    EXPECT_TRUE(store_->Head(wal::SlotKey("n1", epoch, seq)).ok()) << "slot " << seq << " was deleted";
  }
}

TEST_F(EngineTest, TablesAreReadFromTheMetastoreOnlyAfterAChange) {
  // Kafka Metadata and every Flight call ask for a table: from memory until
  // a table change ends (a missing table too), not a metastore read each.
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  std::atomic<int> reads{0};
  hooked->fail_get_table = [&] {
    ++reads;
    return Status::Ok();
  };
  ASSERT_TRUE(CreateTable("t", 2, StreamConfig{}).ok());
  reads = 0;
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK_AND_ASSIGN(auto t, engine_->GetTable(kBasin, "t"));
    EXPECT_EQ(t.bucket_count, 2u);
    EXPECT_EQ(engine_->GetTable(kBasin, "none").status().code(), Code::kNotFound);
  }
  EXPECT_EQ(reads.load(), 2);
  // A name no table could have is looked up each time (not remembered).
  const std::string huge(4096, 'h');
  for (int i = 0; i < 3; ++i) EXPECT_EQ(engine_->GetTable(kBasin, huge).status().code(), Code::kNotFound);
  EXPECT_EQ(reads.load(), 5);
  ASSERT_TRUE(engine_->AddTableBuckets(kBasin, "t", 3).ok());
  ASSERT_OK_AND_ASSIGN(auto grown, engine_->GetTable(kBasin, "t"));
  EXPECT_EQ(grown.bucket_count, 3u);
  ASSERT_TRUE(engine_->DeleteTable(kBasin, "t").ok());
  EXPECT_EQ(engine_->GetTable(kBasin, "t").status().code(), Code::kNotFound);
  // A failed read is not remembered.
  hooked->fail_get_table = [] { return Unavailable("injected"); };
  EXPECT_EQ(engine_->GetTable(kBasin, "u").status().code(), Code::kUnavailable);
  hooked->fail_get_table = nullptr;
  EXPECT_EQ(engine_->GetTable(kBasin, "u").status().code(), Code::kNotFound);
}

TEST_F(EngineTest, AReadOfAnObjectMissingForGoodIsCorruptionNotAMissingStream) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto segs = store_->List("seg/", "", 1000);
  ASSERT_TRUE(segs.ok());
  ASSERT_EQ(segs->objects.size(), 1u);
  ASSERT_TRUE(store_->Delete(segs->objects[0].key).ok());
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  auto b = engine_->ReadBatches(kBasin, "s", 0, 1 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kCorruption) << b.status().ToString();
  // A stream that is gone is still "not found".
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "s").ok());
  EXPECT_EQ(engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20).status().code(),
            Code::kNotFound);
}

TEST_F(EngineTest, ASupersededProcessStopsSettlingOnceItKnows) {
  // Each round would upload the unsettled batches as segments, be refused,
  // and delete them: once the refusal shows a successor, no more rounds.
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  std::atomic<int> commits{0};
  hooked->after_commit_settle = [&](Status st) {
    commits++;
    return st;
  };
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());
  EXPECT_EQ(engine_->SettleNow().code(), Code::kPreconditionFailed);
  EXPECT_EQ(commits.load(), 1);
  // The refused round's segment stays for the next start's sweep (as a
  // superseded merge's object: a successor may name its key).
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u) << "deleted what a successor may name";
  EXPECT_EQ(engine_->SettleNow().code(), Code::kPreconditionFailed);
  EXPECT_EQ(engine_->MergeSegmentsNow().code(), Code::kPreconditionFailed);
  EXPECT_EQ(engine_->ApplyRetention().code(), Code::kPreconditionFailed);
  EXPECT_EQ(commits.load(), 1) << "a superseded process settled again";
  settle_on_close_ = false;
}

TEST_F(EngineTest, MergesStopAtTheSizeTheyAimForAndLeaveLargerSegmentsAlone) {
  merge_small_bytes_ = 1024;
  Restart();
  std::vector<std::string> all;
  for (int i = 0; i < 30; ++i) {
    all.push_back(std::string(100, static_cast<char>('a' + i % 26)));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  all.push_back(std::string(2000, 'L'));  // one segment over the size: never merged
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({all.back()})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  const size_t after_first = CountKeys(*store_, "seg/");
  EXPECT_GT(after_first, 2u);   // runs closed at about 1 KiB each
  EXPECT_LT(after_first, 31u);
  EXPECT_EQ(ReadPaged(*engine_, "s"), all);
  // What was merged is no longer small: a second call changes nothing.
  const uint64_t merges = engine_->metrics().segment_merges.load();
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(engine_->metrics().segment_merges.load(), merges);
}

TEST_F(EngineTest, ASupersededNodeTrimsAndDeletesNothing) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(2)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  const size_t segments = CountKeys(*store_, "seg/");
  // A successor takes the node: what it loaded must stay readable.
  auto node = meta_->GetNode("n1");
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE(meta_->MintEpoch("n1", node->epoch, node->window).ok());
  EXPECT_FALSE(engine_->superseded());
  EXPECT_EQ(engine_->TrimTo(kBasin, "s", 3).status().code(), Code::kUnavailable);  // the metastore refuses
  EXPECT_TRUE(engine_->superseded());  // and it knows from then on
  EXPECT_FALSE(engine_->ApplyRetention().ok());
  EXPECT_EQ(engine_->metrics().segments_deleted.load(), 0u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), segments);
  EXPECT_EQ(engine_->TrimTo(kBasin, "s", 3).status().code(), Code::kFenced);  // it knows now
}

TEST_F(EngineTest, RetentionGoesOnPastATransactionItCannotCommit) {
  retention_streams_per_txn_ = 1;
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->CreateStream(kBasin, "t", StreamConfig{}).ok());
  for (const char* name : {"s", "t"}) {
    ASSERT_TRUE(engine_->Append(kBasin, name, Bodies({"a"})).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
    std::vector<AppendRecord> trim;
    trim.push_back(Command("trim", Be64(1)));
    ASSERT_TRUE(engine_->Append(kBasin, name, std::move(trim)).status.ok());
  }
  const uint64_t s_id = engine_->GetStream(kBasin, "s")->info.id;
  const size_t segments = CountKeys(*store_, "seg/");
  hooked->fail_delete_segments = [&](uint64_t id) { return id == s_id ? Unavailable("down") : Status::Ok(); };
  EXPECT_FALSE(engine_->ApplyRetention().ok());
  EXPECT_EQ(engine_->metrics().segments_deleted.load(), 1u);  // t's
  hooked->fail_delete_segments = nullptr;
  EXPECT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(engine_->metrics().segments_deleted.load(), 2u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), segments - 2);
}

TEST_F(EngineTest, RetentionCutsManyStreamsInOneTransaction) {
  retention_streams_per_txn_ = 3;
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) {
    names.push_back("cut-" + std::to_string(i));
    ASSERT_TRUE(engine_->CreateStream(kBasin, names.back(), StreamConfig{}).ok());
    ASSERT_TRUE(engine_->Append(kBasin, names.back(), Bodies({"old"})).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());
  for (const std::string& name : names) {
    ASSERT_TRUE(engine_->Append(kBasin, name, Bodies({"new"})).status.ok());
    std::vector<AppendRecord> trim;
    trim.push_back(Command("trim", Be64(1)));
    ASSERT_TRUE(engine_->Append(kBasin, name, std::move(trim)).status.ok());
  }
  ASSERT_TRUE(engine_->SettleNow().ok());
  const size_t segments = CountKeys(*store_, "seg/");
  const uint64_t txns = meta_->counters().transactions.load();
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(hooked->delete_segments_calls.load(), 3);  // 7 streams, 3 per transaction
  EXPECT_EQ(meta_->counters().transactions.load() - txns, 3u);
  EXPECT_EQ(engine_->metrics().segments_deleted.load(), 7u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), segments - 7);
  for (const std::string& name : names) EXPECT_EQ(ReadAll(name, 1), (std::vector<std::string>{"new", Be64(1)})) << name;
  // Nothing left to cut: no transaction.
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(hooked->delete_segments_calls.load(), 3);
}

// Rows removed with the answer lost: the next pass finds nothing to remove,
// takes the metastore's rows, and deletes the objects no row names any more.
TEST_F(EngineTest, RetentionDeletesTheObjectsOfRowsRemovedWithTheAnswerLost) {
  auto hooked = RestartHooked();
  ASSERT_TRUE(engine_);
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"b"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(1)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  const size_t segments = CountKeys(*store_, "seg/");
  hooked->map_delete_segments_answer = [](Status) { return Unavailable("the answer was lost"); };
  EXPECT_FALSE(engine_->ApplyRetention().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), segments);
  hooked->map_delete_segments_answer = nullptr;
  EXPECT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), segments - 1);
  EXPECT_EQ(engine_->metrics().segments_deleted.load(), 1u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"b", Be64(1)}));
}

TEST_F(EngineTest, RetentionAndTrimDeleteSettledSegments) {
  StreamConfig cfg;
  cfg.retention_age_s = 60;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "ret", cfg).ok());
  auto old = Bodies({"old1", "old2"});
  for (auto& r : old) r.timestamp_ms = WallMillis() - 3600 * 1000;
  ASSERT_TRUE(engine_->Append(kBasin, "ret", std::move(old)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->Append(kBasin, "ret", Bodies({"new"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b", "c"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(3)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 3u);
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(engine_->metrics().segments_deleted.load(), 2u);
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
  EXPECT_EQ(ReadAll("ret"), (std::vector<std::string>{"new"}));
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1000);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].offset, 3u);
  Restart();
  EXPECT_EQ(ReadAll("ret"), (std::vector<std::string>{"new"}));
}

TEST_F(EngineTest, RetentionDeletesNothingBelowATrimThatIsNotDurableYet) {
  auto gated = RestartGated();
  const uint64_t epoch = engine_->epoch();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a", "b", "c"})).status.ok());  // slot 0
  ASSERT_OK(engine_->SettleNow());
  ASSERT_EQ(CountKeys(*store_, "seg/"), 1u);
  const std::string slot1 = wal::SlotKey("n1", epoch, 1);
  gated->Gate(slot1);
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(3)));
  std::promise<AppendOutcome> done;
  engine_->AppendAsync(kBasin, "s", std::move(trim), {}, [&](AppendOutcome o) { done.set_value(std::move(o)); });
  ASSERT_TRUE(gated->WaitBlocked(slot1));
  // The trim is not durable: its append could still fail, so the segment stays.
  ASSERT_OK(engine_->ApplyRetention());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 1u);
  gated->Open(slot1);
  ASSERT_TRUE(done.get_future().get().status.ok());
  ASSERT_OK(engine_->ApplyRetention());
  EXPECT_EQ(CountKeys(*store_, "seg/"), 0u);
}

TEST_F(EngineTest, ConcurrentAppendsReadsAndSettles) {
  cache_bytes_ = 8 << 10;  // most reads go to WAL slots or segments
  Restart();
  const int streams = 4;
  for (int i = 0; i < streams; ++i) ASSERT_TRUE(engine_->CreateStream(kBasin, "c" + std::to_string(i), StreamConfig{}).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  // One appender per stream, so record k of stream i is at offset k.
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 150; ++k) {
        auto o = engine_->Append(kBasin, "c" + std::to_string(i), Bodies({"c" + std::to_string(i) + "-" + std::to_string(k)}));
        if (!o.status.ok() || o.ack.start_offset != static_cast<uint64_t>(k)) ++errors;
      }
    });
  }
  std::thread settler([&] {
    while (!stop) {
      if (!engine_->SettleNow().ok()) ++errors;
      std::this_thread::sleep_for(2ms);
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(static_cast<uint32_t>(r));
      while (!stop) {
        int i = static_cast<int>(rng() % streams);
        auto tail = engine_->CheckTail(kBasin, "c" + std::to_string(i));
        if (!tail.ok() || *tail == 0) continue;
        uint64_t from = rng() % *tail;
        auto got = engine_->Read(kBasin, "c" + std::to_string(i), ReadStart{ReadStart::kOffset, from}, 50, 1 << 20);
        if (!got.ok()) {
          ADD_FAILURE() << got.status().ToString();
          ++errors;
          continue;
        }
        for (size_t j = 0; j < got->records.size(); ++j) {
          const auto& rec = got->records[j];
          if (rec.offset != from + j || rec.record.value != "c" + std::to_string(i) + "-" + std::to_string(rec.offset)) {
            ++errors;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  // The settler's rounds count once they settle something: let one run
  // before stopping it (the appends may all land between two of its turns).
  for (int i = 0; i < 6000 && engine_->metrics().settle_cycles.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  stop = true;
  settler.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_TRUE(engine_->SettleNow().ok());
  for (int i = 0; i < streams; ++i) EXPECT_EQ(ReadAll("c" + std::to_string(i)).size(), 150u);
  EXPECT_GT(engine_->metrics().settle_cycles.load(), 1u);
}

TEST_F(EngineTest, PipelinedAppendsOnOneStreamShareASlot) {
  auto gated = RestartGated();
  uint64_t epoch = engine_->epoch();
  const std::string slot0 = wal::SlotKey("n1", epoch, 0);
  gated->Gate(slot0);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<AppendOutcome> outs;
  auto collect = [&](AppendOutcome o) {
    std::lock_guard lk(mu);
    outs.push_back(std::move(o));
    cv.notify_all();
  };
  engine_->AppendAsync(kBasin, "s", Bodies({"first"}), {}, collect);
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  for (int i = 0; i < 20; ++i) engine_->AppendAsync(kBasin, "s", Bodies({"p" + std::to_string(i)}), {}, collect);
  gated->Open(slot0);
  std::unique_lock lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, 60s, [&] { return outs.size() == 21; }));
  for (size_t i = 0; i < outs.size(); ++i) {
    ASSERT_TRUE(outs[i].status.ok());
    EXPECT_EQ(outs[i].ack.start_offset, i) << "acks in offset order";
  }
  // While slot 0 was stuck at most 7 more slots could be claimed (window 8),
  // so the 20 pipelined appends shared slots: at most 9 slots for 21 appends.
  EXPECT_LE(engine_->wal().metrics().slots.load(), 9u);
}

TEST_F(EngineTest, StartSweepsObjectsNoCommittedStateNames) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"b"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  uint64_t id = engine_->GetStream(kBasin, "s")->info.id;
  uint64_t epoch = engine_->epoch();
  // Left behind by a crash: an uncommitted segment and a settled flight that
  // was never deleted.
  const std::string orphan = SegmentKey(id, 2, 9, epoch);
  ASSERT_TRUE(store_->Put(orphan, "partial").ok());
  const std::string stale = wal::SlotKey("n1", epoch, 0);
  ASSERT_TRUE(store_->Put(stale, std::string(100, 'f')).ok());
  // And a segment of a stream deleted since (its settle round committed
  // after the delete, which skipped its row); a segment of a stream newer
  // than any this start knows (made by another process) stays.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "gone", StreamConfig{}).ok());
  const uint64_t gone_id = engine_->GetStream(kBasin, "gone")->info.id;
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "gone").ok());
  ASSERT_TRUE(engine_->CreateStream(kBasin, "last", StreamConfig{}).ok());
  const std::string of_deleted = SegmentKey(gone_id, 0, 3, epoch);
  ASSERT_TRUE(store_->Put(of_deleted, "gone").ok());
  // The stream with the largest id ever allocated, deleted too.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "newest", StreamConfig{}).ok());
  const uint64_t newest_id = engine_->GetStream(kBasin, "newest")->info.id;
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "newest").ok());
  const std::string of_newest_deleted = SegmentKey(newest_id, 0, 3, epoch);
  ASSERT_TRUE(store_->Put(of_newest_deleted, "gone too").ok());
  const std::string of_newer = SegmentKey(newest_id + 1, 0, 3, epoch);
  ASSERT_TRUE(store_->Put(of_newer, "newer").ok());
  // A successor of the restarted process may commit a segment while the
  // restart's sweep lists: one of an epoch at or above its own stays.
  const std::string of_successor = SegmentKey(id, 2, 9, epoch + 10);
  ASSERT_TRUE(store_->Put(of_successor, "a successor's").ok());
  Restart();
  Restart();
  EXPECT_TRUE(store_->Head(of_successor).ok());
  EXPECT_EQ(store_->Head(orphan).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Head(stale).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Head(of_deleted).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Head(of_newest_deleted).status().code(), Code::kNotFound);
  EXPECT_TRUE(store_->Head(of_newer).ok());
  // The poisons each recovery wrote into the epochs it fenced stay.
  auto page = store_->List("wal/n1/", "", 1000);
  ASSERT_TRUE(page.ok());
  size_t poisons = 0;
  for (const auto& obj : page->objects) poisons += obj.size == wal::kEnvelopeSize;
  EXPECT_EQ(poisons, 2u);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a", "b"}));
}

// An append the WAL failed at close (close_timeout) may still land past the
// settled checkpoint: the node's heartbeat stays set, so the next start
// replays it before anything else serves the stream.
TEST_F(EngineTest, ACloseThatFailedAppendsLeavesTheHeartbeatSet) {
  engine_->Close();
  engine_.reset();
  auto gated = std::make_shared<testing::GatedStore>(store_);
  EngineOptions o = Options();
  o.wal.close_timeout = 200ms;
  auto opened = Engine::Open(o, gated, meta_);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> e = std::move(*opened);
  // Slot 0's PUT lands, then its answer is held.
  const std::string slot0 = wal::SlotKey("n1", e->epoch(), 0);
  gated->Gate(slot0, /*after_apply=*/true);
  std::shared_ptr<void> open_gate(nullptr, [&](void*) { gated->Open(slot0); });
  std::promise<AppendOutcome> pending;
  e->AppendAsync(kBasin, "s", Bodies({"x"}), {}, [&](AppendOutcome out) { pending.set_value(std::move(out)); });
  ASSERT_TRUE(gated->WaitBlocked(slot0));
  auto closed = std::async(std::launch::async, [&] { e->Close(); });
  AppendOutcome out = pending.get_future().get();  // failed after close_timeout
  EXPECT_EQ(out.status.code(), Code::kUnavailable) << out.status.ToString();
  gated->Open(slot0);
  closed.wait();
  e.reset();
  ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
  EXPECT_NE(n1.heartbeat_ms, 0) << "the heartbeat was cleared while a failed append had landed";
  // The restart replays what landed.
  Start();
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"x"}));
  // A clean close clears it.
  engine_->Close();
  engine_.reset();
  ASSERT_OK_AND_ASSIGN(n1, meta_->GetNode("n1"));
  EXPECT_EQ(n1.heartbeat_ms, 0);
  Start();
}

// Calls `on_list` before each listing of the inner store.
class ListHookStore : public testing::GatedStore {
 public:
  using GatedStore::GatedStore;
  std::function<void(std::string_view prefix)> on_list;
  Result<objstore::ListPage> List(std::string_view p, std::string_view s = {}, size_t m = 1000) override {
    if (on_list) on_list(p);
    return GatedStore::List(p, s, m);
  }
};

// Segment keys carry an epoch but no node id: a start whose node is taken
// over while its sweep lists (a successor minted the node's next epoch and
// may commit segments of its own epochs) deletes no segment object.
TEST_F(EngineTest, ASweepSupersededWhileItListsDeletesNoSegment) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"a"})).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  const uint64_t id = engine_->GetStream(kBasin, "s")->info.id;
  // Named by no row, of an epoch below the next start's: to that start it
  // looks like a crash's leftover.
  const std::string unnamed = SegmentKey(id, 1, 9, engine_->epoch());
  ASSERT_OK(store_->Put(unnamed, "a successor's, or garbage"));
  engine_->Close();
  engine_.reset();
  auto hooked = std::make_shared<ListHookStore>(store_);
  bool minted = false;
  hooked->on_list = [&](std::string_view prefix) {
    if (prefix != "seg/" || minted) return;
    minted = true;
    ASSERT_OK_AND_ASSIGN(metastore::NodeState n1, meta_->GetNode("n1"));
    ASSERT_OK(meta_->MintEpoch("n1", n1.epoch, 8, /*minter=*/12345).status());
  };
  Start(hooked);
  EXPECT_TRUE(minted);
  EXPECT_TRUE(store_->Head(unnamed).ok()) << "a superseded start deleted a segment it could not judge";
  // A start that keeps its epoch deletes it.
  engine_->Close();
  engine_.reset();
  Start();
  EXPECT_EQ(store_->Head(unnamed).status().code(), Code::kNotFound);
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"a"}));
}

TEST_F(EngineTest, ReadsSpanSegmentsAndTheWal) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"v" + std::to_string(i)})).status.ok());
    if (i % 2 == 1) {
      ASSERT_TRUE(engine_->SettleNow().ok());
    }
  }
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"v4"})).status.ok());
  EXPECT_EQ(ReadAll("s"), (std::vector<std::string>{"v0", "v1", "v2", "v3", "v4"}));
  EXPECT_EQ(ReadAll("s", 3), (std::vector<std::string>{"v3", "v4"}));
  auto ts = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTailOffset, 4}, 2, 1000);
  ASSERT_TRUE(ts.ok());
  ASSERT_EQ(ts->records.size(), 2u);
  EXPECT_EQ(ts->records[0].offset, 1u);
}

// ---- Raw RecordBatches (the Kafka front-end) ----------------------------------

// A batch as a Kafka producer builds it: base offset 0, its own timestamps.
std::string KafkaBatch(std::vector<std::string> values, int64_t ts = 1000, int64_t pid = -1, int16_t epoch = -1,
                       int32_t seq = -1) {
  std::vector<wal::Record> recs;
  for (size_t i = 0; i < values.size(); ++i) {
    wal::Record r;
    r.timestamp = ts + static_cast<int64_t>(i);
    r.key = "k" + std::to_string(i);
    r.value = values[i];
    recs.push_back(std::move(r));
  }
  wal::EncodeOptions o;
  o.producer_id = pid;
  o.producer_epoch = epoch;
  o.base_sequence = seq;
  std::string out;
  EXPECT_TRUE(wal::EncodeRecordBatch(recs, o, &out).ok());
  return out;
}

AppendOutcome AppendRaw(Engine& e, const std::string& stream, std::string batch) {
  std::promise<AppendOutcome> done;
  e.AppendBatchAsync(kBasin, stream, std::move(batch), [&](AppendOutcome o) { done.set_value(std::move(o)); });
  return done.get_future().get();
}

// Kafka producers may send NO_TIMESTAMP (-1): retention took such a
// segment for one from 1970 and deleted it at its next pass. Kafka ages it
// by its file's time; here it goes with the first later segment that
// expires (its records came before that one's).
TEST_F(EngineTest, ASegmentWithoutTimestampsIsKeptUntilALaterOneExpires) {
  StreamConfig expiring;
  expiring.retention_age_s = 60;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "nt", expiring).ok());
  auto log_start = [&] { return engine_->GetStream(kBasin, "nt")->log_start; };
  ASSERT_TRUE(AppendRaw(*engine_, "nt", KafkaBatch({"untimed"}, -1)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(ReadAll("nt"), (std::vector<std::string>{"untimed"})) << "deleted as if it were from 1970";
  // A later segment that expires takes it along.
  ASSERT_TRUE(AppendRaw(*engine_, "nt", KafkaBatch({"old"}, WallMillis() - 3'600'000)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(log_start(), 2u);
  // One before a segment that has not expired stays.
  ASSERT_TRUE(AppendRaw(*engine_, "nt", KafkaBatch({"untimed too"}, -1)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(AppendRaw(*engine_, "nt", KafkaBatch({"new"}, WallMillis())).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  ASSERT_TRUE(engine_->ApplyRetention().ok());
  EXPECT_EQ(log_start(), 2u);
  EXPECT_EQ(ReadAll("nt", 2), (std::vector<std::string>{"untimed too", "new"}));
}

TEST_F(EngineTest, AReadByTimeStartsAtTheFirstRecordAtOrAfterItAndSkipsNoneAfter) {
  // Kafka producers' clocks need not agree: timestamps 100, 90, 110.
  for (int64_t ts : {100, 90, 110}) {
    ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"x"}, ts)).status.ok());
  }
  for (bool settled : {false, true}) {
    if (settled) {
      ASSERT_TRUE(engine_->SettleNow().ok());
    }
    auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 95}, 10, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<int64_t> got;
    for (const auto& rec : r->records) got.push_back(rec.record.timestamp);
    EXPECT_EQ(got, (std::vector<int64_t>{100, 90, 110})) << "settled " << settled;
    // A time past every record's (even past INT64_MAX) starts at the tail.
    auto late = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, UINT64_MAX}, 10, 1 << 20);
    ASSERT_TRUE(late.ok()) << late.status().ToString();
    EXPECT_TRUE(late->records.empty());
  }
}

TEST_F(EngineTest, AReadByTimeSeeksOnlyUntilItsFirstRecord) {
  // Segment 1 holds the first record at or after 150; segment 2 (over 64 KiB,
  // so its time index has several entries) starts with older records. All of
  // them follow the first match and must be read.
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"x"}, 100)).status.ok());
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"first"}, 150)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  const std::string kib(1024, 'o');
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({kib}, 50)).status.ok());
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"late"}, 300)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 150}, 1000, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 102u);
  EXPECT_EQ(r->records.front().offset, 1u);
  EXPECT_EQ(r->records[1].offset, 2u);
  EXPECT_EQ(r->records.back().record.value, "late");
}

// A run of small segments merges once its newest record is merge_min_age
// old, wherever in the run that record is (producers' times need not grow).
TEST_F(EngineTest, AMergeWaitsForTheNewestRecordOfItsRunNotOfItsLastSegment) {
  merge_min_age_ = std::chrono::minutes(10);
  Restart();
  ASSERT_TRUE(engine_->CreateStream(kBasin, "aged", StreamConfig{}).ok());
  const int64_t now = WallMillis();
  const int64_t hour_ago = now - 3'600'000;
  for (auto [stream, first] : {std::pair{"s", now}, std::pair{"aged", hour_ago}}) {
    ASSERT_TRUE(AppendRaw(*engine_, stream, KafkaBatch({"first"}, first)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
    ASSERT_TRUE(AppendRaw(*engine_, stream, KafkaBatch({"older"}, hour_ago - 1000)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  ASSERT_EQ(CountKeys(*store_, "seg/"), 4u);
  ASSERT_TRUE(engine_->MergeSegmentsNow().ok());
  EXPECT_EQ(engine_->metrics().segment_merges.load(), 1u) << "only the stream whose records are all old";
  EXPECT_EQ(CountKeys(*store_, "seg/"), 3u);
  EXPECT_EQ(ReadPaged(*engine_, "s"), (std::vector<std::string>{"first", "older"}));
  EXPECT_EQ(ReadPaged(*engine_, "aged"), (std::vector<std::string>{"first", "older"}));
}

// A read by time whose only record at or after the time lies below the
// trim point (producer times out of order) fetches the segment it starts
// in, not every later segment up to the tail: those hold only older records.
TEST_F(EngineTest, AReadByTimePassesOverSegmentsOfOlderRecords) {
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"a"}, 100)).status.ok());
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"late"}, 500)).status.ok());
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"b"}, 100)).status.ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"old"}, 100)).status.ok());
    ASSERT_TRUE(engine_->SettleNow().ok());
  }
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"unsettled"}, 100)).status.ok());
  ASSERT_TRUE(engine_->TrimTo(kBasin, "s", 2).ok());
  auto counted = RestartCounted();
  const uint64_t before = counted->counters().gets.load();
  // (A limit of one record: the first pass collects the first segment only.)
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 400}, 1, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->records.empty());
  EXPECT_EQ(r->tail, 14u);
  EXPECT_LE(counted->counters().gets.load() - before, 1u);
  // Unchanged where the records are: a later one reaching the time is found.
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"newest"}, 450)).status.ok());
  r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 400}, 10, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_EQ(r->records[0].offset, 14u);
}

// The segment a read by time starts in is found through the segments'
// running newest time (their times go back and forth here) after each way
// the segment list changes: settles, retention, a merge, a restart's load.
TEST_F(EngineTest, AReadByTimeFindsItsSegmentAsTheSegmentListChanges) {
  // Times a minute ago (older ones would be past the stream's retention age).
  const int64_t base = WallMillis() - 60'000;
  for (int64_t ts : {100, 40, 300, 200}) {
    ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"x"}, base + ts)).status.ok());
    ASSERT_OK(engine_->SettleNow());
  }
  auto first_at = [&](int64_t t) -> int64_t {
    auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, static_cast<uint64_t>(base + t)}, 1, 4096);
    if (!r.ok()) {
      ADD_FAILURE() << r.status().ToString();
      return -2;
    }
    return r->records.empty() ? -1 : static_cast<int64_t>(r->records[0].offset);
  };
  EXPECT_EQ(first_at(30), 0);
  EXPECT_EQ(first_at(100), 0);
  EXPECT_EQ(first_at(101), 2);  // not 1 (40) nor 3 (200, later): 2 holds 300
  EXPECT_EQ(first_at(250), 2);
  EXPECT_EQ(first_at(301), -1);
  // Retention takes [0, 1): the 100 no longer hides the 40.
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(1)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  ASSERT_OK(engine_->SettleNow());
  ASSERT_OK(engine_->ApplyRetention());
  EXPECT_EQ(first_at(30), 1);
  EXPECT_EQ(first_at(41), 2);
  EXPECT_EQ(first_at(201), 2);
  // Merged into one segment (newest time: the trim command's, now), then loaded again.
  ASSERT_OK(engine_->MergeSegmentsNow());
  EXPECT_GT(engine_->metrics().segment_merges.load(), 0u);
  for (bool restarted : {false, true}) {
    if (restarted) Restart();
    EXPECT_EQ(first_at(30), 1) << "restarted " << restarted;
    EXPECT_EQ(first_at(41), 2) << "restarted " << restarted;
    EXPECT_EQ(first_at(250), 2) << "restarted " << restarted;
  }
}

TEST_F(EngineTest, ABatchMaxTimestampIsTheRecordsLargest) {
  // A producer's header says 0 (or anything) while its records run 5000..5002:
  // lookups and retention go by the records, as in Kafka.
  std::string lying = KafkaBatch({"a", "b", "c"}, 5000);
  wal::SetCreateTime(&lying, 0);
  ASSERT_TRUE(wal::VerifyBatch(lying).ok());
  auto o = AppendRaw(*engine_, "s", lying);
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(o.ack.last_timestamp_ms, 5002);
  for (bool settled : {false, true}) {
    if (settled) {
      ASSERT_TRUE(engine_->SettleNow().ok());
    }
    auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kTimestamp, 5001}, 10, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->records.size(), 2u) << "settled " << settled;
    EXPECT_EQ(r->records[0].offset, 1u);
    EXPECT_EQ(r->tail_timestamp_ms, 5002);
  }
}

TEST_F(EngineTest, AProducersLogAppendTimeBitIsClearedOnACreateTimeStream) {
  // The bit tells readers to take maxTimestamp for every record; on a
  // CreateTime stream a producer cannot choose the records' times that way.
  std::string stamped = KafkaBatch({"a", "b"}, 5000);
  wal::SetLogAppendTime(&stamped, 999999);
  ASSERT_TRUE(wal::VerifyBatch(stamped).ok());
  auto o = AppendRaw(*engine_, "s", stamped);
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(o.ack.last_timestamp_ms, 5001);
  EXPECT_FALSE(o.ack.log_append_time);
  auto r = engine_->ReadBatches(kBasin, "s", 0, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->batches.size(), 1u);
  auto h = wal::VerifyBatch(*r->batches[0]);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->attributes & wal::kTimestampLogAppendTime, 0);
  EXPECT_EQ(h->max_timestamp, 5001);
  auto read = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->records.size(), 2u);
  EXPECT_EQ(read->records[0].record.timestamp, 5000);
}

TEST_F(EngineTest, RawBatchesAreStoredAsSentWithOffsetsAssigned) {
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"rest"})).status.ok());
  std::string sent = KafkaBatch({"a", "b", "c"});
  auto o = AppendRaw(*engine_, "s", sent);
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(o.ack.start_offset, 1u);
  EXPECT_EQ(o.ack.end_offset, 4u);
  EXPECT_EQ(o.ack.first_timestamp_ms, 1000);
  EXPECT_EQ(o.ack.last_timestamp_ms, 1002);
  EXPECT_EQ(o.ack.log_start, 0u);
  // Byte for byte as sent, but for the base offset (outside the CRC).
  auto r = engine_->ReadBatches(kBasin, "s", 2, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->batches.size(), 1u);  // the batch holding offset 2
  std::string expect = sent;
  wal::SetBaseOffset(&expect, 0, 1);
  EXPECT_EQ(*r->batches[0], expect);
  EXPECT_EQ(r->tail, 4u);
  // And the records are readable as S2 records, keys and timestamps intact.
  auto rec = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 1}, 10, 1 << 20);
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->records.size(), 3u);
  EXPECT_EQ(rec->records[1].record.key, "k1");
  EXPECT_EQ(rec->records[1].record.value, "b");
  EXPECT_EQ(rec->records[1].record.timestamp, 1001);
  // All batches from 0, and survive settle + restart.
  ASSERT_TRUE(engine_->SettleNow().ok());
  Restart();
  r = engine_->ReadBatches(kBasin, "s", 0, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->batches.size(), 2u);
  EXPECT_EQ(*r->batches[1], expect);
  // Without a producer id, epoch and sequence are ignored (kafkajs sends 0, 0).
  auto plain = AppendRaw(*engine_, "s", KafkaBatch({"d"}, 2000, -1, 0, 0));
  ASSERT_TRUE(plain.status.ok()) << plain.status.ToString();
  EXPECT_EQ(plain.ack.start_offset, 4u);
}

TEST_F(EngineTest, RawBatchesAreVerified) {
  auto one_plain_record = [] {
    wal::Record r;
    r.value = "plain";
    r.headers.push_back(wal::RecordHeader{"h", "v"});
    return r;
  };
  std::string good = KafkaBatch({"a"});
  std::string bad_crc = good;
  bad_crc.back() ^= 1;
  EXPECT_EQ(AppendRaw(*engine_, "s", bad_crc).status.code(), Code::kCorruption);
  EXPECT_EQ(AppendRaw(*engine_, "s", good + "x").status.code(), Code::kInvalidArgument);
  EXPECT_EQ(AppendRaw(*engine_, "s", good.substr(0, 40)).status.code(), Code::kCorruption);
  std::vector<wal::Record> cmd(1);
  cmd[0].value = "tok";
  cmd[0].headers.push_back(wal::RecordHeader{"", "fence"});
  std::string cmd_batch;
  ASSERT_TRUE(wal::EncodeRecordBatch(cmd, {}, &cmd_batch).ok());
  EXPECT_EQ(AppendRaw(*engine_, "s", cmd_batch).status.code(), Code::kInvalidArgument);
  // Compressed too (it would read as a command never applied), also behind other records.
  cmd.insert(cmd.begin(), one_plain_record());
  for (int16_t codec = 1; codec <= 4; ++codec) {
    wal::EncodeOptions zipped;
    zipped.attributes = codec;
    std::string compressed;
    ASSERT_TRUE(wal::EncodeRecordBatch(cmd, zipped, &compressed).ok()) << codec;
    auto refused = AppendRaw(*engine_, "s", compressed);
    EXPECT_EQ(refused.status.code(), Code::kInvalidArgument) << codec << " " << refused.status.ToString();
  }
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 0u);
  std::vector<wal::Record> one(1);
  one[0].value = "v";
  std::string txn;
  wal::EncodeOptions eo;
  eo.attributes = wal::kTransactionalFlag;
  eo.producer_id = 5;
  eo.producer_epoch = 0;
  eo.base_sequence = 0;
  ASSERT_TRUE(wal::EncodeRecordBatch(one, eo, &txn).ok());
  EXPECT_EQ(AppendRaw(*engine_, "s", txn).status.code(), Code::kNotSupported);
  EXPECT_EQ(AppendRaw(*engine_, "missing", good).status.code(), Code::kNotFound);
  // A right CRC over wrong records: the records are checked too (Kafka's
  // broker does), so no reader ever meets a batch it cannot decode.
  auto recrc = [](std::string b) {
    StoreBE32(b.data() + 17, Crc32c(b.data() + 21, b.size() - 21));
    return b;
  };
  std::string miscounted = good;
  StoreBE32(miscounted.data() + 23, 1);  // lastOffsetDelta 1 and
  StoreBE32(miscounted.data() + 57, 2);  // recordCount 2, with one record present
  // (Built wrong rather than damaged: kInvalidArgument, Kafka's INVALID_RECORD.)
  EXPECT_EQ(AppendRaw(*engine_, "s", recrc(miscounted)).status.code(), Code::kInvalidArgument);
  for (int32_t count : {-1, 0}) {  // negative (or zero, so lastOffsetDelta -1) counts, under a right CRC
    std::string negative = good;
    StoreBE32(negative.data() + 23, static_cast<uint32_t>(count - 1));
    StoreBE32(negative.data() + 57, static_cast<uint32_t>(count));
    EXPECT_EQ(AppendRaw(*engine_, "s", recrc(negative)).status.code(), Code::kInvalidArgument) << count;
  }
  std::string zstd;
  eo = {};
  eo.attributes = wal::kCodecZstd;
  ASSERT_TRUE(wal::EncodeRecordBatch(one, eo, &zstd).ok());
  std::string garbled = zstd;
  std::fill(garbled.begin() + wal::kRecordBatchHeaderSize, garbled.end(), '\xff');  // not zstd at all
  EXPECT_EQ(AppendRaw(*engine_, "s", recrc(garbled)).status.code(), Code::kInvalidArgument);
  // Nothing of the above changed the stream.
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 0u);
  EXPECT_EQ(engine_->GetStream(kBasin, "s")->fencing_token, "");
}

TEST_F(EngineTest, RawBatchIdempotence) {
  auto first = AppendRaw(*engine_, "s", KafkaBatch({"a", "b"}, 1000, 42, 0, 0));
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  auto second = AppendRaw(*engine_, "s", KafkaBatch({"c"}, 1000, 42, 0, 2));
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(second.ack.start_offset, 2u);
  // A retry returns the original offsets and appends nothing.
  auto retry = AppendRaw(*engine_, "s", KafkaBatch({"a", "b"}, 1000, 42, 0, 0));
  ASSERT_TRUE(retry.status.ok());
  EXPECT_TRUE(retry.ack.duplicated);
  EXPECT_EQ(retry.ack.start_offset, 0u);
  EXPECT_EQ(retry.ack.end_offset, 2u);
  // A gap is out of order; an older epoch is fenced; an unknown producer may
  // start anywhere (Kafka since KIP-360).
  auto gap = AppendRaw(*engine_, "s", KafkaBatch({"x"}, 1000, 42, 0, 7));
  EXPECT_EQ(gap.status.code(), Code::kOutOfRange);
  ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({"d"}, 1000, 42, 1, 0)).status.ok());
  auto stale = AppendRaw(*engine_, "s", KafkaBatch({"e"}, 1000, 42, 0, 3));
  EXPECT_EQ(stale.status.code(), Code::kFenced);
  EXPECT_TRUE(stale.producer_fenced);
  auto unknown = AppendRaw(*engine_, "s", KafkaBatch({"y"}, 1000, 77, 0, 5));
  ASSERT_TRUE(unknown.status.ok()) << unknown.status.ToString();
  EXPECT_EQ(unknown.ack.start_offset, 4u);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), 5u);
  // The window survives a restart (replayed from the batches' own headers).
  Restart();
  auto again = AppendRaw(*engine_, "s", KafkaBatch({"d"}, 1000, 42, 1, 0));
  ASSERT_TRUE(again.status.ok());
  EXPECT_TRUE(again.ack.duplicated);
  EXPECT_EQ(again.ack.start_offset, 3u);
}

TEST_F(EngineTest, ArrivalStreamsStampRawBatchesWithLogAppendTime) {
  StreamConfig cfg;
  cfg.timestamping = TimestampingMode::kArrival;
  ASSERT_TRUE(engine_->CreateStream(kBasin, "arrival", cfg).ok());
  int64_t before = WallMillis();
  auto o = AppendRaw(*engine_, "arrival", KafkaBatch({"a", "b"}, 5));
  ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_GE(o.ack.last_timestamp_ms, before);
  auto r = engine_->ReadBatches(kBasin, "arrival", 0, 1 << 20);
  ASSERT_TRUE(r.ok());
  auto h = wal::VerifyBatch(*r->batches[0]);  // resealed: the CRC still holds
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->attributes & wal::kTimestampLogAppendTime);
  auto rec = engine_->Read(kBasin, "arrival", ReadStart{ReadStart::kOffset, 0}, 10, 1 << 20);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->records[0].record.timestamp, o.ack.last_timestamp_ms);
  // An idempotent retry gets the original's stamp back, as Kafka answers.
  std::string idem = KafkaBatch({"c"}, 5, /*pid=*/9, /*epoch=*/0, /*seq=*/0);
  auto first = AppendRaw(*engine_, "arrival", idem);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  auto again = AppendRaw(*engine_, "arrival", idem);
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_TRUE(again.ack.duplicated);
  EXPECT_TRUE(again.ack.log_append_time);
  EXPECT_EQ(again.ack.last_timestamp_ms, first.ack.last_timestamp_ms);
}

TEST_F(EngineTest, ReadBatchesBoundsAndLimits) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({std::string(100, 'a' + i)})).status.ok());
  EXPECT_EQ(engine_->ReadBatches(kBasin, "s", 6, 100).status().code(), Code::kOutOfRange);
  auto at_tail = engine_->ReadBatches(kBasin, "s", 5, 100);
  ASSERT_TRUE(at_tail.ok());
  EXPECT_TRUE(at_tail->batches.empty());
  // At least one batch even when it exceeds max_bytes; then whole batches within it.
  auto one = engine_->ReadBatches(kBasin, "s", 0, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->batches.size(), 1u);
  auto two = engine_->ReadBatches(kBasin, "s", 1, 2 * one->batches[0]->size());
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->batches.size(), 2u);
  // Below the trim point is out of range; the log start moves.
  std::vector<AppendRecord> trim;
  trim.push_back(Command("trim", Be64(3)));
  ASSERT_TRUE(engine_->Append(kBasin, "s", std::move(trim)).status.ok());
  EXPECT_EQ(engine_->ReadBatches(kBasin, "s", 2, 100).status().code(), Code::kOutOfRange);
  auto offs = engine_->Offsets(kBasin, "s");
  ASSERT_TRUE(offs.ok());
  EXPECT_EQ(offs->log_start, 3u);
  EXPECT_EQ(offs->tail, 6u);
}

TEST_F(EngineTest, TablesCreateAndDeleteTheirBucketStreams) {
  metastore::TableInfo t;
  t.basin = kBasin;
  t.name = "orders";
  t.bucket_count = 3;
  t.config = "{}";
  auto created = engine_->CreateTable(t, StreamConfig{});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->bucket_count, 3u);
  EXPECT_EQ(engine_->CreateTable(t, StreamConfig{}).status().code(), Code::kAlreadyExists);
  t.name = "a/b";
  EXPECT_EQ(engine_->CreateTable(t, StreamConfig{}).status().code(), Code::kInvalidArgument);
  // Each bucket is an ordinary stream, appendable at once and after a restart.
  ASSERT_TRUE(AppendRaw(*engine_, "orders/2", KafkaBatch({"x"})).status.ok());
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "orders/2", Bodies({"y"})).status.ok());
  EXPECT_EQ(ReadAll("orders/2"), (std::vector<std::string>{"x", "y"}));
  auto tables = engine_->ListTables(kBasin, "", "", 10);
  ASSERT_TRUE(tables.ok());
  ASSERT_EQ(tables->size(), 1u);
  EXPECT_EQ(engine_->DeleteStream(kBasin, "orders/0").code(), Code::kPreconditionFailed);
  ASSERT_TRUE(engine_->DeleteTable(kBasin, "orders").ok());
  EXPECT_EQ(engine_->CheckTail(kBasin, "orders/2").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->GetTable(kBasin, "orders").status().code(), Code::kNotFound);
  EXPECT_EQ(engine_->DeleteTable(kBasin, "orders").code(), Code::kNotFound);
  Restart();
  EXPECT_EQ(engine_->CheckTail(kBasin, "orders/0").status().code(), Code::kNotFound);
}

TEST_F(EngineTest, TheBacklogIsBoundedInBatchesToo) {
  // Tiny batches take little slot space but an index entry each in memory.
  max_unsettled_batches_ = 5;
  admission_timeout_ = 50ms;
  Restart();
  size_t accepted = 0;
  Status refused;
  for (int i = 0; i < 20 && refused.ok(); ++i) {
    auto a = engine_->Append(kBasin, "s", Bodies({"t"}));
    if (a.status.ok()) {
      ++accepted;
    } else {
      refused = a.status;
    }
  }
  ASSERT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("6 batches"), std::string::npos) << refused.message();
  EXPECT_EQ(accepted, 6u);
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_TRUE(engine_->Append(kBasin, "s", Bodies({"after settle"})).status.ok());
}

// A producer's retry of a batch already in its window needs no room: under
// backpressure it is answered at once, not after the admission timeout.
TEST_F(EngineTest, AProducersRetryIsAnsweredWithoutWaitingForAdmission) {
  max_unsettled_bytes_ = 4000;
  admission_timeout_ = 50ms;
  Restart();
  auto pid = engine_->AllocateProducerId();
  ASSERT_TRUE(pid.ok());
  AppendOptions o;
  o.producer = ProducerRef{*pid, 0, 0};
  const std::string body(1000, 'x');
  auto first = engine_->Append(kBasin, "s", Bodies({body}), o);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  auto kafka_first = AppendRaw(*engine_, "s", KafkaBatch({"k"}, 1000, static_cast<int64_t>(*pid), 0, 1));
  ASSERT_TRUE(kafka_first.status.ok()) << kafka_first.status.ToString();
  Status refused;
  for (int i = 0; i < 20 && refused.ok(); ++i) refused = engine_->Append(kBasin, "s", Bodies({body})).status;
  ASSERT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  ASSERT_TRUE(engine_->AdmissionMayWait(1000));
  auto retry = engine_->Append(kBasin, "s", Bodies({body}), o);
  ASSERT_TRUE(retry.status.ok()) << retry.status.ToString();
  EXPECT_TRUE(retry.ack.duplicated);
  EXPECT_EQ(retry.ack.start_offset, first.ack.start_offset);
  auto kafka_retry = AppendRaw(*engine_, "s", KafkaBatch({"k"}, 1000, static_cast<int64_t>(*pid), 0, 1));
  ASSERT_TRUE(kafka_retry.status.ok()) << kafka_retry.status.ToString();
  EXPECT_TRUE(kafka_retry.ack.duplicated);
  EXPECT_EQ(kafka_retry.ack.start_offset, kafka_first.ack.start_offset);
  // A new batch of the producer still waits for room.
  o.producer->seq = 2;
  EXPECT_EQ(engine_->Append(kBasin, "s", Bodies({body}), o).status.code(), Code::kResourceExhausted);
}

// Admission waited for without blocking (front-ends whose threads must not
// wait): TryAdmission holds room in the WAL pool for the appends given its
// ticket, which are then admitted without waiting while others are refused;
// WhenAdmissible looks until there is room, the deadline passes or the
// caller gives up.
TEST_F(EngineTest, AdmissionWaitedForWithoutBlockingHoldsItsRoom) {
  wal_budget_ = 1 << 20;
  Restart();
  const size_t big = 420 << 10;
  auto t1 = engine_->TryAdmission(big, 1);
  auto t2 = engine_->TryAdmission(big, 1);
  ASSERT_NE(t1, nullptr);
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(engine_->TryAdmission(big, 1), nullptr);  // 840 KiB held of 1 MiB
  const std::string body(200 << 10, 'x');  // (a slot holds 256 KiB)
  AppendOptions no_wait;
  no_wait.may_wait = false;
  EXPECT_EQ(engine_->Append(kBasin, "s", Bodies({body}), no_wait).status.code(), Code::kResourceExhausted);
  AppendOptions with_ticket = no_wait;
  with_ticket.ticket = t1;
  auto admitted = engine_->Append(kBasin, "s", Bodies({body}), with_ticket);
  ASSERT_TRUE(admitted.status.ok()) << admitted.status.ToString();
  // Larger than the whole pool: a ticket without room (the append is refused at once).
  auto huge = engine_->TryAdmission(2 << 20, 1);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(huge->Take(2 << 20), std::nullopt);
  EXPECT_FALSE(huge->has_room());
  // Appends that never fit the pool together wait in groups that do (at least one each).
  const std::vector<size_t> rooms{big, big, big, 2 << 20, 10};
  auto room_of = [&](size_t i) { return rooms[i]; };
  auto g = engine_->NextAdmissionGroup(0, rooms.size(), room_of);
  EXPECT_EQ(g.end, 2u);
  EXPECT_EQ(g.bytes, 2 * big);
  EXPECT_EQ(engine_->NextAdmissionGroup(2, rooms.size(), room_of).end, 3u);
  EXPECT_EQ(engine_->NextAdmissionGroup(3, rooms.size(), room_of).end, 4u);  // too large alone: refused later
  EXPECT_EQ(engine_->NextAdmissionGroup(4, rooms.size(), room_of).end, 5u);

  // WhenAdmissible, with a timer of threads the test joins.
  std::mutex mu;
  std::vector<std::thread> timers;
  auto after = [&](Duration delay, std::function<void()> fn) {
    std::lock_guard lk(mu);
    timers.emplace_back([delay, fn = std::move(fn)] {
      std::this_thread::sleep_for(delay);
      fn();
    });
  };
  auto wait = [&](TimePoint deadline, std::function<bool()> abandon) {
    auto p = std::make_shared<std::promise<std::pair<Engine::AdmissionWait, std::shared_ptr<AdmissionTicket>>>>();
    auto f = p->get_future();
    engine_->WhenAdmissible(big, 1, deadline, after, std::move(abandon),
                            [p](Engine::AdmissionWait how, std::shared_ptr<AdmissionTicket> t) {
                              p->set_value({how, std::move(t)});
                            });
    return f;
  };
  t1.reset();  // what the append did not use goes back (its own room once its slot is released)
  with_ticket.ticket.reset();
  std::shared_ptr<AdmissionTicket> t3;
  for (auto until = Now() + 30s; !t3 && Now() < until; std::this_thread::sleep_for(1ms)) {
    t3 = engine_->TryAdmission(big, 1);
  }
  ASSERT_NE(t3, nullptr);  // t2 and t3 hold the pool again
  auto room = wait(Now() + 60s, nullptr);
  EXPECT_EQ(room.wait_for(200ms), std::future_status::timeout);  // (a wrong early answer shows here)
  t2.reset();
  ASSERT_EQ(room.wait_for(30s), std::future_status::ready);
  auto [how, ticket] = room.get();
  EXPECT_EQ(how, Engine::AdmissionWait::kRoom);
  ASSERT_NE(ticket, nullptr);
  EXPECT_EQ(ticket->Take(big + 1), std::nullopt);  // only room that covers the append
  auto taken = ticket->Take(big);
  EXPECT_NE(taken, std::nullopt);
  EXPECT_EQ(ticket->Take(1), std::nullopt);  // all of it taken
  auto expired = wait(Now(), nullptr);  // t3 and the room taken hold the pool
  ASSERT_EQ(expired.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(expired.get().first, Engine::AdmissionWait::kExpired);
  auto abandoned = wait(Now() + 60s, [] { return true; });
  ASSERT_EQ(abandoned.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(abandoned.get().first, Engine::AdmissionWait::kAbandoned);
  std::vector<std::thread> joined;
  {
    std::lock_guard lk(mu);
    joined.swap(timers);
  }
  for (auto& t : joined) t.join();
}

// A caller on an I/O thread asks not to wait: with no room now, the batch
// is refused at once (retriable), whatever the admission timeout.
TEST_F(EngineTest, AnAppendThatMayNotWaitIsRefusedAtOnceWithoutRoom) {
  max_unsettled_bytes_ = 4000;
  admission_timeout_ = 60s;
  Restart();
  uint64_t appended = 0;
  for (; appended < 20 && !engine_->AdmissionMayWait(1000); ++appended) {
    ASSERT_TRUE(AppendRaw(*engine_, "s", KafkaBatch({std::string(1000, 'x')})).status.ok());
  }
  ASSERT_TRUE(engine_->AdmissionMayWait(1000));
  std::promise<AppendOutcome> done;
  auto answer = done.get_future();
  engine_->AppendBatchAsync(kBasin, "s", KafkaBatch({"y"}), [&](AppendOutcome o) { done.set_value(std::move(o)); },
                            /*may_wait=*/false);
  ASSERT_EQ(answer.wait_for(20s), std::future_status::ready) << "the append waited for admission";
  EXPECT_EQ(answer.get().status.code(), Code::kResourceExhausted);
  // Records (REST) alike.
  AppendOptions no_wait;
  no_wait.may_wait = false;
  std::promise<AppendOutcome> records_done;
  auto records_answer = records_done.get_future();
  engine_->AppendAsync(kBasin, "s", Bodies({"z"}), no_wait,
                       [&](AppendOutcome o) { records_done.set_value(std::move(o)); });
  ASSERT_EQ(records_answer.wait_for(20s), std::future_status::ready) << "the append waited for admission";
  EXPECT_EQ(records_answer.get().status.code(), Code::kResourceExhausted);
  EXPECT_EQ(*engine_->CheckTail(kBasin, "s"), appended);
  ASSERT_TRUE(engine_->SettleNow().ok());
  std::promise<AppendOutcome> again;
  engine_->AppendBatchAsync(kBasin, "s", KafkaBatch({"y"}), [&](AppendOutcome o) { again.set_value(std::move(o)); },
                            /*may_wait=*/false);
  EXPECT_TRUE(again.get_future().get().status.ok());
}

// A settle that falls behind slows writers: past max_unsettled_bytes appends
// wait, then fail with kResourceExhausted and change nothing; settling (or
// deleting the stream that holds the backlog) lets them through again.
TEST_F(EngineTest, AppendsWaitForSettleWhenTheBacklogIsFull) {
  max_unsettled_bytes_ = 4000;
  admission_timeout_ = 50ms;
  Restart();
  const std::string body(1000, 'x');
  size_t accepted = 0;
  Status refused;
  for (int i = 0; i < 20 && refused.ok(); ++i) {
    auto a = engine_->Append(kBasin, "s", Bodies({body}));
    if (a.status.ok()) {
      ++accepted;
    } else {
      refused = a.status;
    }
  }
  ASSERT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("not yet settled"), std::string::npos) << refused.message();
  EXPECT_GE(accepted, 3u);
  EXPECT_GT(engine_->unsettled_bytes(), 4000u);
  EXPECT_EQ(engine_->metrics().settle_backlog_timeouts.load(), 1u);
  EXPECT_EQ(ReadAll("s").size(), accepted);  // the refused append left nothing

  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_EQ(engine_->unsettled_bytes(), 0u);
  auto after = engine_->Append(kBasin, "s", Bodies({"after settle"}));
  ASSERT_TRUE(after.status.ok()) << after.status.ToString();
  EXPECT_EQ(after.ack.start_offset, accepted);

  // A waiting append is let through as soon as the backlog shrinks.
  admission_timeout_ = 30s;
  Restart();
  while (engine_->unsettled_bytes() <= 4000) {
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({body})).status.ok());
  }
  std::thread settler([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(engine_->SettleNow().ok());
  });
  auto waited = engine_->Append(kBasin, "s", Bodies({"waited"}));
  settler.join();
  EXPECT_TRUE(waited.status.ok()) << waited.status.ToString();

  // Deleting a stream drops its backlog.
  ASSERT_TRUE(engine_->CreateStream(kBasin, "gone", StreamConfig{}).ok());
  ASSERT_TRUE(engine_->SettleNow().ok());
  while (engine_->unsettled_bytes() <= 4000) {
    ASSERT_TRUE(engine_->Append(kBasin, "gone", Bodies({body})).status.ok());
  }
  ASSERT_TRUE(engine_->DeleteStream(kBasin, "gone").ok());
  EXPECT_EQ(engine_->unsettled_bytes(), 0u);
  EXPECT_TRUE(engine_->Append(kBasin, "s", Bodies({"room again"})).status.ok());
}


// A settle whose batches fell out of the cache reads them back from their
// slots in rounds of about log_cache_bytes each, and still settles all.
TEST_F(EngineTest, SettleReadsEvictedBatchesBackInBoundedRounds) {
  cache_bytes_ = 4096;
  Restart();
  const std::string body(1000, 'r');
  std::vector<std::string> want;
  for (int i = 0; i < 40; ++i) {
    want.push_back(body + std::to_string(i));
    ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({want.back()})).status.ok());
  }
  // The eviction thread drops them from the cache (acks never wait for it).
  for (int i = 0; i < 6000 && engine_->cached_bytes() > 4096; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_LE(engine_->cached_bytes(), 4096u);
  const uint64_t cycles = engine_->metrics().settle_cycles.load();
  ASSERT_TRUE(engine_->SettleNow().ok());
  EXPECT_GT(engine_->metrics().settle_reread_bytes.load(), 30000u);
  // ~40 KB read back, at most ~4 KB (plus one slot) per round.
  EXPECT_GE(engine_->metrics().settle_cycles.load() - cycles, 5u);
  EXPECT_EQ(engine_->unsettled_bytes(), 0u);
  EXPECT_EQ(ReadAll("s"), want);
  Restart();
  EXPECT_EQ(ReadAll("s"), want);
}

// A batch read back from its WAL slot (evicted from the cache, not settled)
// whose baseOffset was damaged in the store: the batch's CRC does not cover
// it, so the read checks the offsets itself (as segment reads do) and fails,
// rather than serving the records at other offsets or skipping them.
TEST_F(EngineTest, ABatchReadBackAtTheWrongOffsetIsCorruption) {
  cache_bytes_ = 4096;
  Restart();
  const std::string body(1000, 'r');
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({body + std::to_string(i)})).status.ok());
  for (int i = 0; i < 6000 && engine_->cached_bytes() > 4096; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_LE(engine_->cached_bytes(), 4096u);
  // Batch 3 (offset 3, evicted) in its slot: its header starts with the
  // baseOffset, then the length, the leader epoch and magic 2.
  auto slots = store_->List("wal/", "", 1000);
  ASSERT_TRUE(slots.ok());
  bool damaged = false;
  for (const auto& o : slots->objects) {
    std::string bytes = *store_->Get(o.key);
    const size_t rec = bytes.find(body + "3");
    if (rec == std::string::npos) continue;
    for (size_t at = rec; at-- > 0 && !damaged;) {
      auto h = wal::ParseBatchHeader(std::string_view(bytes).substr(at));
      if (!h.ok() || h->base_offset != 3 || at + h->total_size() < rec) continue;
      bytes[at + 7] = 1;  // baseOffset 1
      ASSERT_OK(store_->Put(o.key, bytes));
      damaged = true;
    }
  }
  ASSERT_TRUE(damaged) << "batch 3 was not found in a WAL slot";
  auto r = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 2}, 100, 1 << 20);
  EXPECT_EQ(r.status().code(), Code::kCorruption) << (r.ok() ? "read " + std::to_string(r->records.size()) : "");
  auto batches = engine_->ReadBatches(kBasin, "s", 3, 1 << 20);
  EXPECT_EQ(batches.status().code(), Code::kCorruption);
  // Reads before it are served.
  auto before = engine_->Read(kBasin, "s", ReadStart{ReadStart::kOffset, 0}, 2, 1 << 20);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ(before->records.size(), 2u);
}

// A producer's batch that fits the WAL pool but no slot (a small
// --max-slot-bytes) is refused as too large and not written: Kafka answers
// MESSAGE_TOO_LARGE (it was INVALID_RECORD, and a retry of a batch refused
// as it reached the WAL was taken for possibly written).
TEST_F(EngineTest, ABatchLargerThanASlotIsTooLargeAndNotWritten) {
  wal_budget_ = 1 << 20;  // slots of 256 KiB
  Restart();
  ASSERT_TRUE(engine_->Append(kBasin, "s", Bodies({"first"})).status.ok());
  const AppendOutcome o = AppendRaw(*engine_, "s", KafkaBatch({std::string(300 << 10, 'b')}));
  EXPECT_EQ(o.status.code(), Code::kInvalidArgument) << o.status.ToString();
  EXPECT_TRUE(o.too_large);
  EXPECT_TRUE(o.not_admitted);
  EXPECT_EQ(ReadAll("s"), std::vector<std::string>{"first"});
  // The stream goes on at the next offset.
  const AppendOutcome next = AppendRaw(*engine_, "s", KafkaBatch({"second"}));
  ASSERT_TRUE(next.status.ok()) << next.status.ToString();
  EXPECT_EQ(next.ack.start_offset, 1u);
}

}  // namespace
}  // namespace weir::log
