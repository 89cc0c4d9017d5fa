// The stream engine: basins and streams on top of the WAL writer and the
// metastore (DESIGN.md §2–§3, §5). Front-ends (REST, Kafka, Flight) call it.
//
// Ownership and threads: one Engine per node (process), owned by the server.
// Every public method is thread-safe. Append completion callbacks run on a WAL
// upload thread (or the thread resuming or abandoning the WAL after a halt,
// or closing the engine) and must not block.
//
// Guarantees:
//  - An append is acknowledged only after its WAL slot and every earlier slot
//    are durable; offsets are dense per stream and acknowledged in order.
//  - Sequencing (match_seq_num, fencing token, producer window, offsets,
//    timestamps) happens under the stream's short lock; the wait for
//    durability happens outside it, so pipelined appends share a slot.
//  - Reads never return a record that is not yet acknowledged.
//  - Open() recovers every acknowledged record of earlier epochs of this node:
//    it mints a new epoch, fences each earlier chain from the checkpoint and
//    replays every committed slot. Offsets, producer windows, fencing tokens
//    and trim points come back exactly.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "log/segment_index_cache.h"
#include "metastore/metastore.h"
#include "objstore/object_store.h"
#include "wal/fence.h"
#include "wal/record_batch.h"
#include "wal/writer.h"

namespace weir::log {

struct BatchRef;
struct SegmentObject;

struct EngineOptions {
  std::string node = "node-1";
  wal::WriterOptions wal;  // node and epoch are filled in by Open
  // Where WAL slots go (fence, walk, read-back, trim): null = the object
  // store. A QuorumStore makes the express class (docs/storage-classes.md).
  std::shared_ptr<objstore::ObjectStore> wal_store;
  size_t max_append_records = 1000;
  size_t max_append_bytes = 1 << 20;  // metered (MeteredBytes)
  // A RecordBatch appended as sent (AppendBatchAsync): Kafka's default
  // max.message.bytes.
  size_t max_batch_bytes = 1048588;
  // Acknowledged, unsettled batches kept in memory (reads, settle). Settle
  // runs early once a quarter of it is in use; past it, batches are read
  // back from their WAL slots.
  size_t log_cache_bytes = 64u << 20;
  // Footers and indexes of segments read by range, kept so that a reader
  // paging through a large segment GETs them once (SegmentIndexCache).
  size_t segment_index_cache_bytes = 8u << 20;
  // Segment PUTs a settle cycle runs at once. Object stores want many; a
  // local disk wants few, so the WAL's writes do not queue behind segments.
  size_t segment_uploads = 16;
  // Acknowledged bytes not yet settled (in WAL slots) beyond which appends
  // wait for settle, failing with kResourceExhausted after admission_timeout:
  // a settle that falls behind slows writers instead of filling the store.
  uint64_t max_unsettled_bytes = uint64_t{4} << 30;
  // Likewise beyond this many acknowledged batches not yet settled: each
  // holds an index entry in memory (about 100 bytes) until it settles, so a
  // backlog of tiny batches is bounded in memory too (about 200 MiB).
  uint64_t max_unsettled_batches = 2'000'000;
  size_t max_read_records = 1000;
  size_t max_read_bytes = 1 << 20;
  Duration admission_timeout = std::chrono::seconds(10);
  // Settle: every interval, the due streams' acknowledged batches (below)
  // become per-stream segments in one metastore transaction; then the slots
  // below the new checkpoint are deleted. 0 = only SettleNow.
  Duration settle_interval = std::chrono::seconds(1);
  // A background round settles a stream once it holds settle_min_bytes of
  // acknowledged batches, or its oldest is settle_max_delay old, or memory
  // wants it (the log cache over a quarter full: the streams caching most
  // settle until the others cache at most an eighth; the backlog half full:
  // all). A stream waiting keeps the WAL checkpoint at its first slot, so
  // later slots stay (a start replays them; batches settled meanwhile are
  // skipped). Fewer, larger segments: a PUT each. 0 bytes = every stream
  // every round. SettleNow settles every stream.
  size_t settle_min_bytes = 1u << 20;
  Duration settle_max_delay = std::chrono::seconds(10);
  // Streams at most (table buckets and Kafka partitions count): a create
  // that would pass it is kQuotaExhausted. Each stream costs memory (about
  // 2 KB, loaded at every start) and a look from every settle round. Those
  // stored always load, even past it.
  size_t max_streams = 100'000;
  // Basins at most in the metastore (all nodes'), for creates by clients
  // (BasinCreator::kClient): past it they are kQuotaExhausted. The server's
  // own basins (the default basin, Kafka's) are made whatever the count.
  size_t max_basins = 10'000;
  // Retention and trim: expired or trimmed segments are deleted this often.
  Duration retention_interval = std::chrono::seconds(60);
  // Streams whose segment rows one retention transaction removes, at most
  // (1..Metastore::kMaxSegmentCuts); their objects go in one DeleteMany.
  size_t retention_streams_per_txn = 100;
  // Recovery reads stream rows and states this many a round trip (1..1000),
  // and segments this many (1..10000).
  size_t load_page_streams = 1000;
  size_t load_page_segments = 10000;
  // Merging small segments (settle writes one per due stream, a slow
  // stream's every settle_max_delay): adjacent segments under merge_small_bytes are merged once they
  // add up to merge_small_bytes, or once the newest of them is merge_min_age
  // old (by record time), this often. 0 = only MergeSegmentsNow.
  Duration merge_interval = std::chrono::seconds(10);
  size_t merge_small_bytes = 1u << 20;
  Duration merge_min_age = std::chrono::minutes(10);
  // Segments merged per pass at most (each a GET; a pass's first run is
  // merged whatever its size). A pass that runs out resumes at the stream it
  // stopped at, or past it if it merged some: every stream gets its turn.
  size_t merge_parts_per_pass = 2048;
  bool settle_on_close = true;  // false: leave acknowledged slots for the next start to replay
  // One node per metastore, until stream leases land: the engine stores a
  // heartbeat this often (Metastore::Heartbeat, from a thread of its own;
  // 0 = only at start; by the metastore's clock), refuses to start while
  // another node's is younger than node_live_window, and clears its own once
  // Close has settled everything acknowledged. It guards against
  // two nodes configured on one metastore; it is not a lease (a node cut off
  // from the metastore goes on serving).
  Duration heartbeat_interval = std::chrono::seconds(5);
  Duration node_live_window = std::chrono::seconds(20);
  // The basin whose tables are Kafka topics (kafka::kKafkaBasin when serving
  // Kafka): deleting one of its tables, by any path, deletes the groups'
  // committed offsets of that topic in the same metastore transaction.
  std::string group_offsets_basin;
};

struct EngineMetrics {
  std::atomic<uint64_t> settle_cycles{0}, segments_written{0}, segment_bytes{0};
  std::atomic<uint64_t> slots_deleted{0}, segments_deleted{0}, settle_failures{0};
  // Segment objects no row names whose delete failed (a store refusing
  // deletes): tried again by each retention pass (Engine::DeleteObjects).
  std::atomic<uint64_t> segment_delete_failures{0};  // failed DeleteMany calls
  std::atomic<int64_t> segments_undeleted{0};        // objects waiting for a retry now
  std::atomic<uint64_t> empty_streams_deleted{0};  // by delete_on_empty
  std::atomic<uint64_t> segment_merges{0}, segments_merged{0};  // merged objects written, and the segments they replaced
  // Batch bytes settle took from the log cache, and read back from WAL slots.
  std::atomic<uint64_t> settle_cached_bytes{0}, settle_reread_bytes{0};
  std::atomic<uint64_t> settle_backlog_timeouts{0};  // appends refused: max_unsettled_bytes
  // Streams the last settle round left waiting (settle_min_bytes), and the
  // acknowledged bytes they held.
  std::atomic<uint64_t> settle_waiting_streams{0}, settle_waiting_bytes{0};
  std::atomic<uint64_t> stream_creates_refused{0};  // past max_streams
  // Waits for admission without a thread (WhenAdmissible) that found no room
  // at first, by what was full; those that ran out, and those abandoned.
  std::atomic<uint64_t> admission_waits_pool{0}, admission_waits_backlog{0};
  std::atomic<uint64_t> admission_wait_timeouts{0}, admission_waits_abandoned{0};
};

// One record as a front-end hands it in. S2 command records have exactly one
// header with an empty name whose value is "fence" or "trim"; the body is the
// new fencing token (fence) or an 8-byte big-endian offset (trim).
struct AppendRecord {
  std::optional<int64_t> timestamp_ms;
  std::optional<std::string> key;
  std::vector<wal::RecordHeader> headers;
  std::string body;
};

struct ProducerRef {
  uint64_t id = 0;
  int16_t epoch = 0;
  int32_t seq = 0;  // sequence of the batch's first record (Kafka baseSequence)
  // A producer the stream does not know may start at any sequence (Kafka
  // since KIP-360: a producer whose state went with a deleted topic, a
  // DeleteRecords or an expiry goes on). Batches (Kafka, Flight) set it;
  // REST appends start at 0.
  bool unknown_starts_anywhere = false;
};

// Room in the WAL pool held for appends (Engine::TryAdmission, directly or
// through WhenAdmissible): appends given it (AppendOptions::ticket, or
// AppendBatchAsync's) are admitted from it without waiting. Shared by one
// request's appends; any thread. Room no append used goes back to the pool
// when the last holder drops it.
class AdmissionTicket {
 public:
  explicit AdmissionTicket(std::optional<wal::Writer::Reservation> room) : room_(std::move(room)) {}
  // Room for an append of `bytes`, if what is left covers it (else the
  // append takes its room as any other: a part would leave it refused for
  // the rest instead of waiting).
  std::optional<wal::Writer::Reservation> Take(size_t bytes) {
    std::lock_guard lk(mu_);
    if (!room_ || room_->bytes() < bytes + wal::Writer::kEntryOverhead) return std::nullopt;
    return room_->Split(bytes);
  }
  // Whether it holds room at all (none: the appends could never fit the
  // pool at once, there is no WAL, or the engine is closing).
  bool has_room() {
    std::lock_guard lk(mu_);
    return room_.has_value();
  }

