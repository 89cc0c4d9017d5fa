#include "wal/quorum_store.h"

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/thread.h"
#include "wal/slot_format.h"

namespace weir::wal {

namespace {

// What a store's lane answers for a request it did not queue.
constexpr const char* kNotQueued =
    "the store did not take the request: its queue is full (a store that stopped answering) or the quorum "
    "store is closing";
// Stores known to hold a slot this process wrote, for reads past the
// envelope (settle's read-back) without probing every store first.
constexpr size_t kMaxRemembered = 16384;

// One store and the threads that call it: a slow store's queue never holds another store's requests. Owned by
// QuorumStore::Impl (lanes). Submit is called from any thread; tasks run on the lane's own threads, reads, listings
// and deletes ahead of slot copies, and copies take at most three quarters of the threads, so a store with a backlog
// of copies still answers them. Destroying it joins its threads; tasks still queued are dropped.
class Lane {
 public:
  Lane(std::shared_ptr<objstore::ObjectStore> store, size_t threads, size_t backlog_cap, size_t max_requests)
      : store_(std::move(store)),
        backlog_cap_(backlog_cap),
        max_requests_(max_requests),
        copy_threads_(CopyThreads(threads)) {
    for (size_t i = 0; i < threads; ++i) {
      try {
        threads_.emplace_back([this] { Run(); });
      } catch (const std::system_error&) {
        if (threads_.empty()) throw;
        break;  // fewer threads: slower, not wrong
      }
    }
    if (threads_.size() < threads) {
      std::lock_guard lk(mu_);  // the threads started read it
      copy_threads_ = CopyThreads(threads_.size());
    }
  }
  // Copies take at most three quarters of `threads` (one at least), so
  // requests still find a thread.
  static size_t CopyThreads(size_t threads) { return threads > 1 ? threads - std::max<size_t>(1, threads / 4) : 1; }
  ~Lane() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  objstore::ObjectStore& store() { return *store_; }
  QuorumStoreCounters& counters() { return counters_; }

  // Queues `fn`: a slot copy of `bytes` (> 0), which count against the
  // backlog until it has run, or a request (0). False, and nothing queued,
  // when the copy would not fit, max_requests_ requests wait already, or the
  // lane is stopping.
  bool Submit(size_t bytes, std::function<void()> fn) {
    {
      std::lock_guard lk(mu_);
      if (stop_) return false;
      if (bytes == 0) {
        if (requests_.size() >= max_requests_) {
          counters_.requests_refused.fetch_add(1, std::memory_order_relaxed);
          return false;
        }
        requests_.push_back(Task{0, std::move(fn)});
      } else {
        if (backlog_ + bytes > backlog_cap_ && backlog_ > 0) return false;
        backlog_ += bytes;
        counters_.backlog_bytes.store(backlog_, std::memory_order_relaxed);
        copies_.push_back(Task{bytes, std::move(fn)});
      }
    }
    cv_.notify_one();
    return true;
  }

 private:
  struct Task {
    size_t bytes;
    std::function<void()> fn;
  };
  void Run() {
    SetThreadName("wal-quorum");
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] {
        return stop_ || !requests_.empty() || (!copies_.empty() && copies_running_ < copy_threads_);
      });
      if (stop_) return;  // queued copies are dropped: tolerated absent
      std::deque<Task>& from = !requests_.empty() ? requests_ : copies_;
      Task t = std::move(from.front());
      from.pop_front();
      if (t.bytes > 0) ++copies_running_;
      lk.unlock();
      t.fn();
      t.fn = nullptr;  // releases what it held before the backlog says so
      lk.lock();
      if (t.bytes > 0) {
        --copies_running_;
        backlog_ -= t.bytes;
        counters_.backlog_bytes.store(backlog_, std::memory_order_relaxed);
        if (!copies_.empty()) cv_.notify_one();  // a thread may be waiting for a copy's turn
      }
    }
  }

  std::shared_ptr<objstore::ObjectStore> store_;
  const size_t backlog_cap_;
  const size_t max_requests_;
  size_t copy_threads_;  // guarded by mu_ once threads run
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> requests_;
  std::deque<Task> copies_;
  size_t copies_running_ = 0;
  size_t backlog_ = 0;
  bool stop_ = false;
  QuorumStoreCounters counters_;
  std::vector<std::thread> threads_;
};

