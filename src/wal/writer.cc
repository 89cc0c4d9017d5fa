#include "wal/writer.h"

#include <algorithm>
#include <random>
#include <unordered_set>

#include "base/log.h"
#include "base/thread.h"
#include "wal/record_batch.h"
#include "wal/slot_format.h"

namespace weir::wal {

namespace {
// Released slot buffers kept for reuse (at most this many, each up to the cap):
// building into warm memory avoids page faults on every slot.
constexpr size_t kMaxSpareBuffers = 4;

uint64_t RandomNonce() {
  std::random_device rd;
  uint64_t n = 0;
  while (n == 0) n = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return n;
}
}  // namespace

struct Writer::Entry {
  uint64_t stream_id = 0;
  std::shared_ptr<const std::string> bytes;  // dropped once the slot is built; see offset/length
  uint32_t length = 0;
  uint32_t batch_count = 0;
  uint32_t record_count = 0;
  uint64_t offset = 0;  // object-absolute, once built
  AckCallback done;
  TimePoint submitted;
};

// One cut slot. Made and filled with entries by the flusher under mu_; shared
// (shared_ptr) by slots_, jobs_ and the uploader writing it until released,
// in slot order. Read by uploaders and Resume/Abandon/Close: the notes below
// say what guards each field after the cut.
struct Writer::Slot {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  std::vector<Entry> entries;
  size_t charge = 0;
  TimePoint claimed;
  TimePoint durable_at;  // set with `durable`
  // Guarded by build_mu: the serialized object and the entries' positions.
  std::mutex build_mu;
  bool built = false;
  std::string bytes;
  // Guarded by Writer::mu_.
  bool durable = false;
  bool recyclable = false;  // durable through its own upload: no thread reads bytes any more
  bool abandoned = false;  // superseded by Resume/Abandon/Close: uploader stops
  uint64_t attempts = 0;
  Status last_error;
};

Status ValidateWriterOptions(const WriterOptions& options) {
  WEIR_RETURN_IF_ERROR(ValidateNodeId(options.node));
  if (options.window < 1 || options.window > 1024) {
    return InvalidArgument("WAL pipeline window must be 1..1024, got {}", options.window);
  }
  size_t min_cap = kEnvelopeSize + kFooterFixedSize + kFooterEntrySize + kRecordBatchHeaderSize;
  if (options.slot_cap_bytes < min_cap || options.slot_cap_bytes > (1u << 30)) {
    return InvalidArgument("WAL slot size cap must be {}..{} bytes, got {}", min_cap, 1u << 30,
                           options.slot_cap_bytes);
  }
  if (options.budget_bytes < options.slot_cap_bytes) {
    return InvalidArgument("WAL pool budget ({} bytes) must be at least the slot size cap ({} bytes)",
                           options.budget_bytes, options.slot_cap_bytes);
  }
  if (options.linger < Duration::zero()) return InvalidArgument("WAL linger must not be negative");
  if (!(options.linger_put_share >= 0 && options.linger_put_share <= 1)) {
    return InvalidArgument("WAL linger's share of the PUT latency must be 0..1, got {}", options.linger_put_share);
  }
  return Status::Ok();
}

Duration EffectiveLinger(const WriterOptions& options, Duration put_estimate) {
  const auto from_puts = std::chrono::duration_cast<Duration>(put_estimate * options.linger_put_share);
  return std::max(options.linger, std::min(kMaxLingerFromPuts, from_puts));
}

Duration NextPutEstimate(Duration estimate, Duration sample) {
  if (estimate <= Duration::zero()) return std::min<Duration>(sample, std::chrono::milliseconds(50));
  return (estimate * 7 + std::min(sample, estimate * 4)) / 8;
}

Result<std::unique_ptr<Writer>> Writer::Start(std::shared_ptr<objstore::ObjectStore> store,
                                              WriterOptions options) {
  if (!store) return InvalidArgument("WAL writer needs an object store");
  WEIR_RETURN_IF_ERROR(ValidateWriterOptions(options));
  if (options.nonce == 0) options.nonce = RandomNonce();
  std::unique_ptr<Writer> w(new Writer(std::move(store), std::move(options)));
  w->flusher_ = std::thread([p = w.get()] { p->FlusherLoop(); });
  for (int i = 0; i < w->options_.window; ++i) {
    w->uploaders_.emplace_back([p = w.get()] { p->UploaderLoop(); });
  }
  return w;
}

Writer::Writer(std::shared_ptr<objstore::ObjectStore> store, WriterOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      epoch_(options_.epoch),
      next_seq_(options_.first_seq),
      released_below_(options_.epoch, options_.first_seq) {}

Writer::~Writer() { Close(); }

uint64_t Writer::epoch() const {
  std::lock_guard lk(mu_);
  return epoch_;
}

std::optional<uint64_t> Writer::halted_seq() const {
  std::lock_guard lk(mu_);
  return halted_seq_;
}

Duration Writer::StalledFor(TimePoint now) const {
  std::lock_guard lk(mu_);
  for (const auto& slot : slots_) {  // claim order: the first found is the oldest
    if (!slot->durable && !slot->abandoned) {
      return std::max(Duration::zero(), std::min(now - slot->claimed, now - last_release_));
    }
  }
  return Duration::zero();
}

std::pair<uint64_t, uint64_t> Writer::released_below() const {
  // If callbacks are running, wait (briefly) for that round to finish so
  // every acknowledgement already delivered is covered by the answer.
  std::unique_lock lk(mu_);
  idle_cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return !releasing_; });
  return released_below_;
}