 private:
  std::mutex mu_;
  // None: no WAL, appends that never fit the pool at once, or the engine closing.
  std::optional<wal::Writer::Reservation> room_;
};

struct AppendOptions {
  std::optional<uint64_t> match_seq_num;
  std::optional<std::string> fencing_token;
  std::optional<ProducerRef> producer;
  // False for a caller whose thread must not wait (every front-end: they
  // wait through WhenAdmissible instead): no room in the WAL pool or the
  // settle backlog now is kResourceExhausted at once.
  bool may_wait = true;
  std::shared_ptr<AdmissionTicket> ticket = nullptr;  // room held for this append (TryAdmission)
  // Only to this stream (StreamIdOf): kNotFound once the name names another
  // (this one deleted, and a stream made again under its name).
  std::optional<uint64_t> stream_id = std::nullopt;
};

struct AppendAck {
  uint64_t start_offset = 0;
  uint64_t end_offset = 0;  // exclusive
  uint64_t tail = 0;        // the stream's next offset when this ack was issued
  int64_t first_timestamp_ms = 0;
  int64_t last_timestamp_ms = 0;
  bool duplicated = false;
  uint64_t log_start = 0;  // the first offset still held (trim point, retention)
  // The stream stamped the batch on arrival (Kafka's LogAppendTime): every
  // record's timestamp is last_timestamp_ms.
  bool log_append_time = false;
  int64_t tail_timestamp_ms = 0;  // of the record before `tail`
};

// The outcome of an append. On kPreconditionFailed exactly one of the
// mismatch fields says which condition failed and what the stream holds.
struct AppendOutcome {
  Status status;
  AppendAck ack;
  std::optional<uint64_t> seq_num_mismatch;  // the stream's tail
  std::optional<std::string> fencing_token_mismatch;  // the current token
  // The producer's epoch is older than its window's (Kafka's
  // INVALID_PRODUCER_EPOCH); status is kFenced. Any other kFenced means this
  // node lost its WAL to a successor: the append was not written, retry.
  bool producer_fenced = false;
  // The append is larger than the whole WAL pool budget or than one slot's
  // payload: no retry can fit it (Kafka's MESSAGE_TOO_LARGE); status is
  // kInvalidArgument.
  bool too_large = false;
  // The stream is being deleted (delete_on_empty; S2's
  // stream_deletion_pending): nothing was written; status is kUnavailable
  // (should the deletion fail, the stream takes appends again).
  bool deletion_pending = false;
  // Refused before it was given offsets (admission: no room in the WAL pool
  // or the settle backlog in time; the stream missing, deleted or unknown):
  // nothing of it was written, so a producer's retry with the same sequence
  // is the next batch (Kafka's NOT_ENOUGH_REPLICAS, not REQUEST_TIMED_OUT,
  // which clients take for possibly written).
  bool not_admitted = false;
};
using AppendCallback = std::function<void(AppendOutcome)>;

struct ReadStart {
  enum Kind { kOffset, kTimestamp, kTailOffset } kind = kOffset;
  uint64_t value = 0;  // offset, timestamp (ms) or records back from the tail
};

struct ReadRecord {
  uint64_t offset = 0;
  wal::Record record;
};

struct ReadResult {
  std::vector<ReadRecord> records;
  uint64_t stream_id = 0;  // the stream read: one created again under its name has another
  uint64_t tail = 0;  // next offset to be acknowledged
  int64_t tail_timestamp_ms = 0;  // timestamp of the last acknowledged record
};

// Raw batches for a Kafka fetch: whole RecordBatches as stored (base offsets
// set), in offset order; the first one may start before the requested offset.
struct BatchReadResult {
  std::vector<std::shared_ptr<const std::string>> batches;
  uint64_t tail = 0;       // high watermark: next offset to be acknowledged
  uint64_t log_start = 0;  // first offset held
};

struct StreamSummary {
  metastore::StreamInfo info;
  uint64_t tail = 0;
  int64_t tail_timestamp_ms = 0;  // timestamp of the last acknowledged record
  uint64_t trim_point = 0;
  std::string fencing_token;
  uint64_t log_start = 0;  // the first offset held (trim point, retention)
};

// Runs once when a watched stream's tail moves past the watched offset, or the
// stream is deleted. Called where that happens (a WAL upload thread, the
// caller of DeleteStream, the settle thread for delete_on_empty and
// retention): must not block.
using TailCallback = std::function<void()>;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Open(EngineOptions options,
                                              std::shared_ptr<objstore::ObjectStore> store,
                                              std::shared_ptr<metastore::Metastore> meta);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Basins: names are 8..48 characters of [a-z0-9-], no leading or trailing '-'.
  // `request_token` (S2's s2-request-token, may be empty) is kept so a retry
  // of the create can be told from a conflicting one: CreateToken.
  // `config` is S2's basin config: defaults for new streams and auto-creation.
  // `creator`: a client's create counts against max_basins.
  enum class BasinCreator { kServer, kClient };
  Status CreateBasin(const std::string& name, const std::string& request_token = "",
                     const metastore::BasinConfig& config = {}, BasinCreator creator = BasinCreator::kServer);
  Status ReconfigureBasin(const std::string& name, const metastore::BasinConfig& config);  // kNotFound
  // Creates stream `name` with the basin's default stream config when the
  // basin creates missing streams on `when` (a metastore write: call it off
  // I/O threads). true: the stream exists now (created here or by a racing
  // create, and registered); false: the basin does not auto-create.
  // kNotFound if the basin does not exist.
  enum class AutoCreate { kOnAppend, kOnRead };
  // The stream gets `requested` over the basin's default config. `admit`, if
  // given, judges that config first: its error is returned, and nothing is
  // created.
  Result<bool> CreateIfConfigured(const std::string& basin, const std::string& name, AutoCreate when,
                                  const std::function<Status(const metastore::StreamConfig&)>& admit = nullptr,
                                  const metastore::StreamConfigLayer& requested = {});
  // Whether the stream is known here (memory only; for choosing a thread).
  bool HasStream(const std::string& basin, const std::string& name);
  // The id of the stream the name names now, if any (AppendOptions::stream_id).
  std::optional<uint64_t> StreamIdOf(const std::string& basin, const std::string& name);
  // kQuotaExhausted if `n` more streams would pass max_streams now (a
  // validate-only create); `what` names them in the message.
  Status CheckStreamRoom(size_t n, std::string_view what);
  // Whether admitting an append of about `bytes` may have to wait now (the
  // WAL pool or the settle backlog is full or nearly): front-ends then append
  // from a worker, not an I/O thread. A hint, read without locks.
  bool AdmissionMayWait(size_t bytes) const;
  // How long an append that may wait waits for admission at most.
  Duration admission_timeout() const { return options_.admission_timeout; }
  // Room for `appends` appends of `bytes` in all (AdmissionBytes of records;
  // a Kafka batch's size), held for them, if the settle backlog and the WAL
  // pool have it now; a ticket without room when they could never fit the
  // pool at once (each append then takes its own room), or when no room
  // will come (the engine closing or superseded, its WAL abandoned): the
  // appends are then refused at once; else null.
  std::shared_ptr<AdmissionTicket> TryAdmission(size_t bytes, size_t appends);
  // Whether `appends` appends of `bytes` in all fit the WAL pool's whole
  // budget (else TryAdmission never holds room for them together).
  bool FitsPoolAtOnce(size_t bytes, size_t appends) const;
  // The next group of a request's appends to wait for admission together,
  // from append `from` of `count` (`room_of(i)`: append i's room, as
  // TryAdmission counts it): as many as fit the WAL pool's whole budget at
  // once, at least one. Appends that could never fit together wait in such
  // groups, one after another.
  struct AdmissionGroup {
    size_t end;    // exclusive
    size_t bytes;  // the group's room
  };
  AdmissionGroup NextAdmissionGroup(size_t from, size_t count, const std::function<size_t(size_t)>& room_of) const;
  // The room an append of `records` takes in the WAL pool (at least their
  // encoded batch's size).
  static size_t AdmissionBytes(const std::vector<AppendRecord>& records);
  // Waiting for admission without blocking, for a front-end whose threads
  // must not wait: calls `ready` with the ticket once TryAdmission gives one
  // (kRoom), `deadline` has passed (kExpired) or `abandon` answers true
  // (kAbandoned), looking every 1 to 16 ms through `after` (the front-end's
  // timer: runs a function on one of its threads after a delay), and
  // hurrying settle meanwhile as a blocked wait does. `ready` runs on the
  // caller's thread when there is room at once, else on a timer's thread.
  // The engine must outlive the wait.
  enum class AdmissionWait { kRoom, kExpired, kAbandoned };
  using AfterFn = std::function<void(Duration delay, std::function<void()> fn)>;
  void WhenAdmissible(size_t bytes, size_t appends, TimePoint deadline, AfterFn after, std::function<bool()> abandon,
                      std::function<void(AdmissionWait, std::shared_ptr<AdmissionTicket>)> ready);
  // What an append waiting for admission does: wakes settle when its
  // backlog is what is full.
  void HurrySettleIfBehind();
  // What AppendAsync checks first, without the stream (the limits on records
  // and metered bytes; header names; command records): kInvalidArgument.
  Status CheckAppendRecords(const std::vector<AppendRecord>& records) const;
  // The answer a stream that does not exist yet would give an append of
  // `count` records with `options` (as a new stream: tail 0, no fencing
  // token, no producers), if it would refuse it: a basin that creates streams
  // on append then creates nothing.
  static std::optional<AppendOutcome> RefusedByANewStream(const AppendOptions& options, size_t count);
  Result<std::vector<metastore::BasinInfo>> ListBasins(const std::string& prefix, const std::string& start_after,
                                                       size_t limit);
  Result<metastore::BasinInfo> GetBasin(const std::string& name);
  Status DeleteBasin(const std::string& name);
  // The token a basin (stream empty) or stream was created with, or "".
  Result<std::string> CreateToken(const std::string& basin, const std::string& stream);