// Results of one request fanned out to every store; the caller waits on it
// until it can decide, and the stores' tasks that answer later still find it.
template <typename T>
struct Fanout {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<T>> answers;
  size_t answered = 0;
  explicit Fanout(size_t n) : answers(n) {}
  void Answer(size_t i, T v) {
    {
      std::lock_guard lk(mu);
      answers[i] = std::move(v);
      ++answered;
    }
    cv.notify_all();
  }
};

bool SameEnvelope(const Envelope& a, const Envelope& b) {
  return a.kind == b.kind && a.epoch == b.epoch && a.seq == b.seq && a.nonce == b.nonce &&
         a.total_size == b.total_size;
}

}  // namespace

// QuorumStore's state, owned by it. Any thread: lanes, w and grace are fixed
// by Open; the stores known to hold this process's slots (holders) are under
// remembered_mu, at most kMaxRemembered keys, oldest dropped first.
struct QuorumStore::Impl {
  std::vector<std::unique_ptr<Lane>> lanes;
  size_t w = 0;
  std::chrono::milliseconds grace{0};
  std::mutex remembered_mu;
  std::unordered_map<std::string, uint32_t> holders;  // key -> stores holding our copy
  std::deque<std::string> remembered_order;

  size_t k() const { return lanes.size(); }

  void Remember(std::string_view key, uint32_t mask) {
    std::lock_guard lk(remembered_mu);
    auto [it, added] = holders.try_emplace(std::string(key), mask);
    if (!added) return;
    remembered_order.push_back(it->first);
    if (remembered_order.size() > kMaxRemembered) {
      holders.erase(remembered_order.front());
      remembered_order.pop_front();
    }
  }
  void Forget(std::string_view key) {
    std::lock_guard lk(remembered_mu);
    holders.erase(std::string(key));  // its remembered_order entry ages out
  }
  uint32_t Holders(std::string_view key) {
    std::lock_guard lk(remembered_mu);
    auto it = holders.find(std::string(key));
    return it == holders.end() ? 0 : it->second;
  }

  // Runs fn(lane) for every store on its lane; a store whose lane refuses
  // (a full backlog or request queue, or stopping) answers `refused`.
  template <typename T, typename Fn>
  std::shared_ptr<Fanout<T>> FanOut(size_t bytes, Fn fn, T refused) {
    auto out = std::make_shared<Fanout<T>>(k());
    for (size_t i = 0; i < k(); ++i) {
      Lane* lane = lanes[i].get();
      bool queued = lane->Submit(bytes, [out, i, lane, fn] { out->Answer(i, fn(*lane)); });
      if (!queued) {
        if (bytes > 0) lane->counters().copies_skipped.fetch_add(1, std::memory_order_relaxed);
        out->Answer(i, refused);
      }
    }
    return out;
  }

  struct Probe {
    enum Kind { kMissing, kFound, kFailed } kind = kFailed;
    std::string bytes;  // kFound: the object's first kEnvelopeSize bytes (or all of a shorter one)
    Status error;       // kFailed
  };
  struct Decision {
    Status status;      // not ok: kNotFound (no committed copy), kCorruption, or a store's failure
    std::string bytes;  // the envelope bytes of the decided object
    Envelope envelope;
    uint32_t holders = 0;
  };

