// SqlMetastore: the Metastore on a SQL database, through a SqlDb driver:
// sqlite://PATH (sqlite_db.h) or postgres://... (postgres_db.h).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "metastore/metastore.h"
#include "metastore/sql_db.h"

namespace weir::metastore {

// The catalog's schema version, the same on every driver. Each driver
// refuses a database with a newer one (kNotSupported) and creates or
// upgrades an older one in place, in one transaction:
//   1: basins, streams, stream_states, segments, nodes, counters
//   2: + tables, group_offsets (new tables only, so a v1 database just
//      gains them; a v1 build then refuses the upgraded file)
//   3: + create_tokens (likewise)
//   4: + streams.delete_on_empty_s (ALTER TABLE for a v1 to v3 file)
//   5: + the basin config columns of basins (ALTER TABLE for a v1 to v4 file)
//   6: + nodes.heartbeat_ms (ALTER TABLE for a v1 to v5 database)
//   7: + nodes.takeover (likewise, for a v1 to v6 database)
//   8: + nodes.minted_by (likewise, for a v1 to v7 database)
//   9: + an index of group_offsets by topic (a topic's delete deletes its
//      committed offsets without a scan of every group's)
// PostgreSQL databases start at 5.
inline constexpr int kSchemaVersion = 9;

// A Metastore whose every query and rule is written once here; the driver
// runs them. Each write method is one transaction of the driver's (writers
// serialized with every other writer of the database, all or nothing).
//
// Ownership: created by a driver's Open (usually via OpenMetastore) and
// shared by the engine. Threads: any; every method is blocking and
// serialized on the driver's one connection by a mutex. Guarantees: reads += 1
// per read method call, writes += 1 per write method call, transactions += 1
// per committed write.
//
// Storage: u64 values are stored as int64 by two's-complement cast and read
// back by the reverse cast. Segment offsets must be below 2^63 because SQL
// compares them; they are validated on insert.
class SqlMetastore final : public Metastore {
 public:
  // Creates or upgrades the schema (one transaction) and returns the store.
  static Result<std::shared_ptr<SqlMetastore>> Open(std::unique_ptr<SqlDb> db);

  explicit SqlMetastore(std::unique_ptr<SqlDb> db);  // use Open
  ~SqlMetastore() override;
  SqlMetastore(const SqlMetastore&) = delete;
  SqlMetastore& operator=(const SqlMetastore&) = delete;

  using Metastore::CreateBasin;
  Status CreateBasin(const BasinInfo& basin, const EpochCheck& by, size_t max_basins) override;
  Result<BasinInfo> GetBasin(std::string_view name) override;
  Status ReconfigureBasin(std::string_view name, const BasinConfig& config, const EpochCheck& by) override;
  Result<std::vector<BasinInfo>> ListBasins(std::string_view prefix, std::string_view start_after,
                                            size_t limit) override;
  Status DeleteBasin(std::string_view name, const EpochCheck& by) override;
  Result<std::string> CreateToken(std::string_view basin, std::string_view stream) override;

  Result<StreamInfo> CreateStream(const StreamInfo& info, const EpochCheck& by) override;
  Result<StreamInfo> GetStream(std::string_view basin, std::string_view name) override;
  Result<StreamInfo> GetStreamById(uint64_t id) override;
  Result<std::vector<StreamInfo>> ListStreams(std::string_view basin, std::string_view prefix,
                                              std::string_view start_after, size_t limit) override;
  Status UpdateStreamConfig(uint64_t id, const StreamConfig& config, const EpochCheck& by) override;
  Status RaiseTrimPoint(std::string_view node, uint64_t epoch, uint64_t id, uint64_t trim_point) override;
  Status UpdateTableConfig(uint64_t table_id, std::string_view config,
                           const std::vector<std::pair<uint64_t, StreamConfig>>& stream_configs,
                           const EpochCheck& by) override;
  Result<std::vector<std::string>> DeleteStream(uint64_t id, const EpochCheck& by) override;
  Result<std::vector<std::string>> DeleteEmptyStream(uint64_t id, std::string_view node, uint64_t epoch) override;