  // Streams: names are 1..512 bytes without NUL, not "." or "..".
  Result<metastore::StreamInfo> CreateStream(const std::string& basin, const std::string& name,
                                             const metastore::StreamConfig& config,
                                             const std::string& request_token = "");
  Result<StreamSummary> GetStream(const std::string& basin, const std::string& name);
  Result<std::vector<metastore::StreamInfo>> ListStreams(const std::string& basin, const std::string& prefix,
                                                         const std::string& start_after, size_t limit);
  Status ReconfigureStream(const std::string& basin, const std::string& name, const metastore::StreamConfig& config);
  // Sets the stream's config to `change(its config)`, read and written under
  // the lock every config change takes (a table's too), so a change made
  // meanwhile (Kafka AlterConfigs on a partition's stream) is not lost.
  // `change`'s error is returned as it is, and nothing changes. `change`
  // runs with config_mu_ held: it may read the metastore (GetBasin) but take
  // no engine lock (GetTable, another reconfiguration) and throw nothing.
  Result<metastore::StreamConfig> ReconfigureStream(
      const std::string& basin, const std::string& name,
      const std::function<Result<metastore::StreamConfig>(const metastore::StreamConfig&)>& change);
  // Trims the stream below `offset` without a command record (Kafka
  // DeleteRecords): durable in the metastore before it returns; never lowers
  // the trim point. kOutOfRange if `offset` is past the acknowledged tail.
  // Returns the first offset the stream holds afterwards.
  Result<uint64_t> TrimTo(const std::string& basin, const std::string& name, uint64_t offset);
  Status DeleteStream(const std::string& basin, const std::string& name);

