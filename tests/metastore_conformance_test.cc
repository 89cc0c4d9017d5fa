// One conformance suite, run against every Metastore backend. To cover a new
// backend, add one factory to Backends() below. The postgres backend runs on
// the server of CTest's "pg" fixture (tests/pg/pg-start.sh), found through
// WEIR_TEST_POSTGRES_ENV; without it, its cases skip.
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <latch>
#include <limits>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "pg_test_env.h"
#include "test_support.h"
#include "metastore/metastore.h"
#include "metastore/sqlite_db.h"

namespace weir::metastore {
namespace {

namespace fs = std::filesystem;

using TempDir = ::weir::testing::TempDir;

constexpr EpochCheck kNoNode{};  // acts for no node: no epoch check

// One backend under test: the metastore plus whatever it lives in.
struct BackendEnv {
  std::unique_ptr<TempDir> dir;  // destroyed after the metastore (declared first)
  std::string uri;               // reopens the same data; empty if the backend is not persistent
  std::shared_ptr<Metastore> meta;
};

struct BackendFactory {
  std::string name;
  // Returns an env with a null metastore to skip (e.g. postgres not configured).
  std::function<BackendEnv()> make;
  // Optional: with the metastore closed, marks the stored schema as newer than
  // this build understands.
  std::function<void(const BackendEnv&)> bump_schema_version;
};

BackendEnv OpenEnv(std::unique_ptr<TempDir> dir, std::string uri, bool persistent) {
  auto meta = OpenMetastore(uri);
  if (!meta.ok()) {
    ADD_FAILURE() << uri << ": " << meta.status().ToString();
    return BackendEnv{std::move(dir), "", nullptr};
  }
  return BackendEnv{std::move(dir), persistent ? uri : "", *meta};
}

void SqliteBumpSchemaVersion(const BackendEnv& env) {
  const std::string path = env.uri.substr(std::string_view("sqlite://").size());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const int rc = sqlite3_exec(db, "UPDATE schema_version SET version = version + 1", nullptr, nullptr, nullptr);
  EXPECT_EQ(rc, SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

using ::weir::testing::PostgresBaseUri;
using ::weir::testing::PostgresExec;

// Each test gets a schema of its own (the URI sets its search_path).
BackendEnv MakePostgresEnv() {
  const std::string base = PostgresBaseUri();
  if (base.empty()) return BackendEnv{};
  static std::atomic<int> next{0};
  const std::string schema = fmt::format("t{}_{}", ::getpid(), next++);
  PostgresExec(base, "CREATE SCHEMA " + schema);
  return OpenEnv(nullptr, base + "?options=-csearch_path%3D" + schema, true);
}

void PostgresBumpSchemaVersion(const BackendEnv& env) {
  PostgresExec(env.uri, "UPDATE schema_version SET version = version + 1");
}

std::vector<BackendFactory> Backends() {
  return {
      {"sqlite_memory", [] { return OpenEnv(nullptr, "sqlite://:memory:", false); }, nullptr},
      {"sqlite_file",
       [] {
         auto dir = std::make_unique<TempDir>();
         std::string uri = "sqlite://" + dir->path() + "/meta.db";
         return OpenEnv(std::move(dir), std::move(uri), true);
       },
       SqliteBumpSchemaVersion},
      {"postgres", MakePostgresEnv, PostgresBumpSchemaVersion},
  };
}

std::string BackendName(const ::testing::TestParamInfo<BackendFactory>& info) { return info.param.name; }

SegmentInfo Seg(uint64_t stream, uint64_t start, uint64_t end, int64_t first_ts = 0, int64_t last_ts = 0) {
  SegmentInfo s;
  s.stream_id = stream;
  s.start_offset = start;
  s.end_offset = end;
  s.first_timestamp_ms = first_ts;
  s.last_timestamp_ms = last_ts;
  s.object_key = "segments/" + std::to_string(stream) + "/" + std::to_string(start);
  s.size_bytes = (end - start) * 100;
  return s;
}

StreamState State(uint64_t stream, uint64_t settled, std::string token = "", std::string producers = "") {
  StreamState s;
  s.stream_id = stream;
  s.settled_offset = settled;
  s.trim_point = settled / 2;
  s.fencing_token = std::move(token);
  s.last_timestamp_ms = 1700000000000 + static_cast<int64_t>(settled);
  s.producer_state = std::move(producers);
  return s;
}

std::string Str(const SegmentInfo& s) {
  return fmt::format("seg(stream={} [{},{}) ts={}..{} key={} size={})", s.stream_id, s.start_offset, s.end_offset,
                     s.first_timestamp_ms, s.last_timestamp_ms, s.object_key, s.size_bytes);
}
std::string Str(const StreamState& s) {
  return fmt::format("state(stream={} settled={} trim={} token={:?} ts={} producers={:?})", s.stream_id,
                     s.settled_offset, s.trim_point, s.fencing_token, s.last_timestamp_ms, s.producer_state);
}
std::string Str(const NodeState& n) {
  return fmt::format("node({} epoch={} window={} ckpt=({},{}))", n.node, n.epoch, n.window, n.checkpoint.epoch,
                     n.checkpoint.seq);
}
std::string Str(const StreamInfo& s) {
  return fmt::format("stream({} {}/{} class={} retention={} ts={} uncapped={} created={})", s.id, s.basin, s.name,
                     StorageClassName(s.config.storage_class), s.config.retention_age_s,
                     TimestampingModeName(s.config.timestamping), s.config.uncapped_timestamps, s.created_at_ms);
}
std::string Str(const TableInfo& t) {
  return fmt::format("table({} {}/{} kind={} buckets={} config={:?} created={})", t.id, t.basin, t.name, t.kind,
                     t.bucket_count, t.config, t.created_at_ms);
}
std::string Str(const GroupOffset& o) {
  return fmt::format("offset({}/{}={} epoch={} meta={:?} at={})", o.topic, o.partition, o.offset, o.leader_epoch,
                     o.metadata, o.commit_time_ms);
}
template <typename T>
std::string Str(const std::vector<T>& v) {
  std::string out = "[";
  for (const T& x : v) out += Str(x) + " ";
  return out + "]";
}

class MetastoreConformance : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    env_ = GetParam().make();
    if (!env_.meta) GTEST_SKIP() << "backend " << GetParam().name << " is not available";
  }
  void TearDown() override { env_.meta.reset(); }

  Metastore& m() { return *env_.meta; }
  bool persistent() const { return !env_.uri.empty(); }

  // Closes the metastore and opens the same data again.
  void Reopen() {
    env_.meta.reset();
    auto meta = OpenMetastore(env_.uri);
    ASSERT_TRUE(meta.ok()) << meta.status().ToString();
    env_.meta = *meta;
  }

  void MakeBasin(const std::string& name, int64_t created = 1000) {
    ASSERT_OK(m().CreateBasin(BasinInfo{name, created}, kNoNode));
  }

  // Creates basin/name (and the basin if missing); returns the new stream's id.
  uint64_t MakeStream(const std::string& basin, const std::string& name) {
    if (!m().GetBasin(basin).ok()) {
      EXPECT_OK(m().CreateBasin(BasinInfo{basin, 1}, kNoNode));
    }
    StreamInfo info;
    info.basin = basin;
    info.name = name;
    info.created_at_ms = 2000;
    auto created = m().CreateStream(info, kNoNode);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    return created.ok() ? created->id : 0;
  }

  std::vector<std::string> BasinNames(std::string_view prefix, std::string_view start_after = {},
                                      size_t limit = 1000) {
    auto r = m().ListBasins(prefix, start_after, limit);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::string> names;
    if (r.ok()) {
      for (const BasinInfo& b : *r) names.push_back(b.name);
    }
    return names;
  }

  std::vector<std::string> StreamNames(std::string_view basin, std::string_view prefix,
                                       std::string_view start_after = {}, size_t limit = 1000) {
    auto r = m().ListStreams(basin, prefix, start_after, limit);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::string> names;
    if (r.ok()) {
      for (const StreamInfo& s : *r) {
        EXPECT_EQ(s.basin, basin);
        names.push_back(s.name);
      }
    }
    return names;
  }

  // Creates basin/name with `buckets` buckets (and the basin if missing).
  std::pair<TableInfo, std::vector<StreamInfo>> MakeTable(const std::string& basin, const std::string& name,
                                                          uint32_t buckets, std::string config = "{}") {
    if (!m().GetBasin(basin).ok()) {
      EXPECT_OK(m().CreateBasin(BasinInfo{basin, 1}, kNoNode));
    }
    TableInfo t;
    t.basin = basin;
    t.name = name;
    t.bucket_count = buckets;
    t.config = std::move(config);
    t.created_at_ms = 3000;
    auto created = m().CreateTable(t, StreamConfig{}, kNoNode);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    return created.ok() ? *created : std::pair<TableInfo, std::vector<StreamInfo>>{};
  }

  std::vector<std::string> TableNames(std::string_view basin, std::string_view prefix,
                                      std::string_view start_after = {}, size_t limit = 1000) {
    auto r = m().ListTables(basin, prefix, start_after, limit);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::string> names;
    if (r.ok()) {
      for (const TableInfo& t : *r) {
        EXPECT_EQ(t.basin, basin);
        names.push_back(t.name);
      }
    }
    return names;
  }

  std::string Offsets(std::string_view group) {
    auto r = m().FetchGroupOffsets(group);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? Str(*r) : "error";
  }

  std::vector<SegmentInfo> Segments(uint64_t stream, uint64_t from = 0, size_t limit = 1000) {
    auto r = m().FindSegments(stream, from, limit);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::vector<SegmentInfo>{};
  }

  std::vector<uint64_t> Starts(uint64_t stream, uint64_t from = 0, size_t limit = 1000) {
    std::vector<uint64_t> starts;
    for (const SegmentInfo& s : Segments(stream, from, limit)) starts.push_back(s.start_offset);
    return starts;
  }

  NodeState Node(std::string_view node) {
    auto r = m().GetNode(node);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : NodeState{};
  }

  // Everything a settle may touch, printed: compare before and after.
  std::string Snapshot(std::string_view node, const std::vector<uint64_t>& streams) {
    std::string out = Str(Node(node));
    auto states = m().ListStreamStates(0, 1000);
    EXPECT_TRUE(states.ok()) << states.status().ToString();
    if (states.ok()) out += Str(*states);
    for (uint64_t id : streams) out += Str(Segments(id));
    return out;
  }

  // Mints epochs of `node` until it is at `epoch`.
  void MintTo(std::string_view node, uint64_t epoch, uint32_t window = 4) {
    for (uint64_t e = Node(node).epoch; e < epoch; ++e) {
      ASSERT_TRUE(m().MintEpoch(node, e, window).ok());
    }
  }

  BackendEnv env_;
};

// ---- Basins -------------------------------------------------------------------

TEST_P(MetastoreConformance, BasinCreateGetDelete) {
  ASSERT_OK(m().CreateBasin(BasinInfo{"orders", 1234}, kNoNode));
  ASSERT_OK_AND_ASSIGN(BasinInfo b, m().GetBasin("orders"));
  EXPECT_EQ(b.name, "orders");
  EXPECT_EQ(b.created_at_ms, 1234);

  const Status dup = m().CreateBasin(BasinInfo{"orders", 99}, kNoNode);
  EXPECT_EQ(dup.code(), Code::kAlreadyExists) << dup.ToString();
  EXPECT_EQ(m().GetBasin("orders")->created_at_ms, 1234);

  EXPECT_EQ(m().GetBasin("nope").status().code(), Code::kNotFound);
  EXPECT_EQ(m().DeleteBasin("nope", kNoNode).code(), Code::kNotFound);

  ASSERT_OK(m().DeleteBasin("orders", kNoNode));
  EXPECT_EQ(m().GetBasin("orders").status().code(), Code::kNotFound);
  EXPECT_EQ(m().DeleteBasin("orders", kNoNode).code(), Code::kNotFound);
  ASSERT_OK(m().CreateBasin(BasinInfo{"orders", 5}, kNoNode));
  EXPECT_EQ(m().GetBasin("orders")->created_at_ms, 5);
}

// A create past max_basins is refused and writes nothing; a name that
// exists is kAlreadyExists whatever the count; a delete makes room.
TEST_P(MetastoreConformance, BasinCreatesStopAtMaxBasins) {
  ASSERT_OK(m().CreateBasin(BasinInfo{"first", 1}, kNoNode, 2));
  ASSERT_OK(m().CreateBasin(BasinInfo{"second", 2}, kNoNode, 2));
  const Status past = m().CreateBasin(BasinInfo{"third", 3, "tok"}, kNoNode, 2);
  EXPECT_EQ(past.code(), Code::kQuotaExhausted) << past.ToString();
  EXPECT_EQ(m().GetBasin("third").status().code(), Code::kNotFound);
  ASSERT_OK_AND_ASSIGN(std::string token, m().CreateToken("third", ""));
  EXPECT_EQ(token, "");  // the refused create's token was not kept
  EXPECT_EQ(m().CreateBasin(BasinInfo{"first", 4}, kNoNode, 2).code(), Code::kAlreadyExists);
  EXPECT_EQ(m().CreateBasin(BasinInfo{"first", 4}, kNoNode, 1).code(), Code::kAlreadyExists);
  ASSERT_OK(m().CreateBasin(BasinInfo{"third", 3}, kNoNode, 3));  // a larger cap
  EXPECT_EQ(m().CreateBasin(BasinInfo{"fourth", 4}, kNoNode, 3).code(), Code::kQuotaExhausted);
  ASSERT_OK(m().DeleteBasin("second", kNoNode));
  ASSERT_OK(m().CreateBasin(BasinInfo{"fourth", 4}, kNoNode, 3));
  ASSERT_OK_AND_ASSIGN(auto basins, m().ListBasins("", "", 10));
  ASSERT_EQ(basins.size(), 3u);
  EXPECT_EQ(basins[0].name, "first");
  EXPECT_EQ(basins[1].name, "fourth");
  EXPECT_EQ(basins[2].name, "third");
}

// AwaitCommitsInFlight takes the writers' lock and gives it back: it leaves
// no transaction open, and writes and reads go on after it.
TEST_P(MetastoreConformance, AwaitCommitsInFlightLeavesNothingOpen) {
  for (int i = 0; i < 3; ++i) ASSERT_OK(m().AwaitCommitsInFlight());
  ASSERT_OK(m().CreateBasin(BasinInfo{"after-await", 1}, kNoNode));
  ASSERT_OK(m().AwaitCommitsInFlight());
  EXPECT_EQ(m().GetBasin("after-await")->created_at_ms, 1);
  ASSERT_OK(m().DeleteBasin("after-await", kNoNode));
}

TEST_P(MetastoreConformance, BasinConfigIsStoredAndReplaced) {
  BasinConfig config;
  config.create_stream_on_append = true;
  config.default_stream_config.storage_class = StorageClass::kExpress;
  config.default_stream_config.retention_age_s = 0;  // set: keep forever
  config.default_stream_config.uncapped_timestamps = true;
  ASSERT_OK(m().CreateBasin(BasinInfo{"configured", 7, "", config}, kNoNode));
  ASSERT_OK(m().CreateBasin(BasinInfo{"plain-one", 8}, kNoNode));

  ASSERT_OK_AND_ASSIGN(BasinInfo b, m().GetBasin("configured"));
  EXPECT_EQ(b.config, config);
  // Unset fields stay unset: they are not the defaults written out.
  EXPECT_FALSE(b.config.default_stream_config.timestamping.has_value());
  EXPECT_FALSE(b.config.default_stream_config.delete_on_empty_min_age_s.has_value());
  EXPECT_EQ(m().GetBasin("plain-one")->config, BasinConfig{});
  ASSERT_OK_AND_ASSIGN(std::vector<BasinInfo> listed, m().ListBasins("", "", 10));
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].config, config);
  EXPECT_EQ(listed[1].config, BasinConfig{});

  BasinConfig next;
  next.create_stream_on_read = true;
  next.default_stream_config.timestamping = TimestampingMode::kArrival;
  next.default_stream_config.delete_on_empty_min_age_s = 30;
  ASSERT_OK(m().ReconfigureBasin("configured", next, kNoNode));
  EXPECT_EQ(m().GetBasin("configured")->config, next);
  EXPECT_EQ(m().GetBasin("configured")->created_at_ms, 7);
  EXPECT_EQ(m().ReconfigureBasin("missing-one", next, kNoNode).code(), Code::kNotFound);

  // A default the stream config would refuse is refused here too, changing nothing.
  BasinConfig bad;
  bad.default_stream_config.retention_age_s = -1;
  EXPECT_EQ(m().ReconfigureBasin("configured", bad, kNoNode).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().CreateBasin(BasinInfo{"bad-basin", 1, "", bad}, kNoNode).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().GetBasin("configured")->config, next);
  EXPECT_EQ(m().GetBasin("bad-basin").status().code(), Code::kNotFound);
}

TEST(StreamConfigLayer, OverAndResolve) {
  StreamConfigLayer basin;
  basin.storage_class = StorageClass::kExpress;
  basin.retention_age_s = 3600;
  StreamConfigLayer stream;
  stream.retention_age_s = 60;
  stream.timestamping = TimestampingMode::kArrival;
  const StreamConfig c = stream.Over(basin).Resolve();
  EXPECT_EQ(c.storage_class, StorageClass::kExpress);  // from the basin
  EXPECT_EQ(c.retention_age_s, 60);                     // the stream's own
  EXPECT_EQ(c.timestamping, TimestampingMode::kArrival);
  EXPECT_EQ(c.uncapped_timestamps, StreamConfig{}.uncapped_timestamps);  // weir's default
  EXPECT_EQ(StreamConfigLayer{}.Resolve(), StreamConfig{});
  EXPECT_TRUE(StreamConfigLayer{}.Empty());
  EXPECT_EQ(StreamConfigLayer::Of(c).Resolve(), c);
  EXPECT_EQ(StreamConfigLayer::Of(c).Over(basin).Resolve(), c);
}

