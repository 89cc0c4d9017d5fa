// Settle, trim and retention: acknowledged WAL slots become per-stream
// segments; the metastore learns about them in one transaction per cycle.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "base/log.h"
#include "base/thread.h"
#include "log/engine_internal.h"
#include "wal/fence.h"
#include "wal/slot_format.h"

namespace weir::log {

namespace {
bool Before(const wal::AckInfo& where, const metastore::ChainPosition& p) {
  return std::pair(where.epoch, where.seq) < std::pair(p.epoch, p.seq);
}
// The bytes the batch starting `data` says it spans (at least 12 bytes in
// hand): its length field, unchecked, plus the 12 before it.
uint64_t BatchBytes(std::string_view data) { return 12 + uint64_t{LoadBE32(data.data() + 8)}; }
}  // namespace

namespace {
std::atomic<size_t> parallel_threads{0};  // started by ForEachParallel, not yet joined

bool TakeParallelThread() {
  for (size_t n = parallel_threads.load(); n < kMaxParallelThreads;) {
    if (parallel_threads.compare_exchange_weak(n, n + 1)) return true;
  }
  return false;
}
}  // namespace

size_t ParallelThreadsRunning() { return parallel_threads.load(); }

void ForEachParallel(size_t n, size_t workers, const char* thread_name, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(std::max<size_t>(workers, 1), n); ++t) {
    if (!TakeParallelThread()) break;  // the ones there (and this one) do it all
    try {
      threads.emplace_back([&] {
        SetThreadName(thread_name);
        work();
      });
    } catch (const std::system_error&) {  // out of threads: likewise
      parallel_threads--;
      break;
    }
  }
  work();
  for (auto& t : threads) t.join();
  parallel_threads -= threads.size();
}

std::string SegmentKey(uint64_t stream_id, uint64_t start, uint64_t end, uint64_t epoch) {
  return fmt::format("seg/{:020}/{:020}-{:020}-e{}", stream_id, start, end, epoch);
}

std::optional<uint64_t> SegmentKeyEpoch(std::string_view key) {
  size_t slash = key.rfind('/');
  size_t e = key.rfind("-e");
  if (slash == std::string_view::npos || e == std::string_view::npos || e < slash) return std::nullopt;
  std::string_view digits = key.substr(e + 2);
  uint64_t epoch = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), epoch);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) return std::nullopt;
  return epoch;
}

Status Engine::ReadBack(const std::vector<BatchRef>& refs, size_t parallel, std::vector<ReadBackBytes>* out) {
  struct Run {
    size_t first = 0, last = 0;  // indexes into refs, inclusive
    uint64_t length = 0;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < refs.size(); ++i) {
    const wal::AckInfo& w = refs[i].where;
    if (refs[i].bytes) continue;
    if (!runs.empty() && runs.back().last + 1 == i) {
      const wal::AckInfo& p = refs[i - 1].where;
      if (p.epoch == w.epoch && p.seq == w.seq && p.offset + p.length == w.offset) {
        runs.back().last = i;
        runs.back().length += w.length;
        continue;
      }
    }
    runs.push_back(Run{i, i, w.length});
  }
  if (runs.empty()) return Status::Ok();  // all cached (settle's usual case): `out` is never looked at
  out->assign(refs.size(), ReadBackBytes{});
  std::vector<Status> failed(runs.size());
  ForEachParallel(runs.size(), parallel, "read-back", [&](size_t k) {
    const Run& run = runs[k];
    const wal::AckInfo& w = refs[run.first].where;
    const std::string key = wal::SlotKey(options_.node, w.epoch, w.seq);
    // The run's batches from its range, or from the whole slot (`whole`).
    auto take = [&](bool whole) -> Status {
      std::optional<objstore::ByteRange> range;
      if (!whole) range = objstore::ByteRange{w.offset, run.length};
      auto got = wal_store_->Get(key, range);
      if (!got.ok()) return got.status().WithContext("reading an unsettled batch");
      const uint64_t base = whole ? w.offset : 0;
      if (got->size() < base || got->size() - base < run.length || (!whole && got->size() != run.length)) {
        return Corruption("WAL slot {}/{}: batches at byte {} are cut short", w.epoch, w.seq, w.offset);
      }
      // Only the run's bytes are kept (a whole slot is up to the slot cap).
      auto buffer = std::make_shared<const std::string>(whole ? got->substr(base, run.length) : std::move(*got));
      size_t at = 0;
      for (size_t i = run.first; i <= run.last; ++i) {
        const std::string_view view = std::string_view(*buffer).substr(at, refs[i].where.length);
        // The batch's CRC (a range is not covered by the slot's), and its
        // offsets, which the CRC does not cover, against the index: damaged
        // bytes are an error, not records served (or settled) as they are.
        auto h = wal::VerifyBatch(view);
        if (!h.ok() || h->total_size() != view.size() || static_cast<uint64_t>(h->base_offset) != refs[i].start ||
            static_cast<uint64_t>(h->last_offset()) + 1 != refs[i].end) {
          return Corruption("WAL slot {}/{}: the batch at byte {} is not offsets [{}, {}) ({})", w.epoch, w.seq,
                            refs[i].where.offset, refs[i].start, refs[i].end,
                            h.ok() ? fmt::format("it holds [{}, {}]", h->base_offset, h->last_offset())
                                   : h.status().ToString());
        }
        (*out)[i] = ReadBackBytes{buffer, view};
        at += refs[i].where.length;
      }
      return Status::Ok();
    };
    Status st = take(false);
    if (st.code() == Code::kCorruption) {
      // Once more, whole: a quorum WAL store checks a whole copy it returns
      // and passes a damaged one over for the next holder, which it cannot
      // do for a range.
      Status whole = take(true);
      if (whole.ok()) {
        Log().warn("WAL slot {}/{}: a range read back was damaged ({}); the whole slot read back holds it intact",
                   w.epoch, w.seq, st.message());
      }
      st = std::move(whole);  // damaged there too, or a failure to retry (a slot settled and deleted meanwhile)
    }
    failed[k] = std::move(st);
  });
  for (Status& st : failed) WEIR_RETURN_IF_ERROR(st);
  return Status::Ok();
}

void Engine::SettleLoop() {
  SetThreadName("settle");
  std::unique_lock lk(settle_wait_mu_);
  while (!closing_) {
    settle_cv_.wait_for(lk, options_.settle_interval, [&] { return closing_ || settle_requested_; });
    if (closing_) break;
    settle_requested_ = false;
    if (superseded_) continue;  // nothing it does could commit (said when it was found)
    lk.unlock();
    Status st = SettleDue();
    if (!st.ok()) {
      metrics_.settle_failures.fetch_add(1);
      Log().warn("settle: {}", st.ToString());
    }
    // Whatever settle did: retention works on settled segments only, and a
    // settle that keeps failing must not also keep expired data for ever.
    if (Now() - last_retention_ >= options_.retention_interval) {
      if (Status r = ApplyRetention(); !r.ok()) Log().warn("retention: {}", r.ToString());
    }
    if (options_.merge_interval > Duration::zero() && Now() - last_merge_ >= options_.merge_interval) {
      if (Status m = MergeSegmentsNow(); !m.ok()) Log().warn("merging segments: {}", m.ToString());
    }
    lk.lock();
  }
}