  // Tables (DESIGN.md §9): a table's buckets are streams named
  // metastore::BucketStreamName(table, b). Kafka topics are log tables of the
  // weir-kafka basin. CreateTable creates the table and its bucket streams in
  // one metastore transaction; DeleteTable removes them all.
  Result<metastore::TableInfo> CreateTable(const metastore::TableInfo& table, const metastore::StreamConfig& config);
  // From memory while no table changed since it was last read (Kafka
  // Metadata and Flight calls ask per request). A read from the metastore
  // also loads the table's buckets memory lacks (as LoadTable).
  Result<metastore::TableInfo> GetTable(const std::string& basin, const std::string& name);
  // Loads the table's bucket streams that exist in the metastore but not in
  // memory (a create whose answer was lost); kNotFound if there is no table.
  Status LoadTable(const std::string& basin, const std::string& name);
  Result<std::vector<metastore::TableInfo>> ListTables(const std::string& basin, const std::string& prefix,
                                                       const std::string& start_after, size_t limit);
  Status DeleteTable(const std::string& basin, const std::string& name);
  // Moves on whenever a table is created, deleted or reconfigured (after
  // the metastore change, whatever its outcome): a cache of table configs
  // drops what it read under an older value.
  uint64_t TablesVersion() const { return tables_version_.load(std::memory_order_acquire); }
  const std::string& group_offsets_basin() const { return options_.group_offsets_basin; }
  // Runs `fn` while no table is created, deleted or reconfigured: a caller
  // that checks tables exist and then writes what must go with them (Kafka
  // offset commits) is never overtaken by a delete. `fn` must not call the
  // table methods above.
  Status WithTablesSteady(const std::function<Status()>& fn) {
    std::lock_guard lk(tables_mu_);
    return fn();
  }
  // Raises a table's bucket count, creating the new buckets' streams with the
  // config of bucket 0's stream, in one metastore transaction (Kafka
  // CreatePartitions). Errors as Metastore::AddBuckets.
  Result<metastore::TableInfo> AddTableBuckets(const std::string& basin, const std::string& name,
                                               uint32_t new_bucket_count);
  // Replaces a table's config blob and sets each bucket stream's config to
  // `apply(its config)`, in one metastore transaction (Kafka AlterConfigs).
  Status ReconfigureTable(const std::string& basin, const std::string& name, const std::string& config,
                          const std::function<metastore::StreamConfig(const metastore::StreamConfig&)>& apply);

  // Appends a batch of records; `done` runs once the batch is durable (or
  // failed). True when its conditions (fencing token, match_seq_num) refused
  // it: nothing of it is written, and `done` gets the 412 now, or once the
  // state it names (made by appends still on their way) is durable, or their
  // failure. A caller that pipelines appends stops submitting there.
  bool AppendAsync(const std::string& basin, const std::string& stream, std::vector<AppendRecord> records,
                   const AppendOptions& options, AppendCallback done);
  AppendOutcome Append(const std::string& basin, const std::string& stream, std::vector<AppendRecord> records,
                       const AppendOptions& options = {});

  // Appends one Kafka RecordBatch v2 as a producer sent it: verified (CRC,
  // lengths, record count), never re-encoded; only baseOffset is rewritten
  // (and, resealed: on an arrival-timestamped stream, maxTimestamp with the
  // log-append-time bit set; otherwise, when the producer's were wrong,
  // maxTimestamp as the records' largest with the bit clear). Idempotence comes from the batch's own
  // producer id, epoch and base sequence. Transactional and control batches
  // are kNotSupported; a batch (compressed or not) holding a record shaped
  // like an S2 command record (one header, empty name) is kInvalidArgument. At most
  // max_batch_bytes. `done` runs as for AppendAsync. With `may_wait` false
  // (a caller whose thread must not wait) admission does not wait: no room
  // in the WAL pool or the settle backlog now is kResourceExhausted at once.
  void AppendBatchAsync(const std::string& basin, const std::string& stream, std::string batch,
                        AppendCallback done, bool may_wait = true, std::shared_ptr<AdmissionTicket> ticket = nullptr);
  // Before waiting for admission (a full WAL pool or settle backlog): an
  // idempotent producer's retry of a batch its window holds needs no room,
  // so it is answered now, or queued behind its original still on its way
  // (`done` runs then). True when it took `done`; false for anything else,
  // which then goes through AppendBatchAsync. The batch passes
  // AppendBatchAsync's checks before it is answered (as a retry through
  // AppendBatchAsync would). CPU only (it may decompress the batch).
  bool AnswerRetriedBatch(const std::string& basin, const std::string& stream, std::string_view batch,
                          AppendCallback& done);
  // The same for an append of records (AppendAsync's) carrying a producer
  // (options.producer): answered when its window holds it and the records
  // pass AppendAsync's checks.
  bool AnswerRetriedAppend(const std::string& basin, const std::string& stream,
                           const std::vector<AppendRecord>& records, const AppendOptions& options,
                           AppendCallback& done);
  // The checks AppendBatchAsync makes of the batch itself, whatever the
  // stream (as it would fail them): its header and its records' largest
  // timestamp. CPU only (it may decompress the batch).
  struct CheckedBatch {
    wal::BatchHeader header;
    int64_t max_timestamp_ms = 0;
  };
  Result<CheckedBatch> CheckBatch(std::string_view batch) const;

  // Whole stored batches from `from` (the first may start before it), at
  // least one if any is available, then up to `max_bytes` in all. kOutOfRange
  // if `from` is past the tail or below the first offset held.
  Result<BatchReadResult> ReadBatches(const std::string& basin, const std::string& stream, uint64_t from,
                                      size_t max_bytes);
  // ReadBatches of several streams of a basin (a Kafka fetch's partitions):
  // out[i] is what ReadBatches(basin, reads[i]...) answers. Reads that need
  // the object store (settled or evicted batches) run up to `parallel` at a
  // time on threads of their own; the rest run on the caller's thread.
  struct BatchRead {
    std::string stream;
    uint64_t from = 0;
    size_t max_bytes = 0;
  };
  std::vector<Result<BatchReadResult>> ReadBatchesMany(const std::string& basin, const std::vector<BatchRead>& reads,
                                                       size_t parallel);
  // The first offset held and the tail, without reading.
  Result<BatchReadResult> Offsets(const std::string& basin, const std::string& stream);

  // Reads acknowledged records from `start`, at most `max_records` / `max_bytes`
  // (clamped to the engine limits). If none are available and `wait_until` is
  // set, waits until one is acknowledged or the deadline passes. Reading from
  // an offset past the tail is kOutOfRange (S2's 416); below the trim point
  // starts at the trim point.
  // With `stream_id`, only that stream is read: kNotFound once the name
  // names another (the stream was deleted and created again), as it is for
  // WatchTail. A session that reads on pins the id its first read returned.
  Result<ReadResult> Read(const std::string& basin, const std::string& stream, const ReadStart& start,
                          size_t max_records, size_t max_bytes, std::optional<TimePoint> wait_until = std::nullopt,
                          std::optional<uint64_t> stream_id = std::nullopt);
  Result<uint64_t> CheckTail(const std::string& basin, const std::string& stream);

  // For front-ends that wait without a thread (long polls, read sessions):
  // registers `fn` to run once the acknowledged tail passes `offset` or the
  // stream is deleted, and returns a watch id. Returns 0 without registering
  // when that has already happened (the caller reads at once).
  Result<uint64_t> WatchTail(const std::string& basin, const std::string& stream, uint64_t offset, TailCallback fn,
                             std::optional<uint64_t> stream_id = std::nullopt);
  // Drops a watch that has not fired (a timed-out long poll); a no-op otherwise.
  void UnwatchTail(const std::string& basin, const std::string& stream, uint64_t id);
  // The watches a stream holds (0 if it is missing): for tests.
  size_t TailWatchCount(const std::string& basin, const std::string& stream);

  Result<uint64_t> AllocateProducerId();
  // Whether producer id `id` was ever allocated (AllocateProducerId, on any
  // node): front-ends that take ids from clients (REST, Flight) refuse
  // others, which could be a Kafka producer's id later. KnowsProducerId is
  // true for ids this process has seen allocated, without I/O;
  // ProducerIdAllocated reads the metastore for the others.
  bool KnowsProducerId(uint64_t id) const { return id != 0 && id <= producer_ids_seen_.load(); }
  Result<bool> ProducerIdAllocated(uint64_t id);