TEST_P(MetastoreConformance, ListBasinsPagesInOrder) {
  for (int i = 24; i >= 0; --i) MakeBasin(fmt::format("b{:02}", i), i);
  MakeBasin("a");
  MakeBasin("c");

  std::vector<std::string> all;
  std::string after;
  int pages = 0;
  while (true) {
    ASSERT_OK_AND_ASSIGN(std::vector<BasinInfo> page, m().ListBasins("b", after, 10));
    if (page.empty()) break;
    ++pages;
    EXPECT_LE(page.size(), 10u);
    for (const BasinInfo& b : page) all.push_back(b.name);
    after = page.back().name;
  }
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(all.size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(all[i], fmt::format("b{:02}", i));
  EXPECT_EQ(m().ListBasins("b", "", 10)->at(3).created_at_ms, 3);

  EXPECT_EQ(BasinNames("b1").size(), 10u);
  EXPECT_EQ(BasinNames("").size(), 27u);
  EXPECT_EQ(BasinNames("", "b24"), (std::vector<std::string>{"c"}));
  EXPECT_EQ(BasinNames("", "", 2), (std::vector<std::string>{"a", "b00"}));
  EXPECT_EQ(BasinNames("b2", "b21"), (std::vector<std::string>{"b22", "b23", "b24"}));
  // start_after before the prefix range, and after it.
  EXPECT_EQ(BasinNames("b0", "a").size(), 10u);
  EXPECT_TRUE(BasinNames("b0", "b1").empty());
  EXPECT_TRUE(BasinNames("x").empty());
  EXPECT_EQ(BasinNames("c"), (std::vector<std::string>{"c"}));
  EXPECT_EQ(BasinNames("", "", 1000).size(), 27u);

  EXPECT_EQ(m().ListBasins("", "", 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListBasins("", "", 1001).status().code(), Code::kInvalidArgument);
}

TEST_P(MetastoreConformance, ListPrefixMatchesLiterally) {
  for (const char* name : {"a", "a%", "a%b", "a_c", "abc", "axb", "a\\x", "ab", "b%", "caf\xc3\xa9", "caf\xc3\xa9s",
                           "cafe", "caf\xc3\xaa"}) {
    MakeBasin(name);
  }
  EXPECT_EQ(BasinNames("a%"), (std::vector<std::string>{"a%", "a%b"}));
  EXPECT_EQ(BasinNames("a_"), (std::vector<std::string>{"a_c"}));
  EXPECT_EQ(BasinNames("a\\"), (std::vector<std::string>{"a\\x"}));
  EXPECT_EQ(BasinNames("%"), std::vector<std::string>{});
  EXPECT_EQ(BasinNames("_"), std::vector<std::string>{});
  EXPECT_EQ(BasinNames("ab"), (std::vector<std::string>{"ab", "abc"}));
  EXPECT_EQ(BasinNames("caf\xc3\xa9"), (std::vector<std::string>{"caf\xc3\xa9", "caf\xc3\xa9s"}));
  // Byte-wise order: "cafe" < "café" < "cafê".
  EXPECT_EQ(BasinNames("caf"), (std::vector<std::string>{"cafe", "caf\xc3\xa9", "caf\xc3\xa9s", "caf\xc3\xaa"}));

  for (const char* name : {"s%", "s%1", "sx1", "s_1", "s1"}) MakeStream("a", name);
  MakeStream("ab", "s%2");  // another basin: never listed with "a"
  EXPECT_EQ(StreamNames("a", "s%"), (std::vector<std::string>{"s%", "s%1"}));
  EXPECT_EQ(StreamNames("a", "s_"), (std::vector<std::string>{"s_1"}));
  EXPECT_EQ(StreamNames("a", "s"), (std::vector<std::string>{"s%", "s%1", "s1", "s_1", "sx1"}));
}

TEST_P(MetastoreConformance, DeleteBasinWithStreamsIsRefused) {
  const uint64_t id = MakeStream("logs", "app");
  const Status st = m().DeleteBasin("logs", kNoNode);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_NE(st.message().find("logs"), std::string::npos) << st.ToString();
  ASSERT_TRUE(m().GetBasin("logs").ok());
  ASSERT_TRUE(m().GetStreamById(id).ok());

  ASSERT_TRUE(m().DeleteStream(id, kNoNode).ok());
  ASSERT_OK(m().DeleteBasin("logs", kNoNode));
  EXPECT_EQ(m().GetBasin("logs").status().code(), Code::kNotFound);
}

// ---- Streams ------------------------------------------------------------------

TEST_P(MetastoreConformance, DeleteEmptyStreamNeedsTheNodesEpochAndTheConfig) {
  const uint64_t id = MakeStream("b", "eph");
  ASSERT_OK_AND_ASSIGN(NodeState first, m().MintEpoch("n1", 0, 8));
  // delete_on_empty not set: refused.
  EXPECT_EQ(m().DeleteEmptyStream(id, "n1", first.epoch).status().code(), Code::kPreconditionFailed);
  StreamConfig c;
  c.delete_on_empty_min_age_s = 10;
  ASSERT_OK(m().UpdateStreamConfig(id, c, kNoNode));
  // A superseded node (or an unknown one) deletes nothing.
  ASSERT_OK_AND_ASSIGN(NodeState second, m().MintEpoch("n1", first.epoch, 8));
  EXPECT_EQ(m().DeleteEmptyStream(id, "n1", first.epoch).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().DeleteEmptyStream(id, "n2", second.epoch).status().code(), Code::kPreconditionFailed);
  ASSERT_TRUE(m().GetStreamById(id).ok());
  ASSERT_OK(m().DeleteEmptyStream(id, "n1", second.epoch).status());
  EXPECT_EQ(m().GetStreamById(id).status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStreamState(id).status().code(), Code::kNotFound);
  EXPECT_EQ(m().DeleteEmptyStream(id, "n1", second.epoch).status().code(), Code::kNotFound);
}

// A superseded node deletes no stream or table: its successor serves them
// and would acknowledge appends that settle then drops. Nor does it create,
// change or delete anything else its successor serves (basins included).
TEST_P(MetastoreConformance, ChangesNeedTheNodesEpoch) {
  const uint64_t id = MakeStream("b", "kept");
  ASSERT_OK(m().CreateBasin(BasinInfo{"empty-basin", 1}, kNoNode));
  const auto table = MakeTable("b", "tbl", 2);
  ASSERT_OK_AND_ASSIGN(NodeState first, m().MintEpoch("n1", 0, 8));
  ASSERT_OK_AND_ASSIGN(NodeState second, m().MintEpoch("n1", first.epoch, 8));
  StreamConfig changed;
  changed.retention_age_s = 77;
  for (const EpochCheck& stale : {EpochCheck{"n1", first.epoch}, EpochCheck{"n2", 1}}) {
    EXPECT_EQ(m().DeleteStream(id, stale).status().code(), Code::kPreconditionFailed);
    EXPECT_EQ(m().DeleteTable(table.first.id, true, stale).status().code(), Code::kPreconditionFailed);
    // Creates and config changes too: a superseded node changes nothing its successor serves.
    StreamInfo info;
    info.basin = "b";
    info.name = "new";
    EXPECT_EQ(m().CreateStream(info, stale).status().code(), Code::kPreconditionFailed);
    TableInfo t;
    t.basin = "b";
    t.name = "newtbl";
    t.kind = "log";
    t.bucket_count = 1;
    EXPECT_EQ(m().CreateTable(t, StreamConfig{}, stale).status().code(), Code::kPreconditionFailed);
    EXPECT_EQ(m().AddBuckets(table.first.id, 3, StreamConfig{}, 1, stale).status().code(), Code::kPreconditionFailed);
    EXPECT_EQ(m().UpdateStreamConfig(id, changed, stale).code(), Code::kPreconditionFailed);
    EXPECT_EQ(m().UpdateTableConfig(table.first.id, "{}", {{table.second[0].id, changed}}, stale).code(),
              Code::kPreconditionFailed);
    // Basins too.
    EXPECT_EQ(m().CreateBasin(BasinInfo{"new-basin", 1}, stale).code(), Code::kPreconditionFailed);
    BasinConfig on_append;
    on_append.create_stream_on_append = true;
    EXPECT_EQ(m().ReconfigureBasin("b", on_append, stale).code(), Code::kPreconditionFailed);
    EXPECT_EQ(m().DeleteBasin("empty-basin", stale).code(), Code::kPreconditionFailed);
  }
  EXPECT_EQ(m().GetBasin("new-basin").status().code(), Code::kNotFound);
  EXPECT_FALSE(m().GetBasin("b")->config.create_stream_on_append);
  EXPECT_TRUE(m().GetBasin("empty-basin").ok());
  {
    const EpochCheck now{"n1", second.epoch};
    ASSERT_OK(m().CreateBasin(BasinInfo{"new-basin", 1}, now));
    BasinConfig on_append;
    on_append.create_stream_on_append = true;
    ASSERT_OK(m().ReconfigureBasin("new-basin", on_append, now));
    EXPECT_TRUE(m().GetBasin("new-basin")->config.create_stream_on_append);
    ASSERT_OK(m().DeleteBasin("new-basin", now));
    ASSERT_OK(m().DeleteBasin("empty-basin", now));
    EXPECT_EQ(m().GetBasin("empty-basin").status().code(), Code::kNotFound);
  }
  EXPECT_EQ(m().GetStream("b", "new").status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetTable("b", "newtbl").status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetTable("b", "tbl")->bucket_count, 2u);
  EXPECT_EQ(m().GetStreamById(id)->config.retention_age_s, StreamConfig{}.retention_age_s);
  EXPECT_EQ(m().GetStreamById(table.second[0].id)->config.retention_age_s, StreamConfig{}.retention_age_s);
  const EpochCheck current{"n1", second.epoch};
  ASSERT_OK(m().UpdateStreamConfig(id, changed, current));
  EXPECT_EQ(m().GetStreamById(id)->config.retention_age_s, 77);
  EXPECT_TRUE(m().GetStreamById(id).ok());
  EXPECT_TRUE(m().GetTable("b", "tbl").ok());
  EXPECT_TRUE(m().GetStream("b", "tbl/1").ok());
  ASSERT_OK(m().DeleteStream(id, EpochCheck{"n1", second.epoch}).status());
  ASSERT_OK(m().DeleteTable(table.first.id, true, EpochCheck{"n1", second.epoch}).status());
  EXPECT_EQ(m().GetStreamById(id).status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStream("b", "tbl/1").status().code(), Code::kNotFound);
}

TEST_P(MetastoreConformance, CreateStreamAllocatesIdAndZeroState) {
  MakeBasin("b");
  StreamInfo info;
  info.id = 999999;  // ignored
  info.basin = "b";
  info.name = "s1";
  info.config.storage_class = StorageClass::kExpress;
  info.config.retention_age_s = 3600;
  info.config.timestamping = TimestampingMode::kArrival;
  info.config.uncapped_timestamps = true;
  info.created_at_ms = 424242;
  ASSERT_OK_AND_ASSIGN(StreamInfo created, m().CreateStream(info, kNoNode));
  EXPECT_NE(created.id, 0u);
  EXPECT_NE(created.id, 999999u);
  info.id = created.id;
  EXPECT_EQ(Str(created), Str(info));

  ASSERT_OK_AND_ASSIGN(StreamInfo by_name, m().GetStream("b", "s1"));
  EXPECT_EQ(Str(by_name), Str(info));
  ASSERT_OK_AND_ASSIGN(StreamInfo by_id, m().GetStreamById(created.id));
  EXPECT_EQ(Str(by_id), Str(info));

  ASSERT_OK_AND_ASSIGN(StreamState state, m().GetStreamState(created.id));
  StreamState zero;
  zero.stream_id = created.id;
  EXPECT_EQ(Str(state), Str(zero));

  // Ids are unique; the same name in another basin is a different stream.
  const uint64_t other = MakeStream("c", "s1");
  EXPECT_NE(other, created.id);
  const uint64_t s2 = MakeStream("b", "s2");
  EXPECT_NE(s2, created.id);
  EXPECT_NE(s2, other);
}

TEST_P(MetastoreConformance, CreateStreamErrors) {
  MakeBasin("b");
  StreamInfo info;
  info.basin = "b";
  info.name = "s";
  ASSERT_TRUE(m().CreateStream(info, kNoNode).ok());

  auto dup = m().CreateStream(info, kNoNode);
  EXPECT_EQ(dup.status().code(), Code::kAlreadyExists) << dup.status().ToString();

  info.basin = "missing";
  auto no_basin = m().CreateStream(info, kNoNode);
  EXPECT_EQ(no_basin.status().code(), Code::kNotFound) << no_basin.status().ToString();
  EXPECT_EQ(m().GetStream("missing", "s").status().code(), Code::kNotFound);

  info.basin = "b";
  info.name = "neg";
  info.config.retention_age_s = -1;
  EXPECT_EQ(m().CreateStream(info, kNoNode).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().GetStream("b", "neg").status().code(), Code::kNotFound);

  EXPECT_EQ(StreamNames("b", ""), (std::vector<std::string>{"s"}));
}

TEST_P(MetastoreConformance, StreamIdsAreNeverReused) {
  std::set<uint64_t> seen;
  uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    const uint64_t id = MakeStream("b", "same-name");
    EXPECT_TRUE(seen.insert(id).second) << "id " << id << " reused";
    EXPECT_GT(id, last);
    last = id;
    ASSERT_TRUE(m().DeleteStream(id, kNoNode).ok());
    EXPECT_EQ(m().GetStreamById(id).status().code(), Code::kNotFound);
  }
  if (persistent()) {
    Reopen();
    const uint64_t id = MakeStream("b", "same-name");
    EXPECT_GT(id, last);
  }
}

TEST_P(MetastoreConformance, GetStreamMissing) {
  MakeStream("b", "s");
  EXPECT_EQ(m().GetStream("b", "t").status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStream("c", "s").status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStreamById(123456).status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStreamState(123456).status().code(), Code::kNotFound);
  EXPECT_EQ(m().UpdateStreamConfig(123456, StreamConfig{}, kNoNode).code(), Code::kNotFound);
  EXPECT_EQ(m().DeleteStream(123456, kNoNode).status().code(), Code::kNotFound);
}

TEST_P(MetastoreConformance, ListStreamsPagesWithinABasin) {
  for (int i = 0; i < 23; ++i) MakeStream("b", fmt::format("s{:02}", i));
  MakeStream("b", "t");
  MakeStream("bb", "s99");

  std::vector<std::string> all;
  std::string after;
  while (true) {
    ASSERT_OK_AND_ASSIGN(std::vector<StreamInfo> page, m().ListStreams("b", "s", after, 5));
    if (page.empty()) break;
    EXPECT_LE(page.size(), 5u);
    for (const StreamInfo& s : page) {
      EXPECT_EQ(s.basin, "b");
      all.push_back(s.name);
    }
    after = page.back().name;
  }
  ASSERT_EQ(all.size(), 23u);
  for (int i = 0; i < 23; ++i) EXPECT_EQ(all[i], fmt::format("s{:02}", i));

  EXPECT_EQ(StreamNames("b", "").size(), 24u);
  EXPECT_EQ(StreamNames("b", "s1").size(), 10u);
  EXPECT_EQ(StreamNames("b", "", "s22"), (std::vector<std::string>{"t"}));
  EXPECT_EQ(StreamNames("bb", ""), (std::vector<std::string>{"s99"}));
  EXPECT_EQ(StreamNames("b", "", "", 1), (std::vector<std::string>{"s00"}));

  EXPECT_EQ(m().ListStreams("b", "", "", 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListStreams("b", "", "", 1001).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListStreams("nope", "", "", 10).status().code(), Code::kNotFound);
  MakeBasin("empty");
  EXPECT_TRUE(StreamNames("empty", "").empty());
}

TEST_P(MetastoreConformance, UpdateStreamConfigRoundTripsEveryField) {
  const uint64_t id = MakeStream("b", "s");
  const StreamConfig defaults;
  ASSERT_OK_AND_ASSIGN(StreamInfo before, m().GetStreamById(id));
  EXPECT_EQ(before.config.storage_class, defaults.storage_class);
  EXPECT_EQ(before.config.retention_age_s, defaults.retention_age_s);
  EXPECT_EQ(before.config.timestamping, defaults.timestamping);
  EXPECT_EQ(before.config.uncapped_timestamps, defaults.uncapped_timestamps);
  EXPECT_EQ(before.config.delete_on_empty_min_age_s, 0);

  const StreamConfig configs[] = {
      {StorageClass::kExpress, 0, TimestampingMode::kClientRequire, true, 60},
      {StorageClass::kStandard, 86400, TimestampingMode::kArrival, false, 0},
      {StorageClass::kExpress, std::numeric_limits<int64_t>::max(), TimestampingMode::kClientPrefer, true,
       std::numeric_limits<int64_t>::max()},
      {StorageClass::kStandard, 1, TimestampingMode::kClientRequire, false, 1},
  };
  for (const StreamConfig& c : configs) {
    ASSERT_OK(m().UpdateStreamConfig(id, c, kNoNode));
    ASSERT_OK_AND_ASSIGN(StreamInfo after, m().GetStreamById(id));
    EXPECT_EQ(after.config.storage_class, c.storage_class);
    EXPECT_EQ(after.config.retention_age_s, c.retention_age_s);
    EXPECT_EQ(after.config.timestamping, c.timestamping);
    EXPECT_EQ(after.config.uncapped_timestamps, c.uncapped_timestamps);
    EXPECT_EQ(after.config.delete_on_empty_min_age_s, c.delete_on_empty_min_age_s);
    // Identity does not change.
    EXPECT_EQ(after.basin, "b");
    EXPECT_EQ(after.name, "s");
    EXPECT_EQ(after.created_at_ms, before.created_at_ms);
  }

  StreamConfig bad;
  bad.retention_age_s = -5;
  EXPECT_EQ(m().UpdateStreamConfig(id, bad, kNoNode).code(), Code::kInvalidArgument);
  bad = StreamConfig{};
  bad.delete_on_empty_min_age_s = -1;
  EXPECT_EQ(m().UpdateStreamConfig(id, bad, kNoNode).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().GetStreamById(id)->config.retention_age_s, 1);
  EXPECT_EQ(m().GetStreamById(id)->config.delete_on_empty_min_age_s, 1);
}

TEST_P(MetastoreConformance, DeleteStreamRemovesStateAndSegments) {
  const uint64_t a = MakeStream("b", "a");
  const uint64_t keep = MakeStream("b", "keep");
  MintTo("n1", 1);
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 3}, {Seg(a, 0, 10), Seg(a, 10, 20), Seg(keep, 0, 5)},
                             {State(a, 20, "tok"), State(keep, 5)}));

  ASSERT_OK_AND_ASSIGN(std::vector<std::string> keys, m().DeleteStream(a, kNoNode));
  EXPECT_EQ(keys, (std::vector<std::string>{Seg(a, 0, 10).object_key, Seg(a, 10, 20).object_key}));
  EXPECT_EQ(m().GetStreamById(a).status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStream("b", "a").status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStreamState(a).status().code(), Code::kNotFound);
  EXPECT_TRUE(Segments(a).empty());
  EXPECT_FALSE(m().FindSegmentByTimestamp(a, 0)->has_value());
  ASSERT_OK_AND_ASSIGN(std::vector<StreamState> states, m().ListStreamStates(0, 1000));
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].stream_id, keep);
  EXPECT_EQ(StreamNames("b", ""), (std::vector<std::string>{"keep"}));

  // The other stream is untouched.
  EXPECT_EQ(Starts(keep), (std::vector<uint64_t>{0}));
  EXPECT_EQ(m().GetStreamState(keep)->settled_offset, 5u);

  EXPECT_EQ(m().DeleteStream(a, kNoNode).status().code(), Code::kNotFound);
  // A stream without segments returns no keys.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> none, m().DeleteStream(MakeStream("b", "fresh"), kNoNode));
  EXPECT_TRUE(none.empty());
}

