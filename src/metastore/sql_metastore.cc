// SqlMetastore: the Metastore's queries and rules, over a SqlDb driver
// (SQLite or PostgreSQL).
#include "metastore/sql_metastore.h"

#include <algorithm>
#include <array>
#include <bit>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace weir::metastore {

namespace {

constexpr size_t kMaxListLimit = 1000;
constexpr size_t kMaxSegmentListLimit = 10000;
// Offsets are compared in SQL as int64, so they must stay below 2^63.
constexpr uint64_t kMaxOffset = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

int64_t I64(uint64_t v) { return static_cast<int64_t>(v); }
uint64_t U64(int64_t v) { return static_cast<uint64_t>(v); }

bool Before(const ChainPosition& a, const ChainPosition& b) {
  return a.epoch != b.epoch ? a.epoch < b.epoch : a.seq < b.seq;
}

// The smallest string above every string that starts with prefix, or nullopt
// if there is none (prefix empty or all 0xff bytes).
std::optional<std::string> PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    const auto last = static_cast<unsigned char>(end.back());
    if (last != 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::nullopt;
}

Status CheckListLimit(size_t limit) {
  if (limit < 1 || limit > kMaxListLimit) {
    return InvalidArgument("list limit {} is out of range; it must be 1..{}", limit, kMaxListLimit);
  }
  return Status::Ok();
}

Status ValidateConfig(const StreamConfig& c) {
  if (StorageClassName(c.storage_class) == "unknown") {
    return InvalidArgument("invalid storage class value {}", static_cast<int>(c.storage_class));
  }
  if (TimestampingModeName(c.timestamping) == "unknown") {
    return InvalidArgument("invalid timestamping mode value {}", static_cast<int>(c.timestamping));
  }
  if (c.retention_age_s < 0) {
    return InvalidArgument("retention_age_s must be >= 0 (0 = keep forever), got {}", c.retention_age_s);
  }
  if (c.delete_on_empty_min_age_s < 0) {
    return InvalidArgument("delete_on_empty min age must be >= 0 (0 = never), got {}", c.delete_on_empty_min_age_s);
  }
  return Status::Ok();
}

Status ValidateSegment(const SegmentInfo& s) {
  if (s.start_offset >= s.end_offset) {
    return InvalidArgument("segment of stream {} has an empty or inverted range [{}, {})", s.stream_id,
                           s.start_offset, s.end_offset);
  }
  if (s.end_offset > kMaxOffset) {
    return InvalidArgument("segment of stream {} ends at {}, beyond the largest offset 2^63-1", s.stream_id,
                           s.end_offset);
  }
  if (s.object_key.empty()) {
    return InvalidArgument("segment [{}, {}) of stream {} has an empty object key", s.start_offset, s.end_offset,
                           s.stream_id);
  }
  return Status::Ok();
}

// ---- SQL ------------------------------------------------------------------
// Every statement binds its inputs as parameters; none is assembled from data.
// One text serves every driver (sql_db.h says which SQL that allows); each
// driver creates the tables (sqlite_db.cc, postgres_db.cc).

constexpr const char kCreateSchemaVersion[] = "CREATE TABLE IF NOT EXISTS schema_version(version BIGINT NOT NULL)";
constexpr const char kGetSchemaVersion[] = "SELECT version FROM schema_version";
constexpr const char kSetSchemaVersion[] = "INSERT INTO schema_version(version) VALUES(?1)";
constexpr const char kUpgradeSchemaVersion[] = "UPDATE schema_version SET version = ?1";

constexpr const char kBumpCounter[] =
    "INSERT INTO counters(name, value) VALUES(?1, 1) "
    "ON CONFLICT(name) DO UPDATE SET value = counters.value + 1 RETURNING value";
constexpr const char kBumpCounterBy[] =
    "INSERT INTO counters(name, value) VALUES(?1, ?2) "
    "ON CONFLICT(name) DO UPDATE SET value = counters.value + ?2 RETURNING value";
constexpr const char kCounterValue[] = "SELECT value FROM counters WHERE name = ?1";
constexpr const char kInsertCounterIfAbsent[] =
    "INSERT INTO counters(name, value) VALUES(?1, ?2) ON CONFLICT(name) DO NOTHING";
constexpr std::string_view kDeploymentIdCounter = "deployment_id";
constexpr std::string_view kStreamIdCounter = "stream_id";
constexpr std::string_view kProducerIdCounter = "producer_id";
constexpr std::string_view kTableIdCounter = "table_id";

#define WEIR_BASIN_COLUMNS                                                                   \
  "name, created_at_ms, on_append, on_read, default_storage_class, default_retention_age_s, " \
  "default_timestamping, default_uncapped, default_delete_on_empty_s"
constexpr const char kInsertBasin[] =
    "INSERT INTO basins(" WEIR_BASIN_COLUMNS ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
constexpr const char kUpdateBasinConfig[] =
    "UPDATE basins SET on_append = ?3, on_read = ?4, default_storage_class = ?5, default_retention_age_s = ?6, "
    "default_timestamping = ?7, default_uncapped = ?8, default_delete_on_empty_s = ?9 WHERE name = ?1";
constexpr const char kGetBasin[] = "SELECT " WEIR_BASIN_COLUMNS " FROM basins WHERE name = ?1";
constexpr const char kCountBasins[] = "SELECT COUNT(*) FROM basins";
constexpr const char kListBasinsBounded[] = "SELECT " WEIR_BASIN_COLUMNS
                                            " FROM basins WHERE name > ?1 AND name >= ?2 AND name < ?3 "
                                            "ORDER BY name LIMIT ?4";
constexpr const char kListBasinsOpen[] =
    "SELECT " WEIR_BASIN_COLUMNS " FROM basins WHERE name > ?1 AND name >= ?2 ORDER BY name LIMIT ?4";
constexpr const char kFirstStreamOfBasin[] = "SELECT name FROM streams WHERE basin = ?1 ORDER BY name LIMIT 1";
constexpr const char kDeleteBasin[] = "DELETE FROM basins WHERE name = ?1";
constexpr const char kInsertToken[] =
    "INSERT INTO create_tokens(basin, stream, token) VALUES(?1, ?2, ?3) "
    "ON CONFLICT(basin, stream) DO UPDATE SET token = excluded.token";
constexpr const char kGetToken[] = "SELECT token FROM create_tokens WHERE basin = ?1 AND stream = ?2";
constexpr const char kDeleteToken[] = "DELETE FROM create_tokens WHERE basin = ?1 AND stream = ?2";

#define WEIR_STREAM_COLUMNS \
  "id, basin, name, storage_class, retention_age_s, timestamping, uncapped, created_at_ms, delete_on_empty_s"
constexpr const char kStreamByName[] = "SELECT " WEIR_STREAM_COLUMNS " FROM streams WHERE basin = ?1 AND name = ?2";
constexpr const char kStreamById[] = "SELECT " WEIR_STREAM_COLUMNS " FROM streams WHERE id = ?1";
constexpr const char kStreamsById[] = "SELECT " WEIR_STREAM_COLUMNS " FROM streams WHERE id > ?1 ORDER BY id LIMIT ?2";
constexpr const char kListStreamsBounded[] =
    "SELECT " WEIR_STREAM_COLUMNS
    " FROM streams WHERE basin = ?1 AND name > ?2 AND name >= ?3 AND name < ?4 ORDER BY name LIMIT ?5";
constexpr const char kListStreamsOpen[] =
    "SELECT " WEIR_STREAM_COLUMNS " FROM streams WHERE basin = ?1 AND name > ?2 AND name >= ?3 ORDER BY name LIMIT ?5";
constexpr const char kInsertStream[] =
    "INSERT INTO streams(" WEIR_STREAM_COLUMNS ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
constexpr const char kInsertStreamsHead[] = "INSERT INTO streams(" WEIR_STREAM_COLUMNS ") VALUES";
#undef WEIR_STREAM_COLUMNS
constexpr const char kStreamExists[] = "SELECT 1 FROM streams WHERE id = ?1";
constexpr const char kUpdateConfig[] =
    "UPDATE streams SET storage_class = ?2, retention_age_s = ?3, timestamping = ?4, uncapped = ?5, "
    "delete_on_empty_s = ?6 WHERE id = ?1";

#define WEIR_STATE_COLUMNS "stream_id, settled_offset, trim_point, fencing_token, last_timestamp_ms, producer_state"
constexpr const char kInsertZeroState[] =
    "INSERT INTO stream_states(" WEIR_STATE_COLUMNS ") VALUES(?1, 0, 0, ?2, 0, ?2)";  // ?2: an empty blob
constexpr const char kInsertZeroStatesHead[] = "INSERT INTO stream_states(" WEIR_STATE_COLUMNS ") VALUES";
constexpr const char kGetState[] = "SELECT " WEIR_STATE_COLUMNS " FROM stream_states WHERE stream_id = ?1";
constexpr const char kListStates[] =
    "SELECT " WEIR_STATE_COLUMNS " FROM stream_states WHERE stream_id > ?1 ORDER BY stream_id LIMIT ?2";
#undef WEIR_STATE_COLUMNS
constexpr const char kRaiseTrimPoint[] =
    "UPDATE stream_states SET trim_point = CASE WHEN trim_point > ?2 THEN trim_point ELSE ?2 END "
    "WHERE stream_id = ?1";

#define WEIR_NODE_COLUMNS "node, epoch, \"window\", ckpt_epoch, ckpt_seq, heartbeat_ms, takeover, minted_by"
constexpr const char kGetNode[] = "SELECT " WEIR_NODE_COLUMNS " FROM nodes WHERE node = ?1";
constexpr const char kListNodes[] = "SELECT " WEIR_NODE_COLUMNS " FROM nodes ORDER BY node";
#undef WEIR_NODE_COLUMNS
constexpr const char kUpsertEpoch[] =
    "INSERT INTO nodes(node, epoch, \"window\", ckpt_epoch, ckpt_seq, minted_by) VALUES(?1, ?2, ?3, 0, 0, ?4) "
    "ON CONFLICT(node) DO UPDATE SET epoch = excluded.epoch, \"window\" = excluded.\"window\", "
    "minted_by = excluded.minted_by";
constexpr const char kLiveOtherNode[] =
    "SELECT node, heartbeat_ms FROM nodes WHERE node <> ?1 AND heartbeat_ms > 0 AND heartbeat_ms >= ?2 "
    "ORDER BY heartbeat_ms DESC LIMIT 1";
constexpr const char kSetHeartbeat[] = "UPDATE nodes SET heartbeat_ms = ?2, takeover = ?3 WHERE node = ?1";
constexpr const char kSetCheckpoint[] = "UPDATE nodes SET ckpt_epoch = ?2, ckpt_seq = ?3 WHERE node = ?1";

#define WEIR_SEGMENT_COLUMNS "stream_id, start_offset, end_offset, first_ts, last_ts, object_key, size_bytes"
constexpr const char kInsertSegment[] =
    "INSERT INTO segments(" WEIR_SEGMENT_COLUMNS ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)";
// Neighbours of a new segment, for the overlap check.
constexpr const char kSegmentAtOrBefore[] =
    "SELECT start_offset, end_offset FROM segments WHERE stream_id = ?1 AND start_offset <= ?2 "
    "ORDER BY start_offset DESC LIMIT 1";
constexpr const char kSegmentAfter[] =
    "SELECT start_offset, end_offset FROM segments WHERE stream_id = ?1 AND start_offset > ?2 "
    "ORDER BY start_offset LIMIT 1";
// Segments never overlap (checked on insert), so every segment ending after
// ?2 starts at or after the one containing ?2: an index seek, not a scan.
constexpr const char kFindSegments[] =
    "SELECT " WEIR_SEGMENT_COLUMNS " FROM segments WHERE stream_id = ?1 AND end_offset > ?2 AND start_offset >= "
    "coalesce((SELECT start_offset FROM segments WHERE stream_id = ?1 AND start_offset <= ?2 "
    "ORDER BY start_offset DESC LIMIT 1), 0) ORDER BY start_offset LIMIT ?3";