  Result<StreamState> GetStreamState(uint64_t id) override;
  Result<std::vector<StreamState>> ListStreamStates(uint64_t after_id, size_t limit) override;
  Result<std::vector<StreamInfo>> ListStreamsById(uint64_t after_id, size_t limit) override;

  Result<NodeState> GetNode(std::string_view node) override;
  Status AwaitCommitsInFlight() override;
  Result<std::vector<NodeState>> ListNodes() override;
  Result<NodeState> MintEpoch(std::string_view node, uint64_t expected, uint32_t window, uint64_t minter = 0) override;
  Status Heartbeat(std::string_view node, uint64_t epoch, int64_t live_window_ms) override;
  Status CheckNoOtherLiveNode(std::string_view node, int64_t live_window_ms) override;

  Result<uint64_t> AllocateProducerId() override;
  Result<uint64_t> DeploymentId() override;

  Status CommitSettle(std::string_view node, uint64_t epoch, const ChainPosition& expected,
                      const ChainPosition& next, const std::vector<SegmentInfo>& segments,
                      const std::vector<StreamState>& states) override;

  Result<std::vector<SegmentInfo>> FindSegments(uint64_t stream_id, uint64_t from_offset, size_t limit) override;
  Result<std::vector<SegmentInfo>> ListSegmentsFrom(uint64_t stream_id, uint64_t start_offset, size_t limit) override;
  Result<std::optional<SegmentInfo>> FindSegmentByTimestamp(uint64_t stream_id, int64_t timestamp_ms) override;
  Result<std::vector<SegmentInfo>> DeleteSegmentsBelow(std::string_view node, uint64_t epoch,
                                                       const std::vector<SegmentCut>& cuts) override;
  Result<uint64_t> LastStreamId() override;
  Result<uint64_t> LastProducerId() override;
  Status ReplaceSegments(std::string_view node, uint64_t epoch, uint64_t stream_id,
                         const std::vector<SegmentInfo>& replaced, const SegmentInfo& merged) override;

  Result<std::pair<TableInfo, std::vector<StreamInfo>>> CreateTable(const TableInfo& table,
                                                                    const StreamConfig& stream_config,
                                                                    const EpochCheck& by) override;
  Result<TableInfo> GetTable(std::string_view basin, std::string_view name) override;
  Result<std::vector<TableInfo>> ListTables(std::string_view basin, std::string_view prefix,
                                            std::string_view start_after, size_t limit) override;
  Result<std::vector<std::string>> DeleteTable(uint64_t table_id, bool with_group_offsets,
                                                const EpochCheck& by) override;
  Result<std::pair<TableInfo, std::vector<StreamInfo>>> AddBuckets(uint64_t table_id, uint32_t new_bucket_count,
                                                                   const StreamConfig& stream_config,
                                                                   int64_t created_at_ms, const EpochCheck& by) override;

  Status CommitGroupOffsets(std::string_view group, const std::vector<GroupOffset>& offsets,
                            const EpochCheck& by) override;
  Result<std::vector<GroupOffset>> FetchGroupOffsets(std::string_view group) override;
  Result<std::vector<GroupOffset>> FetchPartitionOffsets(
      std::string_view group, const std::vector<std::pair<std::string, int32_t>>& partitions) override;
  Result<bool> GroupHasOffsets(std::string_view group) override;
  Status DeletePartitionOffsets(std::string_view group,
                                const std::vector<std::pair<std::string, int32_t>>& partitions,
                                const EpochCheck& by) override;
  Result<std::vector<std::string>> ListOffsetGroups(size_t limit) override;
  Result<bool> DeleteAllGroupOffsets(std::string_view group, const EpochCheck& by) override;
  Result<std::vector<std::string>> ExpireGroupOffsets(int64_t committed_before_ms,
                                                      const std::vector<std::string>& keep,
                                                      const EpochCheck& by) override;

  const MetastoreCounters& counters() const override { return counters_; }
  std::string Describe() const override { return describe_; }

  // Tests: runs one statement of the driver's own SQL (e.g. to cap a SQLite
  // database's size).
  Status ExecForTest(const std::string& sql);

 private:
  class Stmt;