Status Writer::Append(uint64_t stream_id, std::string batches, AckCallback done, TimePoint deadline) {
  return Append(stream_id, std::make_shared<const std::string>(std::move(batches)), std::move(done), deadline);
}

Status Writer::Append(uint64_t stream_id, std::shared_ptr<const std::string> shared, AckCallback done,
                      TimePoint deadline) {
  return AppendImpl(stream_id, std::move(shared), std::move(done), deadline, nullptr);
}

Status Writer::Append(uint64_t stream_id, std::shared_ptr<const std::string> shared, AckCallback done,
                      Reservation* room) {
  if (!room || room->writer_ != this) return InvalidArgument("WAL append: a reservation of another writer");
  return AppendImpl(stream_id, std::move(shared), std::move(done), TimePoint::min(), room);
}

Result<Writer::Reservation> Writer::Reserve(size_t payload_bytes, TimePoint deadline) {
  const TimePoint start = Now();
  const size_t charge = payload_bytes + kEntryOverhead;
  // Would wait for ever (and be told to retry): the budget is set too small.
  if (charge > options_.budget_bytes) {
    return InvalidArgument("an append of {} bytes cannot fit the WAL pool budget of {} bytes; raise the budget",
                           charge, options_.budget_bytes);
  }
  std::unique_lock lk(mu_);
  WEIR_RETURN_IF_ERROR(WaitForRoom(lk, charge, start, deadline));
  return Hold(charge);
}

std::optional<Writer::Reservation> Writer::TryReserve(size_t payload_bytes, size_t appends) {
  const size_t charge = payload_bytes + appends * kEntryOverhead;
  std::lock_guard lk(mu_);
  if (closing_ || held_bytes_ + charge > options_.budget_bytes) return std::nullopt;
  return Hold(charge);
}

Writer::Reservation Writer::Hold(size_t charge) {
  held_bytes_ += charge;
  metrics_.pool_bytes.store(static_cast<int64_t>(held_bytes_), std::memory_order_relaxed);
  Reservation r;
  r.writer_ = this;
  r.bytes_ = charge;
  return r;
}

Writer::Reservation Writer::Reservation::Split(size_t payload_bytes) {
  Reservation r;
  r.writer_ = writer_;
  r.bytes_ = std::min(bytes_, payload_bytes + kEntryOverhead);
  bytes_ -= r.bytes_;
  return r;
}

void Writer::Unreserve(size_t bytes) {
  {
    std::lock_guard lk(mu_);
    held_bytes_ -= bytes;
    metrics_.pool_bytes.store(static_cast<int64_t>(held_bytes_), std::memory_order_relaxed);
  }
  space_cv_.notify_all();
}