Status Engine::SettleNow() { return Settle(true); }

Status Engine::SettleDue() { return Settle(false); }

Status Engine::Settle(bool all) {
  std::lock_guard settle(settle_mu_);
  WEIR_RETURN_IF_ERROR(RefuseIfSuperseded("settle"));
  auto [rel_epoch, rel_seq] = wal_->released_below();
  const metastore::ChainPosition released{rel_epoch, rel_seq};
  // Rounds, each holding at most about log_cache_bytes of batches read back
  // from slots, until everything released (and due) is settled.
  bool more = true;
  while (more) WEIR_RETURN_IF_ERROR(SettleRound(released, all, &more));
  return Status::Ok();
}

Status Engine::SettleRound(metastore::ChainPosition target, bool all, bool* more) {
  *more = false;
  if (std::pair(target.epoch, target.seq) <= std::pair(checkpoint_.epoch, checkpoint_.seq)) return Status::Ok();

  // What each stream holds before the target, and which of them settle now.
  struct Held {
    std::shared_ptr<Stream> stream;
    uint64_t bytes = 0, cached = 0;
    TimePoint oldest{};
    metastore::ChainPosition first;  // its first batch's slot
    bool due = false;
  };
  std::vector<Held> held;
  {
    std::vector<std::shared_ptr<Stream>> streams;
    {
      std::lock_guard lk(mu_);
      streams.reserve(by_id_.size());
      for (auto& [id, s] : by_id_) streams.push_back(s);
    }
    for (auto& s : streams) {
      Held h;
      std::lock_guard lk(s->mu);
      for (const BatchRef& b : s->durable) {
        if (!Before(b.where, target)) break;
        if (h.bytes == 0) h = Held{s, 0, 0, b.acked, {b.where.epoch, b.where.seq}, false};
        h.bytes += b.where.length;
        if (b.bytes) h.cached += b.bytes->size();
      }
      if (h.bytes > 0) held.push_back(std::move(h));
    }
  }
  // A backlog half full settles everything, as does SettleNow.
  all = all || options_.settle_min_bytes == 0 || unsettled_bytes_.load() >= options_.max_unsettled_bytes / 2 ||
        unsettled_batches_.load() >= options_.max_unsettled_batches / 2;
  const TimePoint now = Now();
  uint64_t waiting_cached = 0;
  for (Held& h : held) {
    h.due = all || h.bytes >= options_.settle_min_bytes || h.oldest == TimePoint{} ||  // replayed
            now - h.oldest >= options_.settle_max_delay;
    if (!h.due) waiting_cached += h.cached;
  }
  // The log cache over a quarter full (settle was asked early): the streams
  // caching most settle until those left cache at most an eighth of it.
  if (!all && cache_bytes_.load() > options_.log_cache_bytes / 4 && waiting_cached > options_.log_cache_bytes / 8) {
    std::vector<Held*> waiting;
    for (Held& h : held) {
      if (!h.due) waiting.push_back(&h);
    }
    std::sort(waiting.begin(), waiting.end(), [](const Held* a, const Held* b) { return a->cached > b->cached; });
    for (Held* h : waiting) {
      if (waiting_cached <= options_.log_cache_bytes / 8) break;
      h->due = true;
      waiting_cached -= h->cached;
    }
  }
  // Batches no longer cached are read back and held until their segment is
  // written: stop this round at the slot where they would pass the budget.
  {
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, uint64_t>> uncached;  // slot, bytes
    for (const Held& h : held) {
      if (!h.due) continue;
      std::lock_guard lk(h.stream->mu);
      for (const BatchRef& b : h.stream->durable) {
        if (!Before(b.where, target)) break;
        if (!b.bytes) uncached.push_back({{b.where.epoch, b.where.seq}, b.where.length});
      }
    }
    std::sort(uncached.begin(), uncached.end());
    uint64_t in_round = 0;  // in whole slots before uncached[i]
    for (size_t i = 0; i < uncached.size();) {
      const auto slot = uncached[i].first;
      uint64_t bytes = 0;
      for (; i < uncached.size() && uncached[i].first == slot; ++i) bytes += uncached[i].second;
      if (in_round > 0 && in_round + bytes > options_.log_cache_bytes) {
        // At least one earlier slot is in this round, so it settles something.
        target = metastore::ChainPosition{slot.first, slot.second};
        *more = true;
        break;
      }
      in_round += bytes;
    }
  }
  // The checkpoint stops at the first slot of a stream left waiting: the
  // slots from there on stay, for its batches.
  metastore::ChainPosition next = target;
  uint64_t waiting_streams = 0, waiting_bytes = 0;
  for (const Held& h : held) {
    if (h.due) continue;
    waiting_streams++;
    waiting_bytes += h.bytes;
    if (std::pair(h.first.epoch, h.first.seq) < std::pair(next.epoch, next.seq)) next = h.first;
  }
  metrics_.settle_waiting_streams.store(waiting_streams);
  metrics_.settle_waiting_bytes.store(waiting_bytes);
  struct Work {
    std::shared_ptr<Stream> stream;
    size_t batches = 0;
    StreamFacts settled;
    metastore::SegmentInfo segment;
  };
  std::vector<Work> work;
  std::vector<SegmentObject> objects;  // parallel to segments
  std::vector<metastore::SegmentInfo> segments;
  std::vector<metastore::StreamState> states;
  // Every due stream's batches of this round, then what is no longer cached
  // read back for all of them at once (in parallel, a GET per run in a slot).
  std::vector<BatchRef> refs;
  std::vector<std::pair<std::shared_ptr<Stream>, size_t>> firsts;  // each stream's first index in refs
  for (const Held& h : held) {
    if (!h.due) continue;
    const std::shared_ptr<Stream>& s = h.stream;
    const size_t first = refs.size();
    {
      std::lock_guard lk(s->mu);
      for (const BatchRef& b : s->durable) {
        if (!Before(b.where, target)) break;
        refs.push_back(b);
      }
    }
    if (refs.size() > first) firsts.emplace_back(s, first);
  }
  std::vector<ReadBackBytes> read_back;
  WEIR_RETURN_IF_ERROR(ReadBack(refs, options_.segment_uploads, &read_back));
  for (size_t k = 0; k < firsts.size(); ++k) {
    const std::shared_ptr<Stream>& s = firsts[k].first;
    const size_t first = firsts[k].second, end = k + 1 < firsts.size() ? firsts[k + 1].second : refs.size();
    Work w{s, end - first, s->settled, {}};
    // The segment is written from the batches where they are (cached, or read
    // back from their slot): views into buffers `object` holds, no copy.
    SegmentObject object;
    SegmentBuilder builder(s->info.id);
    for (size_t i = first; i < end; ++i) {
      const BatchRef& ref = refs[i];
      std::string_view bytes;
      if (ref.bytes) {
        bytes = *ref.bytes;
        object.held.push_back(ref.bytes);
        metrics_.settle_cached_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
      } else {
        bytes = read_back[i].view;
        if (object.held.empty() || object.held.back() != read_back[i].buffer) object.held.push_back(read_back[i].buffer);
        metrics_.settle_reread_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
      }
      // Cached bytes were verified on append; bytes read back are checked again.
      WEIR_RETURN_IF_ERROR(ApplyBatch(&w.settled, bytes, ref.bytes != nullptr, ref.commands)
                               .WithContext(fmt::format("settling stream {}", s->info.id)));
      WEIR_RETURN_IF_ERROR(builder.AddView(bytes));
    }
    WEIR_ASSIGN_OR_RETURN(object.tail, builder.FinishTail());
    object.parts = builder.views();
    object.size = builder.data_bytes() + object.tail.size();
    const SegmentFooter& f = builder.footer();
    metastore::SegmentInfo seg{s->info.id, f.start_offset, f.end_offset, f.first_timestamp_ms,
                               f.last_timestamp_ms, SegmentKey(s->info.id, f.start_offset, f.end_offset, epoch_.load()),
                               object.size};
    objects.push_back(std::move(object));
    w.segment = seg;
    segments.push_back(seg);
    states.push_back(metastore::StreamState{s->info.id, w.settled.next_offset, w.settled.trim_point,
                                            w.settled.fencing_token, w.settled.last_timestamp_ms,
                                            w.settled.producers.Serialize()});
    work.push_back(std::move(w));
  }

  read_back.clear();  // the segments hold what they use
  if (segments.empty() && next == checkpoint_) {  // every stream waits
    if (undeleted_slots_from_) DeleteSlots(checkpoint_, checkpoint_);  // deletes that failed before
    return Status::Ok();
  }
  std::vector<std::string> created;
  WEIR_RETURN_IF_ERROR(UploadSegments(segments, objects, &created));
  objects.clear();  // releases the batches read back for this cycle
  Status committed = meta_->CommitSettle(options_.node, epoch_.load(), checkpoint_, next, segments, states);
  if (!committed.ok()) {
    // Rejected (another epoch, a moved checkpoint, a bad row): nothing landed.
    // Any other failure may have (a timeout, or a COMMIT whose fsync failed
    // and that SQLite replays from its WAL at the next open).
    const Code c = committed.code();
    const bool rejected =
        c == Code::kPreconditionFailed || c == Code::kAlreadyExists || c == Code::kInvalidArgument;
    if (!rejected) {
      // The commit may have landed: settle cannot go on until it knows (the
      // next round's commit would expect the old checkpoint for ever).
      Result<bool> landed = SettleLanded(checkpoint_, next, segments);
      if (landed.ok() && *landed) {
        Log().info("settle: the commit that answered {} had landed", committed.ToString());
        committed = Status::Ok();
      }
    }
    if (!committed.ok()) {
      // Rejected: what this round created is garbage, unless a successor
      // may have written and indexed the same keys (CreatedObjectsAreOurs).
      // Still unknown: the objects stay, and the next start's sweep decides.
      if (rejected && CreatedObjectsAreOurs(committed)) store_->DeleteMany(created).IgnoreError();
      NoteIfSuperseded(committed);
      return committed.WithContext("committing settle");
    }
  }
  metastore::ChainPosition old = checkpoint_;
  checkpoint_ = next;
  metrics_.settle_cycles.fetch_add(1);
  uint64_t settled_bytes = 0, settled_batches = 0;
  std::vector<std::string> orphans;  // segments of streams deleted meanwhile: no row names them
  for (Work& w : work) {
    Stream& s = *w.stream;
    s.settled = std::move(w.settled);
    std::lock_guard lk(s.mu);
    if (s.deleted) orphans.push_back(w.segment.object_key);
    for (size_t i = 0; i < w.batches && !s.durable.empty(); ++i) {
      if (s.durable.front().bytes) cache_bytes_ -= s.durable.front().bytes->size();
      settled_bytes += s.durable.front().where.length;
      settled_batches++;
      s.durable.pop_front();
    }
    s.segments.Append(w.segment);
  }
  if (settled_batches > 0) SettledBytes(settled_bytes, settled_batches);
  DeleteObjects(std::move(orphans), "segments settled for deleted streams");
  DeleteSlots(old, next);
  return Status::Ok();
}