// A row-value comparison: an index range on (stream_id, start_offset).
constexpr const char kSegmentsFrom[] = "SELECT " WEIR_SEGMENT_COLUMNS
                                       " FROM segments WHERE (stream_id, start_offset) >= (?1, ?2) "
                                       "ORDER BY stream_id, start_offset LIMIT ?3";
constexpr const char kSegmentByTimestamp[] =
    "SELECT " WEIR_SEGMENT_COLUMNS
    " FROM segments WHERE stream_id = ?1 AND last_ts >= ?2 ORDER BY start_offset LIMIT 1";
// "start_offset < ?2" is implied by "end_offset <= ?2"; it bounds the index range.
constexpr const char kDeleteSegmentsBelowTail[] = ") RETURNING " WEIR_SEGMENT_COLUMNS;
constexpr const char kInsertSegmentsHead[] = "INSERT INTO segments(" WEIR_SEGMENT_COLUMNS ") VALUES";
#undef WEIR_SEGMENT_COLUMNS
// The segments starting in [?2, ?3) of stream ?1 (a merge's run), at most ?4.
constexpr const char kSegmentsStartingIn[] =
    "SELECT start_offset, end_offset, object_key FROM segments "
    "WHERE stream_id = ?1 AND start_offset >= ?2 AND start_offset < ?3 ORDER BY start_offset LIMIT ?4";
constexpr const char kDeleteSegmentsStartingIn[] =
    "DELETE FROM segments WHERE stream_id = ?1 AND start_offset >= ?2 AND start_offset < ?3";

#define WEIR_TABLE_COLUMNS "id, basin, name, kind, bucket_count, config, created_at_ms"
constexpr const char kInsertTable[] = "INSERT INTO tables(" WEIR_TABLE_COLUMNS ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)";
constexpr const char kTableByName[] = "SELECT " WEIR_TABLE_COLUMNS " FROM tables WHERE basin = ?1 AND name = ?2";
constexpr const char kTableById[] = "SELECT " WEIR_TABLE_COLUMNS " FROM tables WHERE id = ?1";
constexpr const char kSetTableBuckets[] = "UPDATE tables SET bucket_count = ?2 WHERE id = ?1";
constexpr const char kSetTableConfig[] = "UPDATE tables SET config = ?2 WHERE id = ?1";
constexpr const char kListTablesBounded[] =
    "SELECT " WEIR_TABLE_COLUMNS
    " FROM tables WHERE basin = ?1 AND name > ?2 AND name >= ?3 AND name < ?4 ORDER BY name LIMIT ?5";
constexpr const char kListTablesOpen[] =
    "SELECT " WEIR_TABLE_COLUMNS " FROM tables WHERE basin = ?1 AND name > ?2 AND name >= ?3 ORDER BY name LIMIT ?5";
#undef WEIR_TABLE_COLUMNS
constexpr const char kFirstTableOfBasin[] = "SELECT name FROM tables WHERE basin = ?1 ORDER BY name LIMIT 1";
constexpr const char kDeleteTable[] = "DELETE FROM tables WHERE id = ?1";

constexpr const char kFetchGroupOffsets[] =
    "SELECT topic, part, committed_offset, leader_epoch, metadata, commit_time_ms FROM group_offsets "
    "WHERE group_id = ?1 ORDER BY topic, part";
constexpr const char kGroupHasOffsets[] = "SELECT 1 FROM group_offsets WHERE group_id = ?1 LIMIT 1";
constexpr const char kDeleteTopicOffsets[] = "DELETE FROM group_offsets WHERE topic = ?1";
constexpr const char kStaleGroups[] =
    "SELECT group_id FROM group_offsets GROUP BY group_id HAVING MAX(commit_time_ms) < ?1";
constexpr const char kDeleteAllGroupOffsets[] = "DELETE FROM group_offsets WHERE group_id = ?1";
constexpr const char kListOffsetGroups[] =
    "SELECT DISTINCT group_id FROM group_offsets ORDER BY group_id LIMIT ?1";
#undef WEIR_BASIN_COLUMNS

// A statement over many rows, so that PostgreSQL runs many rows in one round
// trip: its text for 1, 2, 4, ... 2^kBatchRowsLog2 rows, built once (the
// driver caches statements by text: at most eight per kind). Immutable after
// construction; any thread.
constexpr int kBatchRowsLog2 = 7;  // 128 rows: at most 8 * 128 + 1 parameters

class BatchSql {
 public:
  // The text is head, then row(0), sep, row(1), ..., then tail; row(i) names
  // row i's parameters.
  BatchSql(std::string_view head, std::string_view sep, std::string_view tail,
           const std::function<std::string(size_t)>& row) {
    for (int k = 0; k <= kBatchRowsLog2; ++k) {
      std::string text(head);
      for (size_t i = 0; i < (size_t{1} << k); ++i) {
        if (i > 0) text += sep;
        text += row(i);
      }
      text += tail;
      sql_[static_cast<size_t>(k)] = std::move(text);
    }
  }
  // The most rows, at most n (>= 1), that one statement takes, and its text.
  std::pair<size_t, const char*> For(size_t n) const {
    const int k = std::min(static_cast<int>(std::bit_width(n)) - 1, kBatchRowsLog2);
    return {size_t{1} << k, sql_[static_cast<size_t>(k)].c_str()};
  }

 private:
  std::array<std::string, kBatchRowsLog2 + 1> sql_;
};

// "?first, ?first+1, ..." for n parameters.
std::string Params(size_t first, size_t n) {
  std::string out;
  for (size_t k = 0; k < n; ++k) out += fmt::format("{}?{}", k > 0 ? ", " : "", first + k);
  return out;
}
// A statement of head, a list of one parameter a row from ?first, tail
// (IN lists).
BatchSql ListSql(std::string_view head, size_t first, std::string_view tail) {
  return BatchSql(head, ", ", tail, [first](size_t i) { return fmt::format("?{}", first + i); });
}

// Covers rows [0, n) with the fewest statements of `sql`, largest first:
// each(st, first, count) binds rows [first, first + count) to a statement
// prepare(text) lent, and runs it. A template because SqlMetastore::Stmt is
// private.
template <typename Prepare, typename Each>
Status ForEachBatch(const BatchSql& sql, size_t n, Prepare&& prepare, Each&& each) {
  for (size_t first = 0; first < n;) {
    const auto [count, text] = sql.For(n - first);
    auto st = prepare(text);
    if (!st.ok()) return st.status();
    WEIR_RETURN_IF_ERROR(each(*st, first, count));
    first += count;
  }
  return Status::Ok();
}

// ?1 is the group; row i's parameters follow from ?2 (offsets: 6 a row).
const BatchSql& UpsertGroupOffsets() {
  static const BatchSql sql(
      "INSERT INTO group_offsets(group_id, topic, part, committed_offset, leader_epoch, metadata, commit_time_ms) "
      "VALUES",
      ", ",
      " ON CONFLICT(group_id, topic, part) DO UPDATE SET "
      "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
      "metadata = excluded.metadata, commit_time_ms = excluded.commit_time_ms",
      [](size_t i) { return "(?1, " + Params(2 + 6 * i, 6) + ")"; });
  return sql;
}
// (topic, partition) pairs: 2 a row.
std::string PartitionOffsetRow(size_t i) {
  const size_t p = 2 + 2 * i;
  return fmt::format("(topic = ?{} AND part = ?{})", p, p + 1);
}
const BatchSql& FetchPartitionOffsetRows() {
  static const BatchSql sql(
      "SELECT topic, part, committed_offset, leader_epoch, metadata, commit_time_ms FROM group_offsets "
      "WHERE group_id = ?1 AND (",
      " OR ", ")", PartitionOffsetRow);
  return sql;
}
const BatchSql& DeletePartitionOffsetRows() {
  static const BatchSql sql("DELETE FROM group_offsets WHERE group_id = ?1 AND (", " OR ", ")", PartitionOffsetRow);
  return sql;
}
// Settle (CommitSettle). Streams that exist, of ids from ?1.
const BatchSql& LiveStreamIds() {
  static const BatchSql sql = ListSql("SELECT id FROM streams WHERE id IN (", 1, ")");
  return sql;
}
// Rows (stream id, start, end, row number), 4 a row from ?1: the row number
// of one whose range [start, end) overlaps an indexed segment, if any. Two
// index seeks a row: the segment at or before its start must end by it, and
// none may start inside it (indexed segments never overlap).
const BatchSql& OverlappingSegment() {
  static const BatchSql sql(
      "SELECT v.column4 FROM (VALUES ", ", ",
      ") AS v WHERE (SELECT end_offset FROM segments WHERE stream_id = v.column1 AND start_offset <= v.column2 "
      "ORDER BY start_offset DESC LIMIT 1) > v.column2 OR EXISTS (SELECT 1 FROM segments WHERE stream_id = "
      "v.column1 AND start_offset > v.column2 AND start_offset < v.column3) LIMIT 1",
      [](size_t i) { return "(" + Params(1 + 4 * i, 4) + ")"; });
  return sql;
}
// Segment rows, 7 a row from ?1 (as kInsertSegment).
const BatchSql& InsertSegments() {
  static const BatchSql sql(kInsertSegmentsHead, ", ", "",
                            [](size_t i) { return "(" + Params(1 + 7 * i, 7) + ")"; });
  return sql;
}
// Stream states, 6 a row from ?1 (the trim point never moves back); a
// deleted stream's row is not there to change.
const BatchSql& UpdateStates() {
  static const BatchSql sql(
      "UPDATE stream_states SET settled_offset = v.column2, trim_point = CASE WHEN trim_point > v.column3 THEN "
      "trim_point ELSE v.column3 END, fencing_token = v.column4, last_timestamp_ms = v.column5, producer_state = "
      "v.column6 FROM (VALUES ",
      ", ", ") AS v WHERE stream_states.stream_id = v.column1",
      [](size_t i) { return "(" + Params(1 + 6 * i, 6) + ")"; });
  return sql;
}
// Buckets (CreateTable, AddBuckets, DeleteTable). ?1 is the basin; names
// from ?2: the first taken, and the ids of those that exist.
const BatchSql& StreamNamesTaken() {
  static const BatchSql sql = ListSql("SELECT name FROM streams WHERE basin = ?1 AND name IN (", 2, ") LIMIT 1");
  return sql;
}
const BatchSql& StreamIdsByName() {
  static const BatchSql sql = ListSql("SELECT id FROM streams WHERE basin = ?1 AND name IN (", 2, ")");
  return sql;
}
// Stream rows, 8 a row from ?2 (?1: the basin), as kInsertStream.
const BatchSql& InsertStreams() {
  static const BatchSql sql(kInsertStreamsHead, ", ", "", [](size_t i) {
    const size_t p = 2 + 8 * i;
    return fmt::format("(?{}, ?1, {})", p, Params(p + 1, 7));
  });
  return sql;
}
// Zero states of stream ids from ?2 (?1: an empty blob), as kInsertZeroState.
const BatchSql& InsertZeroStates() {
  static const BatchSql sql(kInsertZeroStatesHead, ", ", "",
                            [](size_t i) { return fmt::format("(?{}, 0, 0, ?1, 0, ?1)", i + 2); });
  return sql;
}
// Create tokens of stream names from ?2 (?1: the basin).
const BatchSql& DeleteTokens() {
  static const BatchSql sql = ListSql("DELETE FROM create_tokens WHERE basin = ?1 AND stream IN (", 2, ")");
  return sql;
}
// Removing streams (RemoveStreams), ids from ?1.
const BatchSql& SegmentKeysOfStreams() {
  static const BatchSql sql = ListSql("SELECT object_key FROM segments WHERE stream_id IN (", 1, ") ORDER BY stream_id, start_offset");
  return sql;
}
const BatchSql& DeleteSegmentsOfStreams() {
  static const BatchSql sql = ListSql("DELETE FROM segments WHERE stream_id IN (", 1, ")");
  return sql;
}
const BatchSql& DeleteStatesOfStreams() {
  static const BatchSql sql = ListSql("DELETE FROM stream_states WHERE stream_id IN (", 1, ")");
  return sql;
}
const BatchSql& DeleteStreamRows() {
  static const BatchSql sql = ListSql("DELETE FROM streams WHERE id IN (", 1, ")");
  return sql;
}
// Retention cuts (stream id, below offset), 2 a row from ?1: the segments
// wholly below each cut go, and are returned.
const BatchSql& DeleteSegmentsBelowCuts() {
  static const BatchSql sql("DELETE FROM segments WHERE (", " OR ", kDeleteSegmentsBelowTail, [](size_t i) {
    const size_t p = 1 + 2 * i;
    return fmt::format("(stream_id = ?{} AND start_offset < ?{} AND end_offset <= ?{})", p, p + 1, p + 1);
  });
  return sql;
}
// Groups: 1 a row, from ?1.
const BatchSql& DeleteGroupsOffsets() {
  static const BatchSql sql = ListSql("DELETE FROM group_offsets WHERE group_id IN (", 1, ")");
  return sql;
}

}  // namespace