  // Reads every store's envelope and decides what the slot is.
  Decision Classify(std::string_view key_view) {
    const std::string key(key_view);
    auto probes = FanOut<Probe>(
        0,
        [key](Lane& lane) {
          Probe p;
          auto got = lane.store().Get(key, objstore::ByteRange{0, kEnvelopeSize});
          if (got.ok()) {
            p.kind = Probe::kFound;
            p.bytes = std::move(*got);
          } else if (got.status().code() == Code::kNotFound) {
            p.kind = Probe::kMissing;
          } else {
            p.error = got.status();
          }
          return p;
        },
        Probe{Probe::kFailed, {}, Unavailable(kNotQueued)});
    const size_t n = k();
    const size_t poison_quorum = n - w + 1;
    std::unique_lock lk(probes->mu);
    while (true) {
      size_t missing = 0, failed = 0, poisons = 0, unreadable = 0;
      Status first_error;
      std::optional<size_t> first_poison;
      // Flights grouped by envelope: the index of the first and the holders.
      std::vector<std::pair<size_t, uint32_t>> flights;
      std::vector<Envelope> flight_envs;
      for (size_t i = 0; i < n; ++i) {
        const auto& a = probes->answers[i];
        if (!a) continue;
        if (a->kind == Probe::kMissing) {
          ++missing;
        } else if (a->kind == Probe::kFailed) {
          ++failed;
          if (first_error.ok()) first_error = a->error;
        } else {
          auto env = DecodeEnvelope(a->bytes);
          if (!env.ok()) {
            ++unreadable;
          } else if (env->kind == SlotKind::kPoison) {
            ++poisons;
            if (!first_poison) first_poison = i;
          } else {
            size_t g = 0;
            while (g < flight_envs.size() && !SameEnvelope(flight_envs[g], *env)) ++g;
            if (g == flight_envs.size()) {
              flight_envs.push_back(*env);
              flights.emplace_back(i, 0);
            }
            flights[g].second |= uint32_t{1} << i;
          }
        }
      }
      auto decided = [&](size_t first, uint32_t holders) {
        Decision d;
        d.bytes = probes->answers[first]->bytes;
        d.envelope = *DecodeEnvelope(d.bytes);
        d.holders = holders;
        return d;
      };
      for (size_t g = 0; g < flights.size(); ++g) {
        if (static_cast<size_t>(std::popcount(flights[g].second)) >= w) return decided(flights[g].first, flights[g].second);
      }
      if (poisons >= poison_quorum) {
        uint32_t holders = 0;
        for (size_t i = 0; i < n; ++i) {
          const auto& a = probes->answers[i];
          if (!a || a->kind != Probe::kFound) continue;
          auto env = DecodeEnvelope(a->bytes);
          if (env.ok() && env->kind == SlotKind::kPoison) holders |= uint32_t{1} << i;
        }
        return decided(*first_poison, holders);
      }
      const size_t unknown = (n - probes->answered) + failed;
      size_t best_flight = 0;
      for (const auto& f : flights) best_flight = std::max<size_t>(best_flight, std::popcount(f.second));
      // Could a writer or a fencer still complete it? Missing stores may yet
      // take a copy; unknown ones may hold one.
      const bool flight_possible = best_flight + missing + unknown >= w;
      const bool poison_possible = poisons + missing + unknown >= poison_quorum;
      if (!flight_possible && !poison_possible) {
        Decision d;
        d.status = Corruption("slot {} can be neither committed nor poisoned: its stores hold {} flight copies "
                              "of {} writers, {} poisons and {} unreadable objects",
                              key, best_flight, flights.size(), poisons, unreadable);
        return d;
      }
      // Stores yet to answer may still decide it either way (with those that
      // failed): wait for them.
      const size_t pending = n - probes->answered;
      if (pending > 0 && (best_flight + unknown >= w || poisons + unknown >= poison_quorum)) {
        probes->cv.wait(lk);
        continue;
      }
      if (best_flight + failed >= w) {
        // The stores that failed may hold the copies that commit it.
        Decision d;
        d.status = first_error.WithContext(
            fmt::format("slot {}: {} of {} stores did not answer, and the slot is undecided without them", key,
                        failed, n));
        return d;
      }
      Decision d;
      d.status = NotFound("slot {} is not committed (best flight {} of {} copies needed)", key, best_flight, w);
      return d;
    }
  }