TEST_P(MetastoreConformance, CreateTokensAreKeptUntilTheNameIsDeleted) {
  ASSERT_OK(m().CreateBasin(BasinInfo{"tokened", 1, "basin-token"}, kNoNode));
  StreamInfo info;
  info.basin = "tokened";
  info.name = "s";
  info.request_token = "stream-token";
  ASSERT_OK_AND_ASSIGN(StreamInfo s, m().CreateStream(info, kNoNode));
  EXPECT_EQ(*m().CreateToken("tokened", ""), "basin-token");
  EXPECT_EQ(*m().CreateToken("tokened", "s"), "stream-token");
  EXPECT_EQ(*m().CreateToken("tokened", "other"), "");
  EXPECT_EQ(m().CreateStream(info, kNoNode).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(*m().CreateToken("tokened", "s"), "stream-token");  // a failed create changes nothing
  if (persistent()) {
    Reopen();
    EXPECT_EQ(*m().CreateToken("tokened", "s"), "stream-token");
  }
  ASSERT_OK(m().DeleteStream(s.id, kNoNode).status());
  EXPECT_EQ(*m().CreateToken("tokened", "s"), "");
  info.request_token.clear();  // the name again, without a token
  ASSERT_OK(m().CreateStream(info, kNoNode).status());
  EXPECT_EQ(*m().CreateToken("tokened", "s"), "");
  ASSERT_OK(m().DeleteStream(m().GetStream("tokened", "s")->id, kNoNode).status());
  ASSERT_OK(m().DeleteBasin("tokened", kNoNode));
  EXPECT_EQ(*m().CreateToken("tokened", ""), "");
}

TEST_P(MetastoreConformance, ListStreamStatesReturnsEveryStream) {
  ASSERT_OK_AND_ASSIGN(std::vector<StreamState> empty, m().ListStreamStates(0, 1000));
  EXPECT_TRUE(empty.empty());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(MakeStream("b" + std::to_string(i % 2), "s" + std::to_string(i)));
  MintTo("n", 1);
  ASSERT_OK(m().CommitSettle("n", 1, {0, 0}, {1, 1}, {}, {State(ids[2], 77, "fence", std::string("\0\1\2", 3))}));
  ASSERT_OK_AND_ASSIGN(std::vector<StreamState> states, m().ListStreamStates(0, 1000));
  ASSERT_EQ(states.size(), 5u);
  std::set<uint64_t> got;
  for (const StreamState& s : states) {
    got.insert(s.stream_id);
    if (s.stream_id == ids[2]) {
      EXPECT_EQ(Str(s), Str(State(ids[2], 77, "fence", std::string("\0\1\2", 3))));
    } else {
      EXPECT_EQ(s.settled_offset, 0u);
    }
  }
  EXPECT_EQ(got, std::set<uint64_t>(ids.begin(), ids.end()));
  // Paged by id, two at a time: each once, in order.
  std::vector<uint64_t> paged;
  for (uint64_t after = 0;;) {
    ASSERT_OK_AND_ASSIGN(std::vector<StreamState> page, m().ListStreamStates(after, 2));
    ASSERT_LE(page.size(), 2u);
    if (page.empty()) break;
    for (const StreamState& s : page) paged.push_back(s.stream_id);
    after = page.back().stream_id;
  }
  EXPECT_EQ(paged, ids);
  ASSERT_OK_AND_ASSIGN(std::vector<StreamState> beyond, m().ListStreamStates(std::numeric_limits<uint64_t>::max(), 1));
  EXPECT_TRUE(beyond.empty());
  EXPECT_EQ(m().ListStreamStates(0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListStreamStates(0, 1001).status().code(), Code::kInvalidArgument);
}

// ---- Nodes, epochs, producer ids ----------------------------------------------------

TEST_P(MetastoreConformance, UnknownNodeIsZero) {
  const NodeState n = Node("never-seen");
  EXPECT_EQ(n.node, "never-seen");
  EXPECT_EQ(n.epoch, 0u);
  EXPECT_EQ(n.window, 0u);
  EXPECT_EQ(n.checkpoint, (ChainPosition{0, 0}));
}

TEST_P(MetastoreConformance, MintEpochIsACompareAndSwap) {
  ASSERT_OK_AND_ASSIGN(NodeState first, m().MintEpoch("n1", 0, 8));
  EXPECT_EQ(Str(first), "node(n1 epoch=1 window=8 ckpt=(0,0))");
  EXPECT_EQ(Str(Node("n1")), Str(first));

  // A stale mint changes nothing and names the current epoch.
  auto stale = m().MintEpoch("n1", 0, 99);
  EXPECT_EQ(stale.status().code(), Code::kPreconditionFailed);
  EXPECT_NE(stale.status().message().find("epoch is 1"), std::string::npos) << stale.status().ToString();
  auto ahead = m().MintEpoch("n1", 5, 99);
  EXPECT_EQ(ahead.status().code(), Code::kPreconditionFailed) << ahead.status().ToString();
  EXPECT_EQ(Str(Node("n1")), Str(first));

  // The checkpoint survives a mint; the window is replaced.
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 7}, {}, {}));
  ASSERT_OK_AND_ASSIGN(NodeState second, m().MintEpoch("n1", 1, 16));
  EXPECT_EQ(Str(second), "node(n1 epoch=2 window=16 ckpt=(1,7))");
  EXPECT_EQ(Str(Node("n1")), Str(second));
  auto old = m().MintEpoch("n1", 1, 16);
  EXPECT_EQ(old.status().code(), Code::kPreconditionFailed);
  EXPECT_NE(old.status().message().find("epoch is 2, expected 1"), std::string::npos) << old.status().ToString();

  // Nodes are independent; the first mint of a node must expect 0.
  EXPECT_EQ(m().MintEpoch("n2", 1, 4).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(Node("n2").epoch, 0u);
  ASSERT_OK_AND_ASSIGN(NodeState n2, m().MintEpoch("n2", 0, 4));
  EXPECT_EQ(n2.epoch, 1u);
  EXPECT_EQ(Node("n1").epoch, 2u);

  // Each mint stores its minter (0 when none is named), so a caller whose
  // answer was lost can tell its own mint from a successor's.
  EXPECT_EQ(Node("n1").minted_by, 0u);
  const uint64_t nonce = 0xF00DFACE12345679u;  // past INT64_MAX: stored as is
  ASSERT_OK_AND_ASSIGN(NodeState third, m().MintEpoch("n1", 2, 16, nonce));
  EXPECT_EQ(third.minted_by, nonce);
  EXPECT_EQ(Node("n1").minted_by, nonce);
  EXPECT_EQ(m().MintEpoch("n1", 2, 16, 77).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(Node("n1").minted_by, nonce);
  ASSERT_OK(m().MintEpoch("n1", 3, 16, 77).status());
  EXPECT_EQ(Node("n1").minted_by, 77u);
  EXPECT_EQ(Node("n1").checkpoint, (ChainPosition{1, 7}));
}

TEST_P(MetastoreConformance, ConcurrentMintHasExactlyOneWinner) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 5;
  // Persistent backends also race through a second, independent handle.
  std::shared_ptr<Metastore> other = env_.meta;
  if (persistent()) {
    auto second = OpenMetastore(env_.uri);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    other = *second;
  }
  for (int round = 0; round < kRounds; ++round) {
    std::latch start(kThreads);
    std::vector<Result<NodeState>> results(kThreads, Result<NodeState>(Internal("not run")));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Metastore& meta = t % 2 ? *other : m();
        start.arrive_and_wait();
        results[t] = meta.MintEpoch("racer", static_cast<uint64_t>(round), static_cast<uint32_t>(t));
      });
    }
    for (auto& th : threads) th.join();
    int winner = -1;
    for (int t = 0; t < kThreads; ++t) {
      if (results[t].ok()) {
        EXPECT_EQ(winner, -1) << "two winners in round " << round;
        winner = t;
        EXPECT_EQ(results[t]->epoch, static_cast<uint64_t>(round + 1));
      } else {
        EXPECT_EQ(results[t].status().code(), Code::kPreconditionFailed) << results[t].status().ToString();
      }
    }
    ASSERT_NE(winner, -1) << "no winner in round " << round;
    const NodeState n = Node("racer");
    EXPECT_EQ(n.epoch, static_cast<uint64_t>(round + 1));
    EXPECT_EQ(n.window, static_cast<uint32_t>(winner));
  }
}

TEST_P(MetastoreConformance, ProducerIdsAreUniqueAndIncreasing) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 40;
  std::latch start(kThreads);
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i) {
        auto id = m().AllocateProducerId();
        if (id.ok()) got[t].push_back(*id);
        else ADD_FAILURE() << id.status().ToString();
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (const auto& ids : got) {
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
    for (uint64_t id : ids) EXPECT_TRUE(all.insert(id).second) << "producer id " << id << " handed out twice";
  }
  EXPECT_EQ(all.size(), size_t{kThreads * kPerThread});
  const uint64_t max = *all.rbegin();
  ASSERT_OK_AND_ASSIGN(uint64_t next, m().AllocateProducerId());
  EXPECT_GT(next, max);
  if (persistent()) {
    Reopen();
    ASSERT_OK_AND_ASSIGN(uint64_t after_reopen, m().AllocateProducerId());
    EXPECT_GT(after_reopen, next);
  }
}

// ---- CommitSettle ---------------------------------------------------------------

TEST_P(MetastoreConformance, CommitSettleMakesEverythingVisible) {
  const uint64_t a = MakeStream("b", "a");
  const uint64_t c = MakeStream("b", "c");
  MintTo("n1", 1);
  const std::vector<SegmentInfo> segs = {Seg(a, 0, 10, 100, 109), Seg(c, 0, 3, 50, 52), Seg(a, 10, 25, 110, 124)};
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 4}, segs, {State(a, 25, "tok-a", "p1"), State(c, 3)}));

  EXPECT_EQ(Str(Segments(a)), Str(std::vector<SegmentInfo>{segs[0], segs[2]}));
  EXPECT_EQ(Str(Segments(c)), Str(std::vector<SegmentInfo>{segs[1]}));
  EXPECT_EQ(Str(*m().GetStreamState(a)), Str(State(a, 25, "tok-a", "p1")));
  EXPECT_EQ(Str(*m().GetStreamState(c)), Str(State(c, 3)));
  EXPECT_EQ(Node("n1").checkpoint, (ChainPosition{1, 4}));

  // The next cycle continues from there; an empty cycle only moves the checkpoint.
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 4}, {1, 6}, {Seg(a, 25, 30)}, {State(a, 30)}));
  EXPECT_EQ(Starts(a), (std::vector<uint64_t>{0, 10, 25}));
  EXPECT_EQ(m().GetStreamState(a)->settled_offset, 30u);
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 6}, {1, 6}, {}, {}));
  EXPECT_EQ(Node("n1").checkpoint, (ChainPosition{1, 6}));

  // After a takeover the successor settles from the same checkpoint into a newer epoch.
  MintTo("n1", 2);
  ASSERT_OK(m().CommitSettle("n1", 2, {1, 6}, {2, 0}, {Seg(c, 3, 9)}, {State(c, 9)}));
  EXPECT_EQ(Node("n1").checkpoint, (ChainPosition{2, 0}));
  EXPECT_EQ(Node("n1").epoch, 2u);
  EXPECT_EQ(m().GetStreamState(c)->settled_offset, 9u);
}

// Recovery reads every stream's segments in pages across streams.
TEST_P(MetastoreConformance, ListSegmentsFromPagesAcrossStreams) {
  const uint64_t a = MakeStream("b", "a");
  const uint64_t empty = MakeStream("b", "empty");
  const uint64_t c = MakeStream("b", "c");
  ASSERT_LT(a, empty);
  ASSERT_LT(empty, c);
  MintTo("n1", 1);
  // Inserted out of order: the listing sorts by stream, then by start offset
  // as a number (10 after 9, not before it).
  const std::vector<SegmentInfo> segs = {Seg(c, 0, 3), Seg(a, 10, 25), Seg(a, 0, 9), Seg(a, 9, 10), Seg(c, 3, 100)};
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, segs, {State(a, 25), State(c, 100)}));
  const std::vector<SegmentInfo> sorted = {segs[2], segs[3], segs[1], segs[0], segs[4]};

  ASSERT_OK_AND_ASSIGN(auto all, m().ListSegmentsFrom(0, 0, 10000));
  EXPECT_EQ(Str(all), Str(sorted));
  // Paged two at a time from (last stream, last start + 1): each exactly once.
  std::vector<SegmentInfo> paged;
  for (uint64_t id = 0, from = 0;;) {
    ASSERT_OK_AND_ASSIGN(auto page, m().ListSegmentsFrom(id, from, 2));
    ASSERT_LE(page.size(), 2u);
    if (page.empty()) break;
    id = page.back().stream_id;
    from = page.back().start_offset + 1;
    paged.insert(paged.end(), page.begin(), page.end());
  }
  EXPECT_EQ(Str(paged), Str(sorted));
  // A start inside a stream; a start past every offset moves to the next stream.
  ASSERT_OK_AND_ASSIGN(auto mid, m().ListSegmentsFrom(a, 1, 10000));
  EXPECT_EQ(Str(mid), Str(std::vector<SegmentInfo>{segs[3], segs[1], segs[0], segs[4]}));
  ASSERT_OK_AND_ASSIGN(auto next, m().ListSegmentsFrom(a, std::numeric_limits<uint64_t>::max(), 10000));
  EXPECT_EQ(Str(next), Str(std::vector<SegmentInfo>{segs[0], segs[4]}));
  ASSERT_OK_AND_ASSIGN(auto none, m().ListSegmentsFrom(c + 1, 0, 10000));
  EXPECT_TRUE(none.empty());
  ASSERT_OK_AND_ASSIGN(auto beyond, m().ListSegmentsFrom(std::numeric_limits<uint64_t>::max(), 0, 10000));
  EXPECT_TRUE(beyond.empty());
  EXPECT_EQ(m().ListSegmentsFrom(0, 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListSegmentsFrom(0, 0, 10001).status().code(), Code::kInvalidArgument);
}

TEST_P(MetastoreConformance, ListStreamsByIdPagesAcrossBasins) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(MakeStream(i % 2 == 0 ? "zz-basin" : "aa-basin", "s" + std::to_string(i)));
  ASSERT_OK(m().DeleteStream(ids[3], kNoNode).status());
  const std::vector<uint64_t> live = {ids[0], ids[1], ids[2], ids[4]};
  std::vector<uint64_t> got;
  for (uint64_t after = 0;;) {
    ASSERT_OK_AND_ASSIGN(auto page, m().ListStreamsById(after, 3));
    ASSERT_LE(page.size(), 3u);
    if (page.empty()) break;
    for (const StreamInfo& s : page) {
      got.push_back(s.id);
      ASSERT_OK_AND_ASSIGN(StreamInfo same, m().GetStreamById(s.id));
      EXPECT_EQ(Str(s), Str(same));
    }
    after = page.back().id;
  }
  EXPECT_EQ(got, live);
  ASSERT_OK_AND_ASSIGN(auto after_last, m().ListStreamsById(ids[4], 1000));
  EXPECT_TRUE(after_last.empty());
  ASSERT_OK_AND_ASSIGN(auto beyond, m().ListStreamsById(std::numeric_limits<uint64_t>::max(), 1000));
  EXPECT_TRUE(beyond.empty());
  EXPECT_EQ(m().ListStreamsById(0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListStreamsById(0, 1001).status().code(), Code::kInvalidArgument);
}

TEST_P(MetastoreConformance, RaisedTrimPointsNeverGoDown) {
  const uint64_t a = MakeStream("b", "a");
  MintTo("n1", 1);
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, {Seg(a, 0, 10)}, {State(a, 10)}));  // trim 5
  ASSERT_OK(m().RaiseTrimPoint("n1", 1, a, 8));
  EXPECT_EQ(m().GetStreamState(a)->trim_point, 8u);
  ASSERT_OK(m().RaiseTrimPoint("n1", 1, a, 3));  // lower: no change
  EXPECT_EQ(m().GetStreamState(a)->trim_point, 8u);
  // A settle cycle that folded only command records (trim 7 here) keeps the raised point.
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 1}, {1, 2}, {Seg(a, 10, 14)}, {State(a, 14)}));
  ASSERT_OK_AND_ASSIGN(StreamState st, m().GetStreamState(a));
  EXPECT_EQ(st.trim_point, 8u);
  EXPECT_EQ(st.settled_offset, 14u);
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 2}, {1, 3}, {Seg(a, 14, 20)}, {State(a, 20)}));  // trim 10
  EXPECT_EQ(m().GetStreamState(a)->trim_point, 10u);
  EXPECT_EQ(m().RaiseTrimPoint("n1", 1, a + 100, 1).code(), Code::kNotFound);
  // Offsets past 2^63-1 are refused, not stored as negative numbers.
  EXPECT_EQ(m().RaiseTrimPoint("n1", 1, a, uint64_t{1} << 63).code(), Code::kInvalidArgument);
  StreamState huge = State(a, 30);
  huge.trim_point = UINT64_MAX;
  EXPECT_EQ(m().CommitSettle("n1", 1, {1, 3}, {1, 4}, {Seg(a, 20, 30)}, {huge}).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().GetStreamState(a)->trim_point, 10u);
  EXPECT_EQ(m().GetStreamState(a)->settled_offset, 20u);
  // A superseded node raises nothing.
  MintTo("n1", 2);
  EXPECT_EQ(m().RaiseTrimPoint("n1", 1, a, 12).code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().GetStreamState(a)->trim_point, 10u);
  // Nor does a node that never minted an epoch (it holds none, not epoch 0).
  EXPECT_EQ(m().RaiseTrimPoint("never-minted", 0, a, 12).code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().DeleteSegmentsBelow("never-minted", 0, {{a, 20}}).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().GetStreamState(a)->trim_point, 10u);
}

TEST_P(MetastoreConformance, UpdateTableConfigChangesTheBlobAndStreamsTogether) {
  const auto made = MakeTable("b1", "topic", 2);
  const uint64_t id = made.first.id;
  ASSERT_OK_AND_ASSIGN(StreamInfo s0, m().GetStream("b1", BucketStreamName("topic", 0)));
  ASSERT_OK_AND_ASSIGN(StreamInfo s1, m().GetStream("b1", BucketStreamName("topic", 1)));
  StreamConfig cfg;
  cfg.retention_age_s = 0;
  cfg.timestamping = TimestampingMode::kArrival;
  ASSERT_OK(m().UpdateTableConfig(id, "{\"retention.ms\":\"-1\"}", {{s0.id, cfg}, {s1.id, cfg}}, kNoNode));
  EXPECT_EQ(m().GetTable("b1", "topic")->config, "{\"retention.ms\":\"-1\"}");
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("topic", 1))->config, cfg);
  // A missing stream or table, or an invalid config, changes nothing.
  StreamConfig bad = cfg;
  bad.retention_age_s = -3;
  EXPECT_EQ(m().UpdateTableConfig(id, "{}", {{s0.id, StreamConfig{}}, {s1.id + 1000, StreamConfig{}}}, kNoNode).code(),
            Code::kNotFound);
  EXPECT_EQ(m().UpdateTableConfig(id, "{}", {{s0.id, bad}}, kNoNode).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().UpdateTableConfig(id + 1000, "{}", {}, kNoNode).code(), Code::kNotFound);
  EXPECT_EQ(m().GetTable("b1", "topic")->config, "{\"retention.ms\":\"-1\"}");
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("topic", 0))->config, cfg);
}

TEST_P(MetastoreConformance, DeletePartitionOffsetsRemovesOnlyThose) {
  GroupOffset o;
  o.topic = "t";
  o.offset = 5;
  std::vector<GroupOffset> commit;
  for (int32_t p = 0; p < 3; ++p) {
    o.partition = p;
    commit.push_back(o);
  }
  o.topic = "u";
  o.partition = 0;
  commit.push_back(o);
  ASSERT_OK(m().CommitGroupOffsets("g", commit, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("h", commit, kNoNode));
  ASSERT_OK(m().DeletePartitionOffsets("g", {{"t", 1}, {"u", 0}, {"t", 9}, {"none", 0}}, kNoNode));
  ASSERT_OK_AND_ASSIGN(std::vector<GroupOffset> left, m().FetchGroupOffsets("g"));
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].partition, 0);
  EXPECT_EQ(left[1].partition, 2);
  EXPECT_EQ(m().FetchGroupOffsets("h")->size(), 4u);
  ASSERT_OK(m().DeletePartitionOffsets("nobody", {{"t", 0}}, kNoNode));
}

