// The WAL writer: the node-wide pool, the flusher, the slot uploads and the
// ordered release of acknowledgements (DESIGN.md §3, docs/wal.md).
//
// Ownership and threads: one Writer per node epoch chain, owned by the node
// (the stream engine). Append/Resume/Abandon/Close may be called from any
// thread. The Writer runs one flusher thread and `window` upload threads;
// acknowledgement callbacks run outside every Writer lock, strictly in slot
// order, and must not block for long: on an upload thread, or on the thread
// that calls Resume, Abandon or Close (the callbacks a halt held back).
//
// Guarantees:
//  - An entry's callback gets OK only after its slot and every slot cut before
//    it are durable in the store; callbacks of one Writer are invoked in the
//    order the entries were appended (FIFO), and an OK is never taken back.
//  - Slots are written create-only at wal/<node>/<epoch>/<seq>, seq dense from
//    first_seq, in cut order; a failed PUT is retried with the same key and
//    bytes; an ambiguous 412 is settled by the envelope's nonce.
//  - A foreign occupant (a poison or another writer's flight) halts the chain:
//    no OK is released at or after that slot until Resume re-publishes it.
//  - Memory held by admitted, unacknowledged entries stays under budget_bytes;
//    Append blocks for room until its deadline, then fails with a diagnosis.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/histogram.h"
#include "base/status.h"
#include "objstore/object_store.h"