Result<bool> Engine::SettleLanded(const metastore::ChainPosition& from, const metastore::ChainPosition& target,
                                  const std::vector<metastore::SegmentInfo>& segments) {
  // Asks until it knows (or the engine closes; Close's final settle asks a
  // few times): no later round can commit before this is known, since each
  // expects the checkpoint it leaves.
  Status last;
  Duration backoff = std::chrono::milliseconds(50);
  for (int attempt = 1; !closing_ || (final_settle_ && attempt <= 5); ++attempt) {
    // Only this node's epoch moves its checkpoint (a successor's epoch,
    // whatever its checkpoint, means no later round of ours commits).
    auto node = meta_->GetNode(options_.node);
    if (node.ok() && (node->epoch != epoch_.load() || node->checkpoint != target)) return false;
    if (node.ok() && from != target) return true;
    // The checkpoint stayed (a stream waits at it): the round landed if a
    // segment of it is indexed (those of streams deleted meanwhile are not,
    // and a round of only those is harmless to commit again).
    if (node.ok()) {
      bool found = false;
      for (const metastore::SegmentInfo& seg : segments) {
        auto at = meta_->FindSegments(seg.stream_id, seg.start_offset, 1);
        if (!at.ok()) {
          node = at.status();
          break;
        }
        if (!at->empty() && at->front().start_offset == seg.start_offset && at->front().object_key == seg.object_key) {
          found = true;
          break;
        }
      }
      if (node.ok()) return found;
    }
    last = node.status();
    Log().warn("settle: reading the checkpoint back after an ambiguous commit: {}; retrying", last.ToString());
    std::this_thread::sleep_for(backoff);
    backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(2));
  }
  return last.ok() ? Cancelled("closing") : last;
}

Status Engine::UploadSegments(const std::vector<metastore::SegmentInfo>& segments,
                              const std::vector<SegmentObject>& objects, std::vector<std::string>* created) {
  // Create-only PUTs, up to segment_uploads at a time. A 412 means an earlier
  // cycle of this process wrote the same key (same range, same bytes, same
  // epoch) and either failed to commit or committed without knowing it: not
  // this call's to delete.
  std::vector<Status> results(segments.size());
  std::vector<char> made(segments.size(), 0);
  ForEachParallel(segments.size(), options_.segment_uploads, "segment-upload", [&](size_t i) {
    objstore::PutOptions po;
    po.if_none_match = true;
    std::vector<std::string_view> parts = objects[i].parts;
    parts.push_back(objects[i].tail);
    Duration backoff = std::chrono::milliseconds(20);
    for (int attempt = 1;; ++attempt) {
      Status st = store_->PutParts(segments[i].object_key, parts, po);
      results[i] = st.code() == Code::kPreconditionFailed ? Status::Ok() : st;
      // A retry's 412 may follow our own attempt that landed unseen: ours
      // or an earlier cycle's, it is kept (recovery's sweep removes it if
      // nothing commits it).
      if (st.ok()) made[i] = 1;
      if (results[i].ok() || !results[i].retryable() || attempt == 5 || (closing_ && !final_settle_)) break;
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
  });
  Status first;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!results[i].ok() && first.ok()) first = results[i].WithContext("writing segment " + segments[i].object_key);
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if (made[i]) created->push_back(segments[i].object_key);
  }
  if (!first.ok()) {
    // Nothing of this cycle is committed: what it created is garbage now,
    // unless a successor may have indexed the same keys (as after a refused
    // commit: CreatedObjectsAreOurs).
    if (!created->empty()) {
      if (HoldsItsNode()) {
        store_->DeleteMany(*created).IgnoreError();
      } else {
        Log().warn("settle: {} segments written by a failed round stay for the next start's sweep (the node may "
                   "be a successor's, or the metastore cannot say)",
                   created->size());
      }
    }
    return first;
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    metrics_.segments_written.fetch_add(1);
    metrics_.segment_bytes.fetch_add(objects[i].size);
  }
  return Status::Ok();
}