Writer::Reservation& Writer::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    if (writer_ && bytes_ > 0) writer_->Unreserve(bytes_);
    writer_ = std::exchange(o.writer_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Writer::Reservation::~Reservation() {
  if (writer_ && bytes_ > 0) writer_->Unreserve(bytes_);
}

Status Writer::WaitForRoom(std::unique_lock<std::mutex>& lk, size_t charge, TimePoint start, TimePoint deadline) {
  auto closed = [&] {
    return dead_reason_.ok() ? Cancelled("WAL writer {} is closed", options_.node) : dead_reason_;
  };
  if (closing_) return closed();
  if (charge == 0 || held_bytes_ + charge <= options_.budget_bytes) return Status::Ok();
  (halted_seq_ ? metrics_.stall_budget_halted : metrics_.stall_budget_uploads).fetch_add(1);
  auto has_room = [&] { return closing_ || held_bytes_ + charge <= options_.budget_bytes; };
  bool room = true;
  if (deadline == TimePoint::max()) {
    space_cv_.wait(lk, has_room);
  } else {
    room = space_cv_.wait_until(lk, deadline, has_room);
  }
  if (closing_) return closed();
  if (!room) {
    metrics_.admission_timeouts.fetch_add(1);
    // No wait asked for (the caller waited for room its own way first).
    if (deadline <= start) return ResourceExhausted("no room for the append in the WAL: {}", DiagnoseStall(Now()));
    return ResourceExhausted("WAL admission timed out after {:.0f} ms: {}", ToMillis(Now() - start),
                             DiagnoseStall(Now()));
  }
  return Status::Ok();
}

Status Writer::AppendImpl(uint64_t stream_id, std::shared_ptr<const std::string> shared, AckCallback done,
                          TimePoint deadline, Reservation* room) {
  TimePoint start = Now();
  if (!shared) return InvalidArgument("WAL append of stream {}: no record batches", stream_id);
  const std::string& batches = *shared;
  if (batches.empty()) return InvalidArgument("WAL append of stream {}: no record batches", stream_id);
  Entry e;
  size_t pos = 0;
  while (pos < batches.size()) {
    auto h = ParseBatchHeader(std::string_view(batches).substr(pos));
    if (!h.ok()) {
      return InvalidArgument("WAL append of stream {}: batch {} at byte {}: {}", stream_id, e.batch_count, pos,
                             h.status().message());
    }
    ++e.batch_count;
    e.record_count += static_cast<uint32_t>(h->record_count);
    pos += h->total_size();
  }
  size_t max_payload = options_.slot_cap_bytes - kEnvelopeSize - kFooterFixedSize - kFooterEntrySize;
  if (batches.size() > max_payload) {
    return InvalidArgument("WAL append of stream {}: {} bytes exceeds the largest slot payload ({} bytes)",
                           stream_id, batches.size(), max_payload);
  }
  e.stream_id = stream_id;
  e.length = static_cast<uint32_t>(batches.size());
  e.bytes = std::move(shared);
  e.done = std::move(done);
  e.submitted = start;
  size_t charge = e.length + kEntryOverhead;

  std::unique_lock lk(mu_);
  // From a reservation, what it covers is already counted in held_bytes_.
  const size_t covered = room ? std::min(room->bytes_, charge) : 0;
  WEIR_RETURN_IF_ERROR(WaitForRoom(lk, charge - covered, start, deadline));
  if (room) room->bytes_ -= covered;
  held_bytes_ += charge - covered;
  pool_uncut_bytes_ += e.length;
  metrics_.appends.fetch_add(1, std::memory_order_relaxed);
  metrics_.append_bytes.fetch_add(e.length, std::memory_order_relaxed);
  metrics_.records.fetch_add(e.record_count, std::memory_order_relaxed);
  metrics_.pool_bytes.store(static_cast<int64_t>(held_bytes_), std::memory_order_relaxed);
  pool_.push_back(std::move(e));
  bool wake = pool_uncut_bytes_ >= flusher_wake_at_;
  if (wake) flusher_wake_at_ = SIZE_MAX;  // one signal per flusher wait
  lk.unlock();
  if (wake) flush_cv_.notify_one();
  return Status::Ok();
}

void Writer::FlusherLoop() {
  SetThreadName("wal-flusher");
  std::unique_lock lk(mu_);
  bool window_stalled = false;
  std::unordered_set<uint64_t> streams;
  while (!stop_) {
    bool have = !pool_.empty() && !halted_seq_;
    if (have && slots_.size() >= static_cast<size_t>(options_.window)) {
      if (!window_stalled) metrics_.stall_window.fetch_add(1, std::memory_order_relaxed);
      window_stalled = true;
    }
    if (!have || slots_.size() >= static_cast<size_t>(options_.window)) {
      flusher_wake_at_ = pool_.empty() && !halted_seq_ ? 1 : SIZE_MAX;
      flush_cv_.wait(lk);
      flusher_wake_at_ = SIZE_MAX;
      continue;
    }
    window_stalled = false;
    if (!closing_ && pool_uncut_bytes_ + kEnvelopeSize + kFooterFixedSize < options_.slot_cap_bytes) {
      // Not yet a full slot: wait for the linger deadline (anchored by the
      // oldest byte) and for the pace; an idle node has passed both already.
      TimePoint due = std::max(pool_.front().submitted + EffectiveLinger(options_, put_ewma_),
                               last_cut_ + put_ewma_ / options_.window);
      if (Now() < due) {
        flusher_wake_at_ = options_.slot_cap_bytes - kEnvelopeSize - kFooterFixedSize;
        flush_cv_.wait_until(lk, due);
        flusher_wake_at_ = SIZE_MAX;
        continue;
      }
    }
    // Cut and claim in one step: cut order is slot order.
    auto slot = std::make_shared<Slot>();
    slot->epoch = epoch_;
    slot->seq = next_seq_++;
    slot->claimed = last_cut_ = Now();
    size_t size = kEnvelopeSize + kFooterFixedSize;
    streams.clear();
    while (!pool_.empty()) {
      Entry& e = pool_.front();
      size_t add = e.length + (streams.count(e.stream_id) ? 0 : kFooterEntrySize);
      if (!slot->entries.empty() && size + add > options_.slot_cap_bytes) break;
      size += add;
      streams.insert(e.stream_id);
      pool_uncut_bytes_ -= e.length;
      slot->charge += e.length + kEntryOverhead;
      metrics_.cut_wait_ns.Record(static_cast<uint64_t>((slot->claimed - e.submitted).count()));
      slot->entries.push_back(std::move(e));
      pool_.pop_front();
    }
    slots_.push_back(slot);
    jobs_.push_back(slot);
    metrics_.slots_in_flight.store(static_cast<int64_t>(slots_.size()), std::memory_order_relaxed);
    upload_cv_.notify_one();
  }
}

void Writer::UploaderLoop() {
  SetThreadName("wal-upload");
  std::unique_lock lk(mu_);
  while (true) {
    upload_cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_
    std::shared_ptr<Slot> slot = std::move(jobs_.front());
    jobs_.pop_front();
    if (slot->abandoned) continue;
    lk.unlock();
    Upload(slot);
    lk.lock();
  }
}

void Writer::BuildSlot(Slot& slot, std::string buffer) {
  std::lock_guard lk(slot.build_mu);
  // Emptied: abandoned (Requeue, Abandon) before its uploader came to build it.
  if (slot.built || slot.entries.empty()) return;
  SlotBuilder b;
  for (const Entry& e : slot.entries) b.Add(e.stream_id, *e.bytes, e.batch_count, e.record_count);
  b.FinishInto(slot.epoch, slot.seq, options_.nonce, &buffer);
  for (size_t i = 0; i < slot.entries.size(); ++i) {
    slot.entries[i].offset = b.position(i);
    slot.entries[i].bytes.reset();  // the slot holds the writer's copy now
  }
  metrics_.slot_size_bytes.Record(buffer.size());
  metrics_.slot_entries.Record(slot.entries.size());
  slot.bytes = std::move(buffer);
  slot.built = true;
}

bool Writer::SleepUnlessDone(const Slot& slot, Duration d) {
  std::unique_lock lk(mu_);
  // Resume, Abandon and Halt notify idle_cv_ (Resume and Abandon through
  // DrainReleases): an uploader backing off learns at once that its slot
  // went, and takes the next job.
  return !idle_cv_.wait_for(lk, d, [&] {
    return stop_ || slot.abandoned || (halted_seq_ && slot.epoch == epoch_ && slot.seq >= *halted_seq_);
  });
}

void Writer::Upload(const std::shared_ptr<Slot>& slot) {
  std::string buffer;
  {
    std::lock_guard lk(mu_);
    if (!spare_buffers_.empty()) {
      buffer = std::move(spare_buffers_.back());
      spare_buffers_.pop_back();
    }
  }
  BuildSlot(*slot, std::move(buffer));
  if (!slot->built) return;  // abandoned and emptied: nothing to write
  const std::string key = SlotKey(options_.node, slot->epoch, slot->seq);
  const std::string& bytes = slot->bytes;
  TimePoint start = Now();
  Duration backoff = options_.retry_initial;
  std::minstd_rand jitter(static_cast<uint32_t>(slot->seq ^ options_.nonce));
  auto wait_backoff = [&] {
    std::uniform_real_distribution<double> u(0.5, 1.0);
    auto d = std::chrono::duration_cast<Duration>(backoff * u(jitter));
    backoff = std::min<Duration>(backoff * 2, options_.retry_max);
    return SleepUnlessDone(*slot, d);
  };
  bool durable = false;
  TimePoint attempt_start = start;
  int unreadable = 0;  // envelopes read back after a 412 that did not decode, in a row
  while (!durable) {
    {
      std::lock_guard lk(mu_);
      if (slot->abandoned || stop_) return;
      // A halt at or below this slot means it can never be acknowledged in this epoch.
      if (halted_seq_ && slot->epoch == epoch_ && slot->seq >= *halted_seq_) return;
      if (slot->attempts++ > 0) metrics_.put_retries.fetch_add(1, std::memory_order_relaxed);
    }
    metrics_.put_attempts.fetch_add(1, std::memory_order_relaxed);
    attempt_start = Now();
    objstore::PutOptions po;
    po.if_none_match = true;
    Status st = store_->Put(key, bytes, po);
    if (st.ok()) {
      durable = true;
      break;
    }
    if (st.code() == Code::kPreconditionFailed) {
      // Our earlier attempt may have landed (ambiguous), or someone else owns the slot.
      auto head = store_->Get(key, objstore::ByteRange{0, kEnvelopeSize});
      if (!head.ok() && (head.status().code() == Code::kNotFound || head.status().retryable())) {
        unreadable = 0;  // no envelope read: the count is of unreadable ones in a row
        if (head.status().code() != Code::kNotFound) st = head.status().WithContext("reading envelope after 412");
      } else {
        // An envelope read back, or a read that fails for good (a slot an
        // express quorum can no longer decide: kCorruption; a refused
        // ranged read).
        Result<Envelope> env = head.ok() ? DecodeEnvelope(*head) : Result<Envelope>(head.status());
        if (env.ok() && env->kind == SlotKind::kFlight && env->nonce == options_.nonce &&
            env->epoch == slot->epoch && env->seq == slot->seq) {
          metrics_.put_ambiguous_resolved.fetch_add(1, std::memory_order_relaxed);
          durable = true;
          break;
        }
        // An envelope that does not decode may be a read that went wrong (a
        // short body, a proxy's page): read again, as after a failed read,
        // before taking the slot for another writer's (a halt; the fence
        // then reads it too). So is one that cannot be read, rather than
        // this slot retrying for ever.
        if (!env.ok() && ++unreadable < kUnreadableEnvelopeReads) {
          st = env.status().WithContext(fmt::format("reading envelope after 412 (read {})", unreadable));
        } else {
          Status why = !env.ok() ? Fenced("slot {} cannot be read back after a 412: an unreadable envelope or a "
                                          "failing read ({}; read {} times)",
                                          key, env.status().message(), unreadable)
                       : env->kind == SlotKind::kPoison
                           ? Fenced("slot {} was poisoned by a fencer (nonce {:#x})", key, env->nonce)
                           : Fenced("slot {} holds another writer's flight (nonce {:#x}, ours {:#x})", key,
                                    env->nonce, options_.nonce);
          Halt(slot, why);
          return;
        }
      }
      // kNotFound: the occupant vanished; simply try the PUT again.
    } else {
      unreadable = 0;  // the count is of reads after 412s in a row
    }
    {
      std::lock_guard lk(mu_);
      slot->last_error = st;
    }
    if (slot->attempts == 1 || slot->attempts % 10 == 0) {
      Log().warn("WAL PUT {} failed (attempt {}): {}; retrying", key, slot->attempts, st.ToString());
    }
    if (!wait_backoff()) return;
  }
  Duration took = Now() - start;
  metrics_.put_latency_ns.Record(static_cast<uint64_t>(took.count()));
  metrics_.slots.fetch_add(1, std::memory_order_relaxed);
  metrics_.slot_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
  {
    std::lock_guard lk(mu_);
    // The pace follows the store's PUT latency: the attempt that landed,
    // not the backoff of an outage before it.
    put_ewma_ = NextPutEstimate(put_ewma_, Now() - attempt_start);
    if (slot->abandoned) return;
    slot->durable = true;
    slot->durable_at = Now();
    slot->recyclable = true;
  }
  DrainReleases();
}

void Writer::Halt(const std::shared_ptr<Slot>& slot, const Status& reason) {
  bool first = false;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  {
    std::lock_guard lk(mu_);
    if (slot->abandoned || slot->epoch != epoch_) return;
    first = !halted_seq_;
    if (!halted_seq_ || slot->seq < *halted_seq_) {
      halted_seq_ = slot->seq;
      halt_reason_ = reason;
    }
    epoch = epoch_;
    seq = *halted_seq_;
    if (first) metrics_.halts.fetch_add(1);
  }
  Log().error("WAL chain {}/{} halted at slot {}: {}", options_.node, epoch, seq, reason.message());
  idle_cv_.notify_all();  // a Close waiting to drain sees the halt now, whatever on_halt does
  if (first && options_.on_halt) options_.on_halt(epoch, seq, reason);
}

void Writer::DrainReleases() {
  std::unique_lock lk(mu_);
  if (releasing_) return;  // that thread loops until nothing is releasable
  releasing_ = true;
  std::vector<std::shared_ptr<Slot>> ready;
  while (true) {
    ready.clear();
    while (!slots_.empty() && slots_.front()->durable) {
      ready.push_back(std::move(slots_.front()));
      slots_.pop_front();
    }
    if (ready.empty()) break;
    last_release_ = Now();
    metrics_.slots_in_flight.store(static_cast<int64_t>(slots_.size()), std::memory_order_relaxed);
    // The budget comes back before the callbacks run: an appender waiting
    // for room holds its stream's lock, which the callbacks of that stream
    // take (log::Engine::OnDurable); freeing after them made such an append
    // wait out its whole admission timeout, with every ack held behind it.
    // The slot buffers are freed (or kept as spares) first. The entries'
    // bytes pass to the callbacks (the engine's log cache, with its own bound).
    size_t freed = 0;
    std::vector<std::string> spares;
    for (const auto& slot : ready) {
      freed += slot->charge;
      if (!slot->recyclable) continue;  // an uploader may still read its bytes
      if (spares.size() < kMaxSpareBuffers) {
        spares.push_back(std::move(slot->bytes));
      } else {
        std::string().swap(slot->bytes);
      }
    }
    for (auto& buf : spares) {
      if (spare_buffers_.size() >= kMaxSpareBuffers) break;
      spare_buffers_.push_back(std::move(buf));
    }
    held_bytes_ -= freed;
    metrics_.pool_bytes.store(static_cast<int64_t>(held_bytes_), std::memory_order_relaxed);
    lk.unlock();
    space_cv_.notify_all();
    flush_cv_.notify_one();  // window room
    TimePoint now = Now();
    for (const auto& slot : ready) {
      auto held = static_cast<uint64_t>((now - slot->durable_at).count());
      for (Entry& e : slot->entries) {
        metrics_.ack_latency_ns.Record(static_cast<uint64_t>((now - e.submitted).count()));
        metrics_.release_wait_ns.Record(held);
        if (e.done) e.done(Status::Ok(), AckInfo{slot->epoch, slot->seq, e.offset, e.length});
      }
    }
    std::pair<uint64_t, uint64_t> below{ready.back()->epoch, ready.back()->seq + 1};
    ready.clear();
    lk.lock();
    released_below_ = std::max(released_below_, below);
    idle_cv_.notify_all();
  }
  releasing_ = false;
  idle_cv_.notify_all();
}

std::string Writer::DiagnoseStall(TimePoint now) const {
  if (halted_seq_) {
    return fmt::format("the WAL chain {}/{} halted at slot {} ({}); waiting for fence and resume", options_.node,
                       epoch_, *halted_seq_, halt_reason_.message());
  }
  std::string s = fmt::format(
      "pool budget of {} bytes is full: {} pooled entries ({} bytes) and {} slots in flight (window {})",
      options_.budget_bytes, pool_.size(), pool_uncut_bytes_, slots_.size(), options_.window);
  if (!slots_.empty()) {
    const Slot& oldest = *slots_.front();
    s += fmt::format("; uploads are slow: oldest slot {} claimed {:.0f} ms ago, {} PUT attempts", oldest.seq,
                     ToMillis(now - oldest.claimed), oldest.attempts);
    if (!oldest.last_error.ok()) s += fmt::format(", last error: {}", oldest.last_error.ToString());
  }
  return s;
}

void Writer::Requeue(std::vector<std::shared_ptr<Slot>>& slots) {
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    Slot& slot = **it;
    std::lock_guard blk(slot.build_mu);
    for (auto e = slot.entries.rbegin(); e != slot.entries.rend(); ++e) {
      if (slot.built) e->bytes = std::make_shared<const std::string>(slot.bytes, e->offset, e->length);
      pool_uncut_bytes_ += e->length;
      pool_.push_front(std::move(*e));
      metrics_.republished_entries.fetch_add(1, std::memory_order_relaxed);
    }
    slot.entries.clear();
  }
}

