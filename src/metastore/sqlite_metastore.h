// sqlite://PATH: the embedded default Metastore, one SQLite database file.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "metastore/metastore.h"

struct sqlite3;
struct sqlite3_stmt;

namespace weir::metastore {

// A Metastore in one SQLite database (WAL journal, synchronous=FULL, so a
// committed transaction survives a crash or power loss).
//
// Ownership: created by Open (usually via OpenMetastore) and shared by the
// engine. Threads: any; every method is blocking and serialized on one
// connection by a mutex. Other processes may open the same file: SQLite
// serializes their writers, and a lock held longer than 5 s surfaces as
// kUnavailable (retryable). Guarantees: each write method is one
// BEGIN IMMEDIATE transaction, all or nothing; reads += 1 per read method call,
// writes += 1 per write method call, transactions += 1 per committed write.
//
// Storage: u64 values are stored as SQLite INTEGER (int64) by two's-complement
// cast and read back by the reverse cast. Segment offsets must be below 2^63
// because SQL compares them; they are validated on insert.
class SqliteMetastore final : public Metastore {
 public:
  // Current schema; Open refuses a database with a newer one (kNotSupported)
  // and upgrades an older one in place, in one transaction:
  //   1: basins, streams, stream_states, segments, nodes, counters
  //   2: + tables, group_offsets (new tables only, so a v1 database just
  //      gains them; a v1 build then refuses the upgraded file)
  //   3: + create_tokens (likewise)
  //   4: + streams.delete_on_empty_s (ALTER TABLE for a v1 to v3 file)
  //   5: + the basin config columns of basins (ALTER TABLE for a v1 to v4 file)
  static constexpr int kSchemaVersion = 5;

  // Opens PATH (created if missing; its parent directory must exist) or, for
  // ":memory:", a private in-memory database. Creates the schema if missing.
  static Result<std::shared_ptr<SqliteMetastore>> Open(const std::string& path);

  ~SqliteMetastore() override;
  SqliteMetastore(const SqliteMetastore&) = delete;
  SqliteMetastore& operator=(const SqliteMetastore&) = delete;

  Status CreateBasin(const BasinInfo& basin) override;
  Result<BasinInfo> GetBasin(std::string_view name) override;
  Status ReconfigureBasin(std::string_view name, const BasinConfig& config) override;
  Result<std::vector<BasinInfo>> ListBasins(std::string_view prefix, std::string_view start_after,
                                            size_t limit) override;
  Status DeleteBasin(std::string_view name) override;
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
  Result<std::vector<StreamState>> ListStreamStates() override;

  Result<NodeState> GetNode(std::string_view node) override;
  Result<NodeState> MintEpoch(std::string_view node, uint64_t expected, uint32_t window) override;

  Result<uint64_t> AllocateProducerId() override;

  Status CommitSettle(std::string_view node, uint64_t epoch, const ChainPosition& expected,
                      const ChainPosition& next, const std::vector<SegmentInfo>& segments,
                      const std::vector<StreamState>& states) override;

  Result<std::vector<SegmentInfo>> FindSegments(uint64_t stream_id, uint64_t from_offset, size_t limit) override;
  Result<std::optional<SegmentInfo>> FindSegmentByTimestamp(uint64_t stream_id, int64_t timestamp_ms) override;
  Result<std::vector<SegmentInfo>> DeleteSegmentsBelow(std::string_view node, uint64_t epoch, uint64_t stream_id,
                                                       uint64_t below_offset) override;
  Result<uint64_t> LastStreamId() override;
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

  Status CommitGroupOffsets(std::string_view group, const std::vector<GroupOffset>& offsets) override;
  Result<std::vector<GroupOffset>> FetchGroupOffsets(std::string_view group) override;
  Status DeleteGroupOffsets(std::string_view group, std::string_view topic) override;
  Status DeletePartitionOffsets(std::string_view group,
                                const std::vector<std::pair<std::string, int32_t>>& partitions) override;
  Result<std::vector<std::string>> ListOffsetGroups() override;
  Result<bool> DeleteAllGroupOffsets(std::string_view group) override;
  Result<std::vector<std::string>> ExpireGroupOffsets(int64_t committed_before_ms,
                                                      const std::vector<std::string>& keep) override;

  const MetastoreCounters& counters() const override { return counters_; }
  std::string Describe() const override { return "sqlite://" + path_; }

  // Tests: caps the database at `pages` pages, so writes past it fail as on a full disk.
  Status SetMaxPageCountForTest(int64_t pages);

 private:
  class Stmt;

  SqliteMetastore(std::string path, sqlite3* db);

  // All below: mu_ held.
  Status Init();
  Status Exec(const char* sql, std::string_view what);
  Result<Stmt> Prepare(const char* sql);
  Status Error(int rc, std::string_view what) const;
  // Runs body inside BEGIN IMMEDIATE ... COMMIT; rolls back if it fails.
  template <typename F>
  Status InTransaction(std::string_view what, F&& body);
  void RollbackIfActive();
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
  // Deletes a stream's segment rows, state and row; appends the segment object keys.
  Status RemoveStream(uint64_t id, std::vector<std::string>* keys);
  // The table whose bucket `stream` backs, if any.
  Result<std::optional<TableInfo>> TableOfBucket(std::string_view basin, std::string_view stream);
  Result<uint64_t> NextCounter(std::string_view name);
  Result<std::optional<NodeState>> ReadNode(std::string_view node);
  // In a transaction: the node's state, or kPreconditionFailed unless `node`
  // holds `epoch` (a successor minted a later one, or it was never minted).
  Result<NodeState> NodeAtEpoch(std::string_view node, uint64_t epoch);
  // NodeAtEpoch for `by`; nothing to check for an empty node.
  Status CheckEpoch(const EpochCheck& by);
  // In a transaction: one segment row, unchecked.
  Status InsertSegmentRow(const SegmentInfo& s);
  // DeleteStream's transaction; `check` (if set) runs first inside it with
  // the stream's row and may refuse.
  Result<std::vector<std::string>> DeleteStreamIf(uint64_t id, const char* what,
                                                  const std::function<Status(const StreamInfo&)>& check);

  // Locks mu_ and runs body, turning exceptions into a Status.
  template <typename F>
  auto Locked(std::string_view op, F&& body) -> decltype(body());

  const std::string path_;
  MetastoreCounters counters_;
  std::mutex mu_;
  sqlite3* db_;                                                // guarded by mu_
  std::unordered_map<std::string, sqlite3_stmt*> statements_;  // by SQL text; guarded by mu_
};

}  // namespace weir::metastore