void Engine::DeleteSlots(const metastore::ChainPosition& round_from, const metastore::ChainPosition& to) {
  const metastore::ChainPosition from = undeleted_slots_from_.value_or(round_from);
  std::vector<std::string> keys;
  for (uint64_t e = std::max<uint64_t>(from.epoch, 1); e <= to.epoch; ++e) {
    uint64_t first = e == from.epoch ? from.seq : 0;
    uint64_t last = to.seq;  // exclusive, for the target's epoch
    if (e < to.epoch) {
      auto cut = epoch_cuts_.find(e);
      if (cut == epoch_cuts_.end()) continue;  // an epoch this process never fenced: left to recovery
      last = cut->second;
    }
    for (uint64_t q = first; q < last; ++q) keys.push_back(wal::SlotKey(options_.node, e, q));
  }
  if (keys.empty()) return;
  Status st = wal_store_->DeleteMany(keys);
  if (!st.ok()) {
    // Some may be gone: deleting them again is harmless.
    const bool keep = keys.size() <= kMaxUndeletedSlots;
    Log().warn("deleting {} settled WAL slots: {}; {}", keys.size(), st.ToString(),
               keep ? "the next settle round tries them again" : "left to the next start's sweep");
    undeleted_slots_from_ = keep ? std::optional(from) : std::nullopt;
    return;
  }
  undeleted_slots_from_.reset();
  metrics_.slots_deleted.fetch_add(keys.size());
}

Status Engine::SweepGarbage() {
  // Runs at start, before the settle task: lists what earlier processes may
  // have left behind and deletes what no committed state refers to.
  // 1. WAL flights below the checkpoint (a crash between the settle commit and
  //    the slot deletes). Poisons (exactly an envelope) stay: they keep zombie
  //    writers of old epochs from extending their chains.
  std::vector<std::string> garbage;
  std::string prefix = fmt::format("wal/{}/", options_.node);
  for (std::string after;;) {
    WEIR_ASSIGN_OR_RETURN(auto page, wal_store_->List(prefix, after, 1000));
    for (const auto& obj : page.objects) {
      uint64_t epoch = 0, seq = 0;
      if (std::sscanf(obj.key.c_str() + prefix.size(), "%20" SCNu64 "/%20" SCNu64, &epoch, &seq) != 2) continue;
      bool below = std::pair(epoch, seq) < std::pair(checkpoint_.epoch, checkpoint_.seq);
      if (below && obj.size > wal::kEnvelopeSize) garbage.push_back(obj.key);
    }
    if (page.next_start_after.empty()) break;
    after = page.next_start_after;
  }
  if (!garbage.empty()) {
    Log().info("deleting {} settled WAL slots left behind by earlier runs", garbage.size());
    if (Status st = wal_store_->DeleteMany(garbage); !st.ok()) Log().warn("deleting them: {}", st.ToString());
    garbage.clear();
  }
  // 2. Segment objects no index row names: a crash between upload and
  //    commit, or a stream deleted while a settle round wrote its segment
  //    (the commit skips a deleted stream's rows), or a delete whose object
  //    deletes failed.
  //    Stream ids come from a counter and are never reused: a segment of an
  //    id above the counter as recovery read it (before loading the streams)
  //    belongs to a stream created since (by another process on the same
  //    metastore) and is left alone, unless replay loaded that stream; one
  //    of an id at or below it that no loaded stream has belongs to a
  //    deleted stream.
  //    A key written in this epoch or a later one (`-e<epoch>`) is never
  //    judged: a successor that took the node over while this listing ran
  //    may have committed it after the rows were loaded.
  //    Not while taking a dead node over: a later node of the list, not yet
  //    superseded, may still commit segments this engine did not load; the
  //    node starting sweeps once every takeover is done.
  if (taking_over_) return Status::Ok();
  std::set<std::string> known;
  for (auto& [id, s] : by_id_) {
    for (const auto& seg : s->segments) known.insert(seg.object_key);
  }
  for (std::string after;;) {
    WEIR_ASSIGN_OR_RETURN(auto page, store_->List("seg/", after, 1000));
    for (const auto& obj : page.objects) {
      uint64_t id = 0;
      if (std::sscanf(obj.key.c_str(), "seg/%20" SCNu64 "/", &id) != 1) continue;
      if (id > last_stream_id_at_start_ && by_id_.count(id) == 0) continue;  // created since: not ours to judge
      if (SegmentKeyEpoch(obj.key).value_or(0) >= epoch_.load()) continue;  // written since this start
      if (!known.count(obj.key)) garbage.push_back(obj.key);
    }
    if (page.next_start_after.empty()) break;
    after = page.next_start_after;
  }
  if (garbage.empty()) return Status::Ok();
  // Keys carry an epoch but not the writing node's id, so `-e<epoch>` above
  // only orders this node's own keys. Another node that took this one over
  // while the listing ran (it minted this node's next epoch) may have
  // committed segments of its own epochs since the rows were loaded: once
  // superseded, judge nothing.
  WEIR_ASSIGN_OR_RETURN(metastore::NodeState self, meta_->GetNode(options_.node));
  if (self.epoch != epoch_.load()) {
    Log().warn("not deleting {} unreferenced segment objects: node {} is now at epoch {} (this process holds {})",
               garbage.size(), options_.node, self.epoch, epoch_.load());
    return Status::Ok();
  }
  Log().info("deleting {} objects left behind by earlier runs", garbage.size());
  return store_->DeleteMany(garbage);
}

