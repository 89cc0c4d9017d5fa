#include "log/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <random>
#include <thread>

#include "base/bytes.h"
#include "base/log.h"
#include "log/producer_window.h"
#include "wal/fence.h"
#include "wal/slot_format.h"

namespace weir::log {

namespace {

// An acknowledged batch: its offsets, timestamps, where it lives in the WAL,
// and its bytes while the log cache holds them.
struct BatchRef {
  uint64_t start = 0;
  uint64_t end = 0;  // exclusive
  int64_t max_timestamp_ms = 0;
  wal::AckInfo where;
  std::shared_ptr<const std::string> bytes;  // null once evicted from the cache
};

// Bytes S2 meters for a record: body, header names and values, 8 per record.
size_t MeteredBytes(const AppendRecord& r) {
  size_t n = 8 + r.body.size() + (r.key ? r.key->size() : 0);
  for (const auto& h : r.headers) n += h.key.size() + (h.value ? h.value->size() : 0);
  return n;
}

// A command record: exactly one header, with an empty name.
bool IsCommand(const wal::Record& r) { return r.headers.size() == 1 && r.headers[0].key.empty(); }

uint64_t RandomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
}

}  // namespace

struct Engine::Pending {
  uint64_t start = 0;
  uint64_t end = 0;
  int64_t first_timestamp_ms = 0;
  int64_t last_timestamp_ms = 0;
  std::shared_ptr<const std::string> bytes;
  std::vector<std::pair<AppendCallback, bool>> waiters;  // (callback, duplicated)
};

struct Engine::Stream {
  std::mutex mu;
  std::condition_variable cv;  // readers waiting for the tail to move
  metastore::StreamInfo info;
  uint64_t next_offset = 0;  // assigned, including pending appends
  uint64_t tail = 0;         // acknowledged
  uint64_t trim_point = 0;
  std::string fencing_token;
  int64_t last_timestamp_ms = 0;
  ProducerWindows producers;
  std::deque<BatchRef> durable;  // acknowledged batches, offset order
  std::deque<std::shared_ptr<Pending>> pending;  // assigned, not yet acknowledged
  bool deleted = false;
};

Status ValidateBasinName(const std::string& name) {
  if (name.size() < 8 || name.size() > 48) {
    return InvalidArgument("basin name \"{}\" must be 8 to 48 characters", name);
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      return InvalidArgument("basin name \"{}\" may hold only lowercase letters, digits and hyphens", name);
    }
  }
  if (name.front() == '-' || name.back() == '-') {
    return InvalidArgument("basin name \"{}\" must not start or end with a hyphen", name);
  }
  return Status::Ok();
}

Status ValidateStreamName(const std::string& name) {
  if (name.empty() || name.size() > 512) return InvalidArgument("stream name must be 1 to 512 bytes");
  if (name.find('\0') != std::string::npos) return InvalidArgument("stream name must not contain NUL");
  return Status::Ok();
}

Engine::Engine(EngineOptions options, std::shared_ptr<objstore::ObjectStore> store,
               std::shared_ptr<metastore::Metastore> meta)
    : options_(std::move(options)), store_(std::move(store)), meta_(std::move(meta)) {}

Engine::~Engine() { Close(); }

void Engine::Close() {
  closing_ = true;
  std::thread halt;
  {
    std::lock_guard lk(mu_);
    halt = std::move(halt_thread_);
  }
  if (halt.joinable()) halt.join();
  if (wal_) wal_->Close();
}