namespace weir::wal {

struct WriterOptions {
  std::string node;       // node id (ValidateNodeId)
  uint64_t epoch = 0;     // this incarnation's epoch
  uint64_t first_seq = 0;
  uint64_t nonce = 0;     // 0 = pick a random one
  size_t budget_bytes = 256u << 20;  // admitted, unacknowledged bytes (entries + 64 B each)
  size_t slot_cap_bytes = 8u << 20;  // a slot is cut at this size
  Duration linger = Duration::zero();  // wait this long for more data before cutting
  // ... or longer: this share (0..1) of the PUT latency estimate, up to
  // kMaxLingerFromPuts. Under ordered release an append waits for every
  // earlier slot's PUT, so on a slow store fewer, fuller slots cost less than
  // the extra wait (and fewer PUTs).
  double linger_put_share = 0;
  int window = 8;                      // slots claimed but not yet released
  Duration retry_initial = std::chrono::milliseconds(20);
  Duration retry_max = std::chrono::seconds(2);
  // Close waits this long for what was admitted to become durable; then (an
  // object store that fails or is slow) it fails the rest with kUnavailable:
  // they may or may not be stored, and the next start's recovery decides.
  // (Close itself then still waits for PUTs in flight to return.)
  Duration close_timeout = std::chrono::seconds(60);
  // Called from an upload thread when the chain halts (foreign occupant): once
  // per halt (again after a Resume halts anew; not for Close's timeout).
  // The owner is expected to fence and then call Resume or Abandon.
  std::function<void(uint64_t epoch, uint64_t seq, const Status& reason)> on_halt;
};

// Where an acknowledged entry lives: its slot and byte range in the slot object.
struct AckInfo {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};
using AckCallback = std::function<void(const Status&, const AckInfo&)>;

// Counters and histograms; read them from any thread.
struct WalMetrics {
  std::atomic<uint64_t> appends{0}, append_bytes{0}, records{0};
  std::atomic<uint64_t> slots{0}, slot_bytes{0};
  std::atomic<uint64_t> put_attempts{0}, put_retries{0}, put_ambiguous_resolved{0};
  std::atomic<uint64_t> halts{0}, republished_entries{0};
  // Stalls by cause: an Append that waited for budget, by what held the budget;
  // and flusher cuts delayed by a full pipeline window.
  std::atomic<uint64_t> stall_budget_uploads{0}, stall_budget_halted{0}, stall_window{0};
  std::atomic<uint64_t> admission_timeouts{0};
  std::atomic<int64_t> pool_bytes{0}, slots_in_flight{0};
  Histogram put_latency_ns;    // each successful or resolved PUT, first attempt to durable
  Histogram ack_latency_ns;    // Append call to callback
  // Where ack latency goes besides the PUT, per entry: waiting in the pool to
  // be cut (linger, pace, full window), and waiting, once its slot is
  // durable, for earlier slots (ordered release).
  Histogram cut_wait_ns;
  Histogram release_wait_ns;
  Histogram slot_size_bytes;
  Histogram slot_entries;
};

// The longest linger linger_put_share can ask for (a longer `linger` stays).
inline constexpr Duration kMaxLingerFromPuts = std::chrono::milliseconds(20);

// The linger the flusher waits for, given the PUT latency estimate: the
// options' linger, or their share of the estimate (at most
// kMaxLingerFromPuts) if that is longer.
Duration EffectiveLinger(const WriterOptions& options, Duration put_estimate);

// The checks Writer::Start makes of its options (node id, window, slot cap,
// budget, linger), for callers that must refuse bad options before they act
// on the node (the engine checks them before it mints an epoch).
Status ValidateWriterOptions(const WriterOptions& options);

// The cut pace's PUT latency estimate after a PUT that took `sample`: an
// average over about 8 PUTs of samples clipped to 4 times the estimate (the
// first to 50 ms), so that one PUT held up for seconds (a store's stall, a
// cold connection) does not space cuts out for the dozens of PUTs it would
// take to fade. A store that is truly slower raises it by up to 37.5 % a PUT.
Duration NextPutEstimate(Duration estimate, Duration sample);

class Writer {
 public:
  static Result<std::unique_ptr<Writer>> Start(std::shared_ptr<objstore::ObjectStore> store,
                                               WriterOptions options);
  ~Writer();  // Close()
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Room in the pool budget, taken ahead of an Append. Owned by the caller,
  // on one thread at a time; it must not outlive its writer. What no Append
  // used goes back to the pool when it is destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept
        : writer_(std::exchange(o.writer_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation();
    size_t bytes() const { return bytes_; }
    // Moves the room for an append of `payload_bytes` (or what is left, if
    // less) into a reservation of its own.
    Reservation Split(size_t payload_bytes);

   private:
    friend class Writer;
    Writer* writer_ = nullptr;
    size_t bytes_ = 0;  // charged to the pool, not yet used
  };

  // Admits `batches` (one or more whole Kafka v2 record batches of one stream)
  // and returns at once; `done` runs later, exactly once, with OK (durable) or
  // an error. Blocks while the pool is over budget, until `deadline`: then
  // kResourceExhausted with the cause, and `done` is never called. Bad input is
  // kInvalidArgument; after Close kCancelled.
  Status Append(uint64_t stream_id, std::string batches, AckCallback done, TimePoint deadline);
  // The same for bytes the caller keeps sharing (the engine's log cache):
  // the writer only reads them, and drops its reference once the slot is built.
  Status Append(uint64_t stream_id, std::shared_ptr<const std::string> batches, AckCallback done,
                TimePoint deadline);
  // Waits (until `deadline`, as Append does) for room for an append of up to
  // `payload_bytes`, and holds it. A caller that appends under a lock of its
  // own reserves before taking that lock: a release's callbacks may need the
  // lock, and the pool's room comes back only through releases. More than the
  // whole budget is kInvalidArgument at once (no wait could make room).
  Result<Reservation> Reserve(size_t payload_bytes, TimePoint deadline);
  // What each append takes from the pool besides its bytes (the entry, its
  // callback and its bookkeeping).
  static constexpr size_t kEntryOverhead = 64;
  // Room for appends of `payload_bytes` in all, made of `appends` entries,
  // if the pool has it now (no wait, no stall counted); else none.
  std::optional<Reservation> TryReserve(size_t payload_bytes, size_t appends);
  // Closed or abandoned: no append will be taken again (a wait for room is
  // for nothing).
  bool takes_no_appends() const;
  // Appends from `room` and never blocks: a charge past the reservation is
  // admitted only if the pool has room for it now.
  Status Append(uint64_t stream_id, std::shared_ptr<const std::string> batches, AckCallback done,
                Reservation* room);

  // After a halt, and after the owner fenced the halted epoch and found every
  // slot below `cut` committed: acknowledges those, and re-publishes the
  // entries of the slots at or after `cut` (and everything still pooled) into
  // `new_epoch`, from seq 0, in their original order. Refused once Close
  // began (kPreconditionFailed), and (kInvalidArgument) for a cut past the
  // slots cut so far, or past the halted slot unless the owner read the slots
  // from `read_back_from` to the cut back as our own flights (a PUT that
  // landed with its answer lost, whose envelope read back garbled until the
  // halt) and the halt has not moved below `read_back_from` since.
  Status Resume(uint64_t new_epoch, uint64_t cut, std::optional<uint64_t> read_back_from = std::nullopt);
  // After a halt, when this node lost its streams: acknowledges slots below
  // `cut` (committed), fails every other pending entry with `reason`; those
  // never cut into a slot (certainly not written) with `unwritten` if it is
  // set, as later appends.
  // (A cut past the halted slot as for Resume.)
  Status Abandon(uint64_t cut, const Status& reason, const Status& unwritten = Status::Ok(),
                 std::optional<uint64_t> read_back_from = std::nullopt);

  // Stops admission and waits until everything admitted is acknowledged (or,
  // if halted, fails what cannot be acknowledged with kCancelled; after
  // close_timeout, fails what is not durable with kUnavailable); joins threads.
  void Close();
  // After Close: true if it acknowledged everything admitted; false if it
  // failed appends (halted, or close_timeout), some of which may still land.
  bool closed_clean() const;

  uint64_t epoch() const;
  // Reads of a slot's envelope after a 412 that must fail to decode, in a
  // row, before the slot is taken for another writer's (a halt).
  static constexpr int kUnreadableEnvelopeReads = 5;
  uint64_t nonce() const { return options_.nonce; }
  std::optional<uint64_t> halted_seq() const;
  // How long the oldest slot not yet durable has been claimed, or, if
  // less, since slots were last released (acknowledged; zero if none is
  // pending): a store that fails or hangs shows here while the uploader
  // retries, and so does a halt waiting for its fence; a slow store whose
  // slots still land, in order, does not. Any thread.
  Duration StalledFor(TimePoint now) const;
  // (epoch, seq): every slot before it in chain order is released and its
  // acknowledgement callbacks have returned. It waits up to 100 ms for a
  // running release round, then answers as of the round before: it may lag
  // the acknowledgements delivered by then, never lead them. The settle
  // task's target (settling less is safe).
  std::pair<uint64_t, uint64_t> released_below() const;
  WalMetrics& metrics() { return metrics_; }
  const WriterOptions& options() const { return options_; }

 private:
  struct Entry;
  struct Slot;

  Writer(std::shared_ptr<objstore::ObjectStore> store, WriterOptions options);
  void FlusherLoop();
  void UploaderLoop();
  void Upload(const std::shared_ptr<Slot>& slot);
  void BuildSlot(Slot& slot, std::string buffer);
  // Marks a halt at (epoch, seq) if it is the first or an earlier one.
  void Halt(const std::shared_ptr<Slot>& slot, const Status& reason);
  // Releases every slot at the front that is durable; one thread at a time.
  void DrainReleases();
  std::string DiagnoseStall(TimePoint now) const;  // needs mu_
  // Under mu_ (held by lk): waits until `charge` more bytes fit the budget,
  // until `deadline`; the error to return otherwise.
  Status WaitForRoom(std::unique_lock<std::mutex>& lk, size_t charge, TimePoint start, TimePoint deadline);
  Status AppendImpl(uint64_t stream_id, std::shared_ptr<const std::string> batches, AckCallback done,
                    TimePoint deadline, Reservation* room);
  void Unreserve(size_t bytes);
  // mu_ held: `charge` more of the pool, held by the reservation returned.
  Reservation Hold(size_t charge);
  void Requeue(std::vector<std::shared_ptr<Slot>>& slots);  // needs mu_
  Status CheckCut(uint64_t cut, std::optional<uint64_t> read_back_from) const;  // needs mu_ and a halt
  // Sleeps `d`, or less once the writer stops or `slot` is abandoned or at
  // or past a halt: false then.
  bool SleepUnlessDone(const Slot& slot, Duration d);


  std::shared_ptr<objstore::ObjectStore> store_;
  WriterOptions options_;
  WalMetrics metrics_;

  mutable std::mutex mu_;
  std::condition_variable flush_cv_;   // flusher: pool or window changed
  std::condition_variable upload_cv_;  // uploaders: job queued
  std::condition_variable space_cv_;   // appenders: budget freed
  mutable std::condition_variable idle_cv_;  // releases done, halts, stop
  std::deque<Entry> pool_;             // admitted, not yet cut (FIFO)
  size_t pool_uncut_bytes_ = 0;
  size_t held_bytes_ = 0;              // admitted and not yet released (budget)
  std::deque<std::shared_ptr<Slot>> slots_;  // claimed, unreleased, claim order
  std::deque<std::shared_ptr<Slot>> jobs_;   // claimed, waiting for an uploader
  uint64_t epoch_;
  uint64_t next_seq_;
  std::optional<uint64_t> halted_seq_;
  Status halt_reason_;
  bool closing_ = false;
  bool closed_clean_ = false;  // Close acknowledged everything admitted (closed_clean)
  bool stop_ = false;
  // Append wakes the flusher once the uncut pool reaches this many bytes
  // (1 when it waits for data, the cut size under linger, max while it waits
  // for window room, which releases signal).
  size_t flusher_wake_at_ = SIZE_MAX;
  std::vector<std::string> spare_buffers_;  // released slot buffers, reused by BuildSlot
  // Cut pacing: under load, cuts are spaced put_ewma_/window apart so the
  // window holds slots evenly spread in time instead of in waves
  // (put_ewma_: NextPutEstimate over the PUTs so far).
  Duration put_ewma_ = Duration::zero();
  TimePoint last_cut_;
  TimePoint last_release_ = Now();  // slots were last released (StalledFor)
  // Every slot before (epoch, seq) in chain order has been released and its
  // callbacks have returned.
  std::pair<uint64_t, uint64_t> released_below_;
  Status dead_reason_;  // set by Abandon: why Append now fails
  bool releasing_ = false;  // a thread is running release callbacks

  std::thread flusher_;
  std::vector<std::thread> uploaders_;
};

}  // namespace weir::wal