Status Engine::ApplyRetention() {
  std::lock_guard settle(settle_mu_);  // not while a merge swaps segments
  last_retention_ = Now();
  WEIR_RETURN_IF_ERROR(RefuseIfSuperseded("retention"));
  RetryUndeletedObjects();
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, s] : by_id_) streams.push_back(s);
  }
  // Streams a delete may have removed (its answer lost, and the metastore
  // could not say): forgotten once their row is known gone, appendable again
  // once it is known there. Nothing else would ask (a table's retried delete
  // finds no table; a user need not retry).
  for (auto& s : streams) {
    bool unknown;
    {
      std::lock_guard lk(s->mu);
      unknown = s->delete_unknown && !s->deleted;
    }
    if (unknown) DeleteObjects(AfterFailedDelete(s), fmt::format("segments of stream {}", s->info.name));
  }
  // Streams whose config a failed change may have set: read it now (until
  // a read fails: the metastore is away); retention goes by no age for
  // those it still cannot read (the stored config may keep more).
  {
    std::vector<std::shared_ptr<Stream>> unknown;
    for (auto& s : streams) {
      std::lock_guard lk(s->mu);
      if (s->config_unknown && !s->deleted) unknown.push_back(s);
    }
    if (!unknown.empty()) {
      std::lock_guard config_lk(config_mu_);
      ReloadConfigsLocked(unknown);
    }
  }
  int64_t now_ms = WallMillis();
  Status first_error;
  struct Cut {
    std::shared_ptr<Stream> stream;
    uint64_t below = 0;
  };
  // The offset below which a stream's segments go (0: none), by its config
  // and trim point now.
  auto cut_of = [now_ms](Stream& s) {
    uint64_t below = 0;
    std::lock_guard lk(s.mu);
    // A config that may have changed unseen: trims only (they need none).
    int64_t age = s.config_unknown ? 0 : s.info.config.retention_age_s;
    const int64_t cutoff_ms = now_ms - std::min<int64_t>(age, INT64_MAX / 1000) * 1000;
    for (const auto& seg : s.segments) {
      if (seg.end_offset > s.durable_trim_point) {
        if (age <= 0) break;
        // No timestamps (Kafka's NO_TIMESTAMP, -1): no age of its own (Kafka
        // ages such a segment by its file's time); it goes with the first
        // later segment that expires, whose records came after its own.
        if (seg.last_timestamp_ms < 0) continue;
        if (seg.last_timestamp_ms >= cutoff_ms) break;
      }
      below = seg.end_offset;
    }
    return below;
  };
  std::vector<Cut> cuts;
  for (auto& s : streams) {
    if (uint64_t below = cut_of(*s); below != 0) cuts.push_back(Cut{s, below});
  }
  // A transaction's worth of streams at a time; a chunk that fails is tried
  // again next pass, and the chunks after it go on.
  const size_t per_txn = std::clamp<size_t>(options_.retention_streams_per_txn, 1, metastore::Metastore::kMaxSegmentCuts);
  for (size_t begin = 0; begin < cuts.size(); begin += per_txn) {
    const size_t end = std::min(cuts.size(), begin + per_txn);
    std::vector<metastore::SegmentCut> chunk;
    Result<std::vector<metastore::SegmentInfo>> removed = std::vector<metastore::SegmentInfo>{};
    {
      // No reconfiguration between a chunk's cuts and their deletion: the
      // chunks before may have taken seconds, and a retention raised (and
      // acknowledged) meanwhile must keep what it keeps. Each cut is taken
      // again under the lock (a reconfiguration updates memory within it).
      std::lock_guard config_lk(config_mu_);
      for (size_t i = begin; i < end; ++i) {
        cuts[i].below = cut_of(*cuts[i].stream);
        if (cuts[i].below != 0) chunk.push_back({cuts[i].stream->info.id, cuts[i].below});
      }
      if (!chunk.empty()) removed = meta_->DeleteSegmentsBelow(options_.node, epoch_.load(), chunk);
    }
    if (!removed.ok()) {
      if (first_error.ok()) {
        first_error = removed.status().WithContext(
            fmt::format("{} stream(s) from id {}", end - begin, cuts[begin].stream->info.id));
      }
      if (NoteIfSuperseded(removed.status())) break;  // every chunk would be refused
      continue;
    }
    std::unordered_map<uint64_t, std::vector<std::string>> removed_keys;  // by stream, ascending
    for (const auto& seg : *removed) removed_keys[seg.stream_id].push_back(seg.object_key);
    std::vector<std::string> garbage;  // the chunk's objects, deleted together
    for (size_t i = begin; i < end; ++i) {
      const auto& s = cuts[i].stream;
      const uint64_t below = cuts[i].below;
      if (below == 0) continue;  // nothing of it was due any more
      std::vector<std::string> keys = std::move(removed_keys[s->info.id]);
      bool as_read = true;  // the rows removed are the segments memory drops
      std::vector<std::string> expected;  // the objects memory drops
      {
        std::lock_guard lk(s->mu);
        for (const auto& seg : s->segments) {
          if (seg.end_offset > below) break;
          as_read = as_read && expected.size() < keys.size() && keys[expected.size()] == seg.object_key;
          expected.push_back(seg.object_key);
        }
        as_read = as_read && expected.size() == keys.size();
        if (as_read) {
          s->segments.EraseFront(expected.size());
        }
      }
      // Otherwise memory missed a merge swap that landed (a row may span
      // `below`), or an earlier pass removed rows and lost the answer: memory
      // takes the metastore's rows, and the objects it expected to drop that no
      // row names any more go too.
      if (!as_read) {
        if (Status st = ReloadSegments(s); !st.ok()) {
          // Memory may still name these objects: readers would find them gone.
          // The rows are gone, so the next start's sweep deletes them.
          if (first_error.ok()) first_error = st.WithContext(fmt::format("stream {}", s->info.id));
          continue;
        }
        std::lock_guard lk(s->mu);
        std::set<std::string> named(keys.begin(), keys.end());  // copies: keys grows below
        for (const auto& seg : s->segments) named.insert(seg.object_key);
        for (std::string& key : expected) {
          if (named.count(key) == 0) keys.push_back(std::move(key));
        }
      }
      for (std::string& key : keys) garbage.push_back(std::move(key));
    }
    DeleteObjects(std::move(garbage), "expired segments", /*expired=*/true);
  }
  Status empty = DeleteEmptyStreams();
  return first_error.ok() ? empty : first_error;
}

Status Engine::DeleteEmptyStreams() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, s] : by_id_) streams.push_back(s);
  }
  const int64_t now_ms = WallMillis();
  // Under s->mu: no record held, nothing in flight, quiet for min_age.
  auto due = [&](const Stream& s) {
    const int64_t min_age_s = s.info.config.delete_on_empty_min_age_s;
    if (min_age_s <= 0 || s.deleted || s.deleting || s.config_unknown || !s.pending.empty() ||
        LogStart(s) < s.live.next_offset) {
      return false;
    }
    const int64_t quiet_since = std::max({s.info.created_at_ms, s.last_append_ms, opened_ms_});
    return now_ms - quiet_since >= std::min<int64_t>(min_age_s, INT64_MAX / 1000) * 1000;
  };
  std::vector<std::string> garbage;  // segment objects, deleted once the lock is released
  // No reconfiguration between the check of a stream's config and its deletion.
  std::unique_lock config_lk(config_mu_);
  for (auto& s : streams) {
    {
      std::lock_guard lk(s->mu);
      if (!due(*s)) continue;
    }
    // A table's bucket stream goes only with its table (the metastore would
    // refuse it): skipped here, without holding off its appends.
    if (auto bucket = metastore::ParseBucketStreamName(s->info.name)) {
      auto table = meta_->GetTable(s->info.basin, bucket->table);
      if (table.ok() && bucket->bucket < table->bucket_count) continue;
    }
    int64_t min_age_s = 0;
    {
      // Appends check `deleting` under this lock: none is admitted from here on.
      std::lock_guard lk(s->mu);
      if (!due(*s)) continue;
      s->deleting = true;
      min_age_s = s->info.config.delete_on_empty_min_age_s;
    }
    // Only if this node still holds its epoch and the stored config still
    // asks for it (a reconfiguration updates the metastore first); never a
    // table's bucket stream (checked again there, in the transaction).
    auto keys = meta_->DeleteEmptyStream(s->info.id, options_.node, epoch_.load());
    if (!keys.ok()) {
      if (keys.status().code() == Code::kPreconditionFailed) {  // refused: superseded, or the config changed
        {
          std::lock_guard lk(s->mu);
          s->deleting = false;
        }
        Log().warn("delete_on_empty: keeping stream {}/{}: {}", s->info.basin, s->info.name, keys.status().ToString());
        continue;
      }
      // Failed, or not found (deleted by a user meanwhile, or by an earlier
      // attempt whose answer was lost): forgotten if its row is gone, else
      // it stays (refusing appends if that cannot be known). Appends stay
      // refused until then: one acknowledged meanwhile would go with the row.
      std::vector<std::string> held = AfterFailedDelete(s);
      garbage.insert(garbage.end(), held.begin(), held.end());
      {
        std::lock_guard lk(s->mu);
        if (!s->deleted) s->deleting = false;  // delete_unknown, if set, refuses them now
      }
      if (!IsForgotten(*s)) {
        Log().warn("delete_on_empty: keeping stream {}/{}: {}", s->info.basin, s->info.name, keys.status().ToString());
      }
      continue;
    }
    garbage.insert(garbage.end(), keys->begin(), keys->end());
    std::vector<std::string> held = Forget(s);
    garbage.insert(garbage.end(), held.begin(), held.end());
    metrics_.empty_streams_deleted.fetch_add(1);
    Log().info("deleted empty stream {}/{} (delete_on_empty min age {} s)", s->info.basin, s->info.name, min_age_s);
  }
  config_lk.unlock();
  DeleteObjects(std::move(garbage), "segments of empty streams");
  return Status::Ok();
}