  // Reads `range` from the first store in `mask` that answers with bytes
  // that check out: a whole slot must decode (its CRCs), a range must have
  // `expect` bytes when that is known (nonzero). A store holding a damaged
  // copy is passed over for the next holder, as one that fails is.
  Result<std::string> ReadFrom(uint32_t mask, std::string_view key, std::optional<objstore::ByteRange> range,
                               uint64_t expect = 0) {
    Status last = NotFound("slot {}: no store holds it", key);
    for (size_t i = 0; i < k(); ++i) {
      if (!(mask & (uint32_t{1} << i))) continue;
      auto got = lanes[i]->store().Get(key, range);
      if (got.ok() && !range) {
        if (auto decoded = DecodeSlot(key, *got); !decoded.ok()) {
          got = decoded.status().WithContext(fmt::format("the copy in store {}", i));
        }
      } else if (got.ok() && expect != 0 && got->size() != expect) {
        got = Corruption("slot {}: store {} returned {} bytes of a range of {}", key, i, got->size(), expect);
      }
      if (got.ok()) return got;
      last = got.status();
    }
    return last;
  }
};

QuorumStore::QuorumStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
QuorumStore::~QuorumStore() = default;

Result<std::shared_ptr<QuorumStore>> QuorumStore::Open(std::vector<std::shared_ptr<objstore::ObjectStore>> stores,
                                                       QuorumOptions options) {
  const size_t k = stores.size();
  if (k < 2 || k > QuorumStore::kMaxStores) {
    return InvalidArgument("a quorum WAL store needs 2 to {} stores, not {}", QuorumStore::kMaxStores, k);
  }
  for (const auto& s : stores) {
    if (!s) return InvalidArgument("a quorum WAL store was given a null store");
  }
  // One store named twice would take its own copy's 412 for a second copy
  // (also through two paths to one directory).
  std::map<std::string, std::string> locations;  // Identity() -> Location()
  for (const auto& s : stores) {
    auto [it, added] = locations.emplace(s->Identity(), s->Location());
    if (!added) {
      if (it->second == s->Location()) return InvalidArgument("a quorum WAL store was given {} twice", s->Location());
      return InvalidArgument("a quorum WAL store was given one store twice: {} and {} are the same directory",
                             it->second, s->Location());
    }
  }
  const size_t w = options.write_quorum == 0 ? k / 2 + 1 : options.write_quorum;
  if (w > k) return InvalidArgument("write quorum {} is more than the {} stores", w, k);
  if (options.threads_per_store == 0) return InvalidArgument("a quorum WAL store needs a thread per store at least");
  auto impl = std::make_unique<Impl>();
  impl->w = w;
  impl->grace = options.straggler_grace;
  try {
    for (auto& s : stores) {
      impl->lanes.push_back(std::make_unique<Lane>(std::move(s), options.threads_per_store, options.backlog_bytes,
                                                   std::max<size_t>(options.max_queued_requests, 1)));
    }
  } catch (const std::system_error& e) {
    return ResourceExhausted("starting the quorum WAL store's threads: {}", e.what());
  }
  return std::shared_ptr<QuorumStore>(new QuorumStore(std::move(impl)));
}

size_t QuorumStore::store_count() const { return impl_->k(); }
size_t QuorumStore::write_quorum() const { return impl_->w; }
objstore::ObjectStore& QuorumStore::store(size_t i) const { return impl_->lanes.at(i)->store(); }
const QuorumStoreCounters& QuorumStore::counters(size_t store) const { return impl_->lanes.at(store)->counters(); }