  // Runs one settle cycle now: moves every released WAL slot's batches into
  // segments, commits them with the streams' states and the new chain
  // checkpoint in one metastore transaction per round, then deletes the
  // settled slots. A round holds at most about log_cache_bytes of batches
  // read back from slots (plus one slot).
  Status SettleNow();
  // The background task's cycle: as SettleNow, but only the streams that
  // are due (EngineOptions::settle_min_bytes); the checkpoint stops at the
  // first slot holding a batch of a stream left waiting.
  Status SettleDue();
  // Deletes segments that are past retention or wholly below the trim point,
  // then the streams that delete_on_empty says are due (DeleteEmptyStreams).
  Status ApplyRetention();
  // Merges runs of small adjacent segments (see EngineOptions::merge_*), at
  // most about 64 MiB of them per call; on the settle thread every
  // merge_interval. Readers of a replaced segment retry (kNotFound).
  Status MergeSegmentsNow();

  uint64_t epoch() const { return epoch_.load(); }
  // Whether a later process holds this node (a restart of it, or a takeover,
  // minted its epoch since): appends, reads and tail watches are kFenced
  // (waiting reads and watches are woken to learn it); settle, merges,
  // retention and heartbeats stop. Learnt from a refused heartbeat, WAL
  // write, settle, merge, retention or client change. Any thread.
  bool superseded() const { return superseded_.load(); }
  // Runs `fn` once this process is superseded (at once if it already is):
  // a front-end stops taking clients that only a successor can serve.
  // Runs on the thread that learns it, with settle_mu_ held (or, if set
  // later, on the caller's), so `fn` must not block or call into the
  // engine. One callback; a later call replaces it, and nullptr clears it:
  // once that returns, the old one is not running and never runs. Any
  // thread.
  void OnSuperseded(std::function<void()> fn);
  // Runs a metastore change a superseded process must not make (the Kafka
  // listener's group offset writes) as this node at its epoch, as the
  // engine's own changes run: once more if this process's own halt minted
  // its next epoch meanwhile; kUnavailable once a successor holds the node.
  Status RunAsThisNode(const std::function<Status(const metastore::EpochCheck&)>& change);
  EngineMetrics& metrics() { return metrics_; }
  // Bytes of batches in the log cache (may pass its budget until the
  // eviction thread catches up).
  size_t cached_bytes() const { return cache_bytes_.load(); }
  uint64_t unsettled_bytes() const { return unsettled_bytes_.load(); }
  // Streams in memory (every stream this node serves). Takes mu_.
  size_t stream_count();
  wal::Writer& wal() { return *wal_; }
  // Where the WAL's slots go (EngineOptions::wal_store, or the object store).
  objstore::ObjectStore& wal_store() { return *wal_store_; }
  void Close();