TEST_P(MetastoreConformance, CommitSettlePreconditionFailuresChangeNothing) {
  const uint64_t a = MakeStream("b", "a");
  MintTo("n1", 2);
  ASSERT_OK(m().CommitSettle("n1", 2, {0, 0}, {2, 3}, {Seg(a, 0, 10)}, {State(a, 10)}));
  const std::string before = Snapshot("n1", {a});

  const std::vector<SegmentInfo> segs = {Seg(a, 10, 20)};
  const std::vector<StreamState> states = {State(a, 20, "t")};

  // Wrong expected checkpoint.
  Status st = m().CommitSettle("n1", 2, {2, 2}, {2, 5}, segs, states);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_EQ(Snapshot("n1", {a}), before);
  st = m().CommitSettle("n1", 2, {0, 0}, {2, 5}, segs, states);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_EQ(Snapshot("n1", {a}), before);

  // Stale epoch: a successor minted epoch 3.
  ASSERT_TRUE(m().MintEpoch("n1", 2, 4).ok());
  const std::string after_mint = Snapshot("n1", {a});
  st = m().CommitSettle("n1", 2, {2, 3}, {2, 5}, segs, states);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_NE(st.message().find("superseded"), std::string::npos) << st.ToString();
  EXPECT_EQ(Snapshot("n1", {a}), after_mint);
  // An epoch from the future is not this node's either.
  st = m().CommitSettle("n1", 4, {2, 3}, {2, 5}, segs, states);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_EQ(Snapshot("n1", {a}), after_mint);

  // A node that never minted an epoch.
  st = m().CommitSettle("ghost", 1, {0, 0}, {1, 1}, segs, states);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_EQ(Snapshot("n1", {a}), after_mint);
  EXPECT_EQ(Node("ghost").epoch, 0u);
}

TEST_P(MetastoreConformance, CommitSettleBadInputChangesNothing) {
  const uint64_t a = MakeStream("b", "a");
  MintTo("n1", 1);
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 3}, {Seg(a, 0, 10)}, {State(a, 10)}));
  const std::string before = Snapshot("n1", {a});

  // The checkpoint never moves backwards.
  EXPECT_EQ(m().CommitSettle("n1", 1, {1, 3}, {1, 2}, {}, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().CommitSettle("n1", 1, {1, 3}, {0, 9}, {}, {}).code(), Code::kInvalidArgument);
  // Epoch 0 is never minted.
  EXPECT_EQ(m().CommitSettle("n1", 0, {1, 3}, {1, 4}, {}, {}).code(), Code::kInvalidArgument);
  // Malformed segments.
  SegmentInfo empty_range = Seg(a, 10, 10);
  SegmentInfo inverted = Seg(a, 20, 10);
  SegmentInfo no_key = Seg(a, 10, 20);
  no_key.object_key.clear();
  SegmentInfo huge = Seg(a, 10, 20);
  huge.end_offset = std::numeric_limits<uint64_t>::max();
  for (const SegmentInfo& bad : {empty_range, inverted, no_key, huge}) {
    const Status st = m().CommitSettle("n1", 1, {1, 3}, {1, 4}, {Seg(a, 30, 40), bad}, {State(a, 40)});
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << Str(bad) << ": " << st.ToString();
  }
  EXPECT_EQ(Snapshot("n1", {a}), before);
}

// A stream named twice in one settle's states ends as rows updated in order
// would leave it: the last state, and the highest trim point.
TEST_P(MetastoreConformance, ASettleNamingAStreamTwiceKeepsTheLastStateAndHighestTrim) {
  const uint64_t a = MakeStream("b", "a");
  MintTo("n1", 1);
  StreamState low = State(a, 24, "tok");
  low.trim_point = 2;
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, {Seg(a, 0, 24)}, {State(a, 20), low}));
  ASSERT_OK_AND_ASSIGN(StreamState st, m().GetStreamState(a));
  EXPECT_EQ(st.settled_offset, 24u);
  EXPECT_EQ(st.trim_point, 10u);
  EXPECT_EQ(st.fencing_token, "tok");
}

TEST_P(MetastoreConformance, DuplicateOrOverlappingSegmentRollsBack) {
  const uint64_t a = MakeStream("b", "a");
  const uint64_t c = MakeStream("b", "c");
  MintTo("n1", 1);
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, {Seg(a, 0, 10), Seg(a, 20, 30)}, {State(a, 30)}));
  const std::string before = Snapshot("n1", {a, c});

  const std::vector<SegmentInfo> bad_batches[] = {
      {Seg(c, 0, 5), Seg(a, 0, 10)},          // exact duplicate
      {Seg(c, 0, 5), Seg(a, 0, 7)},           // same start, other end
      {Seg(c, 0, 5), Seg(a, 5, 15)},          // overlaps [0,10)
      {Seg(c, 0, 5), Seg(a, 15, 21)},         // overlaps [20,30)
      {Seg(c, 0, 5), Seg(a, 10, 20), Seg(c, 4, 8)},  // overlaps a segment of the same batch
  };
  for (const auto& batch : bad_batches) {
    const Status st = m().CommitSettle("n1", 1, {1, 1}, {1, 2}, batch, {State(a, 40), State(c, 5)});
    EXPECT_EQ(st.code(), Code::kAlreadyExists) << Str(batch) << ": " << st.ToString();
    EXPECT_EQ(Snapshot("n1", {a, c}), before) << Str(batch);
  }
  // Filling the gap exactly is fine.
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 1}, {1, 2}, {Seg(a, 10, 20), Seg(c, 0, 5)}, {}));
  EXPECT_EQ(Starts(a), (std::vector<uint64_t>{0, 10, 20}));
}

TEST_P(MetastoreConformance, CommitSettleSkipsDeletedStreams) {
  const uint64_t gone = MakeStream("b", "gone");
  const uint64_t live = MakeStream("b", "live");
  MintTo("n1", 1);
  ASSERT_TRUE(m().DeleteStream(gone, kNoNode).ok());
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 2}, {Seg(gone, 0, 10), Seg(live, 0, 4)},
                             {State(gone, 10), State(live, 4)}));
  EXPECT_EQ(m().GetStreamState(gone).status().code(), Code::kNotFound);
  EXPECT_TRUE(Segments(gone).empty());
  ASSERT_OK_AND_ASSIGN(std::vector<StreamState> states, m().ListStreamStates(0, 1000));
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(Str(states[0]), Str(State(live, 4)));
  EXPECT_EQ(Starts(live), (std::vector<uint64_t>{0}));
  EXPECT_EQ(Node("n1").checkpoint, (ChainPosition{1, 2}));
}

TEST_P(MetastoreConformance, CountersShowOneTransactionPerSettle) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(MakeStream("b", "s" + std::to_string(i)));
  MintTo("n1", 1);
  std::vector<SegmentInfo> segs;
  for (int i = 0; i < 50; ++i) {
    const uint64_t id = ids[static_cast<size_t>(i) % ids.size()];
    const uint64_t start = static_cast<uint64_t>(i / 20) * 10;
    segs.push_back(Seg(id, start, start + 10));
  }
  std::vector<StreamState> states;
  for (uint64_t id : ids) states.push_back(State(id, 30));

  const MetastoreCounters& c = m().counters();
  const uint64_t reads = c.reads.load();
  const uint64_t writes = c.writes.load();
  const uint64_t txns = c.transactions.load();
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, segs, states));
  EXPECT_EQ(c.transactions.load() - txns, 1u);
  EXPECT_EQ(c.writes.load() - writes, 1u);
  EXPECT_EQ(c.reads.load() - reads, 0u);

  // A refused settle commits nothing.
  EXPECT_FALSE(m().CommitSettle("n1", 1, {0, 0}, {1, 2}, segs, states).ok());
  EXPECT_EQ(c.transactions.load() - txns, 1u);
  EXPECT_EQ(c.writes.load() - writes, 2u);

  EXPECT_EQ(Segments(ids[0]).size(), 3u);
  EXPECT_EQ(Segments(ids[19]).size(), 2u);
  EXPECT_EQ(c.reads.load() - reads, 2u);
  ASSERT_TRUE(m().GetNode("n1").ok());
  EXPECT_EQ(c.reads.load() - reads, 3u);
  ASSERT_TRUE(m().AllocateProducerId().ok());
  EXPECT_EQ(c.writes.load() - writes, 3u);
  EXPECT_EQ(c.transactions.load() - txns, 2u);
}

// ---- Segment index --------------------------------------------------------------

class SegmentIndexTest : public MetastoreConformance {
 protected:
  void SetUp() override {
    MetastoreConformance::SetUp();
    if (IsSkipped()) return;
    a_ = MakeStream("b", "a");
    other_ = MakeStream("b", "other");
    MintTo("n1", 1);
    // [0,10) [10,20) [20,35) gap [40,50); timestamps rise with offsets.
    ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1},
                               {Seg(a_, 0, 10, 100, 200), Seg(a_, 10, 20, 200, 300), Seg(a_, 20, 35, 300, 400),
                                Seg(a_, 40, 50, 500, 600), Seg(other_, 0, 100, 0, 1000)},
                               {}));
  }
  uint64_t a_ = 0;
  uint64_t other_ = 0;
};

TEST_P(SegmentIndexTest, FindSegmentsFromAnOffset) {
  using V = std::vector<uint64_t>;
  EXPECT_EQ(Starts(a_, 0), (V{0, 10, 20, 40}));
  EXPECT_EQ(Starts(a_, 9), (V{0, 10, 20, 40}));
  EXPECT_EQ(Starts(a_, 10), (V{10, 20, 40}));  // end is exclusive
  EXPECT_EQ(Starts(a_, 19), (V{10, 20, 40}));
  EXPECT_EQ(Starts(a_, 34), (V{20, 40}));
  EXPECT_EQ(Starts(a_, 35), (V{40}));  // in the gap
  EXPECT_EQ(Starts(a_, 39), (V{40}));
  EXPECT_EQ(Starts(a_, 49), (V{40}));
  EXPECT_EQ(Starts(a_, 50), V{});
  EXPECT_EQ(Starts(a_, std::numeric_limits<uint64_t>::max()), V{});
  EXPECT_EQ(Starts(a_, 0, 2), (V{0, 10}));
  EXPECT_EQ(Starts(a_, 15, 1), (V{10}));
  EXPECT_EQ(Starts(other_, 0), (V{0}));
  EXPECT_EQ(Starts(other_, 99), (V{0}));
  EXPECT_EQ(Starts(123456, 0), V{});
  EXPECT_EQ(Str(Segments(a_, 12, 1)), Str(std::vector<SegmentInfo>{Seg(a_, 10, 20, 200, 300)}));
  EXPECT_EQ(m().FindSegments(a_, 0, 0).status().code(), Code::kInvalidArgument);
}

TEST_P(SegmentIndexTest, FindSegmentByTimestamp) {
  auto start_for = [&](uint64_t stream, int64_t ts) -> int64_t {
    auto r = m().FindSegmentByTimestamp(stream, ts);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || !r->has_value()) return -1;
    return static_cast<int64_t>((*r)->start_offset);
  };
  EXPECT_EQ(start_for(a_, std::numeric_limits<int64_t>::min()), 0);
  EXPECT_EQ(start_for(a_, 50), 0);
  EXPECT_EQ(start_for(a_, 200), 0);  // last_timestamp_ms >= t: the first segment still qualifies
  EXPECT_EQ(start_for(a_, 201), 10);
  EXPECT_EQ(start_for(a_, 400), 20);
  EXPECT_EQ(start_for(a_, 401), 40);
  EXPECT_EQ(start_for(a_, 600), 40);
  EXPECT_EQ(start_for(a_, 601), -1);
  EXPECT_EQ(start_for(other_, 1000), 0);
  EXPECT_EQ(start_for(123456, 0), -1);
  auto full = m().FindSegmentByTimestamp(a_, 250);
  ASSERT_TRUE(full.ok() && full->has_value());
  EXPECT_EQ(Str(**full), Str(Seg(a_, 10, 20, 200, 300)));
}

TEST_P(MetastoreConformance, LastStreamIdIsTheLargestEverAllocated) {
  ASSERT_OK_AND_ASSIGN(uint64_t none, m().LastStreamId());
  const uint64_t a = MakeStream("b", "a");
  const uint64_t c = MakeStream("b", "c");
  ASSERT_OK_AND_ASSIGN(uint64_t last, m().LastStreamId());
  EXPECT_LT(none, a);
  EXPECT_EQ(last, std::max(a, c));
  ASSERT_TRUE(m().DeleteStream(c, kNoNode).ok());
  ASSERT_OK_AND_ASSIGN(uint64_t after_delete, m().LastStreamId());
  EXPECT_EQ(after_delete, last);  // never reused, so never lowered
}

TEST_P(SegmentIndexTest, ReplaceSegmentsMergesAdjacentRowsOrChangesNothing) {
  using V = std::vector<uint64_t>;
  const std::vector<SegmentInfo> run{Seg(a_, 0, 10, 100, 200), Seg(a_, 10, 20, 200, 300), Seg(a_, 20, 35, 300, 400)};
  SegmentInfo merged = Seg(a_, 0, 35, 100, 400);
  merged.object_key = "segments/merged";
  // Refused, nothing changed: not spanning, not adjacent, a row indexed otherwise, a stream gone.
  EXPECT_EQ(m().ReplaceSegments("n1", 1, a_, run, Seg(a_, 0, 34, 100, 400)).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ReplaceSegments("n1", 1, a_, {run[0], run[2]}, Seg(a_, 0, 35)).code(), Code::kInvalidArgument);
  SegmentInfo moved = run[1];
  moved.object_key = "segments/elsewhere";
  EXPECT_EQ(m().ReplaceSegments("n1", 1, a_, {run[0], moved, run[2]}, merged).code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().ReplaceSegments("n1", 1, 123456, {Seg(123456, 0, 10)}, Seg(123456, 0, 10)).code(), Code::kNotFound);
  EXPECT_EQ(m().ReplaceSegments("n1", 2, a_, run, merged).code(), Code::kPreconditionFailed);  // not its epoch
  EXPECT_EQ(m().ReplaceSegments("n2", 1, a_, run, merged).code(), Code::kPreconditionFailed);  // no such node
  EXPECT_EQ(Starts(a_), (V{0, 10, 20, 40}));
  ASSERT_OK(m().ReplaceSegments("n1", 1, a_, run, merged));
  EXPECT_EQ(Starts(a_), (V{0, 40}));
  EXPECT_EQ(Str(Segments(a_, 12, 1)), Str(std::vector<SegmentInfo>{merged}));
  EXPECT_EQ(Starts(other_), (V{0}));
  // Done once: a second attempt finds the rows gone.
  EXPECT_EQ(m().ReplaceSegments("n1", 1, a_, run, merged).code(), Code::kPreconditionFailed);
}

// A run of many segments (a merge takes up to 256) is checked and swapped
// whole; any segment of it indexed otherwise, missing, or followed within
// the span by one the run does not name refuses it, changing nothing.
TEST_P(SegmentIndexTest, ReplaceSegmentsOfALongRun) {
  using V = std::vector<uint64_t>;
  std::vector<SegmentInfo> run;
  for (uint64_t i = 0; i < 200; ++i) run.push_back(Seg(other_, 100 + 3 * i, 103 + 3 * i, 1000 + i, 1000 + i));
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 1}, {1, 2}, run, {}));
  SegmentInfo merged = Seg(other_, 100, 700, 1000, 1199);
  merged.object_key = "segments/merged-long";
  SegmentInfo moved = run[150];
  moved.object_key = "segments/elsewhere";
  std::vector<SegmentInfo> with_moved = run;
  with_moved[150] = moved;
  const Status refused = m().ReplaceSegments("n1", 1, other_, with_moved, merged);
  EXPECT_EQ(refused.code(), Code::kPreconditionFailed);
  EXPECT_NE(refused.message().find("[550, 553) is not indexed as segments/elsewhere"), std::string::npos)
      << refused.ToString();
  // Naming one past the indexed ones: [700, 705) is not indexed.
  std::vector<SegmentInfo> longer = run;
  longer.push_back(Seg(other_, 700, 705));
  const Status missing = m().ReplaceSegments("n1", 1, other_, longer, Seg(other_, 100, 705));
  EXPECT_EQ(missing.code(), Code::kPreconditionFailed);
  EXPECT_NE(missing.message().find("[700, 705)"), std::string::npos) << missing.ToString();
  // A run naming [35, 45) where a's index holds [40, 50): refused at that row.
  EXPECT_EQ(m().ReplaceSegments("n1", 1, a_, {Seg(a_, 20, 35), Seg(a_, 35, 45)}, Seg(a_, 20, 45)).code(),
            Code::kPreconditionFailed);
  // All but the last: swapped, the last stays.
  std::vector<SegmentInfo> tail_short(run.begin(), run.end() - 1);
  SegmentInfo short_merged = Seg(other_, 100, 697);
  EXPECT_EQ(Starts(other_).size(), 201u);
  ASSERT_EQ(Starts(a_), (V{0, 10, 20, 40}));

  ASSERT_OK(m().ReplaceSegments("n1", 1, other_, tail_short, short_merged));
  EXPECT_EQ(Starts(other_), (V{0, 100, 697}));
  EXPECT_EQ(Str(Segments(other_, 650, 1)), Str(std::vector<SegmentInfo>{short_merged}));
  EXPECT_EQ(Str(Segments(other_, 697, 1)), Str(std::vector<SegmentInfo>{run.back()}));
}

TEST_P(SegmentIndexTest, DeleteSegmentsBelow) {
  using V = std::vector<uint64_t>;
  auto starts_of = [](const std::vector<SegmentInfo>& segs) {
    V out;
    for (const SegmentInfo& s : segs) out.push_back(s.start_offset);
    return out;
  };
  const uint64_t txns = m().counters().transactions.load();
  // Only the node's current epoch deletes.
  EXPECT_EQ(m().DeleteSegmentsBelow("n1", 2, {{a_, 1000}}).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().DeleteSegmentsBelow("n9", 1, {{a_, 1000}}).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(Starts(a_), (V{0, 10, 20, 40}));
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> none, m().DeleteSegmentsBelow("n1", 1, {{a_, 9}}));
  EXPECT_TRUE(none.empty());
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> first, m().DeleteSegmentsBelow("n1", 1, {{a_, 10}}));  // ends at or below
  EXPECT_EQ(Str(first), Str(std::vector<SegmentInfo>{Seg(a_, 0, 10, 100, 200)}));
  EXPECT_EQ(Starts(a_), (V{10, 20, 40}));
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> mid, m().DeleteSegmentsBelow("n1", 1, {{a_, 34}}));
  EXPECT_EQ(starts_of(mid), (V{10}));  // [20,35) still holds offset 34
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> gap, m().DeleteSegmentsBelow("n1", 1, {{a_, 39}}));
  EXPECT_EQ(starts_of(gap), (V{20}));
  EXPECT_EQ(Starts(a_), (V{40}));
  EXPECT_EQ(Starts(other_), (V{0}));  // other streams untouched
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> rest,
                       m().DeleteSegmentsBelow("n1", 1, {{a_, std::numeric_limits<uint64_t>::max()}}));
  EXPECT_EQ(starts_of(rest), (V{40}));
  EXPECT_TRUE(Starts(a_).empty());
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> empty, m().DeleteSegmentsBelow("n1", 1, {{a_, 1000}}));
  EXPECT_TRUE(empty.empty());
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> unknown, m().DeleteSegmentsBelow("n1", 1, {{123456, 1000}}));
  EXPECT_TRUE(unknown.empty());
  EXPECT_EQ(m().counters().transactions.load() - txns, 7u);
  // The stream and its state are not touched by trimming.
  EXPECT_TRUE(m().GetStreamById(a_).ok());
  EXPECT_TRUE(m().GetStreamState(a_).ok());
  // Trimmed offsets can be settled again only above what remains (none here).
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 1}, {1, 2}, {Seg(a_, 50, 60)}, {}));
  EXPECT_EQ(Starts(a_), (V{50}));
}

