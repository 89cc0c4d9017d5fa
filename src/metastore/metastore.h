// The Metastore interface: weir's catalog. Basins, streams and their config,
// node epochs (minted by compare-and-swap), the producer-id allocator, each
// stream's settled state, the segment index, the WAL chain checkpoint, the
// table catalog (tables whose buckets are streams) and consumer-group offsets.
//
// Ownership: one Metastore per process, shared (std::shared_ptr) by the engine.
// Every method is thread-safe and blocking and returns Status/Result; no
// exception escapes. Multi-row changes (CommitSettle, DeleteStream,
// CreateTable, DeleteTable, CommitGroupOffsets) are one transaction: either
// all of it is visible or none.
//
// The metastore is off the append path (DESIGN.md §2.8): the engine calls it
// for admin operations, at start-up, and once per settle cycle.
//
// Backends: sqlite://PATH (embedded default) and postgres://...; one
// conformance suite (tests/metastore_conformance_test.cc) runs against each.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace weir::metastore {

// ---- Streams --------------------------------------------------------------

enum class StorageClass { kStandard, kExpress };
// S2 timestamping modes: client-prefer (client's if given, else arrival),
// client-require (reject appends without one), arrival (always arrival time).
enum class TimestampingMode { kClientPrefer, kClientRequire, kArrival };

struct StreamConfig {
  StorageClass storage_class = StorageClass::kStandard;
  int64_t retention_age_s = 7 * 24 * 3600;  // 0 = keep forever
  TimestampingMode timestamping = TimestampingMode::kClientPrefer;
  // With client timestamps: allow timestamps in the future of arrival time.
  bool uncapped_timestamps = false;
  // Delete the stream once it holds no record, has existed this long and has
  // taken no append for this long (S2's delete_on_empty). 0 = never.
  int64_t delete_on_empty_min_age_s = 0;
  friend bool operator==(const StreamConfig&, const StreamConfig&) = default;
};

// A partial stream config (S2's OptionalStreamConfig): a basin's defaults for
// its new streams. A plain value, copied freely; no shared state, so any thread.
// An unset field falls back to the layer below (Over), then to StreamConfig's default (Resolve).
struct StreamConfigLayer {
  std::optional<StorageClass> storage_class;
  std::optional<int64_t> retention_age_s;  // 0 = keep forever
  std::optional<TimestampingMode> timestamping;
  std::optional<bool> uncapped_timestamps;
  std::optional<int64_t> delete_on_empty_min_age_s;  // 0 = never

  static StreamConfigLayer Of(const StreamConfig& c);  // every field set
  // This layer's fields, then `below`'s where this one is unset.
  StreamConfigLayer Over(const StreamConfigLayer& below) const;
  StreamConfig Resolve() const;  // unset fields take StreamConfig's defaults
  bool Empty() const { return *this == StreamConfigLayer{}; }
  friend bool operator==(const StreamConfigLayer&, const StreamConfigLayer&) = default;
};

// ---- Basins ---------------------------------------------------------------

// S2's BasinConfig. A stream created in the basin takes default_stream_config
// for the fields its own config leaves unset; the create_stream_on_* flags make
// an append (or a read / tail check) of a missing stream create it first.
struct BasinConfig {
  StreamConfigLayer default_stream_config;
  bool create_stream_on_append = false;
  bool create_stream_on_read = false;
  friend bool operator==(const BasinConfig&, const BasinConfig&) = default;
};

struct BasinInfo {
  std::string name;
  int64_t created_at_ms = 0;
  // On create only: the client's request token (S2's s2-request-token; the
  // REST API stores it with the requested config, as S2 keys creates), kept
  // so a retried create can be recognised (CreateToken). Not read back here.
  std::string request_token = {};
  BasinConfig config = {};
};

std::string_view StorageClassName(StorageClass c);              // "standard" | "express"
std::string_view TimestampingModeName(TimestampingMode m);       // "client-prefer" | ...
Result<StorageClass> ParseStorageClass(std::string_view s);      // kInvalidArgument if unknown
Result<TimestampingMode> ParseTimestampingMode(std::string_view s);

struct StreamInfo {
  uint64_t id = 0;  // allocated by the metastore, never reused
  std::string basin;
  std::string name;
  StreamConfig config;
  int64_t created_at_ms = 0;
  std::string request_token = {};  // on create only, as BasinInfo's
};