Status Engine::MergeSegmentsNow() {
  std::lock_guard settle(settle_mu_);  // one writer of s->segments' objects at a time
  last_merge_ = Now();
  WEIR_RETURN_IF_ERROR(RefuseIfSuperseded("merge"));
  // From the stream the last pass stopped at, round the ids: a pass that
  // runs out of budget must not leave the same streams last every time.
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    for (auto it = by_id_.lower_bound(merge_resume_at_); it != by_id_.end(); ++it) streams.push_back(it->second);
    for (auto it = by_id_.begin(); it != by_id_.end() && it->first < merge_resume_at_; ++it) {
      streams.push_back(it->second);
    }
  }
  merge_resume_at_ = 0;
  const size_t small = options_.merge_small_bytes;
  const int64_t now_ms = WallMillis();
  const int64_t aged_before =
      now_ms - std::chrono::duration_cast<std::chrono::milliseconds>(options_.merge_min_age).count();
  // Per call, so one call stays short (settle waits for it): about 64 MiB,
  // 2,048 parts (each a GET), 5 s.
  uint64_t budget = uint64_t{64} << 20;
  size_t parts_budget = options_.merge_parts_per_pass;
  const TimePoint deadline = Now() + std::chrono::seconds(5);
  Status first_error;
  bool merged_any = false;  // this pass: the first run is merged whatever its size
  for (auto& s : streams) {
    bool merged_here = false;
    std::vector<metastore::SegmentInfo> segments;
    uint64_t trim_point = 0;
    int64_t age_s = 0;
    {
      std::lock_guard lk(s->mu);
      if (s->deleted || s->deleting) continue;
      segments = s->segments.rows();
      trim_point = s->durable_trim_point;
      age_s = s->info.config.retention_age_s;
    }
    const int64_t expired_before = age_s > 0 ? now_ms - std::min<int64_t>(age_s, INT64_MAX / 1000) * 1000 : INT64_MIN;
    // Retention judges a segment by its newest record: a merged one spans at
    // most an eighth of the retention age, so merging keeps no record more
    // than that past its age.
    const uint64_t max_span_ms =
        age_s > 0 ? static_cast<uint64_t>(std::max<int64_t>(std::min<int64_t>(age_s, INT64_MAX / 1000) * 1000 / 8, 1))
                  : UINT64_MAX;
    // Runs of adjacent small segments: one is merged when the merged object
    // would reach `small` (so it is never merged again), when it has
    // kMaxMergeParts parts, or (two or more) when its newest is old enough;
    // a segment at or above `small` ends a run, as does one retention is due
    // to take (trimmed or expired: merging would keep it longer), and one
    // that would stretch the run past max_span_ms. A
    // segment's batches are at least its size less its footer and index (an
    // entry per 64 KiB).
    auto data_at_least = [](uint64_t size) {
      const uint64_t overhead = kSegmentFooterSize + kSegmentIndexEntrySize * (1 + size / (64 << 10));
      return size > overhead ? size - overhead : 0;
    };
    std::vector<std::vector<metastore::SegmentInfo>> runs;
    std::vector<metastore::SegmentInfo> run;
    uint64_t run_data = 0;
    int64_t run_first_ms = INT64_MAX, run_last_ms = INT64_MIN;  // the run's oldest and newest record
    auto close_run = [&] {
      if (run.size() >= 2 && run_last_ms <= aged_before) runs.push_back(run);  // its newest record, anywhere in it
      run.clear();
      run_data = 0;
      run_first_ms = INT64_MAX;
      run_last_ms = INT64_MIN;
    };
    for (const auto& seg : segments) {
      if (seg.end_offset <= trim_point || seg.last_timestamp_ms < expired_before || seg.size_bytes >= small) {
        close_run();
        continue;
      }
      // (Kafka producers' timestamps need not grow: the run's extremes.)
      const int64_t first = std::min(run_first_ms, seg.first_timestamp_ms);
      const int64_t last = std::max(run_last_ms, seg.last_timestamp_ms);
      if (!run.empty() && last > first && static_cast<uint64_t>(last) - static_cast<uint64_t>(first) > max_span_ms) {
        close_run();
      }
      run_first_ms = std::min(run_first_ms, seg.first_timestamp_ms);
      run_last_ms = std::max(run_last_ms, seg.last_timestamp_ms);
      run.push_back(seg);
      run_data += data_at_least(seg.size_bytes);
      if (run_data + kSegmentFooterSize + kSegmentIndexEntrySize >= small || run.size() == kMaxMergeParts) {
        if (run.size() >= 2) runs.push_back(run);
        run.clear();
        run_data = 0;
        run_first_ms = INT64_MAX;
        run_last_ms = INT64_MIN;
      }
    }
    close_run();
    for (const auto& r : runs) {
      if ((merged_any && (budget == 0 || parts_budget < r.size())) || closing_ || Now() >= deadline) {
        // Next time from here, or, if this stream had its turn, from the next one.
        merge_resume_at_ = merged_here ? s->info.id + 1 : s->info.id;
        return first_error;
      }
      uint64_t bytes = 0;
      for (const auto& seg : r) bytes += seg.size_bytes;
      budget -= std::min(budget, bytes);
      parts_budget -= std::min(parts_budget, r.size());
      merged_any = merged_here = true;
      Status st = MergeRun(s, r);
      if (!st.ok()) {
        if (first_error.ok()) first_error = st.WithContext(fmt::format("stream {}", s->info.id));
        break;  // this stream's next runs wait for the next call
      }
    }
    if (superseded_) return first_error;  // no other stream's merge could commit
  }
  return first_error;
}