Status Writer::Resume(uint64_t new_epoch, uint64_t cut, std::optional<uint64_t> read_back_from) {
  {
    std::lock_guard lk(mu_);
    if (!halted_seq_) return PreconditionFailed("WAL chain {}/{} is not halted", options_.node, epoch_);
    // Close decides the halted chain's end itself (it abandons from the cut).
    if (closing_) return PreconditionFailed("WAL chain {}/{} is closing", options_.node, epoch_);
    if (Status st = CheckCut(cut, read_back_from); !st.ok()) return st;
    if (new_epoch <= epoch_) return InvalidArgument("new epoch {} must exceed {}", new_epoch, epoch_);
    std::vector<std::shared_ptr<Slot>> requeue;
    for (auto it = slots_.begin(); it != slots_.end();) {
      Slot& slot = **it;
      if (slot.epoch == epoch_ && slot.seq >= cut) {
        slot.abandoned = true;
        requeue.push_back(*it);
        it = slots_.erase(it);
        continue;
      }
      if (slot.epoch == epoch_) {
        slot.durable = true;  // committed: the fence found it
        slot.durable_at = Now();
        slot.abandoned = true;
      }
      ++it;
    }
    std::erase_if(jobs_, [](const auto& s) { return s->abandoned; });
    Requeue(requeue);
    Log().warn("WAL chain {} resumes in epoch {}: {} slots committed below cut {}, {} slots re-published",
               options_.node, new_epoch, cut, cut, requeue.size());
    epoch_ = new_epoch;
    next_seq_ = 0;
    halted_seq_.reset();
    halt_reason_ = Status::Ok();
    metrics_.slots_in_flight.store(static_cast<int64_t>(slots_.size()), std::memory_order_relaxed);
  }
  flush_cv_.notify_one();
  DrainReleases();
  return Status::Ok();
}