// A stream's state as of its last settle: everything recovery needs besides
// the unsettled WAL slots.
struct StreamState {
  uint64_t stream_id = 0;
  uint64_t settled_offset = 0;  // next offset after the last settled record
  uint64_t trim_point = 0;      // records below this offset are trimmed
  std::string fencing_token;    // empty = none
  int64_t last_timestamp_ms = 0;
  // Opaque to the metastore: the engine's serialized producer windows.
  std::string producer_state;
};

// ---- Segments ---------------------------------------------------------------

// One settled segment object: a stream's records [start_offset, end_offset).
struct SegmentInfo {
  uint64_t stream_id = 0;
  uint64_t start_offset = 0;
  uint64_t end_offset = 0;  // exclusive
  int64_t first_timestamp_ms = 0;
  int64_t last_timestamp_ms = 0;
  std::string object_key;
  uint64_t size_bytes = 0;
};

// Retention's cut of one stream: its segments that end at or below
// below_offset go.
struct SegmentCut {
  uint64_t stream_id = 0;
  uint64_t below_offset = 0;
};

// ---- Tables -----------------------------------------------------------------

// A table: a named set of buckets, each bucket one stream of the same basin.
// Kafka topics are log tables of the `weir-kafka` basin whose buckets are the
// partitions; later, primary-key tables (schemas, partitions) extend this row.
struct TableInfo {
  uint64_t id = 0;  // allocated by the metastore, never reused
  std::string basin;
  std::string name;
  std::string kind = "log";  // "log" today; later "primary-key"
  uint32_t bucket_count = 1;
  // Opaque to the metastore: the front-end's description (Kafka topic
  // configs as JSON; later the schema).
  std::string config;
  int64_t created_at_ms = 0;
};

inline constexpr uint32_t kMaxTableBuckets = 10000;

// The stream that backs bucket `bucket` of table `table`: "<table>/<bucket>",
// the bucket in decimal without padding ("orders/0", "orders/11").
std::string BucketStreamName(std::string_view table, uint32_t bucket);
// A log table's name: Kafka's topic rule (every log table can be read as a
// topic), 1 to 249 of [a-zA-Z0-9._-], not "." or "..", so never a '/'.
// `what` names it in the error ("topic", "table").
Status CheckLogTableName(std::string_view name, std::string_view what = "table");
// The stream config a log table's buckets start from: client timestamps kept
// as sent (Kafka's CreateTime, with no cap).
StreamConfig LogTableStreamConfig();

// The inverse: (table, bucket) if `stream` has that form ("<table>/<decimal>",
// table non-empty, bucket below kMaxTableBuckets, no leading zeros except
// "0"); nullopt otherwise. Whether such a table exists is the metastore's to say.
struct BucketRef {
  std::string_view table;
  uint32_t bucket = 0;
};
std::optional<BucketRef> ParseBucketStreamName(std::string_view stream);

// ---- Consumer-group offsets -------------------------------------------------

// One committed offset of a Kafka consumer group (the next offset to consume).
struct GroupOffset {
  std::string topic;
  int32_t partition = 0;
  int64_t offset = 0;
  int32_t leader_epoch = -1;  // -1 = unknown
  std::string metadata;       // the client's opaque string; a null one is stored as ""
  int64_t commit_time_ms = 0;
};

// ---- Nodes, epochs and the chain checkpoint ---------------------------------

// A position in a node's WAL chain: every slot before (epoch, seq) is settled.
struct ChainPosition {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  friend bool operator==(const ChainPosition&, const ChainPosition&) = default;
};

struct NodeState {
  std::string node;
  uint64_t epoch = 0;        // current (latest minted) epoch; 0 = never minted
  uint32_t window = 0;       // pipeline window recorded with that epoch
  ChainPosition checkpoint;  // settle progress of this node's chain
  // Its last heartbeat, by the metastore's clock (ms since the epoch); 0 =
  // cleared (it stopped having settled all it acknowledged) or never set.
  int64_t heartbeat_ms = 0;
  // The heartbeat was set by a build that takes dead nodes over (schema 7):
  // once stale, the node's unsettled WAL awaits the next node to start. A
  // heartbeat an older build left is not (nodes may have served since
  // without that node's records, and new appends took their offsets).
  bool takeover = false;
  // The `minter` of the mint that made `epoch` (schema 8; 0 before).
  uint64_t minted_by = 0;
};