void Engine::HandleHalt(uint64_t epoch) {
  wal::ChainRef chain{options_.node, epoch};
  Result<wal::FenceResult> fence = Status();
  for (;;) {
    fence = wal::Fence(*store_, chain, 0, nonce_);
    if (fence.ok() || closing_) break;
    Log().error("fencing our own halted epoch {}: {}; retrying", epoch, fence.status().ToString());
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (!fence.ok()) return;  // closing: Close fails what cannot be acknowledged
  auto minted = meta_->MintEpoch(options_.node, epoch, static_cast<uint32_t>(options_.wal.window));
  if (minted.ok()) {
    epoch_ = minted->epoch;
    Status st = wal_->Resume(minted->epoch, fence->cut);
    if (!st.ok()) Log().error("resuming the WAL in epoch {}: {}", minted->epoch, st.ToString());
    return;
  }
  Log().error("node {} was superseded ({}); abandoning its streams", options_.node, minted.status().ToString());
  wal_->Abandon(fence->cut, Fenced("node {} was superseded", options_.node)).IgnoreError();
}

Result<std::unique_ptr<Engine>> Engine::Open(EngineOptions options, std::shared_ptr<objstore::ObjectStore> store,
                                             std::shared_ptr<metastore::Metastore> meta) {
  if (!store || !meta) return InvalidArgument("the engine needs an object store and a metastore");
  WEIR_RETURN_IF_ERROR(wal::ValidateNodeId(options.node));
  std::unique_ptr<Engine> e(new Engine(std::move(options), std::move(store), std::move(meta)));
  WEIR_RETURN_IF_ERROR(e->Recover());
  return e;
}

Status Engine::Recover() {
  WEIR_ASSIGN_OR_RETURN(metastore::NodeState prev, meta_->GetNode(options_.node));
  uint32_t window = static_cast<uint32_t>(options_.wal.window);
  WEIR_ASSIGN_OR_RETURN(metastore::NodeState now, meta_->MintEpoch(options_.node, prev.epoch, window));
  epoch_ = now.epoch;

  // Streams as of their last settle.
  WEIR_ASSIGN_OR_RETURN(auto states, meta_->ListStreamStates());
  for (const auto& st : states) {
    WEIR_ASSIGN_OR_RETURN(auto info, meta_->GetStreamById(st.stream_id));
    auto s = std::make_shared<Stream>();
    s->info = info;
    s->next_offset = s->tail = st.settled_offset;
    s->trim_point = st.trim_point;
    s->fencing_token = st.fencing_token;
    s->last_timestamp_ms = st.last_timestamp_ms;
    WEIR_ASSIGN_OR_RETURN(s->producers, ProducerWindows::Deserialize(st.producer_state));
    by_name_[{info.basin, info.name}] = info.id;
    by_id_[info.id] = std::move(s);
  }

  // Fence and replay every earlier epoch of this node from the checkpoint.
  nonce_ = RandomNonce();
  const uint64_t nonce = nonce_;
  uint64_t first = std::max<uint64_t>(prev.checkpoint.epoch, 1);
  uint64_t slots = 0;
  for (uint64_t e = first; e < epoch_; ++e) {
    wal::ChainRef chain{options_.node, e};
    uint64_t from = e == prev.checkpoint.epoch ? prev.checkpoint.seq : 0;
    WEIR_ASSIGN_OR_RETURN(wal::FenceResult fence, wal::Fence(*store_, chain, from, nonce));
    Status st = wal::Walk(*store_, chain, from, fence.cut,
                          [&](uint64_t seq, const wal::SlotIndex& index, std::string_view bytes) {
                            ++slots;
                            for (const auto& c : index.chunks) {
                              size_t pos = c.offset;
                              Status bs = wal::ForEachBatch(
                                  bytes.substr(c.offset, c.length),
                                  [&](const wal::BatchHeader& h, std::string_view batch) {
                                    wal::AckInfo where{e, seq, pos, static_cast<uint32_t>(batch.size())};
                                    pos += h.total_size();
                                    return ReplayBatch(c.stream_id, batch, where);
                                  });
                              if (!bs.ok()) return bs;
                            }
                            return Status::Ok();
                          });
    if (!st.ok()) return st.WithContext(fmt::format("replaying WAL epoch {}", e));
    uint64_t garbage_window = e + 1 == epoch_ && prev.window > 0 ? prev.window : window;
    auto garbage = wal::DeleteGarbage(*store_, chain, fence.cut, garbage_window);
    if (!garbage.ok()) Log().warn("garbage probe of {}/{}: {}", options_.node, e, garbage.status().ToString());
  }
  Log().info("node {} recovered epochs {}..{} ({} slots), now epoch {}", options_.node, first, epoch_ - 1, slots,
             epoch_);

  wal::WriterOptions wo = options_.wal;
  wo.node = options_.node;
  wo.epoch = epoch_;
  wo.first_seq = 0;
  wo.on_halt = [this](uint64_t epoch, uint64_t, const Status&) {
    std::lock_guard lk(mu_);
    if (closing_) return;
    // A new halt can only follow the previous handler's Resume, its last step.
    if (halt_thread_.joinable()) halt_thread_.join();
    halt_thread_ = std::thread([this, epoch] { HandleHalt(epoch); });
  };
  WEIR_ASSIGN_OR_RETURN(wal_, wal::Writer::Start(store_, wo));
  return Status::Ok();
}

Status Engine::ReplayBatch(uint64_t stream_id, std::string_view batch, const wal::AckInfo& where) {
  auto it = by_id_.find(stream_id);
  if (it == by_id_.end()) return Status::Ok();  // the stream was deleted
  Stream& s = *it->second;
  WEIR_ASSIGN_OR_RETURN(wal::BatchHeader h, wal::VerifyBatch(batch));
  uint64_t base = static_cast<uint64_t>(h.base_offset);
  uint64_t end = static_cast<uint64_t>(h.last_offset()) + 1;
  if (end <= s.next_offset) return Status::Ok();  // already settled
  if (base != s.next_offset) {
    return Corruption("stream {}: WAL batch at offset {} does not follow offset {}", stream_id, base, s.next_offset);
  }
  WEIR_ASSIGN_OR_RETURN(auto records, wal::DecodeRecords(batch));
  for (const auto& r : records) {
    if (!IsCommand(r.record)) continue;
    const auto& cmd = r.record.headers[0].value;
    if (cmd == "fence") s.fencing_token = r.record.value.value_or("");
    if (cmd == "trim" && r.record.value && r.record.value->size() == 8) {
      s.trim_point = std::max(s.trim_point, std::min(LoadBE64(r.record.value->data()), static_cast<uint64_t>(r.offset)));
    }
  }
  if (h.producer_id >= 0) {
    ProducerBatch pb{h.base_sequence, static_cast<int32_t>((static_cast<int64_t>(h.base_sequence) + h.record_count - 1) %
                                                           (int64_t{INT32_MAX} + 1)),
                     base, end, h.base_timestamp, h.max_timestamp};
    s.producers.Record(static_cast<uint64_t>(h.producer_id), h.producer_epoch, pb);
  }
  s.next_offset = s.tail = end;
  s.last_timestamp_ms = std::max(s.last_timestamp_ms, h.max_timestamp);
  std::shared_ptr<const std::string> bytes;
  if (cache_bytes_.load() + batch.size() <= options_.log_cache_bytes) {
    bytes = std::make_shared<const std::string>(batch);
    cache_bytes_ += batch.size();
  }
  s.durable.push_back(BatchRef{base, end, h.max_timestamp, where, std::move(bytes)});
  return Status::Ok();
}

// ---- Basins and streams -------------------------------------------------------

Status Engine::CreateBasin(const std::string& name) {
  WEIR_RETURN_IF_ERROR(ValidateBasinName(name));
  return meta_->CreateBasin(metastore::BasinInfo{name, WallMillis()});
}

Result<std::vector<metastore::BasinInfo>> Engine::ListBasins(const std::string& prefix, const std::string& start_after,
                                                             size_t limit) {
  return meta_->ListBasins(prefix, start_after, limit);
}

Status Engine::DeleteBasin(const std::string& name) { return meta_->DeleteBasin(name); }

Result<metastore::StreamInfo> Engine::CreateStream(const std::string& basin, const std::string& name,
                                                   const metastore::StreamConfig& config) {
  WEIR_RETURN_IF_ERROR(ValidateStreamName(name));
  metastore::StreamInfo info;
  info.basin = basin;
  info.name = name;
  info.config = config;
  info.created_at_ms = WallMillis();
  WEIR_ASSIGN_OR_RETURN(info, meta_->CreateStream(info));
  auto s = std::make_shared<Stream>();
  s->info = info;
  std::lock_guard lk(mu_);
  by_name_[{basin, name}] = info.id;
  by_id_[info.id] = std::move(s);
  return info;
}

Result<std::shared_ptr<Engine::Stream>> Engine::Find(const std::string& basin, const std::string& name) {
  std::lock_guard lk(mu_);
  auto it = by_name_.find({basin, name});
  if (it == by_name_.end()) return NotFound("stream \"{}\" not found in basin \"{}\"", name, basin);
  return by_id_.at(it->second);
}

Result<StreamSummary> Engine::GetStream(const std::string& basin, const std::string& name) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, name));
  std::lock_guard lk(s->mu);
  return StreamSummary{s->info, s->tail, s->trim_point, s->fencing_token};
}