// A statement borrowed from the driver for one use (mu_ held): resets it
// when destroyed.
class SqlMetastore::Stmt {
 public:
  explicit Stmt(SqlStatement* stmt) : stmt_(stmt) {}
  Stmt(Stmt&& other) noexcept : stmt_(std::exchange(other.stmt_, nullptr)) {}
  Stmt& operator=(Stmt&&) = delete;
  ~Stmt() {
    if (stmt_ != nullptr) stmt_->Reset();
  }

  Stmt& Int(int i, int64_t v) { return stmt_->BindInt(i, v), *this; }
  Stmt& Text(int i, std::string_view v) { return stmt_->BindText(i, v), *this; }
  Stmt& Blob(int i, std::string_view v) { return stmt_->BindBlob(i, v), *this; }
  Stmt& Null(int i) { return stmt_->BindNull(i), *this; }
  template <typename T>
  Stmt& OptInt(int i, const std::optional<T>& v) {
    return v ? Int(i, static_cast<int64_t>(*v)) : Null(i);
  }

  Result<bool> Step(std::string_view what) { return stmt_->Step(what); }
  // Steps a statement that returns no rows.
  Status Run(std::string_view what) {
    auto r = Step(what);
    if (!r.ok()) return r.status();
    return Status::Ok();
  }
  int64_t Changes() const { return stmt_->Changes(); }

  int64_t ColInt(int c) const { return stmt_->ColInt(c); }
  bool ColNull(int c) const { return stmt_->ColNull(c); }
  std::string ColText(int c) const { return stmt_->ColBytes(c); }
  std::string ColBlob(int c) const { return stmt_->ColBytes(c); }

 private:
  SqlStatement* stmt_;
};
namespace {

// Row readers, in the column order of the SQL above (templates, because Stmt
// is private to SqlMetastore).
template <typename Row>
Result<StreamInfo> ReadStream(const Row& st) {
  StreamInfo s;
  s.id = U64(st.ColInt(0));
  s.basin = st.ColText(1);
  s.name = st.ColText(2);
  auto storage_class = ParseStorageClass(st.ColText(3));
  if (!storage_class.ok()) return Corruption("stream {}: {}", s.id, storage_class.status().message());
  s.config.storage_class = *storage_class;
  s.config.retention_age_s = st.ColInt(4);
  auto timestamping = ParseTimestampingMode(st.ColText(5));
  if (!timestamping.ok()) return Corruption("stream {}: {}", s.id, timestamping.status().message());
  s.config.timestamping = *timestamping;
  s.config.uncapped_timestamps = st.ColInt(6) != 0;
  s.created_at_ms = st.ColInt(7);
  s.config.delete_on_empty_min_age_s = st.ColInt(8);
  return s;
}

template <typename Row>
Result<BasinInfo> ReadBasin(const Row& st) {
  BasinInfo b;
  b.name = st.ColText(0);
  b.created_at_ms = st.ColInt(1);
  b.config.create_stream_on_append = st.ColInt(2) != 0;
  b.config.create_stream_on_read = st.ColInt(3) != 0;
  StreamConfigLayer& d = b.config.default_stream_config;
  if (!st.ColNull(4)) {
    auto c = ParseStorageClass(st.ColText(4));
    if (!c.ok()) return Corruption("basin {}: {}", b.name, c.status().message());
    d.storage_class = *c;
  }
  if (!st.ColNull(5)) d.retention_age_s = st.ColInt(5);
  if (!st.ColNull(6)) {
    auto m = ParseTimestampingMode(st.ColText(6));
    if (!m.ok()) return Corruption("basin {}: {}", b.name, m.status().message());
    d.timestamping = *m;
  }
  if (!st.ColNull(7)) d.uncapped_timestamps = st.ColInt(7) != 0;
  if (!st.ColNull(8)) d.delete_on_empty_min_age_s = st.ColInt(8);
  return b;
}

template <typename Row>
NodeState ReadNodeRow(const Row& st) {
  NodeState n;
  n.node = st.ColText(0);
  n.epoch = U64(st.ColInt(1));
  n.window = static_cast<uint32_t>(st.ColInt(2));
  n.checkpoint = {U64(st.ColInt(3)), U64(st.ColInt(4))};
  n.heartbeat_ms = st.ColInt(5);
  n.takeover = st.ColInt(6) != 0;
  n.minted_by = U64(st.ColInt(7));
  return n;
}

template <typename Row>
StreamState ReadState(const Row& st) {
  StreamState s;
  s.stream_id = U64(st.ColInt(0));
  s.settled_offset = U64(st.ColInt(1));
  s.trim_point = U64(st.ColInt(2));
  s.fencing_token = st.ColBlob(3);
  s.last_timestamp_ms = st.ColInt(4);
  s.producer_state = st.ColBlob(5);
  return s;
}

template <typename Row>
Result<TableInfo> ReadTable(const Row& st) {
  TableInfo t;
  t.id = U64(st.ColInt(0));
  t.basin = st.ColText(1);
  t.name = st.ColText(2);
  t.kind = st.ColText(3);
  const int64_t buckets = st.ColInt(4);
  if (buckets < 1 || buckets > kMaxTableBuckets) {
    return Corruption("table {} ({}/{}): stored bucket_count {} is out of range", t.id, t.basin, t.name, buckets);
  }
  t.bucket_count = static_cast<uint32_t>(buckets);
  t.config = st.ColBlob(5);
  t.created_at_ms = st.ColInt(6);
  return t;
}

template <typename Row>
SegmentInfo ReadSegment(const Row& st) {
  SegmentInfo s;
  s.stream_id = U64(st.ColInt(0));
  s.start_offset = U64(st.ColInt(1));
  s.end_offset = U64(st.ColInt(2));
  s.first_timestamp_ms = st.ColInt(3);
  s.last_timestamp_ms = st.ColInt(4);
  s.object_key = st.ColText(5);
  s.size_bytes = U64(st.ColInt(6));
  return s;
}

}  // namespace

// ---- Plumbing ---------------------------------------------------------------

SqlMetastore::SqlMetastore(std::unique_ptr<SqlDb> db) : db_(std::move(db)), describe_(db_->Describe()) {}

SqlMetastore::~SqlMetastore() = default;

Result<std::shared_ptr<SqlMetastore>> SqlMetastore::Open(std::unique_ptr<SqlDb> db) {
  auto store = std::make_shared<SqlMetastore>(std::move(db));
  WEIR_RETURN_IF_ERROR(store->Locked("open", [&] { return store->Init(); }));
  store->counters_.transactions.store(0);  // the counters count the interface's calls, not the schema's
  return store;
}

std::optional<int64_t> SqlMetastore::StoredSchemaVersion(Status* read_error) {
  auto get = Prepare(kGetSchemaVersion);
  if (!get.ok()) {
    *read_error = get.status();
    return std::nullopt;
  }
  auto first = get->Step("read schema version");
  if (!first.ok()) *read_error = first.status();
  if (!first.ok() || !*first) return std::nullopt;
  const int64_t version = get->ColInt(0);
  auto second = get->Step("read schema version");
  if (!second.ok() || *second) return std::nullopt;  // exactly one row
  return version;
}

Status SqlMetastore::Init() {
  // A database already at this version takes no DDL, so a role with only
  // the rights to read and write the tables can serve it (PostgreSQL checks
  // CREATE on the schema before IF NOT EXISTS, and 15 grants it to nobody
  // by default). Read outside a transaction: on PostgreSQL a failed
  // statement (no table yet) would abort one.
  Status read_error;
  if (const auto stored = StoredSchemaVersion(&read_error)) {
    if (*stored == kSchemaVersion) return Status::Ok();
    if (*stored > kSchemaVersion) {  // before any DDL, which this role may not have the rights for
      return NotSupported("metastore {}: schema version {} is newer than this build supports ({}); upgrade weir",
                          describe_, *stored, kSchemaVersion);
    }
  }
  // A missing table is the usual reason the read failed (a new database);
  // when the DDL fails too, the read's error may be the one that matters
  // (a role without the right to read schema_version).
  const Status made = InTransaction("create or upgrade the schema", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(db_->Exec(kCreateSchemaVersion, "create schema_version"));
    std::vector<int64_t> versions;
    {
      WEIR_ASSIGN_OR_RETURN(Stmt get, Prepare(kGetSchemaVersion));
      while (true) {
        WEIR_ASSIGN_OR_RETURN(const bool row, get.Step("read schema version"));
        if (!row) break;
        versions.push_back(get.ColInt(0));
      }
    }
    if (versions.size() > 1) {
      return Corruption("metastore {}: schema_version has {} rows, expected one", describe_, versions.size());
    }
    if (!versions.empty() && versions[0] > kSchemaVersion) {
      return NotSupported("metastore {}: schema version {} is newer than this build supports ({}); upgrade weir",
                          describe_, versions[0], kSchemaVersion);
    }
    if (!versions.empty() && versions[0] < 1) {
      return Corruption("metastore {}: invalid schema version {}", describe_, versions[0]);
    }
    // Creating what is missing upgrades any older version, except for the
    // columns added to existing tables since.
    for (const char* sql : db_->Schema()) WEIR_RETURN_IF_ERROR(db_->Exec(sql, "create schema"));
    if (!versions.empty()) {
      for (const char* sql : db_->Upgrade(static_cast<int>(versions[0]))) {
        WEIR_RETURN_IF_ERROR(db_->Exec(sql, fmt::format("upgrade schema to {}", kSchemaVersion)));
      }
    }
    if (versions.empty()) {
      WEIR_ASSIGN_OR_RETURN(Stmt set, Prepare(kSetSchemaVersion));
      return set.Int(1, kSchemaVersion).Run("write schema version");
    }
    if (versions[0] < kSchemaVersion) {
      WEIR_ASSIGN_OR_RETURN(Stmt set, Prepare(kUpgradeSchemaVersion));
      return set.Int(1, kSchemaVersion).Run("upgrade schema version");
    }
    return Status::Ok();
  });
  if (made.ok() || read_error.ok()) return made;
  return Status(made.code(), fmt::format("{} (reading schema_version first failed too: {})", made.message(),
                                         read_error.message()));
}

Status SqlMetastore::ExecForTest(const std::string& sql) {
  std::lock_guard lock(mu_);
  return db_->ExecForTest(sql);
}

Result<SqlMetastore::Stmt> SqlMetastore::Prepare(const char* sql) {
  WEIR_ASSIGN_OR_RETURN(SqlStatement * stmt, db_->Prepare(sql));
  return Stmt(stmt);
}

template <typename F>
Status SqlMetastore::InTransaction(std::string_view what, F&& body) {
  WEIR_RETURN_IF_ERROR(db_->Begin(what));
  Status st = body();
  if (st.ok()) {
    st = db_->Commit(what);
    if (st.ok()) {
      counters_.transactions.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
  }
  db_->RollbackIfActive();
  return st;
}

template <typename F>
auto SqlMetastore::Locked(std::string_view op, F&& body) -> decltype(body()) {
  try {
    std::lock_guard lock(mu_);
    try {
      return body();
    } catch (...) {
      db_->RollbackIfActive();
      throw;
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("metastore {}: {}: out of memory", describe_, op);
  } catch (const std::exception& e) {
    return Internal("metastore {}: {}: unexpected exception: {}", describe_, op, e.what());
  }
}

Result<bool> SqlMetastore::StreamExists(uint64_t id) {
  WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kStreamExists));
  return st.Int(1, I64(id)).Step("look up stream");
}