// Operation counters, for the "O(1) per settle cycle" check and /metrics.
struct MetastoreCounters {
  std::atomic<uint64_t> reads{0};         // read method calls
  std::atomic<uint64_t> writes{0};        // write method calls (a CommitSettle is one)
  std::atomic<uint64_t> transactions{0};  // committed write transactions
};

// Who asks for a change a superseded node must not make: `node` at `epoch`,
// checked in the change's transaction. An empty node checks nothing (tools
// and tests that act for no node).
struct EpochCheck {
  std::string_view node;
  uint64_t epoch = 0;
};

class Metastore {
 public:
  virtual ~Metastore() = default;

  // Basins. Names are validated by the engine, not here. Writes are checked
  // against `by` as stream changes are (kPreconditionFailed when superseded).
  // kAlreadyExists; kQuotaExhausted when `max_basins` exist already (checked
  // in the create's transaction, after kAlreadyExists).
  virtual Status CreateBasin(const BasinInfo& basin, const EpochCheck& by, size_t max_basins) = 0;
  Status CreateBasin(const BasinInfo& basin, const EpochCheck& by) { return CreateBasin(basin, by, SIZE_MAX); }
  virtual Result<BasinInfo> GetBasin(std::string_view name) = 0;  // kNotFound
  // Replaces the basin's config; kNotFound if it does not exist. Streams keep
  // the config they were created with.
  virtual Status ReconfigureBasin(std::string_view name, const BasinConfig& config, const EpochCheck& by) = 0;
  // Basins with names > start_after that start with prefix (byte-wise; '%'
  // and '_' are literal), ascending, at most limit (1..1000, else
  // kInvalidArgument). ListStreams likewise, within one basin (kNotFound).
  virtual Result<std::vector<BasinInfo>> ListBasins(std::string_view prefix, std::string_view start_after,
                                                    size_t limit) = 0;
  // kNotFound if missing; kPreconditionFailed if it still has tables or streams.
  virtual Status DeleteBasin(std::string_view name, const EpochCheck& by) = 0;
  // The request token the basin (stream empty) or stream was created with;
  // "" if none was given or it does not exist. Deleting it forgets the token.
  virtual Result<std::string> CreateToken(std::string_view basin, std::string_view stream) = 0;

  // Streams. CreateStream allocates the id (ignores info.id) and creates the
  // stream's state row (all zero) in the same transaction; the basin must exist
  // (kNotFound) and the name be free (kAlreadyExists). As every change a
  // superseded node must not make, it takes `by` and answers
  // kPreconditionFailed (nothing changes) when `by` names a node not at that
  // epoch: so do UpdateStreamConfig, DeleteStream, CreateTable, DeleteTable,
  // AddBuckets and UpdateTableConfig.
  virtual Result<StreamInfo> CreateStream(const StreamInfo& info, const EpochCheck& by) = 0;
  virtual Result<StreamInfo> GetStream(std::string_view basin, std::string_view name) = 0;
  virtual Result<StreamInfo> GetStreamById(uint64_t id) = 0;
  virtual Result<std::vector<StreamInfo>> ListStreams(std::string_view basin, std::string_view prefix,
                                                      std::string_view start_after, size_t limit) = 0;
  // Streams of every basin with id > after_id, by id, at most limit (1..1000,
  // else kInvalidArgument): recovery loads them a page per round trip.
  virtual Result<std::vector<StreamInfo>> ListStreamsById(uint64_t after_id, size_t limit) = 0;
  virtual Status UpdateStreamConfig(uint64_t id, const StreamConfig& config, const EpochCheck& by) = 0;  // kNotFound
  // Raises a stream's stored trim point to `trim_point` (never lowers it):
  // a trim made without a command record (Kafka DeleteRecords), by `node` at
  // `epoch`. kNotFound; kPreconditionFailed if the node's epoch is not `epoch`.
  virtual Status RaiseTrimPoint(std::string_view node, uint64_t epoch, uint64_t id, uint64_t trim_point) = 0;
  // Removes the stream, its state and its segment rows in one transaction and
  // returns the segment object keys so the caller can delete the objects.
  // kNotFound if missing; kPreconditionFailed if the stream backs a bucket of
  // a table (its basin has a table T and its name is BucketStreamName(T, b)
  // with b < T's bucket_count): such a stream goes only with DeleteTable; and
  // kPreconditionFailed if `by` names a node not at that epoch (a superseded
  // node deletes nothing its successor serves).
  virtual Result<std::vector<std::string>> DeleteStream(uint64_t id, const EpochCheck& by) = 0;
  // The same for delete_on_empty, in one transaction with two more checks:
  // `node` is still at `epoch` (a superseded node deletes nothing) and the
  // stream's config still has delete_on_empty set; else kPreconditionFailed.
  virtual Result<std::vector<std::string>> DeleteEmptyStream(uint64_t id, std::string_view node,
                                                             uint64_t epoch) = 0;