Result<std::vector<metastore::StreamInfo>> Engine::ListStreams(const std::string& basin, const std::string& prefix,
                                                               const std::string& start_after, size_t limit) {
  return meta_->ListStreams(basin, prefix, start_after, limit);
}

Status Engine::ReconfigureStream(const std::string& basin, const std::string& name,
                                 const metastore::StreamConfig& config) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, name));
  WEIR_RETURN_IF_ERROR(meta_->UpdateStreamConfig(s->info.id, config));
  std::lock_guard lk(s->mu);
  s->info.config = config;
  return Status::Ok();
}

Status Engine::DeleteStream(const std::string& basin, const std::string& name) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, name));
  WEIR_ASSIGN_OR_RETURN(auto keys, meta_->DeleteStream(s->info.id));
  if (!keys.empty()) {
    Status st = store_->DeleteMany(keys);
    if (!st.ok()) Log().warn("deleting segments of stream {}: {}", name, st.ToString());
  }
  {
    std::lock_guard lk(mu_);
    by_name_.erase({basin, name});
    by_id_.erase(s->info.id);
  }
  std::lock_guard lk(s->mu);
  s->deleted = true;
  s->cv.notify_all();
  return Status::Ok();
}

Result<uint64_t> Engine::AllocateProducerId() { return meta_->AllocateProducerId(); }