Status Writer::CheckCut(uint64_t cut, std::optional<uint64_t> read_back_from) const {
  if (cut > *halted_seq_ && !(read_back_from && *read_back_from <= *halted_seq_)) {
    return InvalidArgument("fence cut {} is past the halted slot {}", cut, *halted_seq_);
  }
  if (cut > next_seq_) return InvalidArgument("fence cut {} is past the slots cut ({})", cut, next_seq_);
  return Status::Ok();
}

Status Writer::Abandon(uint64_t cut, const Status& reason, const Status& unwritten,
                       std::optional<uint64_t> read_back_from) {
  std::vector<Entry> failed;
  size_t in_slots = 0;  // failed[0, in_slots) were cut into slots; the rest never were
  {
    std::lock_guard lk(mu_);
    if (!halted_seq_) return PreconditionFailed("WAL chain {}/{} is not halted", options_.node, epoch_);
    if (Status st = CheckCut(cut, read_back_from); !st.ok()) return st;
    for (auto it = slots_.begin(); it != slots_.end();) {
      Slot& slot = **it;
      slot.abandoned = true;
      if (slot.epoch == epoch_ && slot.seq >= cut) {
        {
          std::lock_guard blk(slot.build_mu);  // released before the erase may free the slot
          for (Entry& e : slot.entries) failed.push_back(std::move(e));
          slot.entries.clear();  // an uploader about to build it finds nothing to read
        }
        held_bytes_ -= slot.charge;
        it = slots_.erase(it);
        continue;
      }
      slot.durable = true;
      slot.durable_at = Now();
      ++it;
    }
    std::erase_if(jobs_, [](const auto& s) { return s->abandoned; });
    in_slots = failed.size();
    for (Entry& e : pool_) {
      held_bytes_ -= e.length + kEntryOverhead;
      failed.push_back(std::move(e));
    }
    pool_.clear();
    pool_uncut_bytes_ = 0;
    closing_ = true;
    dead_reason_ = reason.ok() ? Fenced("WAL chain {} was abandoned", options_.node) : reason;
    if (!unwritten.ok()) dead_reason_ = unwritten;  // what appends from now on get
    metrics_.pool_bytes.store(static_cast<int64_t>(held_bytes_), std::memory_order_relaxed);
  }
  space_cv_.notify_all();
  DrainReleases();
  {
    // Callbacks run in append order: the OKs of the slots below the cut go
    // out first, also when another thread is releasing them. (Abandon is
    // never called from a release callback.)
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return !releasing_ && slots_.empty(); });
  }
  const Status why = reason.ok() ? Fenced("WAL chain {} was abandoned", options_.node) : reason;
  for (size_t i = 0; i < failed.size(); ++i) {
    if (failed[i].done) failed[i].done(i >= in_slots && !unwritten.ok() ? unwritten : why, AckInfo{});
  }
  return Status::Ok();
}