  virtual Result<StreamState> GetStreamState(uint64_t id) = 0;
  // Stream states with stream id > after_id, by id, at most limit (1..1000,
  // else kInvalidArgument): recovery reads them a page at a time.
  virtual Result<std::vector<StreamState>> ListStreamStates(uint64_t after_id, size_t limit) = 0;

  // Tables. CreateTable allocates the table id (ignores table.id) and, in the
  // same transaction, creates one stream per bucket, named BucketStreamName
  // and configured with stream_config, each with its zero state row as
  // CreateStream does; returns the table and its streams in bucket order.
  // kInvalidArgument for an empty kind, a bucket_count of 0 or above
  // kMaxTableBuckets, or an invalid stream_config; kNotFound if the basin is
  // missing; kAlreadyExists if the table or any bucket stream name exists
  // (nothing is created). Tables and streams have separate namespaces within
  // a basin; only the bucket stream names are shared.
  virtual Result<std::pair<TableInfo, std::vector<StreamInfo>>> CreateTable(const TableInfo& table,
                                                                            const StreamConfig& stream_config,
                                                                            const EpochCheck& by) = 0;
  virtual Result<TableInfo> GetTable(std::string_view basin, std::string_view name) = 0;  // kNotFound
  // Same paging rules as ListStreams (kNotFound for a missing basin).
  virtual Result<std::vector<TableInfo>> ListTables(std::string_view basin, std::string_view prefix,
                                                    std::string_view start_after, size_t limit) = 0;
  // One transaction: removes the table row and its bucket streams (found by
  // name), their states and segment rows; returns the segment object keys, as
  // DeleteStream does. kNotFound if the table is missing. With
  // `with_group_offsets` (the table is a Kafka topic) every group's committed
  // offsets of a topic of the table's name go in the same transaction: a
  // topic created again under the name starts with none.
  // kPreconditionFailed (nothing changes) if `by` names a node not at that epoch.
  virtual Result<std::vector<std::string>> DeleteTable(uint64_t table_id, bool with_group_offsets,
                                                       const EpochCheck& by) = 0;
  // One transaction: raises the table's bucket count to `new_bucket_count`
  // and creates the stream of each new bucket as CreateTable does (config
  // `stream_config`, created at `created_at_ms`); returns the table and the
  // new streams in bucket order (Kafka CreatePartitions). kInvalidArgument
  // unless bucket_count < new_bucket_count <= kMaxTableBuckets, or for an
  // invalid stream_config; kNotFound if the table is missing; kAlreadyExists
  // if a new bucket's stream name is taken (nothing changes).
  virtual Result<std::pair<TableInfo, std::vector<StreamInfo>>> AddBuckets(uint64_t table_id,
                                                                           uint32_t new_bucket_count,
                                                                           const StreamConfig& stream_config,
                                                                           int64_t created_at_ms,
                                                                           const EpochCheck& by) = 0;
  // Replaces a table's config blob and, in the same transaction, the config
  // of the given streams (its bucket streams: Kafka AlterConfigs). kNotFound
  // if the table or a stream is missing, kInvalidArgument for an invalid
  // stream config; either way nothing changes.
  virtual Status UpdateTableConfig(uint64_t table_id, std::string_view config,
                                   const std::vector<std::pair<uint64_t, StreamConfig>>& stream_configs,
                                   const EpochCheck& by) = 0;