TEST_P(SegmentIndexTest, DeleteSegmentsBelowCutsManyStreamsInOneTransaction) {
  using V = std::vector<uint64_t>;
  const uint64_t txns = m().counters().transactions.load();
  // Cuts in any order, one matching nothing, one of an unknown stream.
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> removed,
                       m().DeleteSegmentsBelow("n1", 1, {{other_, 100}, {123456, 5}, {a_, 5}, {a_, 34}}));
  EXPECT_EQ(Str(removed), Str(std::vector<SegmentInfo>{Seg(other_, 0, 100, 0, 1000), Seg(a_, 0, 10, 100, 200),
                                                       Seg(a_, 10, 20, 200, 300)}));
  EXPECT_EQ(m().counters().transactions.load() - txns, 1u);
  EXPECT_EQ(Starts(a_), (V{20, 40}));
  EXPECT_TRUE(Starts(other_).empty());
  // All or nothing: a superseded epoch removes nothing for any cut.
  MintTo("n1", 2);
  EXPECT_EQ(m().DeleteSegmentsBelow("n1", 1, {{a_, 1000}}).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(Starts(a_), (V{20, 40}));
  // Bounded: more cuts than one transaction takes is refused, and removes nothing.
  std::vector<SegmentCut> many(Metastore::kMaxSegmentCuts + 1, SegmentCut{a_, 1000});
  EXPECT_EQ(m().DeleteSegmentsBelow("n1", 2, many).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Starts(a_), (V{20, 40}));
  many.pop_back();
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> all, m().DeleteSegmentsBelow("n1", 2, many));
  EXPECT_EQ(all.size(), 2u);
  EXPECT_TRUE(Starts(a_).empty());
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> none, m().DeleteSegmentsBelow("n1", 2, {}));
  EXPECT_TRUE(none.empty());
}

// ---- Tables ---------------------------------------------------------------------

TEST(BucketStreamNameTest, FormatsAndParses) {
  EXPECT_EQ(BucketStreamName("orders", 0), "orders/0");
  EXPECT_EQ(BucketStreamName("orders", 11), "orders/11");
  EXPECT_EQ(BucketStreamName("a/b", 9999), "a/b/9999");
  for (uint32_t b : {0u, 1u, 10u, 9999u}) {
    const std::string name = BucketStreamName("t.x", b);
    auto ref = ParseBucketStreamName(name);
    ASSERT_TRUE(ref.has_value()) << name;
    EXPECT_EQ(ref->table, "t.x");
    EXPECT_EQ(ref->bucket, b);
  }
  auto nested = ParseBucketStreamName("a/b/3");
  ASSERT_TRUE(nested.has_value());
  EXPECT_EQ(nested->table, "a/b");
  EXPECT_EQ(nested->bucket, 3u);
  for (const char* not_bucket : {"t", "t/", "/0", "t/01", "t/00", "t/-1", "t/+1", "t/1x", "t/ 1", "t/10000",
                                 "t/99999999999", ""}) {
    EXPECT_FALSE(ParseBucketStreamName(not_bucket).has_value()) << not_bucket;
  }
}

TEST_P(MetastoreConformance, CreateTableCreatesBucketStreams) {
  MakeBasin("weir-kafka");
  TableInfo t;
  t.id = 424242;  // ignored
  t.basin = "weir-kafka";
  t.name = "orders";
  t.bucket_count = 3;
  t.config = std::string("{\"retention.ms\":\"-1\"}\0bin", 25);  // binary-safe
  t.created_at_ms = 5555;
  StreamConfig sc;
  sc.storage_class = StorageClass::kExpress;
  sc.retention_age_s = 0;
  sc.timestamping = TimestampingMode::kArrival;
  ASSERT_OK_AND_ASSIGN(auto created, m().CreateTable(t, sc, kNoNode));
  const auto& [table, streams] = created;
  EXPECT_NE(table.id, 0u);
  EXPECT_NE(table.id, 424242u);
  t.id = table.id;
  EXPECT_EQ(Str(table), Str(t));
  EXPECT_EQ(table.kind, "log");
  ASSERT_OK_AND_ASSIGN(TableInfo got, m().GetTable("weir-kafka", "orders"));
  EXPECT_EQ(Str(got), Str(t));

  ASSERT_EQ(streams.size(), 3u);
  std::set<uint64_t> ids;
  for (uint32_t b = 0; b < 3; ++b) {
    const StreamInfo& s = streams[b];
    StreamInfo want;
    want.id = s.id;
    want.basin = "weir-kafka";
    want.name = "orders/" + std::to_string(b);
    want.config = sc;
    want.created_at_ms = 5555;
    EXPECT_EQ(Str(s), Str(want));
    EXPECT_TRUE(ids.insert(s.id).second);
    ASSERT_OK_AND_ASSIGN(StreamInfo by_name, m().GetStream("weir-kafka", BucketStreamName("orders", b)));
    EXPECT_EQ(Str(by_name), Str(want));
    ASSERT_OK_AND_ASSIGN(StreamState state, m().GetStreamState(s.id));
    StreamState zero;
    zero.stream_id = s.id;
    EXPECT_EQ(Str(state), Str(zero));
  }
  EXPECT_EQ(StreamNames("weir-kafka", ""), (std::vector<std::string>{"orders/0", "orders/1", "orders/2"}));
  EXPECT_EQ(m().ListStreamStates(0, 1000)->size(), 3u);

  // Stream and table ids come from different allocators; both are unique.
  const uint64_t plain = MakeStream("weir-kafka", "plain");
  EXPECT_EQ(ids.count(plain), 0u);
  auto second = MakeTable("weir-kafka", "payments", 1);
  EXPECT_NE(second.first.id, table.id);
  EXPECT_EQ(second.second.at(0).name, "payments/0");
  // The same table name in another basin is another table.
  auto elsewhere = MakeTable("other", "orders", 2);
  EXPECT_NE(elsewhere.first.id, table.id);
  EXPECT_EQ(m().GetTable("other", "orders")->bucket_count, 2u);
  EXPECT_EQ(m().GetTable("weir-kafka", "orders")->bucket_count, 3u);
}

TEST_P(MetastoreConformance, CreateTableKindAndMaximumBuckets) {
  MakeBasin("b");
  TableInfo t;
  t.basin = "b";
  t.name = "pk";
  t.kind = "primary-key";
  t.bucket_count = kMaxTableBuckets;
  ASSERT_OK_AND_ASSIGN(auto created, m().CreateTable(t, StreamConfig{}, kNoNode));
  EXPECT_EQ(created.first.kind, "primary-key");
  EXPECT_EQ(created.second.size(), size_t{kMaxTableBuckets});
  EXPECT_EQ(created.second.back().name, "pk/9999");
  EXPECT_EQ(m().GetTable("b", "pk")->kind, "primary-key");
  EXPECT_TRUE(m().GetStream("b", "pk/9999").ok());
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> keys, m().DeleteTable(created.first.id, false, kNoNode));
  EXPECT_TRUE(keys.empty());
  EXPECT_TRUE(StreamNames("b", "").empty());
}

TEST_P(MetastoreConformance, CreateTableErrorsCreateNothing) {
  MakeBasin("b");
  auto attempt = [&](const std::string& basin, const std::string& name, uint32_t buckets, std::string kind = "log",
                     StreamConfig sc = {}) {
    TableInfo t;
    t.basin = basin;
    t.name = name;
    t.bucket_count = buckets;
    t.kind = std::move(kind);
    return m().CreateTable(t, sc, kNoNode).status();
  };
  const MetastoreCounters& c = m().counters();
  const uint64_t txns = c.transactions.load();

  Status st = attempt("missing", "t", 1);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("missing"), std::string::npos) << st.ToString();
  for (uint32_t buckets : {0u, kMaxTableBuckets + 1, std::numeric_limits<uint32_t>::max()}) {
    st = attempt("b", "t", buckets);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << buckets << ": " << st.ToString();
    EXPECT_NE(st.message().find("bucket count"), std::string::npos) << st.ToString();
  }
  st = attempt("b", "t", 1, "");
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  StreamConfig bad;
  bad.retention_age_s = -1;
  EXPECT_EQ(attempt("b", "t", 1, "log", bad).code(), Code::kInvalidArgument);
  EXPECT_EQ(m().GetTable("b", "t").status().code(), Code::kNotFound);
  EXPECT_EQ(c.transactions.load(), txns);

  // A bucket stream name taken by a plain stream: nothing is created, not even bucket 0.
  const uint64_t squatter = MakeStream("b", "t/2");
  st = attempt("b", "t", 4);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.ToString();
  EXPECT_NE(st.message().find("t/2"), std::string::npos) << st.ToString();
  EXPECT_EQ(m().GetTable("b", "t").status().code(), Code::kNotFound);
  EXPECT_EQ(StreamNames("b", ""), (std::vector<std::string>{"t/2"}));
  EXPECT_EQ(m().ListStreamStates(0, 1000)->size(), 1u);
  EXPECT_TRUE(TableNames("b", "").empty());
  // With fewer buckets the name is free, and the squatter is not a bucket.
  auto two = MakeTable("b", "t", 2);
  EXPECT_EQ(StreamNames("b", ""), (std::vector<std::string>{"t/0", "t/1", "t/2"}));
  ASSERT_TRUE(m().DeleteStream(squatter, kNoNode).ok());

  // The table exists.
  st = attempt("b", "t", 2);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.ToString();
  st = attempt("b", "t", 7);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.ToString();
  EXPECT_EQ(m().GetTable("b", "t")->bucket_count, 2u);
  EXPECT_EQ(m().GetTable("b", "t")->id, two.first.id);
  EXPECT_EQ(StreamNames("b", ""), (std::vector<std::string>{"t/0", "t/1"}));
  EXPECT_EQ(m().GetTable("b", "nope").status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetTable("nope", "t").status().code(), Code::kNotFound);
}

TEST_P(MetastoreConformance, ListTablesPagesWithinABasin) {
  for (int i = 0; i < 13; ++i) MakeTable("b", fmt::format("t{:02}", i), 1);
  MakeTable("b", "u", 2);
  MakeTable("b", "t%", 1);
  MakeTable("bb", "t99", 1);
  MakeStream("b", "t-stream");  // streams are not tables

  std::vector<std::string> all;
  std::string after;
  while (true) {
    ASSERT_OK_AND_ASSIGN(std::vector<TableInfo> page, m().ListTables("b", "t0", after, 4));
    if (page.empty()) break;
    EXPECT_LE(page.size(), 4u);
    for (const TableInfo& t : page) all.push_back(t.name);
    after = page.back().name;
  }
  ASSERT_EQ(all.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(all[i], fmt::format("t{:02}", i));

  EXPECT_EQ(TableNames("b", "").size(), 15u);
  EXPECT_EQ(TableNames("b", "t%"), (std::vector<std::string>{"t%"}));
  EXPECT_EQ(TableNames("b", "t_"), std::vector<std::string>{});
  EXPECT_EQ(TableNames("b", "", "t12"), (std::vector<std::string>{"u"}));
  EXPECT_EQ(TableNames("b", "", "", 2), (std::vector<std::string>{"t%", "t00"}));
  EXPECT_EQ(TableNames("bb", ""), (std::vector<std::string>{"t99"}));
  ASSERT_OK_AND_ASSIGN(std::vector<TableInfo> u, m().ListTables("b", "u", "", 10));
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(Str(u[0]), Str(*m().GetTable("b", "u")));

  EXPECT_EQ(m().ListTables("b", "", "", 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListTables("b", "", "", 1001).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().ListTables("nope", "", "", 10).status().code(), Code::kNotFound);
  MakeBasin("empty");
  EXPECT_TRUE(TableNames("empty", "").empty());
}

TEST_P(MetastoreConformance, DeleteTableRemovesBucketsStatesAndSegments) {
  auto [orders, buckets] = MakeTable("k", "orders", 3);
  auto [keep, keep_buckets] = MakeTable("k", "keep", 1);
  const uint64_t plain = MakeStream("k", "orders/3");  // not a bucket of a 3-bucket table
  const uint64_t b0 = buckets[0].id;
  const uint64_t b2 = buckets[2].id;
  const uint64_t k0 = keep_buckets[0].id;
  MintTo("n1", 1);
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, {Seg(b0, 0, 10), Seg(b2, 0, 5), Seg(b0, 10, 20), Seg(k0, 0, 1)},
                             {State(b0, 20), State(b2, 5), State(k0, 1)}));

  const MetastoreCounters& c = m().counters();
  const uint64_t txns = c.transactions.load();
  const uint64_t writes = c.writes.load();
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> keys, m().DeleteTable(orders.id, false, kNoNode));
  EXPECT_EQ(c.transactions.load() - txns, 1u);
  EXPECT_EQ(c.writes.load() - writes, 1u);
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> want = {Seg(b0, 0, 10).object_key, Seg(b0, 10, 20).object_key, Seg(b2, 0, 5).object_key};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(keys, want);

  EXPECT_EQ(m().GetTable("k", "orders").status().code(), Code::kNotFound);
  for (const StreamInfo& s : buckets) {
    EXPECT_EQ(m().GetStreamById(s.id).status().code(), Code::kNotFound);
    EXPECT_EQ(m().GetStreamState(s.id).status().code(), Code::kNotFound);
    EXPECT_TRUE(Segments(s.id).empty());
  }
  EXPECT_EQ(StreamNames("k", ""), (std::vector<std::string>{"keep/0", "orders/3"}));
  EXPECT_EQ(TableNames("k", ""), (std::vector<std::string>{"keep"}));
  EXPECT_EQ(Starts(k0), (std::vector<uint64_t>{0}));
  EXPECT_EQ(m().GetStreamState(k0)->settled_offset, 1u);
  EXPECT_TRUE(m().GetStreamById(plain).ok());

  EXPECT_EQ(m().DeleteTable(orders.id, false, kNoNode).status().code(), Code::kNotFound);
  EXPECT_EQ(m().DeleteTable(123456, false, kNoNode).status().code(), Code::kNotFound);
  // A settle of a deleted bucket is skipped, like any deleted stream.
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 1}, {1, 2}, {Seg(b0, 20, 30)}, {State(b0, 30)}));
  EXPECT_TRUE(Segments(b0).empty());

  // The name is free again; the new table and its streams get new ids.
  auto again = MakeTable("k", "orders", 2);
  EXPECT_GT(again.first.id, keep.id);
  for (const StreamInfo& s : again.second) EXPECT_GT(s.id, plain);
  if (persistent()) {
    const uint64_t last = again.first.id;
    ASSERT_TRUE(m().DeleteTable(last, false, kNoNode).ok());
    Reopen();
    EXPECT_GT(MakeTable("k", "orders", 1).first.id, last);
  }
}

TEST_P(MetastoreConformance, DeleteStreamOfABucketIsRefused) {
  auto [t, buckets] = MakeTable("k", "t", 2);
  const std::string before = Str(*m().ListStreamStates(0, 1000));
  for (const StreamInfo& s : buckets) {
    auto st = m().DeleteStream(s.id, kNoNode);
    EXPECT_EQ(st.status().code(), Code::kPreconditionFailed) << st.status().ToString();
    EXPECT_NE(st.status().message().find("k/" + s.name), std::string::npos) << st.status().ToString();
    EXPECT_NE(st.status().message().find("table t"), std::string::npos) << st.status().ToString();
    EXPECT_TRUE(m().GetStreamById(s.id).ok());
  }
  EXPECT_EQ(Str(*m().ListStreamStates(0, 1000)), before);

  // Names that only look like buckets are ordinary streams.
  for (const char* name : {"t/2", "t/01", "u/0", "t/0/0"}) {
    const uint64_t id = MakeStream("k", name);
    EXPECT_TRUE(m().DeleteStream(id, kNoNode).ok()) << name;
  }
  // The same bucket name in another basin without the table is ordinary too.
  EXPECT_TRUE(m().DeleteStream(MakeStream("other", "t/0"), kNoNode).ok());
  // Other writes to a bucket stream are allowed.
  StreamConfig sc;
  sc.retention_age_s = 60;
  ASSERT_OK(m().UpdateStreamConfig(buckets[1].id, sc, kNoNode));
  EXPECT_EQ(m().GetStreamById(buckets[1].id)->config.retention_age_s, 60);

  ASSERT_TRUE(m().DeleteTable(t.id, false, kNoNode).ok());
  EXPECT_EQ(m().DeleteStream(buckets[0].id, kNoNode).status().code(), Code::kNotFound);
}

TEST_P(MetastoreConformance, DeleteBasinWithTablesIsRefused) {
  auto [t, buckets] = MakeTable("k", "topic", 2);
  const Status st = m().DeleteBasin("k", kNoNode);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_NE(st.message().find("tables"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("topic"), std::string::npos) << st.ToString();
  ASSERT_TRUE(m().GetTable("k", "topic").ok());
  ASSERT_TRUE(m().DeleteTable(t.id, false, kNoNode).ok());
  ASSERT_OK(m().DeleteBasin("k", kNoNode));
  EXPECT_EQ(m().GetBasin("k").status().code(), Code::kNotFound);
}

// ---- Consumer-group offsets ------------------------------------------------------

GroupOffset Offset(std::string topic, int32_t partition, int64_t offset, std::string metadata = "",
                   int32_t epoch = -1, int64_t at = 1700000000000) {
  GroupOffset o;
  o.topic = std::move(topic);
  o.partition = partition;
  o.offset = offset;
  o.leader_epoch = epoch;
  o.metadata = std::move(metadata);
  o.commit_time_ms = at;
  return o;
}

TEST_P(MetastoreConformance, GroupOffsetsCommitFetchUpsert) {
  EXPECT_EQ(Offsets("g"), "[]");
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("b", 10, 5), Offset("b", 2, 7, "m", 3), Offset("a", 0, 0),
                                         Offset("b", 9, -1), Offset("a\xc3\xa9", 0, 1)}, kNoNode));
  // Sorted by (topic bytes, partition as a number).
  const std::vector<GroupOffset> want = {Offset("a", 0, 0), Offset("a\xc3\xa9", 0, 1), Offset("b", 2, 7, "m", 3),
                                         Offset("b", 9, -1), Offset("b", 10, 5)};
  EXPECT_EQ(Offsets("g"), Str(want));

  // Upsert: replaces every field of the committed partitions, keeps the others.
  ASSERT_OK(m().CommitGroupOffsets(
      "g", {Offset("b", 2, 100, std::string("x\0y", 3), 4, 42), Offset("c", 0, 1, "", -1, 43)}, kNoNode));
  EXPECT_EQ(Offsets("g"), Str(std::vector<GroupOffset>{Offset("a", 0, 0), Offset("a\xc3\xa9", 0, 1),
                                                       Offset("b", 2, 100, std::string("x\0y", 3), 4, 42),
                                                       Offset("b", 9, -1), Offset("b", 10, 5),
                                                       Offset("c", 0, 1, "", -1, 43)}));
  // The last entry for a partition in one commit wins; an empty commit is fine.
  ASSERT_OK(m().CommitGroupOffsets("h", {Offset("t", 0, 1), Offset("t", 0, 2)}, kNoNode));
  EXPECT_EQ(Offsets("h"), Str(std::vector<GroupOffset>{Offset("t", 0, 2)}));
  ASSERT_OK(m().CommitGroupOffsets("h", {}, kNoNode));
  EXPECT_EQ(Offsets("h"), Str(std::vector<GroupOffset>{Offset("t", 0, 2)}));

  // Groups are independent, including the empty group id and prefixes of names.
  ASSERT_OK(m().CommitGroupOffsets("", {Offset("t", 0, 9)}, kNoNode));
  EXPECT_EQ(Offsets(""), Str(std::vector<GroupOffset>{Offset("t", 0, 9)}));
  EXPECT_EQ(Offsets("g2"), "[]");
  EXPECT_EQ(Offsets("h"), Str(std::vector<GroupOffset>{Offset("t", 0, 2)}));
  // Extremes round-trip.
  const GroupOffset big = Offset("t", std::numeric_limits<int32_t>::max(), std::numeric_limits<int64_t>::max(),
                                 std::string(10000, 'm'), std::numeric_limits<int32_t>::max(),
                                 std::numeric_limits<int64_t>::min());
  ASSERT_OK(m().CommitGroupOffsets("x", {big}, kNoNode));
  EXPECT_EQ(Offsets("x"), Str(std::vector<GroupOffset>{big}));
}