Result<bool> SqlMetastore::BasinExists(std::string_view name) {
  WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kGetBasin));
  return st.Text(1, name).Step("look up basin");
}

Status SqlMetastore::InsertStream(StreamInfo* info) {
  {
    WEIR_ASSIGN_OR_RETURN(Stmt get, Prepare(kStreamByName));
    WEIR_ASSIGN_OR_RETURN(const bool exists, get.Text(1, info->basin).Text(2, info->name).Step("look up stream"));
    if (exists) return AlreadyExists("stream {}/{} already exists", info->basin, info->name);
  }
  WEIR_ASSIGN_OR_RETURN(info->id, NextCounter(kStreamIdCounter));
  {
    WEIR_ASSIGN_OR_RETURN(Stmt ins, Prepare(kInsertStream));
    ins.Int(1, I64(info->id))
        .Text(2, info->basin)
        .Text(3, info->name)
        .Text(4, StorageClassName(info->config.storage_class))
        .Int(5, info->config.retention_age_s)
        .Text(6, TimestampingModeName(info->config.timestamping))
        .Int(7, info->config.uncapped_timestamps ? 1 : 0)
        .Int(8, info->created_at_ms)
        .Int(9, info->config.delete_on_empty_min_age_s);
    WEIR_RETURN_IF_ERROR(ins.Run("insert stream"));
  }
  WEIR_ASSIGN_OR_RETURN(Stmt state, Prepare(kInsertZeroState));
  WEIR_RETURN_IF_ERROR(state.Int(1, I64(info->id)).Blob(2, "").Run("insert stream state"));
  // A stream name reused after a delete starts without the old token.
  return SetToken(info->basin, info->name, info->request_token);
}

Status SqlMetastore::RemoveStreams(const std::vector<uint64_t>& ids, std::vector<std::string>* keys) {
  auto prepare = [&](const char* sql) { return Prepare(sql); };
  auto bind_ids = [&](Stmt& st, size_t first, size_t count) {
    for (size_t i = 0; i < count; ++i) st.Int(1 + static_cast<int>(i), I64(ids[first + i]));
  };
  WEIR_RETURN_IF_ERROR(
      ForEachBatch(SegmentKeysOfStreams(), ids.size(), prepare, [&](Stmt& st, size_t first, size_t count) -> Status {
        bind_ids(st, first, count);
        while (true) {
          WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list segments of streams"));
          if (!row) return Status::Ok();
          keys->push_back(st.ColText(0));
        }
      }));
  for (const BatchSql* sql : {&DeleteSegmentsOfStreams(), &DeleteStatesOfStreams(), &DeleteStreamRows()}) {
    WEIR_RETURN_IF_ERROR(ForEachBatch(*sql, ids.size(), prepare, [&](Stmt& st, size_t first, size_t count) {
      bind_ids(st, first, count);
      return st.Run("delete streams");
    }));
  }
  return Status::Ok();
}

Result<std::optional<TableInfo>> SqlMetastore::TableOfBucket(std::string_view basin, std::string_view stream) {
  const std::optional<BucketRef> ref = ParseBucketStreamName(stream);
  if (!ref) return std::optional<TableInfo>();
  WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kTableByName));
  WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, basin).Text(2, ref->table).Step("look up table"));
  if (!row) return std::optional<TableInfo>();
  WEIR_ASSIGN_OR_RETURN(TableInfo table, ReadTable(st));
  if (ref->bucket >= table.bucket_count) return std::optional<TableInfo>();
  return std::optional<TableInfo>(std::move(table));
}

Result<uint64_t> SqlMetastore::CounterValue(std::string_view op, std::string_view name) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked(op, [&]() -> Result<uint64_t> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kCounterValue));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, name).Step(fmt::format("read the {} counter", name)));
    return row ? U64(st.ColInt(0)) : uint64_t{0};
  });
}

Result<uint64_t> SqlMetastore::LastStreamId() { return CounterValue("LastStreamId", kStreamIdCounter); }

Result<uint64_t> SqlMetastore::LastProducerId() { return CounterValue("LastProducerId", kProducerIdCounter); }

Result<uint64_t> SqlMetastore::NextCounter(std::string_view name, uint64_t n) {
  WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(n == 1 ? kBumpCounter : kBumpCounterBy));
  const std::string what = fmt::format("allocate {}", name);
  st.Text(1, name);
  if (n != 1) st.Int(2, I64(n));
  WEIR_ASSIGN_OR_RETURN(const bool row, st.Step(what));
  if (!row) return Internal("metastore {}: {}: no value returned", Describe(), what);
  const uint64_t value = U64(st.ColInt(0));
  WEIR_ASSIGN_OR_RETURN(const bool more, st.Step(what));
  if (more) return Internal("metastore {}: {}: more than one value returned", Describe(), what);
  return value;
}

Result<std::optional<NodeState>> SqlMetastore::ReadNode(std::string_view node) {
  WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kGetNode));
  WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, node).Step("read node"));
  if (!row) return std::optional<NodeState>();
  return std::optional<NodeState>(ReadNodeRow(st));
}


// ---- Basins -----------------------------------------------------------------

Status SqlMetastore::CreateBasin(const BasinInfo& basin, const EpochCheck& by, size_t max_basins) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("CreateBasin", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(ValidateConfig(basin.config.default_stream_config.Resolve()));
    return InTransaction("create basin", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      {
        WEIR_ASSIGN_OR_RETURN(Stmt get, Prepare(kGetBasin));
        WEIR_ASSIGN_OR_RETURN(const bool exists, get.Text(1, basin.name).Step("look up basin"));
        if (exists) return AlreadyExists("basin {} already exists", basin.name);
      }
      if (max_basins != SIZE_MAX) {
        WEIR_ASSIGN_OR_RETURN(Stmt count, Prepare(kCountBasins));
        WEIR_ASSIGN_OR_RETURN(const bool row, count.Step("count basins"));
        const int64_t held = row ? count.ColInt(0) : 0;
        if (held >= 0 && static_cast<uint64_t>(held) >= max_basins) {
          return QuotaExhausted("creating basin {} would pass the {} basins this deployment holds at most "
                                "(--max-basins; it holds {})",
                                basin.name, max_basins, held);
        }
      }
      WEIR_ASSIGN_OR_RETURN(Stmt ins, Prepare(kInsertBasin));
      BindBasinConfig(ins.Text(1, basin.name).Int(2, basin.created_at_ms), basin.config);
      WEIR_RETURN_IF_ERROR(ins.Run("insert basin"));
      return SetToken(basin.name, "", basin.request_token);
    });
  });
}

void SqlMetastore::BindBasinConfig(Stmt& st, const BasinConfig& config) {
  const StreamConfigLayer& d = config.default_stream_config;
  st.Int(3, config.create_stream_on_append ? 1 : 0).Int(4, config.create_stream_on_read ? 1 : 0);
  if (d.storage_class) {
    st.Text(5, StorageClassName(*d.storage_class));
  } else {
    st.Null(5);
  }
  st.OptInt(6, d.retention_age_s);
  if (d.timestamping) {
    st.Text(7, TimestampingModeName(*d.timestamping));
  } else {
    st.Null(7);
  }
  st.OptInt(8, d.uncapped_timestamps).OptInt(9, d.delete_on_empty_min_age_s);
}

Status SqlMetastore::ReconfigureBasin(std::string_view name, const BasinConfig& config, const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("ReconfigureBasin", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(ValidateConfig(config.default_stream_config.Resolve()));
    return InTransaction("reconfigure basin", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kUpdateBasinConfig));
      BindBasinConfig(st.Text(1, name), config);
      WEIR_RETURN_IF_ERROR(st.Run("update basin config"));
      if (st.Changes() == 0) return NotFound("basin \"{}\" does not exist", name);
      return Status::Ok();
    });
  });
}

Status SqlMetastore::SetToken(std::string_view basin, std::string_view stream, std::string_view token) {
  if (token.empty()) {
    WEIR_ASSIGN_OR_RETURN(Stmt del, Prepare(kDeleteToken));
    return del.Text(1, basin).Text(2, stream).Run("delete create token");
  }
  WEIR_ASSIGN_OR_RETURN(Stmt ins, Prepare(kInsertToken));
  return ins.Text(1, basin).Text(2, stream).Text(3, token).Run("insert create token");
}

Result<std::string> SqlMetastore::CreateToken(std::string_view basin, std::string_view stream) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("CreateToken", [&]() -> Result<std::string> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kGetToken));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, basin).Text(2, stream).Step("read create token"));
    return row ? st.ColText(0) : std::string();
  });
}

Result<BasinInfo> SqlMetastore::GetBasin(std::string_view name) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GetBasin", [&]() -> Result<BasinInfo> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kGetBasin));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, name).Step("read basin"));
    if (!row) return NotFound("basin \"{}\" does not exist", name);
    return ReadBasin(st);
  });
}

Result<std::vector<BasinInfo>> SqlMetastore::ListBasins(std::string_view prefix, std::string_view start_after,
                                                           size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListBasins", [&]() -> Result<std::vector<BasinInfo>> {
    WEIR_RETURN_IF_ERROR(CheckListLimit(limit));
    const std::optional<std::string> end = PrefixEnd(prefix);
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(end ? kListBasinsBounded : kListBasinsOpen));
    st.Text(1, start_after).Text(2, prefix).Int(4, static_cast<int64_t>(limit));
    if (end) st.Text(3, *end);
    std::vector<BasinInfo> out;
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list basins"));
      if (!row) break;
      WEIR_ASSIGN_OR_RETURN(BasinInfo b, ReadBasin(st));
      out.push_back(std::move(b));
    }
    return out;
  });
}

Status SqlMetastore::DeleteBasin(std::string_view name, const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("DeleteBasin", [&]() -> Status {
    return InTransaction("delete basin", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      {
        WEIR_ASSIGN_OR_RETURN(Stmt first, Prepare(kFirstTableOfBasin));
        WEIR_ASSIGN_OR_RETURN(const bool has_table, first.Text(1, name).Step("look up tables of basin"));
        if (has_table) {
          return PreconditionFailed("basin {} still has tables (e.g. {}); delete them first", name, first.ColText(0));
        }
      }
      {
        WEIR_ASSIGN_OR_RETURN(Stmt first, Prepare(kFirstStreamOfBasin));
        WEIR_ASSIGN_OR_RETURN(const bool has_stream, first.Text(1, name).Step("look up streams of basin"));
        if (has_stream) {
          return PreconditionFailed("basin {} still has streams (e.g. {}); delete them first", name,
                                    first.ColText(0));
        }
      }
      WEIR_ASSIGN_OR_RETURN(Stmt del, Prepare(kDeleteBasin));
      WEIR_RETURN_IF_ERROR(del.Text(1, name).Run("delete basin"));
      if (del.Changes() == 0) return NotFound("basin \"{}\" does not exist", name);
      return SetToken(name, "", "");
    });
  });
}

// ---- Streams ----------------------------------------------------------------

Result<StreamInfo> SqlMetastore::CreateStream(const StreamInfo& info, const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("CreateStream", [&]() -> Result<StreamInfo> {
    WEIR_RETURN_IF_ERROR(ValidateConfig(info.config));
    StreamInfo created = info;
    const Status txn = InTransaction("create stream", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      WEIR_ASSIGN_OR_RETURN(const bool basin_exists, BasinExists(info.basin));
      if (!basin_exists) return NotFound("basin \"{}\" does not exist", info.basin);
      return InsertStream(&created);
    });
    if (!txn.ok()) return txn;
    return created;
  });
}