  // Consumer-group offsets (Kafka OffsetCommit / OffsetFetch), keyed by
  // (group, topic, partition). Commit upserts every entry in one transaction
  // (a later entry for the same key wins); kInvalidArgument (nothing stored)
  // for an empty topic or a negative partition. Fetch returns all of a
  // group's offsets sorted by (topic bytes, partition), empty if none. (A
  // topic's offsets go with its table: DeleteTable.)
  //
  // The writes (commit, and the deletes below) take `by` and answer kPreconditionFailed, changing
  // nothing, when it names a node not at that epoch: a superseded process's
  // Kafka listener must not overwrite or expire what its successor's groups
  // commit.
  virtual Status CommitGroupOffsets(std::string_view group, const std::vector<GroupOffset>& offsets,
                                    const EpochCheck& by) = 0;
  virtual Result<std::vector<GroupOffset>> FetchGroupOffsets(std::string_view group) = 0;
  // The group's offsets of the given (topic, partition)s it holds (each once,
  // sorted as Fetch sorts), in index seeks: Kafka OffsetFetch names the
  // partitions a consumer was assigned, a few of a group's many.
  virtual Result<std::vector<GroupOffset>> FetchPartitionOffsets(
      std::string_view group, const std::vector<std::pair<std::string, int32_t>>& partitions) = 0;
  // Whether the group holds any committed offset (one index seek).
  virtual Result<bool> GroupHasOffsets(std::string_view group) = 0;
  // Removes a group's offsets of the given (topic, partition)s in one
  // transaction (Kafka OffsetDelete); no error for those it has none of.
  virtual Status DeletePartitionOffsets(std::string_view group,
                                        const std::vector<std::pair<std::string, int32_t>>& partitions,
                                        const EpochCheck& by) = 0;
  // The first `limit` (>= 1) groups, sorted, that hold at least one
  // committed offset (Kafka ListGroups lists them even without members).
  virtual Result<std::vector<std::string>> ListOffsetGroups(size_t limit) = 0;
  // Removes all of a group's offsets (Kafka DeleteGroups); returns whether
  // there were any.
  virtual Result<bool> DeleteAllGroupOffsets(std::string_view group, const EpochCheck& by) = 0;
  // Offset retention, in one transaction: removes all offsets of every group
  // whose newest commit is older than `committed_before_ms`, except the groups
  // in `keep` (those with members); returns the groups removed.
  virtual Result<std::vector<std::string>> ExpireGroupOffsets(int64_t committed_before_ms,
                                                              const std::vector<std::string>& keep,
                                                              const EpochCheck& by) = 0;

  // Nodes. GetNode of an unknown node returns a zero NodeState (epoch 0).
  virtual Result<NodeState> GetNode(std::string_view node) = 0;
  // Every node ever minted, ordered by name (a row per --node-id that started here).
  virtual Result<std::vector<NodeState>> ListNodes() = 0;
  // Compare-and-swap: if the node's current epoch is `expected`, sets it to
  // expected + 1 with `window` and `minter` (minted_by), keeps the
  // checkpoint, and returns the new state; otherwise kPreconditionFailed
  // naming the current epoch (a successor exists). The first mint of a node
  // expects 0. A caller whose answer was lost tells its own mint from a
  // successor's by GetNode: epoch expected + 1 and minted_by its minter (a
  // value no other caller uses: the engine's random nonce mixed with the
  // epoch).
  virtual Result<NodeState> MintEpoch(std::string_view node, uint64_t expected, uint32_t window,
                                      uint64_t minter = 0) = 0;

  // Liveness, while a metastore serves one node at a time (stream leases are
  // not built yet): one transaction that stores the metastore's clock (the
  // database server's, so nodes' clocks need not agree) as `node`'s
  // heartbeat (with `takeover` set), or with live_window_ms <= 0 clears it
  // (a clean stop).
  // kPreconditionFailed, writing nothing, if `node` is not at `epoch`
  // (superseded), or, unless clearing, if another node's heartbeat is set
  // and at most live_window_ms old (the message names it): that node is
  // live, and this one must not serve.
  virtual Status Heartbeat(std::string_view node, uint64_t epoch, int64_t live_window_ms) = 0;
  // Heartbeat's look for another live node, alone (reads only): a start asks
  // before it mints an epoch, so a start refused takes none.
  virtual Status CheckNoOtherLiveNode(std::string_view node, int64_t live_window_ms) = 0;

  // Producer ids: unique, increasing, never reused across restarts.
  virtual Result<uint64_t> AllocateProducerId() = 0;
  // The largest producer id allocated so far, on any node (0 if none).
  virtual Result<uint64_t> LastProducerId() = 0;
  // This metastore's identity: a random non-zero number drawn by the first
  // call ever made (on any node) and the same for every call after it. The
  // engine records it in the object store, so that a store is never served
  // with a metastore it was not used with.
  virtual Result<uint64_t> DeploymentId() = 0;
  // The largest stream id ever allocated (0 if none). Stream ids increase and
  // are never reused; a stream's row is written in the transaction that
  // allocates its id, so every id up to this one names a stream that exists
  // now or was deleted.
  virtual Result<uint64_t> LastStreamId() = 0;