// A superseded process's Kafka listener changes no committed offset.
TEST_P(MetastoreConformance, GroupOffsetWritesOfASupersededNodeChangeNothing) {
  MintTo("n1", 1);
  const EpochCheck current{"n1", 1};
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("t", 0, 500, "", -1, 100)}, current));
  ASSERT_OK(m().CommitGroupOffsets("h", {Offset("t", 0, 7, "", -1, 100)}, current));
  MintTo("n1", 2);  // a successor
  const EpochCheck stale{"n1", 1};
  const std::string g = Offsets("g");
  const std::string h = Offsets("h");
  EXPECT_EQ(m().CommitGroupOffsets("g", {Offset("t", 0, 100)}, stale).code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().DeletePartitionOffsets("g", {{"t", 0}}, stale).code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().DeleteAllGroupOffsets("g", stale).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().ExpireGroupOffsets(1000, {}, stale).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(Offsets("g"), g);
  EXPECT_EQ(Offsets("h"), h);
  // The successor's epoch writes.
  const EpochCheck now{"n1", 2};
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("t", 0, 600)}, now));
  ASSERT_OK(m().DeletePartitionOffsets("g", {{"t", 0}}, now));
  EXPECT_EQ(Offsets("g"), "[]");
  ASSERT_OK_AND_ASSIGN(bool had, m().DeleteAllGroupOffsets("h", now));
  EXPECT_TRUE(had);
  ASSERT_OK(m().ExpireGroupOffsets(1000, {}, now).status());
}

TEST_P(MetastoreConformance, GroupOffsetsBadCommitStoresNothing) {
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("t", 0, 1)}, kNoNode));
  const std::string before = Offsets("g");
  const uint64_t txns = m().counters().transactions.load();
  Status st = m().CommitGroupOffsets("g", {Offset("t", 0, 50), Offset("u", -1, 5)}, kNoNode);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("partition -1"), std::string::npos) << st.ToString();
  st = m().CommitGroupOffsets("g", {Offset("t", 0, 50), Offset("", 0, 5)}, kNoNode);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(Offsets("g"), before);
  EXPECT_EQ(m().counters().transactions.load(), txns);
}

TEST_P(MetastoreConformance, ExpireGroupOffsetsRemovesWholeStaleGroups) {
  ASSERT_OK(m().CommitGroupOffsets("old", {Offset("t", 0, 1, "", -1, 100), Offset("t", 1, 2, "", -1, 200)}, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("mixed", {Offset("t", 0, 3, "", -1, 100), Offset("u", 0, 4, "", -1, 900)}, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("kept", {Offset("t", 0, 5, "", -1, 100)}, kNoNode));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed, m().ExpireGroupOffsets(500, {"kept"}, kNoNode));
  EXPECT_EQ(removed, (std::vector<std::string>{"old"}));
  EXPECT_EQ(Offsets("old"), "[]");
  // A group whose newest commit is recent keeps all its offsets, old ones too.
  EXPECT_EQ(Offsets("mixed"), Str(std::vector<GroupOffset>{Offset("t", 0, 3, "", -1, 100),
                                                          Offset("u", 0, 4, "", -1, 900)}));
  EXPECT_EQ(Offsets("kept"), Str(std::vector<GroupOffset>{Offset("t", 0, 5, "", -1, 100)}));
  ASSERT_OK_AND_ASSIGN(removed, m().ExpireGroupOffsets(500, {}, kNoNode));
  EXPECT_EQ(removed, (std::vector<std::string>{"kept"}));
  ASSERT_OK_AND_ASSIGN(removed, m().ExpireGroupOffsets(500, {}, kNoNode));
  EXPECT_TRUE(removed.empty());
}

// OffsetFetch's lookups: only the named partitions the group holds, each
// once, sorted; more than one statement takes (128) in several.
TEST_P(MetastoreConformance, FetchPartitionOffsetsFindsOnlyThoseNamed) {
  std::vector<GroupOffset> commit;
  for (int32_t p = 0; p < 200; ++p) commit.push_back(Offset("t", p, 10 * p, "m" + std::to_string(p), 7));
  commit.push_back(Offset("u", 0, 5));
  ASSERT_OK(m().CommitGroupOffsets("g", commit, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("h", {Offset("t", 1000, 1)}, kNoNode));
  EXPECT_TRUE(*m().GroupHasOffsets("g"));
  EXPECT_TRUE(*m().GroupHasOffsets("h"));
  EXPECT_FALSE(*m().GroupHasOffsets("nobody"));
  EXPECT_TRUE(m().FetchPartitionOffsets("g", {})->empty());

  // Odd partitions of t from the top down (one named twice), u's, two the
  // group lacks (one is h's), and a partition of a topic nobody has.
  std::vector<std::pair<std::string, int32_t>> named;
  for (int32_t p = 199; p >= 1; p -= 2) named.emplace_back("t", p);
  named.emplace_back("t", 3);
  named.emplace_back("u", 0);
  named.emplace_back("t", 1000);
  named.emplace_back("t", 200);
  named.emplace_back("none", 0);
  ASSERT_OK_AND_ASSIGN(std::vector<GroupOffset> got, m().FetchPartitionOffsets("g", named));
  ASSERT_EQ(got.size(), 101u);
  for (size_t i = 0; i < 100; ++i) {
    const int32_t p = static_cast<int32_t>(2 * i + 1);
    EXPECT_EQ(got[i].topic, "t");
    EXPECT_EQ(got[i].partition, p);
    EXPECT_EQ(got[i].offset, 10 * p);
    EXPECT_EQ(got[i].metadata, "m" + std::to_string(p));
  }
  EXPECT_EQ(got[100].topic, "u");
  EXPECT_EQ(got[100].offset, 5);
  ASSERT_OK_AND_ASSIGN(got, m().FetchPartitionOffsets("h", named));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].partition, 1000);
  EXPECT_TRUE(m().FetchPartitionOffsets("nobody", named)->empty());
}

// Commits, deletes and expiries of more rows than one statement takes (128)
// run as several statements in one transaction, with the same outcome.
TEST_P(MetastoreConformance, GroupOffsetsOfManyPartitionsAndGroups) {
  std::vector<GroupOffset> commit;
  for (int32_t p = 0; p < 300; ++p) commit.push_back(Offset(p % 2 == 0 ? "t" : "u", p / 2, p, "m" + std::to_string(p)));
  // A partition named again far from its first entry keeps its last offset.
  commit.push_back(Offset("t", 0, 1000));
  commit.push_back(Offset("u", 149, 2000));
  ASSERT_OK(m().CommitGroupOffsets("g", commit, kNoNode));
  ASSERT_OK_AND_ASSIGN(std::vector<GroupOffset> got, m().FetchGroupOffsets("g"));
  ASSERT_EQ(got.size(), 300u);
  for (size_t i = 0; i < got.size(); ++i) {
    const bool t = i < 150;
    const int32_t part = static_cast<int32_t>(t ? i : i - 150);
    EXPECT_EQ(got[i].topic, t ? "t" : "u");
    EXPECT_EQ(got[i].partition, part);
    const int64_t first = 2 * part + (t ? 0 : 1);
    const int64_t want = t && part == 0 ? 1000 : !t && part == 149 ? 2000 : first;
    EXPECT_EQ(got[i].offset, want) << got[i].topic << " " << part;
    EXPECT_EQ(got[i].metadata, want == first ? "m" + std::to_string(first) : "");
  }

  // Delete every partition of "t" but the last and the even ones of "u" (225).
  std::vector<std::pair<std::string, int32_t>> gone;
  for (int32_t p = 0; p < 149; ++p) gone.emplace_back("t", p);
  for (int32_t p = 0; p < 150; p += 2) gone.emplace_back("u", p);
  gone.emplace_back("t", 0);  // twice
  ASSERT_OK(m().DeletePartitionOffsets("g", gone, kNoNode));
  ASSERT_OK_AND_ASSIGN(got, m().FetchGroupOffsets("g"));
  ASSERT_EQ(got.size(), 76u);
  EXPECT_EQ(got[0].topic, "t");
  EXPECT_EQ(got[0].partition, 149);
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_EQ(got[i].topic, "u");
    EXPECT_EQ(got[i].partition, static_cast<int32_t>(2 * i - 1));
  }

  // 300 stale groups, 10 of them kept; one recent group.
  std::vector<std::string> keep;
  for (int i = 0; i < 300; ++i) {
    const std::string group = "old-" + std::to_string(i);
    ASSERT_OK(m().CommitGroupOffsets(group, {Offset("t", 0, i, "", -1, 100)}, kNoNode));
    if (i % 30 == 7) keep.push_back(group);
  }
  ASSERT_OK(m().CommitGroupOffsets("new", {Offset("t", 0, 1, "", -1, 900)}, kNoNode));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed, m().ExpireGroupOffsets(500, keep, kNoNode));
  EXPECT_EQ(removed.size(), 290u);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> left, m().ListOffsetGroups(1000));
  std::vector<std::string> want = keep;
  want.push_back("new");
  want.push_back("g");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(left, want);
}

TEST_P(MetastoreConformance, AddBucketsGrowsATableInOneTransaction) {
  const uint64_t id = MakeTable("b1", "topic", 2).first.id;
  StreamConfig cfg;
  cfg.retention_age_s = 60;
  ASSERT_OK_AND_ASSIGN(auto added, m().AddBuckets(id, 4, cfg, 9, kNoNode));
  EXPECT_EQ(added.first.bucket_count, 4u);
  ASSERT_EQ(added.second.size(), 2u);
  EXPECT_EQ(added.second[0].name, BucketStreamName("topic", 2));
  EXPECT_EQ(added.second[1].name, BucketStreamName("topic", 3));
  EXPECT_EQ(added.second[1].config.retention_age_s, 60);
  EXPECT_EQ(added.second[1].created_at_ms, 9);
  ASSERT_OK_AND_ASSIGN(auto stored, m().GetTable("b1", "topic"));
  EXPECT_EQ(stored.bucket_count, 4u);
  ASSERT_OK_AND_ASSIGN(auto stream3, m().GetStream("b1", BucketStreamName("topic", 3)));
  EXPECT_EQ(stream3.id, added.second[1].id);
  ASSERT_OK_AND_ASSIGN(auto state, m().GetStreamState(stream3.id));
  EXPECT_EQ(state.settled_offset, 0u);
  // Only upwards, and within the limit.
  EXPECT_EQ(m().AddBuckets(id, 4, cfg, 9, kNoNode).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().AddBuckets(id, 3, cfg, 9, kNoNode).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().AddBuckets(id, kMaxTableBuckets + 1, cfg, 9, kNoNode).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m().AddBuckets(id + 100, 8, cfg, 9, kNoNode).status().code(), Code::kNotFound);
  // A taken name changes nothing.
  StreamInfo squatter;
  squatter.basin = "b1";
  squatter.name = BucketStreamName("topic", 5);
  ASSERT_OK(m().CreateStream(squatter, kNoNode).status());
  EXPECT_EQ(m().AddBuckets(id, 6, cfg, 9, kNoNode).status().code(), Code::kAlreadyExists);
  ASSERT_OK_AND_ASSIGN(stored, m().GetTable("b1", "topic"));
  EXPECT_EQ(stored.bucket_count, 4u);
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("topic", 4)).status().code(), Code::kNotFound);
  // Deleting the table takes the added buckets too.
  ASSERT_OK(m().DeleteTable(id, false, kNoNode).status());
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("topic", 3)).status().code(), Code::kNotFound);
}

// Tables of more buckets than one statement takes (128): made, grown and
// deleted as with few.
TEST_P(MetastoreConformance, TablesOfManyBuckets) {
  auto [table, streams] = MakeTable("b1", "big", 300);
  ASSERT_EQ(streams.size(), 300u);
  for (uint32_t b = 0; b < 300; ++b) {
    EXPECT_EQ(streams[b].name, BucketStreamName("big", b));
    EXPECT_EQ(streams[b].id, streams[0].id + b);
  }
  ASSERT_OK_AND_ASSIGN(auto got, m().GetStream("b1", BucketStreamName("big", 299)));
  EXPECT_EQ(got.id, streams[299].id);
  EXPECT_EQ(got.created_at_ms, 3000);
  ASSERT_OK_AND_ASSIGN(auto states, m().ListStreamStates(0, 1000));
  EXPECT_EQ(states.size(), 300u);
  ASSERT_OK_AND_ASSIGN(const uint64_t last_id, m().LastStreamId());
  EXPECT_EQ(last_id, streams[299].id);

  // A name taken far into the new buckets changes nothing, and is named.
  StreamInfo squatter;
  squatter.basin = "b1";
  squatter.name = BucketStreamName("big", 450);
  ASSERT_OK_AND_ASSIGN(squatter, m().CreateStream(squatter, kNoNode));
  StreamConfig cfg;
  cfg.retention_age_s = 60;
  const Status refused = m().AddBuckets(table.id, 600, cfg, 9, kNoNode).status();
  EXPECT_EQ(refused.code(), Code::kAlreadyExists) << refused.ToString();
  EXPECT_NE(refused.message().find("bucket 450 stream, " + BucketStreamName("big", 450)), std::string::npos)
      << refused.ToString();
  EXPECT_EQ(m().GetTable("b1", "big")->bucket_count, 300u);
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("big", 300)).status().code(), Code::kNotFound);
  EXPECT_EQ(*m().LastStreamId(), squatter.id);
  ASSERT_OK(m().DeleteStream(squatter.id, kNoNode).status());

  ASSERT_OK_AND_ASSIGN(auto added, m().AddBuckets(table.id, 600, cfg, 9, kNoNode));
  ASSERT_EQ(added.second.size(), 300u);
  for (uint32_t i = 0; i < 300; ++i) {
    EXPECT_EQ(added.second[i].name, BucketStreamName("big", 300 + i));
    EXPECT_EQ(added.second[i].id, squatter.id + 1 + i);
    EXPECT_EQ(added.second[i].config.retention_age_s, 60);
  }
  ASSERT_OK_AND_ASSIGN(got, m().GetStream("b1", BucketStreamName("big", 450)));
  EXPECT_EQ(got.id, added.second[150].id);
  EXPECT_EQ(got.config.retention_age_s, 60);
  ASSERT_OK_AND_ASSIGN(auto state, m().GetStreamState(added.second[299].id));
  EXPECT_EQ(state.settled_offset, 0u);

  // Deleting the table removes every bucket and returns each segment's key.
  MintTo("n1", 1);
  const uint64_t a = streams[0].id, b = streams[200].id, c = added.second[299].id;
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 1}, {Seg(c, 0, 5), Seg(a, 0, 10), Seg(b, 0, 3), Seg(a, 10, 12)},
                             {State(a, 12), State(b, 3), State(c, 5)}));
  // Retention cuts of every bucket (more than one statement takes), newest
  // first: what goes is returned by cut, then offset.
  std::vector<SegmentCut> cuts;
  for (auto it = added.second.rbegin(); it != added.second.rend(); ++it) cuts.push_back({it->id, 10});
  for (auto it = streams.rbegin(); it != streams.rend(); ++it) cuts.push_back({it->id, 10});
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentInfo> cut, m().DeleteSegmentsBelow("n1", 1, cuts));
  EXPECT_EQ(Str(cut), Str(std::vector<SegmentInfo>{Seg(c, 0, 5), Seg(b, 0, 3), Seg(a, 0, 10)}));
  ASSERT_OK(m().CommitSettle("n1", 1, {1, 1}, {1, 2}, {Seg(b, 3, 8)}, {State(b, 8)}));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> keys, m().DeleteTable(table.id, false, kNoNode));
  EXPECT_EQ(keys, (std::vector<std::string>{Seg(a, 10, 12).object_key, Seg(b, 3, 8).object_key}));
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("big", 450)).status().code(), Code::kNotFound);
  EXPECT_EQ(m().GetStream("b1", BucketStreamName("big", 0)).status().code(), Code::kNotFound);
  ASSERT_OK_AND_ASSIGN(states, m().ListStreamStates(0, 1000));
  EXPECT_TRUE(states.empty());
  EXPECT_TRUE(m().FindSegments(a, 0, 10)->empty());
  // The names are free again.
  MakeTable("b1", "big", 200);
}

TEST_P(MetastoreConformance, ListAndDeleteWholeGroups) {
  ASSERT_OK_AND_ASSIGN(auto groups, m().ListOffsetGroups(1000));
  EXPECT_TRUE(groups.empty());
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("t", 0, 1), Offset("u", 2, 2)}, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("caf\xc3\xa9", {Offset("t", 0, 3)}, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("a", {Offset("t", 1, 4)}, kNoNode));
  ASSERT_OK_AND_ASSIGN(groups, m().ListOffsetGroups(1000));
  EXPECT_EQ(groups, (std::vector<std::string>{"a", "caf\xc3\xa9", "g"}));  // sorted by bytes, each once
  ASSERT_OK_AND_ASSIGN(groups, m().ListOffsetGroups(2));
  EXPECT_EQ(groups, (std::vector<std::string>{"a", "caf\xc3\xa9"}));
  EXPECT_EQ(m().ListOffsetGroups(0).status().code(), Code::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(bool had, m().DeleteAllGroupOffsets("g", kNoNode));
  EXPECT_TRUE(had);
  EXPECT_EQ(Offsets("g"), "[]");
  EXPECT_EQ(Offsets("a"), Str(std::vector<GroupOffset>{Offset("t", 1, 4)}));
  ASSERT_OK_AND_ASSIGN(had, m().DeleteAllGroupOffsets("g", kNoNode));
  EXPECT_FALSE(had);
  ASSERT_OK_AND_ASSIGN(had, m().DeleteAllGroupOffsets("nobody", kNoNode));
  EXPECT_FALSE(had);
  ASSERT_OK_AND_ASSIGN(groups, m().ListOffsetGroups(1000));
  EXPECT_EQ(groups, (std::vector<std::string>{"a", "caf\xc3\xa9"}));
}