bool Writer::takes_no_appends() const {
  std::lock_guard lk(mu_);
  return closing_;
}

bool Writer::closed_clean() const {
  std::lock_guard lk(mu_);
  return closed_clean_;
}

void Writer::Close() {
  std::unique_lock lk(mu_);
  if (stop_) return;
  closing_ = true;
  space_cv_.notify_all();
  flush_cv_.notify_all();
  // Drain: everything admitted is cut, uploaded and released, unless the
  // chain halts, or close_timeout passes first (a failing or slow store).
  const auto deadline = std::chrono::steady_clock::now() + options_.close_timeout;
  bool drained = idle_cv_.wait_until(lk, deadline,
                                     [&] { return (slots_.empty() && pool_.empty()) || halted_seq_.has_value(); });
  Status why = Cancelled("WAL writer {} closed while halted", options_.node);
  // Under mu_, after close_timeout: as a halt at the first slot not yet
  // durable. The slots below it are released, the rest (and the pool) fail,
  // their uploads stop.
  auto cut_at_first_not_durable = [&] {
    uint64_t cut = next_seq_;
    for (const auto& slot : slots_) {
      if (slot->epoch == epoch_ && !slot->durable) {
        cut = slot->seq;
        break;
      }
    }
    halted_seq_ = halted_seq_ ? std::min(*halted_seq_, cut) : cut;
    why = Unavailable("the WAL's last writes were not durable {:.0f} s after the server began closing (the object "
                      "store is failing or slow); the append may or may not be stored",
                      ToMillis(options_.close_timeout) / 1000);
    Log().error("WAL chain {}/{}: {}", options_.node, epoch_, why.message());
  };
  if (!drained) cut_at_first_not_durable();
  closed_clean_ = !halted_seq_.has_value();
  if (halted_seq_) {
    uint64_t cut = *halted_seq_;
    lk.unlock();
    // Slots below the halt are committed or will be: let them finish, then
    // fail the rest. One of them may halt too (a poison found later): the
    // cut moves down to it, or this would wait for a slot that never lands.
    // One whose PUT keeps failing past close_timeout moves it down as well.
    {
      std::unique_lock lk2(mu_);
      // (Slots of an earlier epoch, left from before a Resume, are all below
      // the cut: seqs start again at 0 in each epoch.)
      auto below_done = [&] {
        if (halted_seq_) cut = std::min(cut, *halted_seq_);
        return slots_.empty() || (slots_.front()->epoch == epoch_ && slots_.front()->seq >= cut);
      };
      if (!idle_cv_.wait_until(lk2, deadline, below_done)) {
        if (drained) cut_at_first_not_durable();  // else done above, at the same deadline
        idle_cv_.wait(lk2, below_done);  // what is left below the cut is durable: released soon
      }
    }
    Abandon(cut, why).IgnoreError();
    lk.lock();
  }
  stop_ = true;
  lk.unlock();
  flush_cv_.notify_all();
  upload_cv_.notify_all();
  idle_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  for (auto& t : uploaders_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace weir::wal