 private:
  class StreamRoom;  // below, with max_streams' count
  struct Stream;
  struct Pending;
  Engine(EngineOptions options, std::shared_ptr<objstore::ObjectStore> store,
         std::shared_ptr<metastore::Metastore> meta);
  Status Recover();
  // Recovers, settles and clears the chain of every other node whose
  // heartbeat was left set (it stopped without settling all it
  // acknowledged) by a build that takes nodes over (NodeState::takeover),
  // each as that node (taking_over_); fails the start if one cannot be (its
  // records would be missing, and new ones take their offsets).
  Status TakeOverDeadNodes();
  // Refuses a store (`what`: "object store", ...) whose marker object `key`
  // names another metastore; claims an unclaimed one for this metastore.
  Status CheckDeployment(objstore::ObjectStore& store, std::string_view what, const std::string& key);
  // Before the object store's marker `key` (deployment `id`) is first
  // written: kPreconditionFailed if the store is empty where the metastore
  // says records are.
  Status CheckUnmarkedStoreIsOurs(const std::string& key, uint64_t id);
  // CheckDeployment for the --wal-store (each store of a quorum).
  Status CheckWalStoreDeployment();
  // Refuses a start whose WAL store differs from the one this node's
  // unsettled chain is in (_weir/wal-store/<node> in the object store names
  // it); returns what to record there once the node is ours, if anything.
  Result<std::optional<std::string>> CheckWalStore(const metastore::NodeState& prev);
  std::string WalStoreMarkerKey() const;
  // Where this start's WAL is, as a marker names it; where `node`'s marker
  // says its WAL is (no marker: the object store).
  std::string OurWalStore() const;
  Result<std::string> RecordedWalStore(const std::string& node) const;
  // Before the mint: kPreconditionFailed if a node this start would take
  // over (its heartbeat set) has its WAL in another store than this start's.
  Status CheckTakeoverWalStores();
  Status ReplayBatch(uint64_t stream_id, std::string_view batch, const wal::AckInfo& where);
  // The stream a front-end names: kNotFound if there is none; kFenced once
  // this process is superseded (its successor serves the streams: what
  // memory holds here is stale once that one appends).
  Result<std::shared_ptr<Stream>> Find(const std::string& basin, const std::string& name);
  // Find, superseded or not (to drop a watch).
  Result<std::shared_ptr<Stream>> FindAny(const std::string& basin, const std::string& name);
  // Makes newly created streams (empty, as the metastore made them)
  // findable; `room`'s reservation ends in the same step.
  void Register(const std::vector<metastore::StreamInfo>& created, StreamRoom* room = nullptr);
  // Drops a deleted stream from memory and wakes its readers and watchers.
  // Returns the object keys of the segments memory held for it: a settle
  // round that committed after the metastore's delete (its rows skipped) but
  // before this call left one there that no row names.
  // Idempotent: a second call returns nothing.
  [[nodiscard]] std::vector<std::string> Forget(const std::shared_ptr<Stream>& s);
  // After a metastore delete of `s` (or of its table) failed: whether its row
  // is gone anyway (a commit whose answer was lost), as the metastore says
  // now; an error if that cannot be known either.
  Result<bool> StreamRowGone(const Stream& s);
  // After a delete of `s` failed: forgotten if its row is gone; if that
  // cannot be known, appends are refused (delete_unknown) until a later
  // attempt knows, so that it never acknowledges records settle would drop.
  // Returns what Forget returned (nothing if the stream stays).
  std::vector<std::string> AfterFailedDelete(const std::shared_ptr<Stream>& s);
  // After a config change of `streams` failed with `failed`: unless it was
  // refused (nothing changed), each takes the config the metastore holds
  // now, as ReloadConfigsLocked. Under config_mu_.
  void AfterFailedConfigChange(const std::vector<std::shared_ptr<Stream>>& streams, const Status& failed);
  // Reads the streams' stored configs (once no commit is in flight) into
  // memory; those it cannot read (all from the first failure on) get
  // config_unknown. Under config_mu_, so no change lands between the read
  // and its use.
  void ReloadConfigsLocked(const std::vector<std::shared_ptr<Stream>>& streams);
  // Before a config change: kUnavailable (retryable) if a stream's config is
  // unknown, as the change was built on memory's; its stored config is read
  // meanwhile (ReloadConfigsLocked). Under config_mu_.
  Status RefuseUnknownConfigsLocked(const std::vector<std::shared_ptr<Stream>>& streams);
  static bool IsForgotten(Stream& s);
  // Runs a metastore change that a superseded node must not make, as this
  // node at its epoch; once more if a halt minted this process's next epoch
  // meanwhile (the change answered kPreconditionFailed). A superseded
  // process gets kUnavailable (and, when settle_mu_ is free, learns it:
  // superseded()). Never called with settle_mu_ held. `change` returns a
  // Status or a Result.
  template <typename Change>
  auto AsThisNode(Change change) -> decltype(change(metastore::EpochCheck{}));
  // Deletes segment objects no row names any more (duplicates allowed);
  // `expired`: retention's, counted in segments_deleted once deleted. A
  // failure is logged and the keys kept for RetryUndeletedObjects (up to
  // kMaxUndeletedObjects; past that, left to the next start's sweep). Any
  // thread.
  void DeleteObjects(std::vector<std::string> keys, std::string_view what, bool expired = false);
  // Deletes the objects earlier DeleteObjects failed to (up to
  // kUndeletedRetryPerPass, in DeleteMany calls of kUndeletedRetryChunk);
  // from retention passes, while this process holds its node.
  void RetryUndeletedObjects();
  static constexpr size_t kMaxUndeletedObjects = 100'000;
  static constexpr size_t kUndeletedRetryPerPass = 10'000;
  static constexpr size_t kUndeletedRetryChunk = 1'000;
  void OnDurable(const std::shared_ptr<Stream>& s, const std::shared_ptr<Pending>& p, const Status& st,
                 const wal::AckInfo& where);
  // Drops the oldest cached batches until the cache is at 3/4 of its budget.
  void EvictCache();
  // Wakes the eviction thread (the cache passed its budget); acks never wait
  // for the scan.
  void RequestEvict();
  void EvictLoop();
  // Stores this node's heartbeat (the metastore's clock), or clears it.
  Status Heartbeat(bool beating);
  void HeartbeatLoop();
  // Wakes the settle loop before its interval (the log cache is filling up).
  void RequestSettle();
  // Under settle_mu_: memory's segment list of `s` as the metastore has it
  // (after a metastore change memory missed: a merge swap that landed unseen).
  Status ReloadSegments(const std::shared_ptr<Stream>& s);
  // Blocks while more than max_unsettled_bytes await settle (up to
  // `deadline`: the append's admission deadline, shared with its wait for
  // pool budget). Called before any stream lock is taken.
  Status WaitForSettleRoom(TimePoint deadline);
  // Settle (or a stream's deletion) released `n` bytes in `batches` batches of the backlog.
  void SettledBytes(uint64_t n, uint64_t batches);
  // More than max_unsettled_bytes or max_unsettled_batches await settle.
  bool BacklogFull() const;
  // Under s->mu (held by lk): applies the producer window to an append of
  // `count` records. True when it took `done` (a duplicate, queued or
  // answered, or a failure; lk is then released unless the duplicate is
  // queued); false for a new batch.
  bool HandledByProducerWindow(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s,
                               const ProducerRef& p, size_t count, AppendCallback& done);
  // Admission, for both kinds of append: a producer's duplicate answered at
  // once (below), then room in the settle backlog and the WAL pool, waited
  // for up to admission_timeout (not at all unless `may_wait`). Empty when
  // `done` has been answered (or queued behind a duplicate's original).
  struct Admitted {
    std::shared_ptr<Stream> stream;
    wal::Writer::Reservation room;
  };
  // `stream_id`: only that stream (kNotFound, before any wait, for another
  // of the name).
  std::optional<Admitted> Admit(const std::string& basin, const std::string& stream,
                                const std::optional<ProducerRef>& producer, size_t count, size_t bytes, bool may_wait,
                                AppendCallback& done, AdmissionTicket* ticket,
                                std::optional<uint64_t> stream_id = std::nullopt);
  // Before the admission waits, while they may wait: a producer's retry of a
  // batch its window holds needs no pool or settle room, so it is answered
  // (or queued behind its original) at once. True when it took `done`.
  bool DuplicateAnsweredBeforeAdmission(const std::string& basin, const std::string& stream, const ProducerRef& p,
                                        size_t count, size_t bytes, AppendCallback& done);
  // The same, whether or not admission may wait.
  bool AnswerDuplicate(const std::string& basin, const std::string& stream, const ProducerRef& p, size_t count,
                       AppendCallback& done);
  // The refusal of an append to a stream being deleted.
  static AppendOutcome DeletionPending(const std::string& stream);
  // Whether the stream's producer window holds this batch (a retry); a look
  // only: DuplicateAnsweredBeforeAdmission decides.
  bool ProducerWindowHolds(const std::string& basin, const std::string& stream, const ProducerRef& p,
                           size_t count);
  // Under s->mu: hands a sealed batch to the WAL and commits the sequencer
  // state once it is admitted; `done` runs when it is durable or failed.
  // `room` was reserved before s->mu was taken (never wait for the pool
  // under a stream lock: the release callbacks take it). `commands` false:
  // the batch holds no command record (settle does not look for them).
  void Submit(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s, std::string batch, size_t count,
              int64_t first_ts, int64_t last_ts, const std::optional<ProducerRef>& producer, std::string token,
              uint64_t trim_point, AppendCallback done, wal::Writer::Reservation& room,
              bool log_append_time = false, bool commands = true);
  // Under s->mu: the first offset still held (trim point, retention).
  static uint64_t LogStart(const Stream& s);
  // Under s->mu, for a read by time that has found nothing yet: `from` if
  // the source holding it (a segment, or a batch still in the WAL) has a
  // record at or after `at_time`, else the start of the first later source
  // that has, else the tail. The sources passed over hold only older records.
  static uint64_t NextReaching(const Stream& s, uint64_t from, int64_t at_time);
  // Under s->mu: the sources covering [from, ...) up to the limits, and at
  // most kMaxSegmentsPerRead segments (each costs a GET).
  static constexpr size_t kMaxSegmentsPerRead = 32;
  static void CollectSources(const Stream& s, uint64_t from, size_t max_records, size_t max_bytes,
                             std::vector<metastore::SegmentInfo>* segments, std::vector<BatchRef>* refs);
  // Fetches the batches of those sources, in offset order.
  Status FetchSources(const std::vector<metastore::SegmentInfo>& segments, const std::vector<BatchRef>& refs,
                      uint64_t from, size_t max_bytes, std::optional<int64_t> at_time,
                      std::vector<std::shared_ptr<const std::string>>* batches);
  // After the WAL halts: fence our own epoch, mint the next one and resume the
  // writer into it, or abandon the writer if a successor holds the node.
  void HandleHalt(uint64_t epoch);
  // For HandleHalt once a successor holds the node: where to abandon the
  // halted chain (the first slot up to `halted` not yet released that is not
  // our flight, else the one after `halted`), and what the appends from there
  // on get.
  std::pair<uint64_t, Status> SupersededCut(const wal::ChainRef& chain, uint64_t halted);
  // With settle_mu_ held, after a fence of `chain` cut at `cut`: deletes the flights in the
  // `window` slots past it, unless a successor holds the node now (then
  // false, marked superseded; nothing deleted: the caller must not go on as
  // the node's). When that cannot be read, deletes nothing and answers true.
  bool DeleteGarbageIfStillOurs(const wal::ChainRef& chain, uint64_t cut, uint64_t window);
  // For HandleHalt when the fence walked past the halted slot, or over slots
  // below it not yet released: Ok if slots [from, to) of `chain` are all our
  // own flights; Corruption at another writer's; Unavailable if one cannot be
  // read or is no flight now. *failed_at (if set) is the slot that failed.
  Status OwnFlights(const wal::ChainRef& chain, uint64_t from, uint64_t to, uint64_t* failed_at = nullptr);
  void SettleLoop();
  // Batches evicted from the log cache, read back from their WAL slots: one
  // ranged GET per run of `refs` adjacent in one slot (a stream's batches in
  // a slot are one chunk), segment_uploads GETs at a time. out[i] is refs[i]'s
  // bytes, a view into a buffer it holds (left unfilled for a ref still
  // cached; `out` stays empty if every ref is).
  // Up to `parallel` GETs at a time (settle: segment_uploads; a read: a few,
  // so that reads after a restart do not crowd out the WAL's PUTs).
  struct ReadBackBytes {
    std::shared_ptr<const std::string> buffer;
    std::string_view view;
  };
  Status ReadBack(const std::vector<BatchRef>& refs, size_t parallel, std::vector<ReadBackBytes>* out);
  // After a read's last look found an object missing (`miss`): the read's
  // answer. ObjectMissing (records lost) if the stream is still this
  // process's and there; `miss` if it was deleted meanwhile; the superseded
  // error (kFenced) if another process holds the node (its merges and
  // retention delete what this one lists); Unavailable if the metastore
  // cannot tell.
  Status AnswerForMiss(const std::string& basin, const std::string& stream, uint64_t stream_id, const Status& miss);
  // The stream's source changes (SegmentList::changes), 0 if it is gone.
  uint64_t SourceChanges(const std::string& basin, const std::string& stream, uint64_t stream_id);
  // Reads that missed an object while the sources moved are tried again,
  // up to this many attempts; then every miss counts towards a loss.
  static constexpr int kMaxReadRaces = 32;
  // After a read's `attempt`-th look missed an object: counts a strike if the
  // sources did not move (or the read raced long enough); false at the third
  // (the miss is then judged by LostObject), else waits a little and is true.
  static bool LookAgainAfterMiss(int attempt, bool sources_moved, int* strikes);
  Result<ReadResult> ReadOnce(const std::string& basin, const std::string& stream, const ReadStart& start,
                              size_t max_records, size_t max_bytes, std::optional<TimePoint> wait_until,
                              uint64_t stream_id);
  // Whether a read of `stream` from `from` would start with a GET (a settled
  // segment, or a batch evicted from the log cache). False if it cannot be
  // read (the read itself says why).
  bool ReadNeedsStore(const std::string& basin, const std::string& stream, uint64_t from);
  // Find, and kNotFound if the name now names a stream other than `stream_id` (if set).
  Result<std::shared_ptr<Stream>> FindAs(const std::string& basin, const std::string& stream,
                                         std::optional<uint64_t> stream_id);
  // The batches of one segment from `from` (and, for a lookup by time, from
  // the first indexed batch that may hold a record at or after `at_time`),
  // about max_bytes of them.
  Status ReadSegment(const metastore::SegmentInfo& seg, uint64_t from, size_t max_bytes,
                     std::optional<int64_t> at_time, std::vector<std::string>* batches);
  // One try of ReadSegment; *cache_hit: it used a kept footer and index.
  Status ReadSegmentOnce(const metastore::SegmentInfo& seg, uint64_t from, size_t max_bytes,
                         std::optional<int64_t> at_time, bool use_cache, bool* cache_hit,
                         std::vector<std::string>* batches);
  Status SweepGarbage();
  // Deletes each stream with delete_on_empty set that holds no record, has
  // existed for its min age and has taken no append for as long (appends
  // before this process started count as made at its start). A table's
  // bucket streams are kept: the table owns them.
  Status DeleteEmptyStreams();
  // SettleNow (all) or SettleDue.
  Status Settle(bool all);
  // One settle round up to `target` (or an earlier slot, so the batches it
  // reads back from slots stay within log_cache_bytes; *more is then set):
  // every stream's batches before it (all), or the due streams' only.
  Status SettleRound(metastore::ChainPosition target, bool all, bool* more);
  // Writes the segments (create-only). *created lists the keys this call
  // made: a key that already existed may be a committed segment's, so only
  // the created ones are ever deleted as garbage.
  Status UploadSegments(const std::vector<metastore::SegmentInfo>& segments,
                        const std::vector<SegmentObject>& objects, std::vector<std::string>* created);
  // After a settle commit that may have landed (timeout, unavailable): whether
  // the node's checkpoint is `target`, read back (with retries), and, if the
  // round left it where it was (`from`), one of `segments` is indexed.
  Result<bool> SettleLanded(const metastore::ChainPosition& from, const metastore::ChainPosition& target,
                            const std::vector<metastore::SegmentInfo>& segments);
  // Deletes WAL slots from `from` up to `to` (exclusive), across epochs, and
  // those of earlier rounds whose deletes failed (kept for the next round).
  void DeleteSlots(const metastore::ChainPosition& from, const metastore::ChainPosition& to);
  // Slots past this many that are still to be deleted after failed deletes
  // are left to the next start's sweep (memory stays bounded).
  static constexpr size_t kMaxUndeletedSlots = 100'000;