// A table deleted as a Kafka topic takes every group's offsets of its name
// with it, in the same transaction; one deleted otherwise leaves them.
TEST_P(MetastoreConformance, DeletingATopicTableDeletesItsGroupOffsets) {
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("t", 0, 1), Offset("u", 0, 2)}, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("h", {Offset("t", 3, 8), Offset("u", 0, 9)}, kNoNode));
  const auto plain = MakeTable("k", "u", 1);
  ASSERT_OK(m().DeleteTable(plain.first.id, false, kNoNode).status());
  const auto topic = MakeTable("k", "t", 2);
  ASSERT_OK(m().DeleteTable(topic.first.id, true, kNoNode).status());
  EXPECT_EQ(Offsets("g"), Str(std::vector<GroupOffset>{Offset("u", 0, 2)}));
  EXPECT_EQ(Offsets("h"), Str(std::vector<GroupOffset>{Offset("u", 0, 9)}));
  // A missing table changes nothing.
  EXPECT_EQ(m().DeleteTable(topic.first.id, true, kNoNode).status().code(), Code::kNotFound);
  EXPECT_EQ(Offsets("g"), Str(std::vector<GroupOffset>{Offset("u", 0, 2)}));
}

TEST_P(MetastoreConformance, CountersForTablesAndGroupOffsets) {
  MakeBasin("k");
  const MetastoreCounters& c = m().counters();
  const uint64_t reads = c.reads.load();
  const uint64_t writes = c.writes.load();
  const uint64_t txns = c.transactions.load();
  auto delta = [&] {
    return fmt::format("r{} w{} t{}", c.reads.load() - reads, c.writes.load() - writes,
                       c.transactions.load() - txns);
  };
  TableInfo t;
  t.basin = "k";
  t.name = "t";
  t.bucket_count = 8;
  ASSERT_OK_AND_ASSIGN(auto created, m().CreateTable(t, StreamConfig{}, kNoNode));
  EXPECT_EQ(delta(), "r0 w1 t1");  // one transaction for the table and its 8 streams
  EXPECT_EQ(m().CreateTable(t, StreamConfig{}, kNoNode).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(delta(), "r0 w2 t1");
  ASSERT_TRUE(m().GetTable("k", "t").ok());
  ASSERT_TRUE(m().ListTables("k", "", "", 10).ok());
  EXPECT_EQ(delta(), "r2 w2 t1");
  ASSERT_OK(m().CommitGroupOffsets("g", {Offset("t", 0, 1), Offset("t", 1, 1), Offset("t", 2, 1)}, kNoNode));
  EXPECT_EQ(delta(), "r2 w3 t2");
  ASSERT_TRUE(m().FetchGroupOffsets("g").ok());
  EXPECT_EQ(delta(), "r3 w3 t2");
  ASSERT_OK(m().DeletePartitionOffsets("g", {{"t", 0}}, kNoNode));
  EXPECT_EQ(delta(), "r3 w4 t3");
  EXPECT_EQ(m().DeleteStream(created.second[0].id, kNoNode).status().code(), Code::kPreconditionFailed);
  EXPECT_EQ(delta(), "r3 w5 t3");
  ASSERT_TRUE(m().DeleteTable(created.first.id, false, kNoNode).ok());
  EXPECT_EQ(delta(), "r3 w6 t4");
}

// ---- Persistence ------------------------------------------------------------------

TEST_P(MetastoreConformance, EverythingSurvivesReopen) {
  if (!persistent()) GTEST_SKIP() << "backend " << GetParam().name << " does not persist";
  MakeBasin("keep", 777);
  StreamInfo info;
  info.basin = "keep";
  info.name = "s";
  info.config = {StorageClass::kExpress, 12345, TimestampingMode::kClientRequire, true};
  info.created_at_ms = 888;
  ASSERT_OK_AND_ASSIGN(StreamInfo created, m().CreateStream(info, kNoNode));
  const uint64_t dropped = MakeStream("keep", "dropped");
  ASSERT_TRUE(m().DeleteStream(dropped, kNoNode).ok());
  EXPECT_EQ(m().DeleteBasin("keep", kNoNode).code(), Code::kPreconditionFailed);
  ASSERT_OK_AND_ASSIGN(NodeState node, m().MintEpoch("n1", 0, 6));
  ASSERT_OK(m().CommitSettle("n1", 1, {0, 0}, {1, 9}, {Seg(created.id, 0, 10, 5, 6)},
                             {State(created.id, 10, "fence", std::string("\0bin\xff", 5))}));
  ASSERT_OK_AND_ASSIGN(uint64_t producer, m().AllocateProducerId());
  const std::string before = Snapshot("n1", {created.id});

  Reopen();
  ASSERT_OK_AND_ASSIGN(BasinInfo b, m().GetBasin("keep"));
  EXPECT_EQ(b.created_at_ms, 777);
  ASSERT_OK_AND_ASSIGN(StreamInfo s, m().GetStream("keep", "s"));
  EXPECT_EQ(Str(s), Str(created));
  EXPECT_EQ(m().GetStreamById(dropped).status().code(), Code::kNotFound);
  EXPECT_EQ(Snapshot("n1", {created.id}), before);
  EXPECT_EQ(Node("n1").epoch, node.epoch);
  EXPECT_EQ(Node("n1").window, 6u);
  EXPECT_EQ(Node("n1").checkpoint, (ChainPosition{1, 9}));
  ASSERT_OK_AND_ASSIGN(uint64_t next_producer, m().AllocateProducerId());
  EXPECT_GT(next_producer, producer);
  EXPECT_GT(MakeStream("keep", "new"), dropped);
  // The CAS continues from the stored epoch.
  EXPECT_EQ(m().MintEpoch("n1", 0, 6).status().code(), Code::kPreconditionFailed);
  EXPECT_TRUE(m().MintEpoch("n1", 1, 6).ok());
}

TEST_P(MetastoreConformance, TablesAndGroupOffsetsSurviveReopen) {
  if (!persistent()) GTEST_SKIP() << "backend " << GetParam().name << " does not persist";
  auto [t, buckets] = MakeTable("weir-kafka", "events", 3, "{\"cleanup.policy\":\"delete\"}");
  auto [gone, gone_buckets] = MakeTable("weir-kafka", "gone", 1);
  ASSERT_TRUE(m().DeleteTable(gone.id, false, kNoNode).ok());
  const std::vector<GroupOffset> offsets = {Offset("events", 0, 10, "m0", 2, 111), Offset("events", 2, 30),
                                            Offset("other", 0, 1, std::string("\0\xff", 2), -1, 222)};
  ASSERT_OK(m().CommitGroupOffsets("g1", offsets, kNoNode));
  ASSERT_OK(m().CommitGroupOffsets("g2", {Offset("events", 1, 5)}, kNoNode));
  ASSERT_OK(m().DeletePartitionOffsets("g2", {{"events", 1}}, kNoNode));

  Reopen();
  ASSERT_OK_AND_ASSIGN(TableInfo got, m().GetTable("weir-kafka", "events"));
  EXPECT_EQ(Str(got), Str(t));
  EXPECT_EQ(m().GetTable("weir-kafka", "gone").status().code(), Code::kNotFound);
  EXPECT_EQ(TableNames("weir-kafka", ""), (std::vector<std::string>{"events"}));
  for (const StreamInfo& s : buckets) {
    ASSERT_OK_AND_ASSIGN(StreamInfo after, m().GetStreamById(s.id));
    EXPECT_EQ(Str(after), Str(s));
  }
  EXPECT_EQ(StreamNames("weir-kafka", ""), (std::vector<std::string>{"events/0", "events/1", "events/2"}));
  EXPECT_EQ(Offsets("g1"), Str(offsets));
  EXPECT_EQ(Offsets("g2"), "[]");
  // Bucket streams are still protected, and allocators continue.
  EXPECT_EQ(m().DeleteStream(buckets[1].id, kNoNode).status().code(), Code::kPreconditionFailed);
  EXPECT_GT(MakeTable("weir-kafka", "next", 1).first.id, gone.id);
}

TEST_P(MetastoreConformance, TheDeploymentIdIsDrawnOnceAndKept) {
  auto id = m().DeploymentId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_NE(*id, 0u);
  EXPECT_LT(*id, uint64_t{1} << 63);
  auto again = m().DeploymentId();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *id);
  if (persistent()) {
    Reopen();
    auto reopened = m().DeploymentId();
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    EXPECT_EQ(*reopened, *id);
  }
}

TEST_P(MetastoreConformance, HeartbeatsKeepOneNodeServing) {
  constexpr int64_t kLong = 3'600'000;  // an hour: any heartbeat of this test is live
  ASSERT_OK(m().MintEpoch("n1", 0, 8).status());
  ASSERT_OK(m().MintEpoch("n2", 0, 8).status());
  // Only a node at its epoch beats.
  EXPECT_EQ(m().Heartbeat("n1", 2, kLong).code(), Code::kPreconditionFailed);
  EXPECT_EQ(m().Heartbeat("n3", 1, kLong).code(), Code::kPreconditionFailed);  // never minted
  ASSERT_OK(m().Heartbeat("n1", 1, kLong));
  ASSERT_OK(m().Heartbeat("n1", 1, kLong));  // a node's own heartbeat never stops it
  // Another node is live while its heartbeat is within the window.
  Status st = m().Heartbeat("n2", 1, kLong);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_NE(st.message().find("node n1 is live"), std::string::npos) << st.ToString();
  // The look alone (a start's, before its mint): the same answer, for any node but n1.
  st = m().CheckNoOtherLiveNode("n3", kLong);
  EXPECT_EQ(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_NE(st.message().find("node n1 is live"), std::string::npos) << st.ToString();
  ASSERT_OK(m().CheckNoOtherLiveNode("n1", kLong));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK(m().CheckNoOtherLiveNode("n3", 5));
  ASSERT_OK(m().Heartbeat("n2", 1, 5));  // n1's is more than 5 ms old: stale
  EXPECT_EQ(m().Heartbeat("n1", 1, kLong).code(), Code::kPreconditionFailed);  // n2 serves
  // Clearing checks no other node; a cleared heartbeat is never live.
  ASSERT_OK(m().Heartbeat("n1", 1, 0));
  ASSERT_OK(m().Heartbeat("n2", 1, 0));
  ASSERT_OK(m().Heartbeat("n1", 1, kLong));
  // The rest of the node's state is untouched.
  ASSERT_OK_AND_ASSIGN(NodeState after, m().GetNode("n1"));
  EXPECT_EQ(after.epoch, 1u);
  EXPECT_EQ(after.window, 8u);
  EXPECT_GT(after.heartbeat_ms, 0);
  ASSERT_OK(m().MintEpoch("n1", 1, 8).status());
  EXPECT_EQ(m().Heartbeat("n1", 1, kLong).code(), Code::kPreconditionFailed);  // superseded
}

// ListNodes: every minted node by name, with its epoch, window, checkpoint
// and heartbeat (0 once cleared), as GetNode reads it.
TEST_P(MetastoreConformance, ListNodesReadsEveryNodesState) {
  ASSERT_OK_AND_ASSIGN(std::vector<NodeState> none, m().ListNodes());
  EXPECT_TRUE(none.empty());
  ASSERT_OK(m().MintEpoch("nb", 0, 8).status());
  ASSERT_OK(m().MintEpoch("na", 0, 4).status());
  ASSERT_OK(m().MintEpoch("na", 1, 16).status());
  ASSERT_OK(m().CommitSettle("na", 2, ChainPosition{}, ChainPosition{2, 3}, {}, {}));
  ASSERT_OK(m().Heartbeat("nb", 1, 3'600'000));
  ASSERT_OK_AND_ASSIGN(std::vector<NodeState> nodes, m().ListNodes());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, "na");
  EXPECT_EQ(nodes[0].epoch, 2u);
  EXPECT_EQ(nodes[0].window, 16u);
  EXPECT_EQ(nodes[0].checkpoint, (ChainPosition{2, 3}));
  EXPECT_EQ(nodes[0].heartbeat_ms, 0);
  EXPECT_FALSE(nodes[0].takeover);
  EXPECT_EQ(nodes[1].node, "nb");
  EXPECT_EQ(nodes[1].epoch, 1u);
  EXPECT_GT(nodes[1].heartbeat_ms, 0);
  EXPECT_TRUE(nodes[1].takeover);  // set by this build: taken over once stale
  ASSERT_OK_AND_ASSIGN(NodeState nb, m().GetNode("nb"));
  EXPECT_EQ(nb.heartbeat_ms, nodes[1].heartbeat_ms);
  ASSERT_OK(m().Heartbeat("nb", 1, 0));
  ASSERT_OK_AND_ASSIGN(nodes, m().ListNodes());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[1].heartbeat_ms, 0);
  EXPECT_FALSE(nodes[1].takeover);
}

TEST_P(MetastoreConformance, NewerSchemaRefusesToOpen) {
  if (!persistent() || !GetParam().bump_schema_version) {
    GTEST_SKIP() << "backend " << GetParam().name << " cannot be reopened with a newer schema";
  }
  MakeBasin("b");
  env_.meta.reset();
  GetParam().bump_schema_version(env_);
  auto reopened = OpenMetastore(env_.uri);
  EXPECT_EQ(reopened.status().code(), Code::kNotSupported) << reopened.status().ToString();
  EXPECT_NE(reopened.status().message().find("newer"), std::string::npos) << reopened.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, MetastoreConformance, ::testing::ValuesIn(Backends()), BackendName);
INSTANTIATE_TEST_SUITE_P(Backends, SegmentIndexTest, ::testing::ValuesIn(Backends()), BackendName);

// ---- SQLite schema upgrades ---------------------------------------------------------

// A database as schema version 1 (the first release) wrote it, verbatim.
constexpr const char* kSqliteSchemaV1[] = {
    "CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS basins(name TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS streams(id INTEGER PRIMARY KEY, basin TEXT NOT NULL REFERENCES basins(name), "
    "name TEXT NOT NULL, storage_class TEXT NOT NULL, retention_age_s INTEGER NOT NULL, "
    "timestamping TEXT NOT NULL, uncapped INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, UNIQUE(basin, name))",
    "CREATE TABLE IF NOT EXISTS stream_states(stream_id INTEGER PRIMARY KEY REFERENCES streams(id), "
    "settled_offset INTEGER NOT NULL, trim_point INTEGER NOT NULL, fencing_token BLOB NOT NULL, "
    "last_timestamp_ms INTEGER NOT NULL, producer_state BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS segments(stream_id INTEGER NOT NULL, start_offset INTEGER NOT NULL, "
    "end_offset INTEGER NOT NULL, first_ts INTEGER NOT NULL, last_ts INTEGER NOT NULL, "
    "object_key TEXT NOT NULL, size_bytes INTEGER NOT NULL, PRIMARY KEY(stream_id, start_offset)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS nodes(node TEXT PRIMARY KEY, epoch INTEGER NOT NULL, window INTEGER NOT NULL, "
    "ckpt_epoch INTEGER NOT NULL, ckpt_seq INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO schema_version(version) VALUES(1)",
    // Some data: a basin with a stream (id 7) and its state, a segment, a node, allocators.
    "INSERT INTO basins VALUES('weir-kafka', 11)",
    "INSERT INTO streams VALUES(7, 'weir-kafka', 'legacy', 'standard', 3600, 'arrival', 0, 12)",
    "INSERT INTO stream_states VALUES(7, 10, 0, x'', 13, x'')",
    "INSERT INTO segments VALUES(7, 0, 10, 1, 2, 'segments/7/0', 1000)",
    "INSERT INTO nodes VALUES('n1', 3, 4, 3, 9)",
    "INSERT INTO counters VALUES('stream_id', 7), ('producer_id', 5)",
};

// Writes a SQLite file at `path` by running each list of statements in order.
void WriteSqliteFile(const std::string& path, std::initializer_list<std::span<const char* const>> lists) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (std::span<const char* const> list : lists) {
    for (const char* sql : list) {
      ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql << ": " << sqlite3_errmsg(db);
    }
  }
  sqlite3_close(db);
}

int64_t SqliteSchemaVersion(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  int64_t version = -1;
  if (sqlite3_prepare_v2(db, "SELECT version FROM schema_version", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    version = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return version;
}

// SQLite's plan for deleting a topic's committed offsets, as one line.
std::string SqliteTopicOffsetsDeletePlan(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  std::string plan;
  if (sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN DELETE FROM group_offsets WHERE topic = 'orders'", -1, &st,
                         nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      plan += reinterpret_cast<const char*>(sqlite3_column_text(st, 3));
      plan += "; ";
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return plan;
}

TEST(SqliteMetastoreErrors, AFullDatabaseIsRetryableAndChangesNothing) {
  // As the file store's ENOSPC: settle and retention may free space, so a
  // caller retries rather than failing hard.
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto m, OpenSqliteMetastore(dir.path() + "/meta.db"));
  ASSERT_OK(m->CreateBasin(BasinInfo{"b", 1}, kNoNode));
  StreamInfo info;
  info.basin = "b";
  info.name = "first";
  ASSERT_OK(m->CreateStream(info, kNoNode).status());
  ASSERT_OK(m->ExecForTest("PRAGMA max_page_count = 1"));  // below what it has: no page may be added
  Status st;
  for (int i = 0; i < 1000 && st.ok(); ++i) {
    info.name = "s" + std::string(200, 'x') + std::to_string(i);
    st = m->CreateStream(info, kNoNode).status();
  }
  ASSERT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_TRUE(st.retryable());
  ASSERT_OK(m->ExecForTest("PRAGMA max_page_count = 1073741824"));
  EXPECT_EQ(m->GetStream("b", info.name).status().code(), Code::kNotFound);
  info.name = "after";
  EXPECT_OK(m->CreateStream(info, kNoNode).status());
}

// An upgrade's DDL waits for a lock another session holds (a pg_dump, a
// session idle in a transaction) past the session's 5 s lock_timeout: it
// failed the start after 5 s.
TEST(PostgresSchemaUpgrade, WaitsForALockHeldPastTheSessionsLockTimeout) {
  BackendEnv env = MakePostgresEnv();
  if (!env.meta) GTEST_SKIP() << "PostgreSQL is not configured (WEIR_TEST_POSTGRES_ENV)";
  env.meta.reset();
  ASSERT_TRUE(PostgresExec(env.uri, "ALTER TABLE nodes DROP COLUMN minted_by"));
  ASSERT_TRUE(PostgresExec(env.uri, "UPDATE schema_version SET version = 7"));
  PGconn* holder = PQconnectdb(env.uri.c_str());
  ASSERT_EQ(PQstatus(holder), CONNECTION_OK) << PQerrorMessage(holder);
  for (const char* sql : {"BEGIN", "SELECT count(*) FROM nodes"}) {
    PGresult* res = PQexec(holder, sql);
    EXPECT_TRUE(PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK)
        << sql << ": " << PQresultErrorMessage(res);
    PQclear(res);
  }
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(7));
    PQclear(PQexec(holder, "COMMIT"));
  });
  auto meta = OpenMetastore(env.uri);
  release.join();
  PQfinish(holder);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  ASSERT_OK((*meta)->MintEpoch("n1", 0, 8, 42).status());
  ASSERT_OK_AND_ASSIGN(NodeState node, (*meta)->GetNode("n1"));
  EXPECT_EQ(node.minted_by, 42u);
}