  // All below: mu_ held.
  Status Init();
  // The version in schema_version if it holds exactly one row (read outside
  // a transaction); nullopt otherwise, or if the table is missing (or could
  // not be read: then *read_error says why).
  std::optional<int64_t> StoredSchemaVersion(Status* read_error);
  Result<Stmt> Prepare(const char* sql);
  // Runs body inside the driver's write transaction; rolls back if it fails.
  template <typename F>
  Status InTransaction(std::string_view what, F&& body);
  Result<bool> StreamExists(uint64_t id);
  Result<bool> BasinExists(std::string_view name);
  // Inserts a stream row (new id) and its zero state; kAlreadyExists if the name is taken.
  Status InsertStream(StreamInfo* info);
  // Inserts the streams of buckets [from, to) of `table` (inside a
  // transaction), appending them to `out`; kAlreadyExists names the bucket.
  Status InsertBucketStreams(const TableInfo& table, uint32_t from, uint32_t to, const StreamConfig& config,
                             int64_t created_at_ms, std::vector<StreamInfo>* out);
  // Records (or, for an empty token, forgets) a create token; in a transaction.
  Status SetToken(std::string_view basin, std::string_view stream, std::string_view token);
  // Binds a basin's config to parameters ?3..?9 of kInsertBasin / kUpdateBasinConfig.
  static void BindBasinConfig(Stmt& st, const BasinConfig& config);
  // Runs kUpdateConfig for stream `id` (in a transaction); kNotFound if it is missing.
  Status WriteStreamConfig(uint64_t id, const StreamConfig& config);
  // Deletes streams' segment rows, states and rows; appends their segment object keys
  // (by stream id, then offset).
  Status RemoveStreams(const std::vector<uint64_t>& ids, std::vector<std::string>* keys);
  // The table whose bucket `stream` backs, if any.
  Result<std::optional<TableInfo>> TableOfBucket(std::string_view basin, std::string_view stream);
  // Adds n (>= 1) to a counter; its new value (so n - 1 below it are also taken).
  Result<uint64_t> NextCounter(std::string_view name, uint64_t n = 1);
  // A counter's value (0 before its first use), as operation `op`.
  Result<uint64_t> CounterValue(std::string_view op, std::string_view name);
  Result<std::optional<NodeState>> ReadNode(std::string_view node);
  // In a transaction: the node's state, or kPreconditionFailed unless `node`
  // holds `epoch` (a successor minted a later one, or it was never minted).
  Result<NodeState> NodeAtEpoch(std::string_view node, uint64_t epoch);
  // kPreconditionFailed naming another node whose heartbeat is set and at
  // most live_window_ms older than now_ms (the metastore's clock).
  Status FindOtherLiveNode(std::string_view node, int64_t now_ms, int64_t live_window_ms);
  // NodeAtEpoch for `by`; nothing to check for an empty node.
  Status CheckEpoch(const EpochCheck& by);
  // In a transaction: one segment row, unchecked.
  Status InsertSegmentRow(const SegmentInfo& s);
  // Binds a segment row to parameters p..p+6 (the segment columns' order).
  static void BindSegment(Stmt& st, int p, const SegmentInfo& s);
  // Appends a statement's group offset rows (kFetchGroupOffsets' columns) to `out`.
  static Status ReadGroupOffsets(Stmt& st, std::vector<GroupOffset>& out);
  // The kAlreadyExists error naming the indexed segment `s` overlaps (kInternal if none does).
  Status SegmentOverlap(const SegmentInfo& s);
  // DeleteStream's transaction; `check` (if set) runs first inside it with
  // the stream's row and may refuse.
  Result<std::vector<std::string>> DeleteStreamIf(uint64_t id, const char* what,
                                                  const std::function<Status(const StreamInfo&)>& check);

  // Locks mu_ and runs body, turning exceptions into a Status.
  template <typename F>
  auto Locked(std::string_view op, F&& body) -> decltype(body());

  MetastoreCounters counters_;
  std::mutex mu_;
  const std::unique_ptr<SqlDb> db_;  // guarded by mu_
  const std::string describe_;
};

}  // namespace weir::metastore