// ---- Appends ------------------------------------------------------------------

void Engine::AppendAsync(const std::string& basin, const std::string& stream, std::vector<AppendRecord> records,
                         const AppendOptions& options, AppendCallback done) {
  auto fail = [&](Status st) { done(AppendOutcome{std::move(st), {}, std::nullopt, std::nullopt}); };
  if (records.empty()) return fail(InvalidArgument("an append needs at least one record"));
  if (records.size() > options_.max_append_records) {
    return fail(InvalidArgument("an append holds at most {} records, got {}", options_.max_append_records,
                                records.size()));
  }
  size_t metered = 0;
  for (const auto& r : records) metered += MeteredBytes(r);
  if (metered > options_.max_append_bytes) {
    return fail(InvalidArgument("an append holds at most {} metered bytes, got {}", options_.max_append_bytes,
                                metered));
  }
  auto found = Find(basin, stream);
  if (!found.ok()) return fail(found.status());
  std::shared_ptr<Stream> s = *found;

  std::unique_lock lk(s->mu);
  if (s->deleted) return fail(NotFound("stream \"{}\" was deleted", stream));
  if (options.fencing_token && *options.fencing_token != s->fencing_token) {
    AppendOutcome o{PreconditionFailed("fencing token mismatch"), {}, std::nullopt, s->fencing_token};
    lk.unlock();
    return done(std::move(o));
  }
  if (options.match_seq_num && *options.match_seq_num != s->next_offset) {
    AppendOutcome o{PreconditionFailed("match_seq_num {} does not match the tail {}", *options.match_seq_num,
                                       s->next_offset),
                    {}, s->next_offset, std::nullopt};
    lk.unlock();
    return done(std::move(o));
  }
  if (options.producer) {
    const ProducerRef& p = *options.producer;
    auto check = s->producers.Check(p.id, p.epoch, p.seq, static_cast<int32_t>(records.size()));
    if (!check.ok()) {
      lk.unlock();
      return fail(check.status());
    }
    if (check->kind == ProducerCheck::kDuplicate) {
      const ProducerBatch& b = check->original;
      AppendAck ack{b.start_offset, b.end_offset, s->tail, b.first_timestamp_ms, b.last_timestamp_ms, true};
      if (b.end_offset <= s->tail) {
        lk.unlock();
        return done(AppendOutcome{Status::Ok(), ack, std::nullopt, std::nullopt});
      }
      for (auto& pend : s->pending) {
        if (pend->start == b.start_offset) {
          pend->waiters.emplace_back(std::move(done), true);
          return;
        }
      }
      lk.unlock();
      return fail(Internal("producer window names offset {} but no append is pending there", b.start_offset));
    }
  }

  // Timestamps: per the stream's mode, capped at arrival unless uncapped, and
  // never below the stream's last timestamp.
  const metastore::StreamConfig& cfg = s->info.config;
  int64_t arrival = WallMillis();
  int64_t last_ts = s->last_timestamp_ms;
  std::vector<wal::Record> recs(records.size());
  std::string token = s->fencing_token;
  uint64_t trim_point = s->trim_point;
  for (size_t i = 0; i < records.size(); ++i) {
    AppendRecord& in = records[i];
    int64_t ts = arrival;
    if (cfg.timestamping == metastore::TimestampingMode::kClientRequire && !in.timestamp_ms) {
      lk.unlock();
      return fail(InvalidArgument("record {}: this stream requires client timestamps", i));
    }
    if (cfg.timestamping != metastore::TimestampingMode::kArrival && in.timestamp_ms) {
      ts = cfg.uncapped_timestamps ? *in.timestamp_ms : std::min(*in.timestamp_ms, arrival);
    }
    ts = std::max(ts, last_ts);
    last_ts = ts;
    wal::Record& r = recs[i];
    r.timestamp = ts;
    r.key = std::move(in.key);
    r.headers = std::move(in.headers);
    r.value = std::move(in.body);
    if (IsCommand(r)) {
      const auto& cmd = r.headers[0].value;
      if (cmd == "fence") {
        if (r.value->size() > 36) {
          lk.unlock();
          return fail(InvalidArgument("record {}: a fencing token is at most 36 bytes", i));
        }
        token = *r.value;
      } else if (cmd == "trim") {
        if (r.value->size() != 8) {
          lk.unlock();
          return fail(InvalidArgument("record {}: a trim command's body is an 8-byte big-endian offset", i));
        }
        trim_point = std::max(trim_point, std::min(LoadBE64(r.value->data()), s->next_offset + i));
      } else {
        lk.unlock();
        return fail(InvalidArgument("record {}: unknown command \"{}\"", i, cmd.value_or("")));
      }
    }
  }

  wal::EncodeOptions eo;
  eo.base_offset = static_cast<int64_t>(s->next_offset);
  if (options.producer) {
    eo.producer_id = static_cast<int64_t>(options.producer->id);
    eo.producer_epoch = options.producer->epoch;
    eo.base_sequence = options.producer->seq;
  }
  std::string batch;
  Status st = wal::EncodeRecordBatch(recs, eo, &batch);
  if (!st.ok()) {
    lk.unlock();
    return fail(st);
  }
  auto pend = std::make_shared<Pending>();
  pend->start = s->next_offset;
  pend->end = s->next_offset + recs.size();
  pend->first_timestamp_ms = recs.front().timestamp;
  pend->last_timestamp_ms = last_ts;
  pend->bytes = std::make_shared<const std::string>(batch);
  pend->waiters.emplace_back(std::move(done), false);
  // Submitting under the stream lock keeps pool order == offset order.
  st = wal_->Append(s->info.id, std::move(batch),
                    [this, s, pend](const Status& result, const wal::AckInfo& where) {
                      OnDurable(s, pend, result, where);
                    },
                    Now() + options_.admission_timeout);
  if (!st.ok()) {
    AppendCallback cb = std::move(pend->waiters.front().first);
    lk.unlock();
    return cb(AppendOutcome{st, {}, std::nullopt, std::nullopt});
  }
  // Commit the sequencer state only once the WAL has admitted the batch.
  if (options.producer) {
    const ProducerRef& p = *options.producer;
    s->producers.Record(p.id, p.epoch,
                        ProducerBatch{p.seq,
                                      static_cast<int32_t>((static_cast<int64_t>(p.seq) + static_cast<int64_t>(recs.size()) - 1) %
                                                           (int64_t{INT32_MAX} + 1)),
                                      pend->start, pend->end, pend->first_timestamp_ms, pend->last_timestamp_ms});
  }
  s->next_offset = pend->end;
  s->last_timestamp_ms = last_ts;
  s->fencing_token = std::move(token);
  s->trim_point = trim_point;
  s->pending.push_back(std::move(pend));
}