  EngineOptions options_;
  std::shared_ptr<objstore::ObjectStore> store_;
  std::shared_ptr<objstore::ObjectStore> wal_store_;  // options_.wal_store, or store_
  std::shared_ptr<metastore::Metastore> meta_;
  std::unique_ptr<wal::Writer> wal_;
  std::atomic<uint64_t> epoch_{0};
  uint64_t nonce_ = 0;  // this process's nonce: its fences and epoch mints carry it

  // Held across a table's metastore change and its streams' (un)registration,
  // and by the table reads: a table is never seen before its bucket streams
  // can take appends.
  std::mutex tables_mu_;
  std::atomic<uint64_t> tables_version_{0};  // TablesVersion; bumped under tables_mu_
  // GetTable's answers (a table, or kNotFound) as of table_cache_version_:
  // read under tables_mu_ with no change in progress, good until the next
  // change ends. At most kTableCacheEntries (then emptied).
  std::mutex table_cache_mu_;
  uint64_t table_cache_version_ = 0;
  std::map<std::pair<std::string, std::string>, Result<metastore::TableInfo>> table_cache_;
  std::mutex mu_;  // guards the maps and halt_thread_
  // Held by ReconfigureStream (metastore, then memory), across
  // DeleteEmptyStreams, across each retention chunk's cuts and their
  // metastore deletion, and while a stored config is read back
  // (ReloadConfigsLocked), so a stream's stored and in-memory configs agree
  // while its deletion (or its segments') is decided (one whose config is
  // unknown is not): a reconfiguration waits for those. Taken after settle_mu_ and tables_mu_,
  // before mu_ or any stream lock.
  std::mutex config_mu_;
  void SeeProducerIds(uint64_t up_to);
  std::atomic<uint64_t> producer_ids_seen_{0};  // the largest producer id known allocated
  // Held by CreateStream across the metastore create and Register.
  std::mutex create_mu_;
  // Room for streams under max_streams, held by one create (so concurrent
  // creates count each other) until Register takes it over (in the same
  // step that makes the streams count) or the room goes. Owned by the
  // creating call, on its thread; takes mu_.
  class StreamRoom {
   public:
    explicit StreamRoom(Engine* e) : e_(e) {}
    StreamRoom(const StreamRoom&) = delete;
    StreamRoom& operator=(const StreamRoom&) = delete;
    ~StreamRoom();
    // kQuotaExhausted (counted in stream_creates_refused if `count`) if `n`
    // more would pass max_streams; `what` names them in the message.
    Status Reserve(size_t n, std::string_view what, bool count = true);
    void ReleaseLocked();  // mu_ held

   private:
    Engine* e_;
    size_t n_ = 0;
  };
  size_t streams_reserved_ = 0;  // guarded by mu_
  std::map<uint64_t, std::shared_ptr<Stream>> by_id_;
  std::map<std::pair<std::string, std::string>, uint64_t> by_name_;
  std::atomic<size_t> cache_bytes_{0};
  std::atomic<bool> closing_{false};
  // Set by Close for its final settle, which retries like any round does
  // (background rounds cut their retries short once closing_ is set).
  std::atomic<bool> final_settle_{false};
  std::atomic<uint64_t> next_watch_id_{1};
  std::thread halt_thread_;
  EngineMetrics metrics_;

  // Set before Recover, then only read: this engine recovers a dead node's
  // chain for the node starting (TakeOverDeadNodes): no deployment check, no
  // heartbeat, no takeovers of its own.
  bool taking_over_ = false;

  SegmentIndexCache segment_indexes_;  // for ReadSegment; any thread