namespace {
template <typename Name>
std::string DescribeQuorum(size_t w, size_t k, Name&& name) {
  std::string out = fmt::format("quorum({} of {}:", w, k);
  for (size_t i = 0; i < k; ++i) out += fmt::format("{} {}", i ? "," : "", name(i));
  return out + ")";
}
}  // namespace

std::string QuorumStore::Describe() const {
  return DescribeQuorum(impl_->w, impl_->k(), [&](size_t i) { return impl_->lanes[i]->store().Describe(); });
}

std::string QuorumStore::Location() const {
  // In order: the same stores named in another order are the same quorum.
  std::vector<std::string> where;
  for (const auto& lane : impl_->lanes) where.push_back(lane->store().Location());
  std::sort(where.begin(), where.end());
  return DescribeQuorum(impl_->w, impl_->k(), [&](size_t i) { return where[i]; });
}

size_t QuorumStore::PreferredParallelPuts() const {
  size_t n = SIZE_MAX;
  for (const auto& l : impl_->lanes) n = std::min(n, l->store().PreferredParallelPuts());
  return n;
}

Status QuorumStore::Put(std::string_view key_view, std::string_view data, const objstore::PutOptions& options) {
  if (!options.if_none_match) {
    return InvalidArgument("the quorum WAL store takes only create-only PUTs of WAL slots ({})", key_view);
  }
  auto mine = DecodeEnvelope(data);
  if (!mine.ok()) return InvalidArgument("the quorum WAL store takes only WAL slots: {}", mine.status().message());
  Impl& im = *impl_;
  const size_t n = im.k();
  // Copies that make it: W for a flight, K-W+1 for a poison (DESIGN §6).
  const size_t need = mine->kind == SlotKind::kPoison ? n - im.w + 1 : im.w;
  enum class Copy { kOurs, kForeign, kFailed };
  struct Outcome {
    Copy copy = Copy::kFailed;
    Status error;
  };
  const std::string key(key_view);
  // Copied: copies still on their way when this returns outlive `data`.
  auto bytes = std::make_shared<const std::string>(data);
  const Envelope env = *mine;
  auto fan = im.FanOut<Outcome>(
      bytes->size(),
      [key, bytes, env](Lane& lane) {
        objstore::ObjectStore& s = lane.store();
        QuorumStoreCounters& c = lane.counters();
        Outcome o;
        Status st = s.Put(key, *bytes, objstore::PutOptions{.if_none_match = true});
        if (st.ok()) {
          o.copy = Copy::kOurs;
        } else if (st.code() == Code::kPreconditionFailed) {
          // Ours from an earlier attempt, or another writer's or a fencer's.
          auto head = s.Get(key, objstore::ByteRange{0, kEnvelopeSize});
          if (head.ok()) {
            // A poison's purpose is met by any fencer's poison of this slot.
            auto theirs = DecodeEnvelope(*head);
            const bool same = theirs.ok() && (SameEnvelope(*theirs, env) ||
                                              (env.kind == SlotKind::kPoison && theirs->kind == SlotKind::kPoison &&
                                               theirs->epoch == env.epoch && theirs->seq == env.seq));
            o.copy = same ? Copy::kOurs : Copy::kForeign;
          } else {
            o.error = head.status().code() == Code::kNotFound
                          ? Unavailable("{}: the occupant vanished", key)  // deleted meanwhile: try again
                          : head.status().WithContext("reading the envelope after 412");
          }
        } else {
          o.error = st;
        }
        if (o.copy == Copy::kOurs) c.copies.fetch_add(1, std::memory_order_relaxed);
        if (o.copy == Copy::kFailed) c.copy_failures.fetch_add(1, std::memory_order_relaxed);
        return o;
      },
      Outcome{Copy::kFailed, Unavailable("{}: this store's backlog of slot copies is full", key)});
  std::unique_lock lk(fan->mu);
  while (true) {
    size_t ours = 0, foreign = 0;
    uint32_t holders = 0;
    Status first_error;
    for (size_t i = 0; i < n; ++i) {
      const auto& a = fan->answers[i];
      if (!a) continue;
      if (a->copy == Copy::kOurs) {
        ++ours;
        holders |= uint32_t{1} << i;
      } else if (a->copy == Copy::kForeign) {
        ++foreign;
      } else if (first_error.ok()) {
        first_error = a->error;
      }
    }
    if (ours >= need) {
      lk.unlock();
      if (env.kind == SlotKind::kFlight) im.Remember(key, holders);
      return Status::Ok();
    }
    if (foreign > n - need) {
      return PreconditionFailed("slot {} is taken: {} of {} stores hold another object", key, foreign, n);
    }
    if (fan->answered == n) {
      if (first_error.ok()) first_error = Unavailable("no store answered");
      return first_error.WithContext(
          fmt::format("slot {}: {} of {} copies landed ({} needed)", key, ours, n, need));
    }
    fan->cv.wait(lk);
  }
}

