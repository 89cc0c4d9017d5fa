// Engine internals shared by engine.cc (appends, reads, recovery) and
// settle.cc (settle, trim, retention). Not part of the module's interface.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "log/engine.h"
#include "log/producer_window.h"
#include "log/segment_format.h"
#include "log/segment_list.h"

namespace weir::log {

// What a run of batches leaves behind besides its records: the next offset,
// the trim point and fencing token set by command records, the last
// timestamp, and the producer windows.
struct StreamFacts {
  uint64_t next_offset = 0;
  uint64_t trim_point = 0;
  std::string fencing_token;
  int64_t last_timestamp_ms = 0;
  ProducerWindows producers;
};

// Applies one verified batch to `facts`. A batch that ends at or below
// next_offset is skipped (already applied); one that does not start at
// next_offset is kCorruption.
// `verified`: the batch's CRC was checked already (on append), so only its
// header is parsed. `commands` false: no record is a command (checked on
// append), so the records are not walked for them.
Status ApplyBatch(StreamFacts* facts, std::string_view batch, bool verified = false, bool commands = true);

// False only if no record of this batch can be a command record (checked
// without decoding the records). Records of compressed batches never are.
bool MayHoldCommands(std::string_view batch);

// A command record: exactly one header, with an empty name.
inline bool IsCommand(const wal::Record& r) { return r.headers.size() == 1 && r.headers[0].key.empty(); }

// An acknowledged batch: its offsets, timestamps, where it lives in the WAL,
// and its bytes while the log cache holds them.
struct BatchRef {
  uint64_t start = 0;
  uint64_t end = 0;  // exclusive
  int64_t max_timestamp_ms = 0;
  wal::AckInfo where;
  std::shared_ptr<const std::string> bytes;  // null once evicted from the cache
  bool commands = true;  // may hold command records (false: none, as checked on append)
  TimePoint acked{};  // when it became durable (settle_max_delay counts from here); {} if replayed: due at once
};

// A segment as settle writes it: the batches in place (views into `held`),
// then the index and footer. Owned by one settle cycle.
struct SegmentObject {
  std::vector<std::string_view> parts;
  std::string tail;
  std::vector<std::shared_ptr<const std::string>> held;
  size_t size = 0;
};

// A batch sequenced into a stream, not yet durable. Shared (shared_ptr) by
// the stream's `pending` queue and its WAL callback; guarded by the stream's
// `mu` (OnDurable runs on the WAL's releasing thread). OnDurable moves its waiters
// and refusals out under `mu` and answers each once, outside it.
struct Engine::Pending {
  bool log_append_time = false;
  uint64_t start = 0;
  uint64_t end = 0;
  int64_t first_timestamp_ms = 0;
  int64_t last_timestamp_ms = 0;
  std::shared_ptr<const std::string> bytes;
  bool commands = true;  // as BatchRef::commands
  std::vector<std::pair<AppendCallback, bool>> waiters;  // (callback, duplicated)
  // Conditional appends refused (412) for the state this batch and those
  // before it make: answered once it is durable, or with its failure (S2
  // does not report a tail or token that might never exist).
  std::vector<std::pair<AppendCallback, AppendOutcome>> refusals;
  uint64_t trim_point = 0;  // the stream's trim point once this batch is applied
};

// One stream in memory. Owned by the Engine (by_id_, shared_ptr); readers and
// WAL callbacks keep a reference. Any thread: `mu` guards everything except
// `settled`, which only the settle task (and recovery, before it starts)
// touches. `tail` moves only as batches become durable (or as recovery
// replays them), in offset order.
struct Engine::Stream {
  std::mutex mu;
  std::condition_variable cv;  // readers waiting for the tail to move
  metastore::StreamInfo info;
  StreamFacts live;          // as sequenced, including pending appends
  uint64_t tail = 0;         // acknowledged
  int64_t tail_timestamp_ms = 0;  // of the last acknowledged record
  // One-shot watchers of the tail: id -> (offset, callback), fired outside
  // `mu`. Keyed by id: an unwatch (every long poll's end) is no scan.
  std::map<uint64_t, std::pair<uint64_t, TailCallback>> watchers;
  SegmentList segments;  // settled, offset order
  std::deque<BatchRef> durable;  // acknowledged, not yet settled, offset order
  std::deque<std::shared_ptr<Pending>> pending;  // assigned, not yet acknowledged
  bool deleted = false;
  // delete_on_empty is deleting it: appends are refused as retryable until
  // the deletion succeeds (then `deleted`) or fails (then false again).
  bool deleting = false;
  // A delete of it failed in a way that may have committed, and the
  // metastore could not say: appends are refused as retryable until a delete
  // or a retention pass knows (restart knows too).
  bool delete_unknown = false;
  // A config change failed in a way that may have committed, and the
  // metastore could not say which config it holds: retention expires
  // nothing of it (trims still apply), delete_on_empty passes it over, and
  // config changes are refused (retryable), until a retention pass or a
  // refused change reads it (a restart reads it too). Merging goes by
  // memory's config (at worst it keeps records longer).
  bool config_unknown = false;
  int64_t last_append_ms = 0;  // wall clock of the last append sequenced here (delete_on_empty)
  StreamFacts settled;       // as of the last settle (offset == first durable batch)
  // The trim point of acknowledged batches and stored trims (TrimTo): unlike
  // live.trim_point, never one of a batch that may still fail. Retention
  // deletes segments below this one only.
  uint64_t durable_trim_point = 0;
};

// Object key of a settled or merged segment:
// seg/<stream id>/<start>-<end>-e<epoch>, zero-padded. The writer's epoch
// makes it unique to one process: a create-only PUT that answers 412 is this
// process's own earlier attempt, never a successor's object (or a
// predecessor's that it might delete after losing its commit).
std::string SegmentKey(uint64_t stream_id, uint64_t start, uint64_t end, uint64_t epoch);
// The epoch a segment key names (`-e<epoch>`); none for keys written before
// keys carried it.
std::optional<uint64_t> SegmentKeyEpoch(std::string_view key);

// Runs fn(i) for every i in [0, n) on up to `workers` threads (the caller's
// is one), each taking the next index not yet taken, so one slow call (a PUT
// or GET) holds up only its own thread. The threads it starts come from a
// process-wide allowance (kMaxParallelThreads): with none left (many reads
// and settle at once, or calls nested), the caller does more of the work
// itself; it never waits for one.
void ForEachParallel(size_t n, size_t workers, const char* thread_name, const std::function<void(size_t)>& fn);
inline constexpr size_t kMaxParallelThreads = 128;
// Threads ForEachParallel has started and not yet joined, process-wide.
size_t ParallelThreadsRunning();

}  // namespace weir::log