Result<StreamInfo> SqlMetastore::GetStream(std::string_view basin, std::string_view name) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GetStream", [&]() -> Result<StreamInfo> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kStreamByName));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, basin).Text(2, name).Step("read stream"));
    if (!row) return NotFound("stream {}/{} does not exist", basin, name);
    return ReadStream(st);
  });
}

Result<StreamInfo> SqlMetastore::GetStreamById(uint64_t id) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GetStreamById", [&]() -> Result<StreamInfo> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kStreamById));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Int(1, I64(id)).Step("read stream"));
    if (!row) return NotFound("stream id {} does not exist", id);
    return ReadStream(st);
  });
}

Result<std::vector<StreamInfo>> SqlMetastore::ListStreams(std::string_view basin, std::string_view prefix,
                                                             std::string_view start_after, size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListStreams", [&]() -> Result<std::vector<StreamInfo>> {
    WEIR_RETURN_IF_ERROR(CheckListLimit(limit));
    {
      WEIR_ASSIGN_OR_RETURN(Stmt get, Prepare(kGetBasin));
      WEIR_ASSIGN_OR_RETURN(const bool exists, get.Text(1, basin).Step("look up basin"));
      if (!exists) return NotFound("basin \"{}\" does not exist", basin);
    }
    const std::optional<std::string> end = PrefixEnd(prefix);
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(end ? kListStreamsBounded : kListStreamsOpen));
    st.Text(1, basin).Text(2, start_after).Text(3, prefix).Int(5, static_cast<int64_t>(limit));
    if (end) st.Text(4, *end);
    std::vector<StreamInfo> out;
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list streams"));
      if (!row) break;
      WEIR_ASSIGN_OR_RETURN(StreamInfo s, ReadStream(st));
      out.push_back(std::move(s));
    }
    return out;
  });
}

Result<std::vector<StreamInfo>> SqlMetastore::ListStreamsById(uint64_t after_id, size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListStreamsById", [&]() -> Result<std::vector<StreamInfo>> {
    WEIR_RETURN_IF_ERROR(CheckListLimit(limit));
    std::vector<StreamInfo> out;
    if (after_id >= kMaxOffset) return out;  // ids are stored as int64
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kStreamsById));
    st.Int(1, I64(after_id)).Int(2, static_cast<int64_t>(limit));
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list streams by id"));
      if (!row) break;
      WEIR_ASSIGN_OR_RETURN(StreamInfo s, ReadStream(st));
      out.push_back(std::move(s));
    }
    return out;
  });
}

Status SqlMetastore::UpdateStreamConfig(uint64_t id, const StreamConfig& config, const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("UpdateStreamConfig", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(ValidateConfig(config));
    return InTransaction("update stream config", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      return WriteStreamConfig(id, config);
    });
  });
}

Status SqlMetastore::WriteStreamConfig(uint64_t id, const StreamConfig& config) {
  WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kUpdateConfig));
  st.Int(1, I64(id))
      .Text(2, StorageClassName(config.storage_class))
      .Int(3, config.retention_age_s)
      .Text(4, TimestampingModeName(config.timestamping))
      .Int(5, config.uncapped_timestamps ? 1 : 0)
      .Int(6, config.delete_on_empty_min_age_s);
  WEIR_RETURN_IF_ERROR(st.Run("update stream config"));
  if (st.Changes() == 0) return NotFound("stream id {} does not exist", id);
  return Status::Ok();
}

Status SqlMetastore::UpdateTableConfig(uint64_t table_id, std::string_view config,
                                          const std::vector<std::pair<uint64_t, StreamConfig>>& stream_configs,
                                          const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("UpdateTableConfig", [&]() -> Status {
    for (const auto& [id, c] : stream_configs) WEIR_RETURN_IF_ERROR(ValidateConfig(c));
    return InTransaction("update table config", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      {
        WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kSetTableConfig));
        WEIR_RETURN_IF_ERROR(st.Int(1, I64(table_id)).Blob(2, config).Run("set table config"));
        if (st.Changes() == 0) return NotFound("table id {} does not exist", table_id);
      }
      for (const auto& [id, c] : stream_configs) WEIR_RETURN_IF_ERROR(WriteStreamConfig(id, c));
      return Status::Ok();
    });
  });
}

void SqlMetastore::BindSegment(Stmt& st, int p, const SegmentInfo& s) {
  st.Int(p, I64(s.stream_id))
      .Int(p + 1, I64(s.start_offset))
      .Int(p + 2, I64(s.end_offset))
      .Int(p + 3, s.first_timestamp_ms)
      .Int(p + 4, s.last_timestamp_ms)
      .Text(p + 5, s.object_key)
      .Int(p + 6, I64(s.size_bytes));
}

Status SqlMetastore::InsertSegmentRow(const SegmentInfo& s) {
  WEIR_ASSIGN_OR_RETURN(Stmt ins, Prepare(kInsertSegment));
  BindSegment(ins, 1, s);
  return ins.Run("insert segment");
}

Status SqlMetastore::SegmentOverlap(const SegmentInfo& s) {
  // The neighbours on either side.
  for (const char* sql : {kSegmentAtOrBefore, kSegmentAfter}) {
    WEIR_ASSIGN_OR_RETURN(Stmt nb, Prepare(sql));
    WEIR_ASSIGN_OR_RETURN(const bool row,
                          nb.Int(1, I64(s.stream_id)).Int(2, I64(s.start_offset)).Step("check segment overlap"));
    if (!row) continue;
    const uint64_t start = U64(nb.ColInt(0));
    const uint64_t end = U64(nb.ColInt(1));
    if (start == s.start_offset) {
      return AlreadyExists("stream {}: a segment starting at offset {} is already indexed ([{}, {}))", s.stream_id,
                           start, start, end);
    }
    if (start < s.end_offset && s.start_offset < end) {
      return AlreadyExists("stream {}: segment [{}, {}) overlaps the indexed segment [{}, {})", s.stream_id,
                           s.start_offset, s.end_offset, start, end);
    }
  }
  return Internal("metastore {}: stream {}: segment [{}, {}) was found to overlap an indexed one, which is not there",
                  describe_, s.stream_id, s.start_offset, s.end_offset);
}

Result<NodeState> SqlMetastore::NodeAtEpoch(std::string_view node, uint64_t epoch) {
  // Epoch 0 is never minted: a node that never minted one holds none.
  if (epoch == 0) return PreconditionFailed("node {} epoch 0 was never minted", node);
  WEIR_ASSIGN_OR_RETURN(std::optional<NodeState> current, ReadNode(node));
  const uint64_t current_epoch = current ? current->epoch : 0;
  if (current_epoch == epoch) return current.value_or(NodeState{});
  return PreconditionFailed("node {} epoch is {}, not {}: {}", node, current_epoch, epoch,
                            current_epoch > epoch ? "this node was superseded" : "that epoch was never minted");
}

Status SqlMetastore::RaiseTrimPoint(std::string_view node, uint64_t epoch, uint64_t id, uint64_t trim_point) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("RaiseTrimPoint", [&]() -> Status {
    if (trim_point > kMaxOffset) {
      return InvalidArgument("stream id {}: trim point {} is beyond the largest offset 2^63-1", id, trim_point);
    }
    return InTransaction("raise trim point", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(NodeAtEpoch(node, epoch).status());
      WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kRaiseTrimPoint));
      WEIR_RETURN_IF_ERROR(st.Int(1, I64(id)).Int(2, I64(trim_point)).Run("raise trim point"));
      if (st.Changes() == 0) return NotFound("stream id {} does not exist", id);
      return Status::Ok();
    });
  });
}

Result<std::vector<std::string>> SqlMetastore::DeleteStream(uint64_t id, const EpochCheck& by) {
  return DeleteStreamIf(id, "DeleteStream", [&](const StreamInfo&) { return CheckEpoch(by); });
}

Status SqlMetastore::CheckEpoch(const EpochCheck& by) {
  if (by.node.empty()) return Status::Ok();
  return NodeAtEpoch(by.node, by.epoch).status();
}

Result<std::vector<std::string>> SqlMetastore::DeleteEmptyStream(uint64_t id, std::string_view node,
                                                                    uint64_t epoch) {
  return DeleteStreamIf(id, "DeleteEmptyStream", [&](const StreamInfo& s) -> Status {
    if (s.config.delete_on_empty_min_age_s <= 0) {
      return PreconditionFailed("stream {}/{} no longer has delete_on_empty set", s.basin, s.name);
    }
    return NodeAtEpoch(node, epoch).status();
  });
}

Result<std::vector<std::string>> SqlMetastore::DeleteStreamIf(
    uint64_t id, const char* what, const std::function<Status(const StreamInfo&)>& check) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked(what, [&]() -> Result<std::vector<std::string>> {
    std::vector<std::string> keys;
    const Status txn = InTransaction("delete stream", [&]() -> Status {
      std::string basin;
      std::string name;
      {
        WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kStreamById));
        WEIR_ASSIGN_OR_RETURN(const bool row, st.Int(1, I64(id)).Step("read stream"));
        if (!row) return NotFound("stream id {} does not exist", id);
        WEIR_ASSIGN_OR_RETURN(StreamInfo info, ReadStream(st));
        if (check) WEIR_RETURN_IF_ERROR(check(info));
        basin = std::move(info.basin);
        name = std::move(info.name);
      }
      WEIR_ASSIGN_OR_RETURN(const std::optional<TableInfo> table, TableOfBucket(basin, name));
      if (table) {
        return PreconditionFailed(
            "stream {}/{} backs a bucket of table {}; delete the table instead (a Kafka topic: DeleteTopics)", basin,
            name, table->name);
      }
      WEIR_RETURN_IF_ERROR(SetToken(basin, name, ""));
      return RemoveStreams({id}, &keys);
    });
    if (!txn.ok()) return txn;
    return keys;
  });
}

Result<StreamState> SqlMetastore::GetStreamState(uint64_t id) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GetStreamState", [&]() -> Result<StreamState> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kGetState));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Int(1, I64(id)).Step("read stream state"));
    if (!row) return NotFound("stream id {} does not exist", id);
    return ReadState(st);
  });
}

Result<std::vector<StreamState>> SqlMetastore::ListStreamStates(uint64_t after_id, size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListStreamStates", [&]() -> Result<std::vector<StreamState>> {
    WEIR_RETURN_IF_ERROR(CheckListLimit(limit));
    std::vector<StreamState> out;
    if (after_id >= kMaxOffset) return out;  // ids are stored as int64
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kListStates));
    st.Int(1, I64(after_id)).Int(2, static_cast<int64_t>(limit));
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list stream states"));
      if (!row) break;
      out.push_back(ReadState(st));
    }
    return out;
  });
}

// ---- Nodes and producers ------------------------------------------------------

Result<NodeState> SqlMetastore::GetNode(std::string_view node) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GetNode", [&]() -> Result<NodeState> {
    // Read inside the writers' lock: a commit whose answer was lost (a
    // remote database) may still be in flight, and the caller asks to learn
    // whether it landed (Engine::SettleLanded). It waits for that commit to end.
    WEIR_RETURN_IF_ERROR(db_->Begin("read node"));
    auto read = ReadNode(node);
    db_->RollbackIfActive();
    WEIR_ASSIGN_OR_RETURN(std::optional<NodeState> n, std::move(read));
    if (n) return std::move(*n);
    NodeState fresh;
    fresh.node = std::string(node);
    return fresh;
  });
}

Status SqlMetastore::AwaitCommitsInFlight() {
  return Locked("AwaitCommitsInFlight", [&]() -> Status {
    // The writers' lock is held by a commit until it ends, also one whose
    // connection is gone (the server finishes or aborts it, then lets go).
    WEIR_RETURN_IF_ERROR(db_->Begin("wait for commits in flight"));
    db_->RollbackIfActive();
    return Status::Ok();
  });
}

Result<std::vector<NodeState>> SqlMetastore::ListNodes() {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListNodes", [&]() -> Result<std::vector<NodeState>> {
    std::vector<NodeState> out;
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kListNodes));
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list nodes"));
      if (!row) break;
      out.push_back(ReadNodeRow(st));
    }
    return out;
  });
}