Status Engine::MergeRun(const std::shared_ptr<Stream>& s, const std::vector<metastore::SegmentInfo>& run) {
  // The parts' data sections, fetched segment_uploads at a time (each GET is
  // a round trip on an object store), checked, then written as one object:
  // views into `held`, no copy.
  std::vector<std::string> held(run.size());
  std::vector<Status> fetched(run.size());
  ForEachParallel(run.size(), options_.segment_uploads, "segment-merge", [&](size_t i) {
    if (closing_) return;
    const auto& seg = run[i];
    fetched[i] = [&]() -> Status {
      WEIR_ASSIGN_OR_RETURN(std::string object, store_->Get(seg.object_key, std::nullopt));
      WEIR_ASSIGN_OR_RETURN(SegmentFooter footer, DecodeSegmentFooter(object, object.size()));
      if (footer.stream_id != seg.stream_id || footer.start_offset != seg.start_offset ||
          footer.end_offset != seg.end_offset) {
        return Corruption("segment {} holds stream {} [{}, {}), its row says stream {} [{}, {})", seg.object_key,
                          footer.stream_id, footer.start_offset, footer.end_offset, seg.stream_id, seg.start_offset,
                          seg.end_offset);
      }
      object.resize(footer.data_end);
      if (Crc32c(object) != footer.data_crc) return Corruption("segment {}: data CRC mismatch", seg.object_key);
      held[i] = std::move(object);
      return Status::Ok();
    }();
  });
  if (closing_) return Cancelled("closing");
  SegmentBuilder builder(s->info.id);
  for (size_t i = 0; i < run.size(); ++i) {
    WEIR_RETURN_IF_ERROR(fetched[i]);
    WEIR_RETURN_IF_ERROR(builder.AddView(held[i]).WithContext(run[i].object_key));
  }
  WEIR_ASSIGN_OR_RETURN(std::string tail, builder.FinishTail());
  const SegmentFooter& f = builder.footer();
  metastore::SegmentInfo merged{s->info.id, f.start_offset, f.end_offset, f.first_timestamp_ms, f.last_timestamp_ms,
                                SegmentKey(s->info.id, f.start_offset, f.end_offset, epoch_.load()),
                                builder.data_bytes() + tail.size()};
  std::vector<std::string_view> parts = builder.views();
  parts.push_back(tail);
  objstore::PutOptions po;
  po.if_none_match = true;
  Status put = store_->PutParts(merged.object_key, parts, po);
  // A 412: an earlier attempt wrote the same key (same range, same bytes).
  if (!put.ok() && put.code() != Code::kPreconditionFailed) return put.WithContext("writing a merged segment");
  const bool created = put.ok();
  Status replaced = meta_->ReplaceSegments(options_.node, epoch_.load(), s->info.id, run, merged);
  const Code rc = replaced.code();
  const bool maybe_landed = rc != Code::kNotFound && rc != Code::kPreconditionFailed && rc != Code::kInvalidArgument;
  // An earlier attempt of ours (this object existed: 412) may have landed
  // unseen, which is why the rows moved.
  const bool earlier_landed = !created && rc == Code::kPreconditionFailed;
  if (!replaced.ok() && (maybe_landed || earlier_landed)) {
    // The row at the run's start tells, once a commit still on its way (a
    // remote metastore's session whose answer was lost) has landed or not.
    if (maybe_landed) meta_->AwaitCommitsInFlight().IgnoreError();
    auto row = meta_->FindSegments(s->info.id, run.front().start_offset, 1);
    if (row.ok() && !row->empty() && row->front().object_key == merged.object_key) {
      Log().info("merge of stream {}: the swap that answered {} had landed", s->info.id, replaced.ToString());
      replaced = Status::Ok();
    }
  }
  if (!replaced.ok()) {
    // Refused (the stream is gone, or its rows changed): the object is ours
    // to delete, unless a successor holds the node (CreatedObjectsAreOurs).
    // Any other failure may have landed: the next start's sweep decides.
    const Code c = replaced.code();
    if (created && (c == Code::kNotFound || c == Code::kPreconditionFailed || c == Code::kInvalidArgument) &&
        CreatedObjectsAreOurs(replaced)) {
      store_->Delete(merged.object_key).IgnoreError();
    }
    // The rows were not as memory has them: an earlier swap of ours that
    // landed unseen (its read-back failed too). Memory takes the rows, or
    // every later merge of the stream would fail the same way.
    if (c == Code::kPreconditionFailed && !NoteIfSuperseded(replaced)) {
      if (Status st = ReloadSegments(s); !st.ok()) Log().warn("stream {}: {}", s->info.id, st.ToString());
    }
    return replaced.WithContext("indexing a merged segment");
  }
  bool swapped = false;
  {
    std::lock_guard lk(s->mu);
    auto first = std::find_if(s->segments.begin(), s->segments.end(), [&](const metastore::SegmentInfo& g) {
      return g.start_offset == run.front().start_offset;
    });
    if (first != s->segments.end() && static_cast<size_t>(s->segments.end() - first) >= run.size() &&
        std::prev(first + static_cast<std::ptrdiff_t>(run.size()))->end_offset == run.back().end_offset) {
      s->segments.ReplaceRun(first, run.size(), merged);
      swapped = true;
    }
  }
  if (!swapped) {
    // Memory changed under us (retention, a delete): it may still name the
    // parts, so they stay; the next start's sweep removes what no row names.
    Log().warn("merge of stream {} at [{}, {}): the parts stay until the next start", s->info.id,
               merged.start_offset, merged.end_offset);
    return Status::Ok();
  }
  std::vector<std::string> old;
  for (const auto& seg : run) old.push_back(seg.object_key);
  // A reader that picked a replaced segment before the swap finds it gone and looks again.
  DeleteObjects(std::move(old), fmt::format("merged segments of stream {}", s->info.id));
  metrics_.segment_merges.fetch_add(1);
  metrics_.segments_merged.fetch_add(run.size());
  return Status::Ok();
}

Status Engine::ReloadSegments(const std::shared_ptr<Stream>& s) {
  // Only while this process holds the node, before and after the rows are
  // read: a successor's rows cover offsets this process still holds
  // unsettled in memory, and reads would return them twice.
  auto held = [&]() -> Status {
    WEIR_ASSIGN_OR_RETURN(metastore::NodeState node, meta_->GetNode(options_.node));
    if (node.epoch != epoch_.load()) {
      return Fenced("node {} is at epoch {}, not {}: its segment rows are a successor's", options_.node, node.epoch,
                    epoch_.load());
    }
    return Status::Ok();
  };
  WEIR_RETURN_IF_ERROR(held());
  std::vector<metastore::SegmentInfo> rows;
  for (uint64_t from = 0;;) {
    WEIR_ASSIGN_OR_RETURN(auto segs, meta_->FindSegments(s->info.id, from, 1000));
    if (segs.empty()) break;
    from = segs.back().end_offset;
    for (auto& seg : segs) rows.push_back(std::move(seg));
  }
  WEIR_RETURN_IF_ERROR(held());
  std::lock_guard lk(s->mu);
  if (s->deleted) return Status::Ok();
  if (rows.size() != s->segments.size()) {
    Log().info("stream {}: {} segments in memory, {} in the metastore; taking the metastore's", s->info.id,
               s->segments.size(), rows.size());
  }
  s->segments.Assign(std::move(rows));
  return Status::Ok();
}