  // One settle cycle, one transaction: inserts `segments`, replaces the given
  // stream states (a state's trim point never lowers the stored one: see
  // RaiseTrimPoint), and moves the node's checkpoint from `expected` to `next`.
  // kPreconditionFailed (changing nothing) if the checkpoint is not `expected`
  // or the node's epoch is no longer `epoch` (this node was superseded).
  // kInvalidArgument if `next` is before `expected` in (epoch, seq) order or a
  // segment is malformed; kAlreadyExists (changing nothing) if a segment
  // overlaps one already indexed (segments of a stream never overlap).
  // Segments and states of streams that no longer exist are skipped.
  virtual Status CommitSettle(std::string_view node, uint64_t epoch, const ChainPosition& expected,
                              const ChainPosition& next, const std::vector<SegmentInfo>& segments,
                              const std::vector<StreamState>& states) = 0;

  // Segments of a stream overlapping [from_offset, ...) (end_offset >
  // from_offset), ascending, at most limit (>= 1, else kInvalidArgument).
  virtual Result<std::vector<SegmentInfo>> FindSegments(uint64_t stream_id, uint64_t from_offset,
                                                        size_t limit) = 0;
  // Segments of every stream from (stream_id, start_offset) on, ordered by
  // stream id then start offset, at most limit (1..10000, else
  // kInvalidArgument). The next page starts at (last.stream_id,
  // last.start_offset + 1). Recovery loads every stream's segments this way.
  virtual Result<std::vector<SegmentInfo>> ListSegmentsFrom(uint64_t stream_id, uint64_t start_offset,
                                                            size_t limit) = 0;
  // The first segment of a stream whose last_timestamp_ms >= timestamp_ms.
  virtual Result<std::optional<SegmentInfo>> FindSegmentByTimestamp(uint64_t stream_id,
                                                                    int64_t timestamp_ms) = 0;
  // For each cut, removes the segment rows of its stream that end at or below
  // its below_offset (retention and trim), for `node` at `epoch`, all in one
  // transaction; returns the rows removed, in the order of the cuts and each
  // stream's ascending. kPreconditionFailed (nothing removed) if the node's
  // epoch is not `epoch`: a superseded process must not delete what its
  // successor reads. kInvalidArgument for more than kMaxSegmentCuts cuts.
  static constexpr size_t kMaxSegmentCuts = 1000;
  virtual Result<std::vector<SegmentInfo>> DeleteSegmentsBelow(std::string_view node, uint64_t epoch,
                                                               const std::vector<SegmentCut>& cuts) = 0;
  // Replaces adjacent segment rows of one stream with one row covering the
  // same offsets (a merge of small segments), for `node` at `epoch`; one
  // transaction. kPreconditionFailed (nothing changed) if the node's epoch is
  // not `epoch` (a successor holds it) or no row has the start offset, end
  // offset and object key of one in `replaced`; kNotFound if the stream is
  // gone; kInvalidArgument unless `replaced` is contiguous and `merged` spans it.
  virtual Status ReplaceSegments(std::string_view node, uint64_t epoch, uint64_t stream_id,
                                 const std::vector<SegmentInfo>& replaced, const SegmentInfo& merged) = 0;

  // Returns once no commit is in flight: a write whose answer was lost (a
  // broken connection to a remote database) may still be committing, unseen
  // by other reads until it ends. Call it before reading back whether such a
  // write landed. An error if the metastore cannot be reached.
  virtual Status AwaitCommitsInFlight() = 0;

  virtual const MetastoreCounters& counters() const = 0;
  virtual std::string Describe() const = 0;
};

// Opens a backend from a URI: sqlite://PATH (file created if missing; the
// parent directory must exist), sqlite://:memory: for tests, or a libpq URI
// postgres://... / postgresql://... (docs/postgres.md).
Result<std::shared_ptr<Metastore>> OpenMetastore(std::string_view uri);
// Whether `uri` names one of the schemes above (kInvalidArgument naming them
// if not); opens nothing.
Status CheckMetastoreScheme(std::string_view uri);

}  // namespace weir::metastore