// Caller holds the lock (and a transaction, for a write that depends on it).
Status SqlMetastore::FindOtherLiveNode(std::string_view node, int64_t now_ms, int64_t live_window_ms) {
  WEIR_ASSIGN_OR_RETURN(Stmt live, Prepare(kLiveOtherNode));
  WEIR_ASSIGN_OR_RETURN(const bool row, live.Text(1, node).Int(2, now_ms - live_window_ms).Step("find live nodes"));
  if (!row) return Status::Ok();
  return PreconditionFailed(
      "node {} is live on this metastore (its last heartbeat was {} ms ago): a metastore is served by one node at "
      "a time until stream leases land; stop it first (a process started as {} would take over its streams and "
      "fence the one running)",
      live.ColText(0), now_ms - live.ColInt(1), live.ColText(0));
}

Status SqlMetastore::CheckNoOtherLiveNode(std::string_view node, int64_t live_window_ms) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("CheckNoOtherLiveNode", [&]() -> Status {
    WEIR_ASSIGN_OR_RETURN(const int64_t now_ms, db_->NowMs());
    return FindOtherLiveNode(node, now_ms, live_window_ms);
  });
}

Status SqlMetastore::Heartbeat(std::string_view node, uint64_t epoch, int64_t live_window_ms) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("Heartbeat", [&]() -> Status {
    return InTransaction("heartbeat", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(NodeAtEpoch(node, epoch).status());
      int64_t now_ms = 0;  // 0: cleared
      if (live_window_ms > 0) {
        WEIR_ASSIGN_OR_RETURN(now_ms, db_->NowMs());
        WEIR_RETURN_IF_ERROR(FindOtherLiveNode(node, now_ms, live_window_ms));
      }
      WEIR_ASSIGN_OR_RETURN(Stmt set, Prepare(kSetHeartbeat));
      return set.Text(1, node).Int(2, now_ms).Int(3, now_ms > 0 ? 1 : 0).Run("store the heartbeat");
    });
  });
}

Result<NodeState> SqlMetastore::MintEpoch(std::string_view node, uint64_t expected, uint32_t window,
                                          uint64_t minter) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("MintEpoch", [&]() -> Result<NodeState> {
    if (expected == std::numeric_limits<uint64_t>::max()) {
      return InvalidArgument("node {}: epoch {} cannot be incremented", node, expected);
    }
    NodeState minted;
    const Status txn = InTransaction("mint epoch", [&]() -> Status {
      WEIR_ASSIGN_OR_RETURN(std::optional<NodeState> current, ReadNode(node));
      const uint64_t epoch = current ? current->epoch : 0;
      if (epoch != expected) {
        return PreconditionFailed("node {} epoch is {}, expected {}: {}", node, epoch, expected,
                                  epoch > expected ? "a successor minted a newer epoch"
                                                   : "the expected epoch was never minted");
      }
      WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kUpsertEpoch));
      WEIR_RETURN_IF_ERROR(
          st.Text(1, node).Int(2, I64(expected + 1)).Int(3, window).Int(4, I64(minter)).Run("mint epoch"));
      minted.node = std::string(node);
      minted.epoch = expected + 1;
      minted.window = window;
      minted.minted_by = minter;
      if (current) minted.checkpoint = current->checkpoint;
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return minted;
  });
}

Result<uint64_t> SqlMetastore::AllocateProducerId() {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("AllocateProducerId", [&]() -> Result<uint64_t> {
    uint64_t id = 0;
    const Status txn = InTransaction("allocate producer id", [&]() -> Status {
      WEIR_ASSIGN_OR_RETURN(id, NextCounter(kProducerIdCounter));
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return id;
  });
}

Result<uint64_t> SqlMetastore::DeploymentId() {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("DeploymentId", [&]() -> Result<uint64_t> {
    uint64_t id = 0;
    const Status txn = InTransaction("read the deployment id", [&]() -> Status {
      {
        // Drawn once: a later call (or another node's) finds the row.
        std::random_device rd;
        const uint64_t drawn = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) >> 1 | 1;  // positive, non-zero
        WEIR_ASSIGN_OR_RETURN(Stmt ins, Prepare(kInsertCounterIfAbsent));
        WEIR_RETURN_IF_ERROR(
            ins.Text(1, kDeploymentIdCounter).Int(2, static_cast<int64_t>(drawn)).Run("draw the deployment id"));
      }
      WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kCounterValue));
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, kDeploymentIdCounter).Step("read the deployment id"));
      if (!row) return Internal("metastore {}: the deployment id was not stored", Describe());
      id = U64(st.ColInt(0));
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return id;
  });
}

// ---- Settle -------------------------------------------------------------------

Status SqlMetastore::CommitSettle(std::string_view node, uint64_t epoch, const ChainPosition& expected,
                                     const ChainPosition& next, const std::vector<SegmentInfo>& segments,
                                     const std::vector<StreamState>& states) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("CommitSettle", [&]() -> Status {
    if (epoch == 0) return InvalidArgument("node {}: settle at epoch 0 (no epoch was minted)", node);
    if (Before(next, expected)) {
      return InvalidArgument("node {}: settle moves the checkpoint backwards, from ({}, {}) to ({}, {})", node,
                             expected.epoch, expected.seq, next.epoch, next.seq);
    }
    for (const SegmentInfo& s : segments) WEIR_RETURN_IF_ERROR(ValidateSegment(s));
    for (const StreamState& s : states) {
      if (s.settled_offset > kMaxOffset || s.trim_point > kMaxOffset) {
        return InvalidArgument("stream id {}: settled offset {} or trim point {} is beyond the largest offset 2^63-1",
                               s.stream_id, s.settled_offset, s.trim_point);
      }
    }

    return InTransaction("commit settle", [&]() -> Status {
      WEIR_ASSIGN_OR_RETURN(const NodeState current, NodeAtEpoch(node, epoch));
      if (current.checkpoint != expected) {
        return PreconditionFailed("node {} checkpoint is ({}, {}), expected ({}, {})", node,
                                  current.checkpoint.epoch, current.checkpoint.seq, expected.epoch, expected.seq);
      }

      // Statements of up to 128 rows each (one round trip each on
      // PostgreSQL). A deleted stream's segments are left out.
      std::vector<uint64_t> ids;
      ids.reserve(segments.size());
      for (const SegmentInfo& s : segments) ids.push_back(s.stream_id);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::unordered_set<uint64_t> live;
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          LiveStreamIds(), ids.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) -> Status {
            for (size_t i = 0; i < count; ++i) st.Int(1 + static_cast<int>(i), I64(ids[first + i]));
            while (true) {
              WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("look up streams"));
              if (!row) return Status::Ok();
              live.insert(U64(st.ColInt(0)));
            }
          }));
      std::vector<const SegmentInfo*> rows;
      rows.reserve(segments.size());
      for (const SegmentInfo& s : segments) {
        if (live.count(s.stream_id) != 0) rows.push_back(&s);
      }

      // Segments never overlap: not each other (in stream and offset order,
      // each starts at or after the one before ends)...
      std::vector<const SegmentInfo*> sorted = rows;
      std::sort(sorted.begin(), sorted.end(), [](const SegmentInfo* a, const SegmentInfo* b) {
        return std::pair(a->stream_id, a->start_offset) < std::pair(b->stream_id, b->start_offset);
      });
      for (size_t i = 1; i < sorted.size(); ++i) {
        const SegmentInfo& a = *sorted[i - 1];
        const SegmentInfo& b = *sorted[i];
        if (a.stream_id == b.stream_id && b.start_offset < a.end_offset) {
          return AlreadyExists("stream {}: segments [{}, {}) and [{}, {}) of one settle overlap", a.stream_id,
                               a.start_offset, a.end_offset, b.start_offset, b.end_offset);
        }
      }
      // ...nor those indexed.
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          OverlappingSegment(), rows.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) -> Status {
            for (size_t i = 0; i < count; ++i) {
              const SegmentInfo& s = *rows[first + i];
              const int p = 1 + 4 * static_cast<int>(i);
              st.Int(p, I64(s.stream_id))
                  .Int(p + 1, I64(s.start_offset))
                  .Int(p + 2, I64(s.end_offset))
                  .Int(p + 3, static_cast<int64_t>(first + i));
            }
            WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("check segment overlap"));
            if (!row) return Status::Ok();
            const int64_t at = st.ColInt(0);
            if (at < 0 || static_cast<size_t>(at) >= rows.size()) {
              return Internal("metastore {}: segment overlap check named row {} of {}", describe_, at, rows.size());
            }
            return SegmentOverlap(*rows[static_cast<size_t>(at)]);
          }));
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          InsertSegments(), rows.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) {
            for (size_t i = 0; i < count; ++i) BindSegment(st, 1 + 7 * static_cast<int>(i), *rows[first + i]);
            return st.Run("insert segments");
          }));

      // One state a stream, as rows updated in order would leave it: the
      // last given, with the highest trim point (PostgreSQL's UPDATE ...
      // FROM would take any one of several).
      std::unordered_map<uint64_t, size_t> last;  // stream id -> its place in `merged`
      std::vector<StreamState> merged;
      for (const StreamState& s : states) {
        auto [it, fresh] = last.emplace(s.stream_id, merged.size());
        if (fresh) {
          merged.push_back(s);
        } else {
          const uint64_t trim = std::max(merged[it->second].trim_point, s.trim_point);
          merged[it->second] = s;
          merged[it->second].trim_point = trim;
        }
      }
      std::vector<const StreamState*> updates;
      updates.reserve(merged.size());
      for (const StreamState& s : merged) updates.push_back(&s);
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          UpdateStates(), updates.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) {
            for (size_t i = 0; i < count; ++i) {
              const StreamState& s = *updates[first + i];
              const int p = 1 + 6 * static_cast<int>(i);
              st.Int(p, I64(s.stream_id))
                  .Int(p + 1, I64(s.settled_offset))
                  .Int(p + 2, I64(s.trim_point))
                  .Blob(p + 3, s.fencing_token)
                  .Int(p + 4, s.last_timestamp_ms)
                  .Blob(p + 5, s.producer_state);
            }
            return st.Run("update stream states");
          }));

      WEIR_ASSIGN_OR_RETURN(Stmt ckpt, Prepare(kSetCheckpoint));
      return ckpt.Text(1, node).Int(2, I64(next.epoch)).Int(3, I64(next.seq)).Run("move checkpoint");
    });
  });
}

// ---- Segments -----------------------------------------------------------------

Result<std::vector<SegmentInfo>> SqlMetastore::FindSegments(uint64_t stream_id, uint64_t from_offset,
                                                               size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("FindSegments", [&]() -> Result<std::vector<SegmentInfo>> {
    if (limit < 1) return InvalidArgument("FindSegments: limit must be >= 1");
    std::vector<SegmentInfo> out;
    if (from_offset >= kMaxOffset) return out;  // every segment ends at or below 2^63-1
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kFindSegments));
    st.Int(1, I64(stream_id))
        .Int(2, I64(from_offset))
        .Int(3, static_cast<int64_t>(std::min<uint64_t>(limit, kMaxOffset)));
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("find segments"));
      if (!row) break;
      out.push_back(ReadSegment(st));
    }
    return out;
  });
}

Result<std::vector<SegmentInfo>> SqlMetastore::ListSegmentsFrom(uint64_t stream_id, uint64_t start_offset,
                                                                   size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListSegmentsFrom", [&]() -> Result<std::vector<SegmentInfo>> {
    if (limit < 1 || limit > kMaxSegmentListLimit) {
      return InvalidArgument("segment list limit {} is out of range; it must be 1..{}", limit, kMaxSegmentListLimit);
    }
    std::vector<SegmentInfo> out;
    // Ids and offsets are stored as int64: nothing is at or past 2^63.
    if (stream_id >= kMaxOffset) return out;
    if (start_offset >= kMaxOffset) {
      ++stream_id;
      start_offset = 0;
      if (stream_id >= kMaxOffset) return out;
    }
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kSegmentsFrom));
    st.Int(1, I64(stream_id)).Int(2, I64(start_offset)).Int(3, static_cast<int64_t>(limit));
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list segments"));
      if (!row) break;
      out.push_back(ReadSegment(st));
    }
    return out;
  });
}