Status Engine::ReadSegment(const metastore::SegmentInfo& seg, uint64_t from, size_t max_bytes,
                           std::optional<int64_t> at_time, std::vector<std::string>* batches) {
  const size_t had = batches->size();
  bool cache_hit = false;
  Status st = ReadSegmentOnce(seg, from, max_bytes, at_time, /*use_cache=*/true, &cache_hit, batches);
  if (cache_hit && (st.code() == Code::kNotFound || st.code() == Code::kCorruption)) {
    // The object is gone (the caller looks at the stream's segments again),
    // or not as its entry says: the entry goes, and such a read is made again
    // from the object's own footer and index.
    segment_indexes_.Erase(seg.object_key);
    if (st.code() == Code::kCorruption) {
      batches->resize(had);
      st = ReadSegmentOnce(seg, from, max_bytes, at_time, /*use_cache=*/false, &cache_hit, batches);
    }
  }
  return st;
}

Status Engine::ReadSegmentOnce(const metastore::SegmentInfo& seg, uint64_t from, size_t max_bytes,
                               std::optional<int64_t> at_time, bool use_cache, bool* cache_hit,
                               std::vector<std::string>* batches) {
  *cache_hit = false;
  // Enough for the requested bytes plus one whole batch (an append is at most ~1 MiB).
  const uint64_t window = max_bytes + (2u << 20);
  // A small object is read whole: one GET, not three (footer, index, data).
  // Not a large one: a read near the end of a 60 MiB segment would fetch it
  // all for a few batches. A large one's footer and index are kept
  // (segment_indexes_): the next page of a reader is one GET.
  constexpr uint64_t kWholeObjectBytes = 8u << 20;
  std::string whole;
  std::shared_ptr<const SegmentIndexCache::Entry> indexed;
  if (seg.size_bytes <= std::min(window, kWholeObjectBytes)) {
    WEIR_ASSIGN_OR_RETURN(whole, store_->Get(seg.object_key, std::nullopt));
    if (whole.size() != seg.size_bytes) {
      return Corruption("segment {}: {} bytes, the index says {}", seg.object_key, whole.size(), seg.size_bytes);
    }
  } else if (use_cache) {
    indexed = segment_indexes_.Find(seg.object_key);
    *cache_hit = indexed != nullptr;
  }
  // Views into `whole`, or bytes fetched into `*fetched`.
  auto range = [&](uint64_t pos, uint64_t len, std::string* fetched) -> Result<std::string_view> {
    if (!whole.empty()) return std::string_view(whole).substr(pos, len);
    WEIR_ASSIGN_OR_RETURN(*fetched, store_->Get(seg.object_key, objstore::ByteRange{pos, len}));
    return std::string_view(*fetched);
  };
  if (!indexed) {
    auto entry = std::make_shared<SegmentIndexCache::Entry>();
    std::string tail_bytes, index_bytes;
    uint64_t tail_len = std::min<uint64_t>(seg.size_bytes, kSegmentFooterSize);
    WEIR_ASSIGN_OR_RETURN(std::string_view tail, range(seg.size_bytes - tail_len, tail_len, &tail_bytes));
    WEIR_ASSIGN_OR_RETURN(entry->footer, DecodeSegmentFooter(tail, seg.size_bytes));
    entry->object_bytes = seg.size_bytes;
    const SegmentFooter& f = entry->footer;
    if (f.stream_id != seg.stream_id || f.start_offset != seg.start_offset || f.end_offset != seg.end_offset) {
      return Corruption("segment {} holds stream {} [{}, {}), its row says stream {} [{}, {})", seg.object_key,
                        f.stream_id, f.start_offset, f.end_offset, seg.stream_id, seg.start_offset, seg.end_offset);
    }
    // A whole object in hand is checked whole: the batches' own CRCs do not
    // cover their offsets and lengths.
    if (!whole.empty() && Crc32c(std::string_view(whole).substr(0, f.data_end)) != f.data_crc) {
      return Corruption("segment {}: data CRC mismatch", seg.object_key);
    }
    WEIR_ASSIGN_OR_RETURN(std::string_view index_view, range(f.data_end, seg.size_bytes - f.data_end, &index_bytes));
    WEIR_ASSIGN_OR_RETURN(entry->index, DecodeSegmentIndex(f, index_view));
    indexed = std::move(entry);
    if (whole.empty()) segment_indexes_.Insert(seg.object_key, indexed);
  }
  const SegmentFooter& footer = indexed->footer;
  const std::vector<SegmentIndexEntry>& index = indexed->index;
  if (indexed->object_bytes != seg.size_bytes) {
    return Corruption("segment {}: {} bytes, the index says {}", seg.object_key, indexed->object_bytes,
                      seg.size_bytes);
  }
  uint64_t pos = SeekOffset(index, from);
  // A lookup by time starts at the last indexed batch before which no record is as late.
  if (at_time) pos = std::max(pos, SeekTimestamp(index, *at_time));
  // The offset the batch at `pos` starts at (the index is CRC-checked); each
  // batch after it starts where the one before ends. A part read by range
  // is checked against these, not against the data CRC.
  uint64_t next = footer.start_offset;
  if (pos > 0) {
    auto entry = std::find_if(index.begin(), index.end(), [&](const SegmentIndexEntry& e) { return e.position == pos; });
    if (entry == index.end()) return Internal("segment {}: seek position {} is not indexed", seg.object_key, pos);
    next = entry->base_offset;
  }
  std::string data_bytes;
  uint64_t want = std::min<uint64_t>(footer.data_end - pos, window);
  WEIR_ASSIGN_OR_RETURN(std::string_view data, range(pos, want, &data_bytes));
  // A window short of the data's end may cut its last batch; one that
  // reaches it cuts none, so a batch running past it is damage (else a read
  // would stop there quietly, and a Kafka fetch go on with the next segment's
  // records past a gap).
  const bool to_data_end = pos + want == footer.data_end;
  size_t at = 0;
  size_t taken = 0;
  while (at < data.size() && taken < max_bytes) {
    const std::string_view rest = data.substr(at);
    if (!to_data_end && (rest.size() < wal::kRecordBatchHeaderSize || BatchBytes(rest) > rest.size())) break;
    // Bytes read by range are not covered by the data CRC: each batch's CRC
    // is checked instead (it covers all but its offset and length, checked
    // below and by the framing).
    auto h = whole.empty() ? wal::VerifyBatch(rest) : wal::ParseBatchHeader(rest);
    if (!h.ok()) return Corruption("segment {}: the batch at byte {}: {}", seg.object_key, pos + at, h.status().message());
    if (h->base_offset < 0 || static_cast<uint64_t>(h->base_offset) != next ||
        static_cast<uint64_t>(h->last_offset_delta) >= footer.end_offset - next) {
      return Corruption("segment {}: the batch at byte {} holds [{}, +{}], expected to start at {} and end by {}",
                        seg.object_key, pos + at, h->base_offset, h->last_offset_delta, next, footer.end_offset);
    }
    next += static_cast<uint64_t>(h->last_offset_delta) + 1;
    if (next - 1 >= from) {
      batches->emplace_back(data.substr(at, h->total_size()));
      taken += h->total_size();
    }
    at += h->total_size();
  }
  if (batches->empty() && footer.data_end > pos) {
    return Corruption("segment {}: no whole batch at byte {}", seg.object_key, pos);
  }
  if (to_data_end && at == data.size() && next != footer.end_offset) {
    return Corruption("segment {}: its batches end at offset {}, its footer says {}", seg.object_key, next,
                      footer.end_offset);
  }
  return Status::Ok();
}

}  // namespace weir::log