void Engine::OnDurable(const std::shared_ptr<Stream>& s, const std::shared_ptr<Pending>& p, const Status& st,
                       const wal::AckInfo& where) {
  std::vector<std::pair<AppendCallback, bool>> waiters;
  AppendAck ack;
  bool evict = false;
  {
    std::lock_guard lk(s->mu);
    auto it = std::find(s->pending.begin(), s->pending.end(), p);
    if (it != s->pending.end()) s->pending.erase(it);
    waiters = std::move(p->waiters);
    if (st.ok()) {
      s->tail = p->end;
      size_t size = p->bytes->size();
      bool cache = cache_bytes_.load() + size <= options_.log_cache_bytes;
      s->durable.push_back(BatchRef{p->start, p->end, p->last_timestamp_ms, where, cache ? p->bytes : nullptr});
      if (cache) {
        cache_bytes_ += size;
      } else {
        evict = true;
      }
      s->cv.notify_all();
      ack = AppendAck{p->start, p->end, s->tail, p->first_timestamp_ms, p->last_timestamp_ms, false};
    }
    p->bytes.reset();
  }
  for (auto& [cb, dup] : waiters) {
    AppendAck a = ack;
    a.duplicated = dup;
    cb(AppendOutcome{st, a, std::nullopt, std::nullopt});
  }
  if (evict) EvictCache();
}