Result<std::optional<SegmentInfo>> SqlMetastore::FindSegmentByTimestamp(uint64_t stream_id, int64_t timestamp_ms) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("FindSegmentByTimestamp", [&]() -> Result<std::optional<SegmentInfo>> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kSegmentByTimestamp));
    WEIR_ASSIGN_OR_RETURN(const bool row,
                          st.Int(1, I64(stream_id)).Int(2, timestamp_ms).Step("find segment by timestamp"));
    if (!row) return std::optional<SegmentInfo>();
    return std::optional<SegmentInfo>(ReadSegment(st));
  });
}

Result<std::vector<SegmentInfo>> SqlMetastore::DeleteSegmentsBelow(std::string_view node, uint64_t epoch,
                                                                      const std::vector<SegmentCut>& cuts) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("DeleteSegmentsBelow", [&]() -> Result<std::vector<SegmentInfo>> {
    if (cuts.size() > kMaxSegmentCuts) {
      return InvalidArgument("{} segment cuts in one call; at most {}", cuts.size(), kMaxSegmentCuts);
    }
    std::vector<SegmentInfo> removed;
    if (cuts.empty()) return removed;
    const Status txn = InTransaction("delete segments", [&]() -> Status {
      removed.clear();
      WEIR_RETURN_IF_ERROR(NodeAtEpoch(node, epoch).status());
      std::vector<const SegmentCut*> live;  // ids are stored as int64: none at or past 2^63
      std::unordered_map<uint64_t, size_t> order;  // stream id -> its first cut's place
      for (const SegmentCut& cut : cuts) {
        if (cut.stream_id >= kMaxOffset) continue;
        live.push_back(&cut);
        order.emplace(cut.stream_id, order.size());
      }
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          DeleteSegmentsBelowCuts(), live.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& del, size_t first, size_t count) -> Status {
            for (size_t i = 0; i < count; ++i) {
              const int p = 1 + 2 * static_cast<int>(i);
              del.Int(p, I64(live[first + i]->stream_id))
                  .Int(p + 1, I64(std::min(live[first + i]->below_offset, kMaxOffset)));
            }
            while (true) {
              WEIR_ASSIGN_OR_RETURN(const bool row, del.Step("delete segments"));
              if (!row) return Status::Ok();
              removed.push_back(ReadSegment(del));
            }
          }));
      // RETURNING has no order: by cut, then offset.
      std::sort(removed.begin(), removed.end(), [&](const SegmentInfo& a, const SegmentInfo& b) {
        return std::pair(order[a.stream_id], a.start_offset) < std::pair(order[b.stream_id], b.start_offset);
      });
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return removed;
  });
}

Status SqlMetastore::ReplaceSegments(std::string_view node, uint64_t epoch, uint64_t stream_id,
                                        const std::vector<SegmentInfo>& replaced, const SegmentInfo& merged) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("ReplaceSegments", [&]() -> Status {
    if (replaced.empty()) return InvalidArgument("stream {}: no segment to replace", stream_id);
    WEIR_RETURN_IF_ERROR(ValidateSegment(merged));
    for (size_t i = 0; i < replaced.size(); ++i) {
      if (replaced[i].stream_id != stream_id || (i > 0 && replaced[i].start_offset != replaced[i - 1].end_offset)) {
        return InvalidArgument("stream {}: the segments to replace are not adjacent segments of it", stream_id);
      }
    }
    if (merged.stream_id != stream_id || merged.start_offset != replaced.front().start_offset ||
        merged.end_offset != replaced.back().end_offset) {
      return InvalidArgument("stream {}: the merged segment [{}, {}) does not span [{}, {})", stream_id,
                             merged.start_offset, merged.end_offset, replaced.front().start_offset,
                             replaced.back().end_offset);
    }
    return InTransaction("replace segments", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(NodeAtEpoch(node, epoch).status());
      WEIR_ASSIGN_OR_RETURN(const bool live, StreamExists(stream_id));
      if (!live) return NotFound("stream id {} does not exist", stream_id);
      // The run is adjacent, so the index holds it as it was exactly when the
      // rows starting in its span are its segments (two statements for any
      // run: a merge takes up to 256 segments).
      const int64_t from = I64(merged.start_offset);
      const int64_t to = I64(merged.end_offset);
      {
        WEIR_ASSIGN_OR_RETURN(Stmt at, Prepare(kSegmentsStartingIn));
        at.Int(1, I64(stream_id)).Int(2, from).Int(3, to).Int(4, I64(replaced.size() + 1));
        for (size_t i = 0;; ++i) {
          WEIR_ASSIGN_OR_RETURN(const bool row, at.Step("read segments"));
          if (!row && i == replaced.size()) break;
          // The first segment of the run not indexed as it was (or, past the
          // run, a row that should not be there: the span overlaps it).
          const SegmentInfo& old = replaced[std::min(i, replaced.size() - 1)];
          if (!row || i == replaced.size() || U64(at.ColInt(0)) != old.start_offset ||
              U64(at.ColInt(1)) != old.end_offset || at.ColText(2) != old.object_key) {
            return PreconditionFailed("stream {}: segment [{}, {}) is not indexed as {} any more", stream_id,
                                      old.start_offset, old.end_offset, old.object_key);
          }
        }
      }
      {
        WEIR_ASSIGN_OR_RETURN(Stmt del, Prepare(kDeleteSegmentsStartingIn));
        WEIR_RETURN_IF_ERROR(del.Int(1, I64(stream_id)).Int(2, from).Int(3, to).Run("delete segments"));
        if (U64(del.Changes()) != replaced.size()) {
          return Internal("stream {}: deleting {} merged segments removed {} rows", stream_id, replaced.size(),
                          del.Changes());
        }
      }
      return InsertSegmentRow(merged);
    });
  });
}

// ---- Tables -------------------------------------------------------------------

Result<std::pair<TableInfo, std::vector<StreamInfo>>> SqlMetastore::CreateTable(const TableInfo& table,
                                                                                   const StreamConfig& stream_config,
                                                                                   const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  using Created = std::pair<TableInfo, std::vector<StreamInfo>>;
  return Locked("CreateTable", [&]() -> Result<Created> {
    if (table.kind.empty()) return InvalidArgument("table {}/{}: empty kind", table.basin, table.name);
    if (table.bucket_count < 1 || table.bucket_count > kMaxTableBuckets) {
      return InvalidArgument("table {}/{}: bucket count {} is out of range; it must be 1..{}", table.basin,
                             table.name, table.bucket_count, kMaxTableBuckets);
    }
    WEIR_RETURN_IF_ERROR(ValidateConfig(stream_config));
    Created created{table, {}};
    const Status txn = InTransaction("create table", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      WEIR_ASSIGN_OR_RETURN(const bool basin_exists, BasinExists(table.basin));
      if (!basin_exists) return NotFound("basin \"{}\" does not exist", table.basin);
      {
        WEIR_ASSIGN_OR_RETURN(Stmt get, Prepare(kTableByName));
        WEIR_ASSIGN_OR_RETURN(const bool exists, get.Text(1, table.basin).Text(2, table.name).Step("look up table"));
        if (exists) return AlreadyExists("table {}/{} already exists", table.basin, table.name);
      }
      WEIR_ASSIGN_OR_RETURN(created.first.id, NextCounter(kTableIdCounter));
      {
        WEIR_ASSIGN_OR_RETURN(Stmt ins, Prepare(kInsertTable));
        ins.Int(1, I64(created.first.id))
            .Text(2, table.basin)
            .Text(3, table.name)
            .Text(4, table.kind)
            .Int(5, table.bucket_count)
            .Blob(6, table.config)
            .Int(7, table.created_at_ms);
        WEIR_RETURN_IF_ERROR(ins.Run("insert table"));
      }
      return InsertBucketStreams(table, 0, table.bucket_count, stream_config, table.created_at_ms, &created.second);
    });
    if (!txn.ok()) return txn;
    return created;
  });
}

Status SqlMetastore::InsertBucketStreams(const TableInfo& table, uint32_t from, uint32_t to,
                                            const StreamConfig& config, int64_t created_at_ms,
                                            std::vector<StreamInfo>* out) {
  // As InsertStream for each bucket, in statements of up to 128 rows.
  if (to <= from) return Status::Ok();
  const size_t n = to - from;
  std::vector<StreamInfo> made(n);
  for (size_t i = 0; i < n; ++i) {
    made[i].basin = table.basin;
    made[i].name = BucketStreamName(table.name, from + static_cast<uint32_t>(i));
    made[i].config = config;
    made[i].created_at_ms = created_at_ms;
  }
  auto prepare = [&](const char* sql) { return Prepare(sql); };
  auto bind_names = [&](Stmt& st, size_t first, size_t count) {
    st.Text(1, table.basin);
    for (size_t i = 0; i < count; ++i) st.Text(2 + static_cast<int>(i), made[first + i].name);
  };
  WEIR_RETURN_IF_ERROR(
      ForEachBatch(StreamNamesTaken(), n, prepare, [&](Stmt& st, size_t first, size_t count) -> Status {
        bind_names(st, first, count);
        WEIR_ASSIGN_OR_RETURN(const bool taken, st.Step("look up streams"));
        if (!taken) return Status::Ok();
        const std::string name = st.ColText(0);
        const std::optional<BucketRef> ref = ParseBucketStreamName(name);
        return AlreadyExists("table {}/{}: the name of its bucket {} stream, {}, is taken by another stream",
                             table.basin, table.name, ref ? ref->bucket : 0, name);
      }));
  WEIR_ASSIGN_OR_RETURN(const uint64_t last_id, NextCounter(kStreamIdCounter, n));
  for (size_t i = 0; i < n; ++i) made[i].id = last_id - n + 1 + i;
  WEIR_RETURN_IF_ERROR(ForEachBatch(InsertStreams(), n, prepare, [&](Stmt& st, size_t first, size_t count) {
    st.Text(1, table.basin);
    for (size_t i = 0; i < count; ++i) {
      const StreamInfo& s = made[first + i];
      const int p = 2 + 8 * static_cast<int>(i);
      st.Int(p, I64(s.id))
          .Text(p + 1, s.name)
          .Text(p + 2, StorageClassName(s.config.storage_class))
          .Int(p + 3, s.config.retention_age_s)
          .Text(p + 4, TimestampingModeName(s.config.timestamping))
          .Int(p + 5, s.config.uncapped_timestamps ? 1 : 0)
          .Int(p + 6, s.created_at_ms)
          .Int(p + 7, s.config.delete_on_empty_min_age_s);
    }
    return st.Run("insert streams");
  }));
  WEIR_RETURN_IF_ERROR(ForEachBatch(InsertZeroStates(), n, prepare, [&](Stmt& st, size_t first, size_t count) {
    st.Blob(1, "");
    for (size_t i = 0; i < count; ++i) st.Int(2 + static_cast<int>(i), I64(made[first + i].id));
    return st.Run("insert stream states");
  }));
  // A stream name reused after a delete starts without the old token.
  WEIR_RETURN_IF_ERROR(ForEachBatch(DeleteTokens(), n, prepare, [&](Stmt& st, size_t first, size_t count) {
    bind_names(st, first, count);
    return st.Run("delete create tokens");
  }));
  out->reserve(out->size() + n);
  for (StreamInfo& s : made) out->push_back(std::move(s));
  return Status::Ok();
}

Result<TableInfo> SqlMetastore::GetTable(std::string_view basin, std::string_view name) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GetTable", [&]() -> Result<TableInfo> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kTableByName));
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Text(1, basin).Text(2, name).Step("read table"));
    if (!row) return NotFound("table {}/{} does not exist", basin, name);
    return ReadTable(st);
  });
}