  std::mutex settle_mu_;  // one settle cycle at a time; guards the fields below
  metastore::ChainPosition checkpoint_;
  std::map<uint64_t, uint64_t> epoch_cuts_;  // fenced epochs of this node -> cut
  // Settled WAL slots from here on were not deleted (a DeleteMany failed):
  // the next round deletes them with its own.
  std::optional<metastore::ChainPosition> undeleted_slots_from_;
  // DeleteObjects' failures: key -> expired (counted in segments_deleted once deleted).
  std::mutex undeleted_mu_;
  std::map<std::string, bool> undeleted_objects_;
  TimePoint last_retention_;
  TimePoint last_merge_;
  uint64_t merge_resume_at_ = 0;  // the stream id the last merge pass stopped at (settle thread, settle_mu_)
  uint64_t last_stream_id_at_start_ = 0;  // the metastore's, read by Recover before it loads the streams
  // A successor process holds this node: settle, merges and retention can
  // commit nothing, so the settle loop stops doing them (each round would
  // upload segments only to delete them); reads and appends are refused.
  // Set under settle_mu_ (MarkSuperseded), read anywhere.
  std::atomic<bool> superseded_{false};
  // OnSuperseded's callback; run under on_superseded_mu_ (so clearing it
  // waits for a run in progress). announced: MarkSuperseded has run the
  // callback set then (a later one runs when set).
  std::mutex on_superseded_mu_;
  std::function<void()> on_superseded_;
  bool superseded_announced_ = false;
  // With settle_mu_ held (so epoch_ is not being minted meanwhile): after a
  // change the metastore refused with `st`, whether a successor holds the
  // node; if so, marks superseded_ (and says so once).
  bool NoteIfSuperseded(const Status& st);
  // With settle_mu_ held: whether a successor holds the node (marked as for
  // NoteIfSuperseded), nullopt if the metastore cannot say. Shared by
  // NoteIfSuperseded and HoldsItsNode.
  std::optional<bool> LearnIfSuperseded();
  // With settle_mu_ held, after the metastore refused (`refused`) a change
  // this process made objects for (a settle round's segments, a merged
  // segment): whether those objects are its alone to delete. Not when a
  // successor holds the node, or that cannot be read: segment keys carry an
  // epoch but not the node id, so a start that took the node over, at an
  // epoch of its own id equal to ours, may have written the same key and
  // indexed it (its 412 taken for an earlier attempt of its own). Then the
  // next start's sweep decides.
  // (The check and the delete after it are not atomic: a takeover between
  // them is not caught, as for the start's sweep.)
  bool CreatedObjectsAreOurs(const Status& refused);
  // With settle_mu_ held: whether the metastore says this process's epoch is
  // still its node's (false if it cannot say; marks superseded if not).
  bool HoldsItsNode();
  // NoteIfSuperseded if settle_mu_ is free now (false if not): never while
  // this process's own halt mints its next epoch, and never waiting. Not
  // with settle_mu_ held by the caller.
  bool TryNoteIfSuperseded(const Status& st);
  // Sets superseded_ and wakes every waiting read and tail watch (they find
  // it set, under their stream's lock, and fail kFenced). Takes mu_, then
  // each stream's mu in turn; runs the watches' callbacks, then
  // OnSuperseded's. Once.
  void MarkSuperseded();
  // kPreconditionFailed once superseded_, naming `what` (settle, merge, retention).
  Status RefuseIfSuperseded(std::string_view what) const;
  // A stream as of its row, settled state and segment index.
  static Result<std::shared_ptr<Stream>> MakeStream(metastore::StreamInfo info, const metastore::StreamState& st,
                                                    std::vector<metastore::SegmentInfo> segments);
  // A stream as of its settled state, its row and segments read from the metastore.
  Result<std::shared_ptr<Stream>> StreamFromState(const metastore::StreamState& st);
  // Recovery: registers a stream from its settled state (in by_id_ and by_name_).
  Status LoadStream(const metastore::StreamState& st);
  // Recovery: registers every stream (in by_id_ and by_name_) as of its last
  // settle, with rows, segments and states read a page at a time across
  // streams (not a round trip per stream).
  Status LoadStreams();
  // After a create failed: loads those of `found` (rows the metastore has)
  // whose id and name are not registered, from their settled state. A
  // stream that cannot be loaded is logged and left out (the first such
  // error is returned). Callers hold tables_mu_ (and create_mu_ for a
  // stream CreateStream may make), as the creates and deletes of those
  // streams do: a row deleted meanwhile is never loaded.
  Status Adopt(const std::vector<metastore::StreamInfo>& found);
  // Adopt for the bucket streams of table basin/name (tables_mu_ held); returns its row.
  Result<metastore::TableInfo> AdoptTableLocked(const std::string& basin, const std::string& name);
  // Whether `table`'s last bucket stream is not in memory (takes mu_ for one
  // lookup): creates and bucket increases add buckets at the end, and a
  // load adopts them all.
  bool LacksBuckets(const metastore::TableInfo& table);
  // Merges `run` (adjacent segments of `s`, at most kMaxMergeParts) into one segment.
  static constexpr size_t kMaxMergeParts = 256;
  Status MergeRun(const std::shared_ptr<Stream>& s, const std::vector<metastore::SegmentInfo>& run);
  int64_t opened_ms_;  // wall clock at construction: appends before it are unknown (delete_on_empty)
  std::mutex settle_wait_mu_;
  std::condition_variable settle_cv_;
  std::atomic<bool> settle_requested_{false};  // the cache is filling up
  std::atomic<uint64_t> unsettled_bytes_{0};  // acknowledged batches not yet settled (slot bytes)
  std::atomic<uint64_t> unsettled_batches_{0};  // and how many they are
  std::mutex backlog_mu_;                     // with backlog_cv_: appends waiting for settle
  std::condition_variable backlog_cv_;
  std::thread settle_thread_;
  std::mutex evict_wait_mu_;  // with evict_cv_: guards evict_requested_
  std::condition_variable evict_cv_;
  bool evict_requested_ = false;
  bool evict_stop_ = false;   // set by Close once the WAL has drained
  std::thread evict_thread_;  // runs EvictLoop, from Open to Close
  std::mutex heartbeat_mu_;   // with heartbeat_cv_: guards heartbeat_stop_
  std::condition_variable heartbeat_cv_;
  bool heartbeat_stop_ = false;   // set by Close once it has finished
  std::thread heartbeat_thread_;  // runs HeartbeatLoop, from Recover's first heartbeat to Close's end
};

// The size S2 meters for a record, used by every limit on bytes: 8 + body +
// for each header 2 + name + value (+ the Kafka key, which S2 records lack).
size_t MeteredBytes(const AppendRecord& r);
size_t MeteredBytes(const wal::Record& r);
// As served over REST and S2S, which carry no Kafka key: what an S2 client
// counts for a record it read (reads' `bytes` limits and positions).
size_t ServedMeteredBytes(const wal::Record& r);
// Its parts, for decoders that meter as they go: a record counts this much
// besides its body, key and headers; a header counts MeteredBytes(header).
// (Inline: the S2S decoder's fuzzer links without the engine.)
inline constexpr size_t kMeteredRecordBytes = 8;
inline size_t MeteredBytes(const wal::RecordHeader& h) {
  return 2 + h.key.size() + (h.value ? h.value->size() : 0);
}

// kInvalidArgument if `config` requires client timestamps and a record has none.
Status CheckClientTimestamps(const metastore::StreamConfig& config, const std::vector<AppendRecord>& records);

// Validation shared with front-ends.
Status ValidateBasinName(const std::string& name);
Status ValidateStreamName(const std::string& name);

}  // namespace weir::log