void Engine::EvictCache() {
  // Drops the oldest cached batches of each stream until the cache is at 3/4
  // of its budget; evicted batches are read back from their WAL slot.
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    if (cache_bytes_.load() <= options_.log_cache_bytes * 3 / 4) return;
    for (auto& [id, s] : by_id_) streams.push_back(s);
  }
  for (auto& s : streams) {
    std::lock_guard lk(s->mu);
    for (auto& b : s->durable) {
      if (!b.bytes) continue;
      size_t size = b.bytes->size();
      b.bytes.reset();
      if ((cache_bytes_ -= size) <= options_.log_cache_bytes * 3 / 4) return;
    }
  }
}

AppendOutcome Engine::Append(const std::string& basin, const std::string& stream, std::vector<AppendRecord> records,
                             const AppendOptions& options) {
  std::promise<AppendOutcome> promise;
  auto future = promise.get_future();
  AppendAsync(basin, stream, std::move(records), options,
              [&promise](AppendOutcome o) { promise.set_value(std::move(o)); });
  return future.get();
}

// ---- Reads --------------------------------------------------------------------

Result<uint64_t> Engine::CheckTail(const std::string& basin, const std::string& stream) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, stream));
  std::lock_guard lk(s->mu);
  return s->tail;
}

Result<ReadResult> Engine::Read(const std::string& basin, const std::string& stream, const ReadStart& start,
                                size_t max_records, size_t max_bytes, std::optional<TimePoint> wait_until) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, stream));
  max_records = std::clamp<size_t>(max_records, 1, options_.max_read_records);
  max_bytes = std::clamp<size_t>(max_bytes, 1, options_.max_read_bytes);
  std::vector<BatchRef> refs;
  uint64_t from = 0;
  ReadResult out;
  {
    std::unique_lock lk(s->mu);
    switch (start.kind) {
      case ReadStart::kOffset:
        from = start.value;
        break;
      case ReadStart::kTailOffset:
        from = s->tail - std::min(start.value, s->tail);
        break;
      case ReadStart::kTimestamp: {
        from = s->tail;
        for (const auto& b : s->durable) {
          if (b.max_timestamp_ms >= static_cast<int64_t>(start.value)) {
            from = b.start;
            break;
          }
        }
        break;
      }
    }
    if (from > s->tail) return OutOfRange("offset {} is past the tail {}", from, s->tail);
    from = std::max(from, s->trim_point);
    if (from == s->tail && wait_until) {
      s->cv.wait_until(lk, *wait_until, [&] { return s->deleted || s->tail > from; });
      if (s->deleted) return NotFound("stream \"{}\" was deleted", stream);
    }
    out.tail = s->tail;
    auto it = std::upper_bound(s->durable.begin(), s->durable.end(), from,
                               [](uint64_t off, const BatchRef& b) { return off < b.end; });
    size_t bytes = 0;
    uint64_t count = 0;
    for (; it != s->durable.end() && count < max_records && bytes < max_bytes; ++it) {
      refs.push_back(*it);
      count += it->end - std::max(it->start, from);
      bytes += it->where.length;
    }
  }
  // Decode outside the lock, fetching evicted batches from their WAL slot.
  size_t bytes = 0;
  for (const BatchRef& ref : refs) {
    std::shared_ptr<const std::string> data = ref.bytes;
    if (!data) {
      auto got = store_->Get(wal::SlotKey(options_.node, ref.where.epoch, ref.where.seq),
                             objstore::ByteRange{ref.where.offset, ref.where.length});
      if (!got.ok()) return got.status().WithContext("reading an unsettled batch");
      data = std::make_shared<const std::string>(std::move(*got));
    }
    WEIR_ASSIGN_OR_RETURN(auto records, wal::DecodeRecords(*data));
    for (auto& r : records) {
      if (static_cast<uint64_t>(r.offset) < from) continue;
      if (start.kind == ReadStart::kTimestamp && r.record.timestamp < static_cast<int64_t>(start.value)) continue;
      size_t size = 8 + (r.record.value ? r.record.value->size() : 0);
      for (const auto& h : r.record.headers) size += h.key.size() + (h.value ? h.value->size() : 0);
      if (out.records.size() >= max_records || (bytes + size > max_bytes && !out.records.empty())) return out;
      bytes += size;
      out.records.push_back(ReadRecord{static_cast<uint64_t>(r.offset), std::move(r.record)});
    }
  }
  return out;
}

}  // namespace weir::log