Result<std::vector<TableInfo>> SqlMetastore::ListTables(std::string_view basin, std::string_view prefix,
                                                           std::string_view start_after, size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListTables", [&]() -> Result<std::vector<TableInfo>> {
    WEIR_RETURN_IF_ERROR(CheckListLimit(limit));
    WEIR_ASSIGN_OR_RETURN(const bool basin_exists, BasinExists(basin));
    if (!basin_exists) return NotFound("basin \"{}\" does not exist", basin);
    const std::optional<std::string> end = PrefixEnd(prefix);
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(end ? kListTablesBounded : kListTablesOpen));
    st.Text(1, basin).Text(2, start_after).Text(3, prefix).Int(5, static_cast<int64_t>(limit));
    if (end) st.Text(4, *end);
    std::vector<TableInfo> out;
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list tables"));
      if (!row) break;
      WEIR_ASSIGN_OR_RETURN(TableInfo t, ReadTable(st));
      out.push_back(std::move(t));
    }
    return out;
  });
}

Result<std::pair<TableInfo, std::vector<StreamInfo>>> SqlMetastore::AddBuckets(uint64_t table_id,
                                                                                   uint32_t new_bucket_count,
                                                                                   const StreamConfig& stream_config,
                                                                                   int64_t created_at_ms,
                                                                                   const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  using Added = std::pair<TableInfo, std::vector<StreamInfo>>;
  return Locked("AddBuckets", [&]() -> Result<Added> {
    WEIR_RETURN_IF_ERROR(ValidateConfig(stream_config));
    Added added;
    const Status txn = InTransaction("add buckets", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      {
        WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kTableById));
        WEIR_ASSIGN_OR_RETURN(const bool row, st.Int(1, I64(table_id)).Step("read table"));
        if (!row) return NotFound("table id {} does not exist", table_id);
        WEIR_ASSIGN_OR_RETURN(added.first, ReadTable(st));
      }
      TableInfo& table = added.first;
      if (new_bucket_count <= table.bucket_count || new_bucket_count > kMaxTableBuckets) {
        return InvalidArgument("table {}/{} has {} buckets; a new count must be above that and at most {}, not {}",
                               table.basin, table.name, table.bucket_count, kMaxTableBuckets, new_bucket_count);
      }
      {
        WEIR_ASSIGN_OR_RETURN(Stmt up, Prepare(kSetTableBuckets));
        WEIR_RETURN_IF_ERROR(up.Int(1, I64(table_id)).Int(2, new_bucket_count).Run("set bucket count"));
      }
      WEIR_RETURN_IF_ERROR(
          InsertBucketStreams(table, table.bucket_count, new_bucket_count, stream_config, created_at_ms, &added.second));
      table.bucket_count = new_bucket_count;
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return added;
  });
}

Result<std::vector<std::string>> SqlMetastore::DeleteTable(uint64_t table_id, bool with_group_offsets,
                                                              const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("DeleteTable", [&]() -> Result<std::vector<std::string>> {
    std::vector<std::string> keys;
    const Status txn = InTransaction("delete table", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      TableInfo table;
      {
        WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kTableById));
        WEIR_ASSIGN_OR_RETURN(const bool row, st.Int(1, I64(table_id)).Step("read table"));
        if (!row) return NotFound("table id {} does not exist", table_id);
        WEIR_ASSIGN_OR_RETURN(table, ReadTable(st));
      }
      // DeleteStream refuses bucket streams, so each is there; skip one that is not.
      std::vector<std::string> names;
      names.reserve(table.bucket_count);
      for (uint32_t b = 0; b < table.bucket_count; ++b) names.push_back(BucketStreamName(table.name, b));
      std::vector<uint64_t> ids;
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          StreamIdsByName(), names.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) -> Status {
            st.Text(1, table.basin);
            for (size_t i = 0; i < count; ++i) st.Text(2 + static_cast<int>(i), names[first + i]);
            while (true) {
              WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("read bucket streams"));
              if (!row) return Status::Ok();
              ids.push_back(U64(st.ColInt(0)));
            }
          }));
      std::sort(ids.begin(), ids.end());  // keys in bucket order, as the streams were made
      WEIR_RETURN_IF_ERROR(RemoveStreams(ids, &keys));
      if (with_group_offsets) {
        WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kDeleteTopicOffsets));
        WEIR_RETURN_IF_ERROR(st.Text(1, table.name).Run("delete topic offsets"));
      }
      WEIR_ASSIGN_OR_RETURN(Stmt del, Prepare(kDeleteTable));
      return del.Int(1, I64(table_id)).Run("delete table");
    });
    if (!txn.ok()) return txn;
    return keys;
  });
}

// ---- Consumer-group offsets ------------------------------------------------------

Status SqlMetastore::CommitGroupOffsets(std::string_view group, const std::vector<GroupOffset>& offsets,
                                          const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("CommitGroupOffsets", [&]() -> Status {
    for (const GroupOffset& o : offsets) {
      if (o.topic.empty()) return InvalidArgument("group {}: offset commit with an empty topic", group);
      if (o.partition < 0) {
        return InvalidArgument("group {}: offset commit for {} partition {}: negative partition", group, o.topic,
                               o.partition);
      }
    }
    // A partition named twice keeps its last offset (as rows written in
    // order would); PostgreSQL refuses one statement that updates a row twice.
    std::map<std::pair<std::string_view, int32_t>, size_t> last;
    for (size_t i = 0; i < offsets.size(); ++i) last[{offsets[i].topic, offsets[i].partition}] = i;
    std::vector<const GroupOffset*> rows;
    rows.reserve(last.size());
    for (const auto& [key, i] : last) rows.push_back(&offsets[i]);
    return InTransaction("commit group offsets", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      return ForEachBatch(
          UpsertGroupOffsets(), rows.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) {
            st.Text(1, group);
            for (size_t i = 0; i < count; ++i) {
              const GroupOffset& o = *rows[first + i];
              const int p = 2 + 6 * static_cast<int>(i);
              st.Text(p, o.topic)
                  .Int(p + 1, o.partition)
                  .Int(p + 2, o.offset)
                  .Int(p + 3, o.leader_epoch)
                  .Blob(p + 4, o.metadata)
                  .Int(p + 5, o.commit_time_ms);
            }
            return st.Run("upsert group offsets");
          });
    });
  });
}

// Appends the rows of a statement selecting kFetchGroupOffsets' columns.
Status SqlMetastore::ReadGroupOffsets(Stmt& st, std::vector<GroupOffset>& out) {
  while (true) {
    WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("fetch group offsets"));
    if (!row) return Status::Ok();
    GroupOffset o;
    o.topic = st.ColText(0);
    o.partition = static_cast<int32_t>(st.ColInt(1));
    o.offset = st.ColInt(2);
    o.leader_epoch = static_cast<int32_t>(st.ColInt(3));
    o.metadata = st.ColBlob(4);
    o.commit_time_ms = st.ColInt(5);
    out.push_back(std::move(o));
  }
}

Result<std::vector<GroupOffset>> SqlMetastore::FetchGroupOffsets(std::string_view group) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("FetchGroupOffsets", [&]() -> Result<std::vector<GroupOffset>> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kFetchGroupOffsets));
    st.Text(1, group);
    std::vector<GroupOffset> out;
    WEIR_RETURN_IF_ERROR(ReadGroupOffsets(st, out));
    return out;
  });
}

Result<std::vector<GroupOffset>> SqlMetastore::FetchPartitionOffsets(
    std::string_view group, const std::vector<std::pair<std::string, int32_t>>& partitions) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("FetchPartitionOffsets", [&]() -> Result<std::vector<GroupOffset>> {
    // Each partition once (an OR list would find a row named twice once, but
    // two batches would both find it).
    std::set<std::pair<std::string_view, int32_t>> unique;
    for (const auto& [topic, part] : partitions) unique.emplace(topic, part);
    const std::vector<std::pair<std::string_view, int32_t>> rows(unique.begin(), unique.end());
    std::vector<GroupOffset> out;
    WEIR_RETURN_IF_ERROR(ForEachBatch(
        FetchPartitionOffsetRows(), rows.size(), [&](const char* sql) { return Prepare(sql); },
        [&](Stmt& st, size_t first, size_t count) {
          st.Text(1, group);
          for (size_t i = 0; i < count; ++i) {
            const int p = 2 + 2 * static_cast<int>(i);
            st.Text(p, rows[first + i].first).Int(p + 1, rows[first + i].second);
          }
          return ReadGroupOffsets(st, out);
        }));
    std::sort(out.begin(), out.end(), [](const GroupOffset& a, const GroupOffset& b) {
      return std::tie(a.topic, a.partition) < std::tie(b.topic, b.partition);
    });
    return out;
  });
}

Result<bool> SqlMetastore::GroupHasOffsets(std::string_view group) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("GroupHasOffsets", [&]() -> Result<bool> {
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kGroupHasOffsets));
    return st.Text(1, group).Step("look up group offsets");
  });
}

Status SqlMetastore::DeletePartitionOffsets(std::string_view group,
                                               const std::vector<std::pair<std::string, int32_t>>& partitions,
                                               const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("DeletePartitionOffsets", [&]() -> Status {
    return InTransaction("delete partition offsets", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      return ForEachBatch(
          DeletePartitionOffsetRows(), partitions.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) {
            st.Text(1, group);
            for (size_t i = 0; i < count; ++i) {
              const int p = 2 + 2 * static_cast<int>(i);
              st.Text(p, partitions[first + i].first).Int(p + 1, partitions[first + i].second);
            }
            return st.Run("delete partition offsets");
          });
    });
  });
}

Result<std::vector<std::string>> SqlMetastore::ListOffsetGroups(size_t limit) {
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  return Locked("ListOffsetGroups", [&]() -> Result<std::vector<std::string>> {
    if (limit < 1) return InvalidArgument("ListOffsetGroups: limit must be >= 1");
    WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kListOffsetGroups));
    st.Int(1, static_cast<int64_t>(std::min<uint64_t>(limit, kMaxOffset)));
    std::vector<std::string> out;
    while (true) {
      WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list offset groups"));
      if (!row) break;
      out.push_back(st.ColText(0));
    }
    return out;
  });
}

Result<bool> SqlMetastore::DeleteAllGroupOffsets(std::string_view group, const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("DeleteAllGroupOffsets", [&]() -> Result<bool> {
    bool any = false;
    const Status txn = InTransaction("delete group", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kDeleteAllGroupOffsets));
      WEIR_RETURN_IF_ERROR(st.Text(1, group).Run("delete group offsets"));
      any = st.Changes() > 0;
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return any;
  });
}

Result<std::vector<std::string>> SqlMetastore::ExpireGroupOffsets(int64_t committed_before_ms,
                                                                     const std::vector<std::string>& keep,
                                                                     const EpochCheck& by) {
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return Locked("ExpireGroupOffsets", [&]() -> Result<std::vector<std::string>> {
    std::vector<std::string> removed;
    const Status txn = InTransaction("expire group offsets", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(CheckEpoch(by));
      std::vector<std::string> stale;
      {
        WEIR_ASSIGN_OR_RETURN(Stmt st, Prepare(kStaleGroups));
        st.Int(1, committed_before_ms);
        while (true) {
          WEIR_ASSIGN_OR_RETURN(const bool row, st.Step("list stale groups"));
          if (!row) break;
          stale.push_back(st.ColText(0));
        }
      }
      const std::set<std::string_view> kept(keep.begin(), keep.end());
      std::vector<std::string> expired;
      for (std::string& group : stale) {
        if (kept.count(group) == 0) expired.push_back(std::move(group));
      }
      WEIR_RETURN_IF_ERROR(ForEachBatch(
          DeleteGroupsOffsets(), expired.size(), [&](const char* sql) { return Prepare(sql); },
          [&](Stmt& st, size_t first, size_t count) {
            for (size_t i = 0; i < count; ++i) st.Text(1 + static_cast<int>(i), expired[first + i]);
            return st.Run("delete group offsets");
          }));
      removed = std::move(expired);
      return Status::Ok();
    });
    if (!txn.ok()) return txn;
    return removed;
  });
}

}  // namespace weir::metastore