TEST(SqliteSchemaUpgrade, Version1DatabaseGainsTablesAndGroupOffsets) {
  TempDir dir;
  const std::string path = dir.path() + "/meta.db";
  WriteSqliteFile(path, {kSqliteSchemaV1});
  ASSERT_EQ(SqliteSchemaVersion(path), 1);

  const std::string uri = "sqlite://" + path;
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> meta, OpenMetastore(uri));
    // The old data is intact.
    ASSERT_OK_AND_ASSIGN(StreamInfo legacy, meta->GetStream("weir-kafka", "legacy"));
    EXPECT_EQ(legacy.id, 7u);
    EXPECT_EQ(legacy.config.timestamping, TimestampingMode::kArrival);
    EXPECT_EQ(legacy.config.delete_on_empty_min_age_s, 0);  // schema 4's column, added with its default
    StreamConfig with_delete = legacy.config;
    with_delete.delete_on_empty_min_age_s = 30;
    ASSERT_OK(meta->UpdateStreamConfig(7, with_delete, kNoNode));
    EXPECT_EQ(meta->GetStreamState(7)->settled_offset, 10u);
    EXPECT_EQ(meta->FindSegments(7, 0, 10)->size(), 1u);
    EXPECT_EQ(meta->GetNode("n1")->checkpoint, (ChainPosition{3, 9}));
    EXPECT_FALSE(meta->GetNode("n1")->takeover);  // schema 7's column, added with its default
    EXPECT_EQ(meta->GetNode("n1")->minted_by, 0u);  // schema 8's, likewise
    EXPECT_EQ(*meta->AllocateProducerId(), 6u);
    // The new tables work.
    TableInfo t;
    t.basin = "weir-kafka";
    t.name = "topic";
    t.bucket_count = 2;
    ASSERT_OK_AND_ASSIGN(auto created, meta->CreateTable(t, StreamConfig{}, kNoNode));
    EXPECT_EQ(created.first.id, 1u);
    EXPECT_EQ(created.second[0].id, 8u);  // the stream allocator continues
    ASSERT_OK(meta->CommitGroupOffsets("g", {GroupOffset{"topic", 1, 42, -1, "", 5}}, kNoNode));
    ASSERT_OK(meta->CreateBasin(BasinInfo{"upgraded", 1, "tok"}, kNoNode));  // schema 3's create tokens
    EXPECT_EQ(*meta->CreateToken("upgraded", ""), "tok");
  }
  EXPECT_EQ(SqliteSchemaVersion(path), kSchemaVersion);
  // Opening the upgraded file again changes nothing.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> meta, OpenMetastore(uri));
  EXPECT_EQ(meta->GetTable("weir-kafka", "topic")->bucket_count, 2u);
  ASSERT_OK_AND_ASSIGN(std::vector<GroupOffset> offsets, meta->FetchGroupOffsets("g"));
  ASSERT_EQ(offsets.size(), 1u);
  EXPECT_EQ(offsets[0].offset, 42);
  EXPECT_EQ(meta->GetStream("weir-kafka", "legacy")->config.delete_on_empty_min_age_s, 30);
  EXPECT_EQ(SqliteSchemaVersion(path), kSchemaVersion);
}

// What schemas 2 and 3 added to version 1, as they wrote it, and data in them.
constexpr const char* kSqliteSchemaV3Additions[] = {
    "CREATE TABLE IF NOT EXISTS tables(id INTEGER PRIMARY KEY, basin TEXT NOT NULL REFERENCES basins(name), "
    "name TEXT NOT NULL, kind TEXT NOT NULL, bucket_count INTEGER NOT NULL, config BLOB NOT NULL, "
    "created_at_ms INTEGER NOT NULL, UNIQUE(basin, name))",
    "CREATE TABLE IF NOT EXISTS group_offsets(group_id TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, "
    "committed_offset INTEGER NOT NULL, leader_epoch INTEGER NOT NULL, metadata BLOB NOT NULL, "
    "commit_time_ms INTEGER NOT NULL, PRIMARY KEY(group_id, topic, part)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS create_tokens(basin TEXT NOT NULL, stream TEXT NOT NULL, token TEXT NOT NULL, "
    "PRIMARY KEY(basin, stream)) WITHOUT ROWID",
    "UPDATE schema_version SET version = 3",
    // A one-partition topic whose bucket stream is 'orders/0' (id 8), an
    // offset of a group, a stream's create token.
    "INSERT INTO streams VALUES(8, 'weir-kafka', 'orders/0', 'standard', 0, 'client-prefer', 1, 20)",
    "INSERT INTO stream_states VALUES(8, 0, 0, x'', 0, x'')",
    "INSERT INTO tables VALUES(1, 'weir-kafka', 'orders', 'log', 1, '{\"retention.ms\":\"-1\"}', 20)",
    "INSERT INTO counters VALUES('table_id', 1)",
    "UPDATE counters SET value = 8 WHERE name = 'stream_id'",
    "INSERT INTO group_offsets VALUES('g', 'orders', 0, 17, -1, x'6d', 21)",
    "INSERT INTO create_tokens VALUES('weir-kafka', 'legacy', 'tok-7')",
};

TEST(SqliteSchemaUpgrade, Version3DatabaseGainsDeleteOnEmpty) {
  TempDir dir;
  const std::string path = dir.path() + "/meta.db";
  WriteSqliteFile(path, {kSqliteSchemaV1, kSqliteSchemaV3Additions});
  ASSERT_EQ(SqliteSchemaVersion(path), 3);
  const std::string uri = "sqlite://" + path;
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> meta, OpenMetastore(uri));
    EXPECT_EQ(SqliteSchemaVersion(path), kSchemaVersion);
    // Every row of schema 3 reads back; the new column has its default.
    ASSERT_OK_AND_ASSIGN(StreamInfo bucket, meta->GetStream("weir-kafka", "orders/0"));
    EXPECT_EQ(bucket.id, 8u);
    EXPECT_EQ(bucket.config.retention_age_s, 0);
    EXPECT_TRUE(bucket.config.uncapped_timestamps);
    EXPECT_EQ(bucket.config.delete_on_empty_min_age_s, 0);
    ASSERT_OK_AND_ASSIGN(TableInfo orders, meta->GetTable("weir-kafka", "orders"));
    EXPECT_EQ(orders.bucket_count, 1u);
    EXPECT_EQ(orders.config, "{\"retention.ms\":\"-1\"}");
    ASSERT_OK_AND_ASSIGN(std::vector<GroupOffset> offsets, meta->FetchGroupOffsets("g"));
    ASSERT_EQ(offsets.size(), 1u);
    EXPECT_EQ(offsets[0].offset, 17);
    EXPECT_EQ(offsets[0].metadata, "m");
    EXPECT_EQ(*meta->CreateToken("weir-kafka", "legacy"), "tok-7");
    // Schema 4's setting is stored, and the allocators continue.
    StreamConfig with_delete = bucket.config;
    with_delete.delete_on_empty_min_age_s = 60;
    ASSERT_OK(meta->UpdateStreamConfig(8, with_delete, kNoNode));
    ASSERT_OK_AND_ASSIGN(auto grown, meta->AddBuckets(orders.id, 2, bucket.config, 30, kNoNode));
    EXPECT_EQ(grown.second.at(0).id, 9u);
    TableInfo t;
    t.basin = "weir-kafka";
    t.name = "events";
    ASSERT_OK_AND_ASSIGN(auto created, meta->CreateTable(t, StreamConfig{}, kNoNode));
    EXPECT_EQ(created.first.id, 2u);
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> meta, OpenMetastore(uri));
  EXPECT_EQ(meta->GetStream("weir-kafka", "orders/0")->config.delete_on_empty_min_age_s, 60);
  // Schema 5: the old basin has the default config, and a config can be stored.
  EXPECT_EQ(meta->GetBasin("weir-kafka")->config, BasinConfig{});
  BasinConfig on_append;
  on_append.create_stream_on_append = true;
  ASSERT_OK(meta->ReconfigureBasin("weir-kafka", on_append, kNoNode));
  EXPECT_EQ(meta->GetBasin("weir-kafka")->config, on_append);
  EXPECT_EQ(meta->GetTable("weir-kafka", "orders")->bucket_count, 2u);
  EXPECT_EQ(SqliteSchemaVersion(path), kSchemaVersion);
}

// Deleting a topic deletes its committed offsets through an index by topic,
// not a scan of every group's (schema 9; an upgraded file gains it too).
TEST(SqliteSchemaUpgrade, TopicOffsetsAreDeletedByIndex) {
  TempDir dir;
  const std::string fresh = dir.path() + "/fresh.db", old = dir.path() + "/old.db";
  ASSERT_OK(OpenMetastore("sqlite://" + fresh).status());
  WriteSqliteFile(old, {kSqliteSchemaV1, kSqliteSchemaV3Additions});
  ASSERT_OK(OpenMetastore("sqlite://" + old).status());
  for (const std::string& path : {fresh, old}) {
    const std::string plan = SqliteTopicOffsetsDeletePlan(path);
    EXPECT_NE(plan.find("INDEX group_offsets_topic"), std::string::npos) << path << ": " << plan;
  }
}

// ---- Names and URIs (backend-independent) --------------------------------------------

TEST(MetastoreNames, EnumsRoundTrip) {
  for (StorageClass c : {StorageClass::kStandard, StorageClass::kExpress}) {
    EXPECT_EQ(*ParseStorageClass(StorageClassName(c)), c);
  }
  EXPECT_EQ(StorageClassName(StorageClass::kStandard), "standard");
  EXPECT_EQ(StorageClassName(StorageClass::kExpress), "express");
  for (TimestampingMode m :
       {TimestampingMode::kClientPrefer, TimestampingMode::kClientRequire, TimestampingMode::kArrival}) {
    EXPECT_EQ(*ParseTimestampingMode(TimestampingModeName(m)), m);
  }
  EXPECT_EQ(TimestampingModeName(TimestampingMode::kClientPrefer), "client-prefer");
  EXPECT_EQ(TimestampingModeName(TimestampingMode::kClientRequire), "client-require");
  EXPECT_EQ(TimestampingModeName(TimestampingMode::kArrival), "arrival");

  auto bad_class = ParseStorageClass("Standard");
  EXPECT_EQ(bad_class.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad_class.status().message().find("standard, express"), std::string::npos);
  auto bad_mode = ParseTimestampingMode("");
  EXPECT_EQ(bad_mode.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad_mode.status().message().find("client-prefer, client-require, arrival"), std::string::npos);
}

// The server ends weir's session (a restart, a failover, an administrator):
// the call that finds it broken fails, retryably, and the next one reconnects.
// A connection the server ended (a restart, a failover, a terminated
// backend) is reopened by the next call: a read or a transaction's BEGIN,
// which changed nothing on the dead one, run again on the new one, so the
// call succeeds.
TEST(PostgresMetastore, ABrokenConnectionIsReopenedWithoutFailingTheNextCall) {
  const std::string base = PostgresBaseUri();
  if (base.empty()) GTEST_SKIP() << "no PostgreSQL server (WEIR_TEST_POSTGRES_ENV)";
  const std::string schema = fmt::format("reconnect_{}", ::getpid());
  PostgresExec(base, "CREATE SCHEMA " + schema);
  const std::string app = "weir-reconnect-" + std::to_string(::getpid());  // none but this test's connection
  ASSERT_OK_AND_ASSIGN(auto m, OpenMetastore(base + "?options=-csearch_path%3D" + schema + "&application_name=" + app));
  ASSERT_OK(m->CreateBasin(BasinInfo{"basin-a", 1}, kNoNode));
  auto end_session = [&] {
    PostgresExec(base, "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE application_name = '" +
                           app + "'");
  };
  end_session();
  ASSERT_OK_AND_ASSIGN(BasinInfo again, m->GetBasin("basin-a"));
  EXPECT_EQ(again.name, "basin-a");
  // A write: its BEGIN meets the dead connection and runs again on a new one.
  end_session();
  ASSERT_OK(m->CreateBasin(BasinInfo{"basin-b", 1}, kNoNode));
  ASSERT_OK_AND_ASSIGN(BasinInfo b, m->GetBasin("basin-b"));
  EXPECT_EQ(b.name, "basin-b");
  ASSERT_OK_AND_ASSIGN(auto ids, m->AllocateProducerId());
  EXPECT_GT(ids, 0u);
}

// A role that may only read and write the tables (no CREATE on the schema,
// PostgreSQL 15's default for public) serves a database another role made.
TEST(PostgresMetastore, ARoleWithoutCreateRightsServesAnExistingSchema) {
  const std::string base = PostgresBaseUri();
  if (base.empty()) GTEST_SKIP() << "no PostgreSQL server (WEIR_TEST_POSTGRES_ENV)";
  const std::string schema = fmt::format("dml_{}", ::getpid());
  const std::string role = fmt::format("weir_dml_{}", ::getpid());
  PostgresExec(base, "CREATE SCHEMA " + schema);
  const std::string path = "?options=-csearch_path%3D" + schema;
  {
    ASSERT_OK_AND_ASSIGN(auto owner, OpenMetastore(base + path));  // creates the tables
    ASSERT_OK(owner->CreateBasin(BasinInfo{"made-by-owner", 1}, kNoNode));
  }
  PostgresExec(base, "CREATE ROLE " + role + " LOGIN");
  PostgresExec(base, "GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  PostgresExec(base, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + schema + " TO " + role);
  const size_t at = base.find("://") + 3;
  const std::string as_role = base.substr(0, at) + role + base.substr(base.find('@', at)) + path;
  auto m = OpenMetastore(as_role);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_OK_AND_ASSIGN(BasinInfo b, (*m)->GetBasin("made-by-owner"));
  EXPECT_EQ(b.name, "made-by-owner");
  ASSERT_OK((*m)->CreateBasin(BasinInfo{"made-by-role", 1}, kNoNode));
  ASSERT_OK_AND_ASSIGN(uint64_t id, (*m)->AllocateProducerId());
  EXPECT_GT(id, 0u);
  // Without the tables, the role cannot make them: a clear error, not a crash.
  const std::string empty_schema = schema + "_empty";
  PostgresExec(base, "CREATE SCHEMA " + empty_schema);
  PostgresExec(base, "GRANT USAGE ON SCHEMA " + empty_schema + " TO " + role);
  auto refused = OpenMetastore(base.substr(0, at) + role + base.substr(base.find('@', at)) +
                               "?options=-csearch_path%3D" + empty_schema);
  EXPECT_FALSE(refused.ok());
  m->reset();
  PostgresExec(base, "DROP OWNED BY " + role);
  PostgresExec(base, "DROP ROLE " + role);
}

TEST(OpenMetastoreTest, UriErrors) {
  TempDir dir;
  auto code_of = [](std::string_view uri) { return OpenMetastore(uri).status().code(); };
  EXPECT_EQ(code_of(""), Code::kInvalidArgument);
  EXPECT_EQ(code_of("sqlite://"), Code::kInvalidArgument);
  EXPECT_EQ(code_of("sqlite:"), Code::kInvalidArgument);
  auto other = OpenMetastore("mysql://root:s3cret@localhost/weir");
  EXPECT_EQ(other.status().code(), Code::kInvalidArgument);
  EXPECT_NE(other.status().message().find("sqlite://"), std::string::npos) << other.status().ToString();
  EXPECT_NE(other.status().message().find("postgres://"), std::string::npos) << other.status().ToString();
  EXPECT_NE(other.status().message().find("\"mysql\""), std::string::npos) << other.status().ToString();
  EXPECT_EQ(other.status().message().find("s3cret"), std::string::npos) << other.status().ToString();
  auto bad_escape = OpenMetastore("postgres://weir:50%off@localhost/weir");  // libpq quotes the bad token
  EXPECT_EQ(bad_escape.status().code(), Code::kInvalidArgument) << bad_escape.status().ToString();
  EXPECT_EQ(bad_escape.status().message().find("50%off"), std::string::npos) << bad_escape.status().ToString();
  // A URI libpq cannot parse; a server that is not there (retryable), named
  // without the password.
  auto bad_param = OpenMetastore("postgres://localhost/weir?no_such_param=1");
  EXPECT_EQ(bad_param.status().code(), Code::kInvalidArgument) << bad_param.status().ToString();
  EXPECT_NE(bad_param.status().message().find("no_such_param"), std::string::npos) << bad_param.status().ToString();
  auto down = OpenMetastore("postgresql://weir:s3cret@127.0.0.1:1/weir?connect_timeout=5");
  EXPECT_EQ(down.status().code(), Code::kUnavailable) << down.status().ToString();
  EXPECT_NE(down.status().message().find("postgres://weir@127.0.0.1:1/weir"), std::string::npos)
      << down.status().ToString();
  EXPECT_EQ(down.status().message().find("s3cret"), std::string::npos) << down.status().ToString();

  auto missing_parent = OpenMetastore("sqlite://" + dir.path() + "/no/such/dir/meta.db");
  EXPECT_EQ(missing_parent.status().code(), Code::kInvalidArgument);
  EXPECT_NE(missing_parent.status().message().find("does not exist"), std::string::npos)
      << missing_parent.status().ToString();
  EXPECT_EQ(code_of("sqlite://" + dir.path()), Code::kInvalidArgument);        // a directory
  EXPECT_EQ(code_of("sqlite://" + dir.path() + "/"), Code::kInvalidArgument);  // names a directory
  {
    std::ofstream(dir.path() + "/file") << "x";
  }
  EXPECT_EQ(code_of("sqlite://" + dir.path() + "/file/meta.db"), Code::kInvalidArgument);  // parent is a file
}

TEST(OpenMetastoreTest, AbsoluteAndRelativePaths) {
  TempDir dir;
  const std::string abs_uri = "sqlite://" + dir.path() + "/abs.db";
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> meta, OpenMetastore(abs_uri));
    EXPECT_EQ(meta->Describe(), abs_uri);
    ASSERT_OK(meta->CreateBasin(BasinInfo{"x", 1}, kNoNode));
  }
  EXPECT_TRUE(fs::exists(dir.path() + "/abs.db"));

  const std::string rel = fs::relative(dir.path(), fs::current_path()).string() + "/rel.db";
  ASSERT_FALSE(rel.starts_with("/"));
  const std::string rel_uri = "sqlite://" + rel;
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> meta, OpenMetastore(rel_uri));
    EXPECT_EQ(meta->Describe(), rel_uri);
    ASSERT_OK(meta->CreateBasin(BasinInfo{"y", 1}, kNoNode));
  }
  EXPECT_TRUE(fs::exists(dir.path() + "/rel.db"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> again, OpenMetastore(rel_uri));
  EXPECT_TRUE(again->GetBasin("y").ok());
  EXPECT_EQ(again->GetBasin("x").status().code(), Code::kNotFound);

  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> mem, OpenMetastore("sqlite://:memory:"));
  EXPECT_EQ(mem->Describe(), "sqlite://:memory:");
  // Each in-memory metastore is private.
  ASSERT_OK(mem->CreateBasin(BasinInfo{"m", 1}, kNoNode));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Metastore> mem2, OpenMetastore("sqlite://:memory:"));
  EXPECT_EQ(mem2->GetBasin("m").status().code(), Code::kNotFound);
}

TEST(OpenMetastoreTest, NotADatabaseIsCorruption) {
  TempDir dir;
  const std::string path = dir.path() + "/garbage.db";
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(8192, 'G');
  }
  auto r = OpenMetastore("sqlite://" + path);
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
}

}  // namespace
}  // namespace weir::metastore