Result<std::string> QuorumStore::Get(std::string_view key, std::optional<objstore::ByteRange> range) {
  Impl& im = *impl_;
  // A read past the envelope of a slot this process wrote: its holders are known.
  if (range && range->offset > 0) {
    if (uint32_t holders = im.Holders(key)) {
      // Whole only: a short answer (a damaged copy, or a range past the end)
      // is decided below, where the slot's size is known.
      auto got = im.ReadFrom(holders, key, range);
      if (got.ok() && got->size() == range->length) return got;
    }
  }
  Impl::Decision d = im.Classify(key);
  if (!d.status.ok()) return d.status;
  // The probe read the first kEnvelopeSize bytes: enough for a poison, or an envelope read.
  const uint64_t total = d.envelope.total_size;
  const uint64_t have = d.bytes.size();
  const uint64_t begin = range ? range->offset : 0;
  const uint64_t end = range ? std::min<uint64_t>(total, range->offset + range->length) : total;
  if (begin >= total && total > 0) return OutOfRange("{}: range starts at {}, past its {} bytes", key, begin, total);
  if (end <= have) return d.bytes.substr(begin, end - begin);
  return im.ReadFrom(d.holders, key, range, end - begin);
}

Result<objstore::ObjectInfo> QuorumStore::Head(std::string_view key_view) {
  Impl& im = *impl_;
  const std::string key(key_view);
  auto fan = im.FanOut<Result<objstore::ObjectInfo>>(
      0, [key](Lane& lane) { return lane.store().Head(key); },
      Result<objstore::ObjectInfo>(Unavailable(kNotQueued)));
  std::unique_lock lk(fan->mu);
  TimePoint grace_end = TimePoint::max();
  while (true) {
    Status first_error;
    size_t absent = 0;
    for (const auto& a : fan->answers) {
      if (!a) continue;
      if (a->ok()) return **a;
      if (a->status().code() == Code::kNotFound) {
        ++absent;
      } else if (first_error.ok()) {
        first_error = a->status();
      }
    }
    // W answers and a grace are enough: a copy only a slow store holds is
    // garbage a later sweep finds; so is one only a failing store may hold,
    // once W stores said it is not there (up to K-W stores may fail).
    if (fan->answered == im.k() || (fan->answered >= im.w && Now() >= grace_end)) {
      if (!first_error.ok() && absent < im.w) return first_error;
      return NotFound("{} is in none of the quorum's stores that answered", key);
    }
    if (fan->answered >= im.w) {
      if (grace_end == TimePoint::max()) grace_end = Now() + im.grace;
      fan->cv.wait_until(lk, grace_end);
    } else {
      fan->cv.wait(lk);
    }
  }
}

Result<objstore::ListPage> QuorumStore::List(std::string_view prefix_view, std::string_view after_view,
                                             size_t max_keys) {
  Impl& im = *impl_;
  const std::string prefix(prefix_view), after(after_view);
  auto fan = im.FanOut<Result<objstore::ListPage>>(
      0, [=](Lane& lane) { return lane.store().List(prefix, after, max_keys); },
      Result<objstore::ListPage>(Unavailable(kNotQueued)));
  // Up to K-W stores may be down or slow (given a grace once W answered):
  // what they hold is listed by the others (every committed slot has W copies, every dead one K-W+1
  // poisons) or is left for a later listing.
  std::unique_lock lk(fan->mu);
  auto listed = [&] {
    size_t ok = 0;
    for (const auto& a : fan->answers) ok += a && a->ok();
    return ok;
  };
  fan->cv.wait(lk, [&] { return fan->answered == im.k() || listed() >= im.w; });
  fan->cv.wait_for(lk, im.grace, [&] { return fan->answered == im.k(); });
  // Each store's page holds its first max_keys keys after `after`, so the
  // merged first max_keys are the quorum's. A key's size is the smallest
  // any store gave: a slot with one flight copy and the fence's poisons is
  // a poison (the sweep keeps poisons), and W answers include one of them.
  std::map<std::string, uint64_t> keys;
  bool more = false;
  size_t failed = 0;
  Status first_error;
  for (const auto& a : fan->answers) {
    if (!a || !a->ok()) {
      ++failed;
      if (a && first_error.ok()) first_error = a->status();
      continue;
    }
    for (const auto& o : (*a)->objects) {
      auto [it, added] = keys.emplace(o.key, o.size);
      if (!added) it->second = std::min(it->second, o.size);
    }
    more |= !(*a)->next_start_after.empty();
  }
  if (failed > im.k() - im.w) {
    return first_error.WithContext(fmt::format("listing {}: {} of {} stores failed", prefix, failed, im.k()));
  }
  objstore::ListPage page;
  for (auto& [k, size] : keys) {
    if (page.objects.size() == max_keys) {
      more = true;
      break;
    }
    page.objects.push_back(objstore::ObjectInfo{k, size});
  }
  if (more && !page.objects.empty()) page.next_start_after = page.objects.back().key;
  return page;
}

Status QuorumStore::Delete(std::string_view key) {
  const std::string k(key);
  return DeleteMany(std::span<const std::string>(&k, 1));
}

Status QuorumStore::DeleteMany(std::span<const std::string> keys_view) {
  Impl& im = *impl_;
  for (const auto& key : keys_view) im.Forget(key);
  auto keys = std::make_shared<const std::vector<std::string>>(keys_view.begin(), keys_view.end());
  auto fan = im.FanOut<Status>(
      0, [keys](Lane& lane) { return lane.store().DeleteMany(*keys); },
      Unavailable(kNotQueued));
  // W answers and a grace are enough: what a slow store keeps is garbage a
  // later sweep finds (the deletes still run there).
  // So is what a failing store keeps, once W stores deleted (up to K-W
  // stores may fail).
  std::unique_lock lk(fan->mu);
  auto deleted = [&] {
    size_t ok = 0;
    for (const auto& a : fan->answers) ok += a && a->ok();
    return ok;
  };
  fan->cv.wait(lk, [&] { return fan->answered >= im.w; });
  fan->cv.wait_for(lk, im.grace, [&] { return fan->answered == im.k(); });
  if (deleted() >= im.w) return Status::Ok();
  for (size_t i = 0; i < im.k(); ++i) {
    if (fan->answers[i] && !fan->answers[i]->ok()) {
      return fan->answers[i]->WithContext(
          fmt::format("deleting from store {} of the quorum ({} of {} deleted)", i, deleted(), im.k()));
    }
  }
  return Unavailable("deleting: {} of {} stores of the quorum deleted", deleted(), im.k());
}

}  // namespace weir::wal
