#include "wal/fence.h"

#include <algorithm>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "base/log.h"

namespace weir::wal {

namespace {

// Runs op until it returns a non-retryable status or attempts run out.
template <typename Op>
auto WithRetry(const RetryPolicy& retry, Op&& op) -> decltype(op()) {
  Duration backoff = retry.initial;
  for (int attempt = 1;; ++attempt) {
    auto r = op();
    if (r.ok() || !r.status().retryable() || attempt >= retry.attempts) return r;
    std::this_thread::sleep_for(backoff);
    backoff = std::min<Duration>(backoff * 2, retry.max);
  }
}

struct StatusBox {  // adapts Status to the Result-like shape WithRetry expects
  Status st;
  bool ok() const { return st.ok(); }
  const Status& status() const { return st; }
};

}  // namespace

Result<SlotProbe> ProbeSlot(objstore::ObjectStore& store, const ChainRef& chain, uint64_t seq,
                            const RetryPolicy& retry) {
  std::string key = SlotKey(chain.node, chain.epoch, seq);
  auto head = WithRetry(retry, [&] { return store.Get(key, objstore::ByteRange{0, kEnvelopeSize}); });
  SlotProbe probe;
  if (!head.ok()) {
    if (head.status().code() == Code::kNotFound) return probe;
    return head.status().WithContext("probing " + key);
  }
  auto env = DecodeEnvelope(*head);
  if (!env.ok()) return env.status().WithContext("slot " + key);
  if (env->epoch != chain.epoch || env->seq != seq) {
    return Corruption("slot {}: envelope names epoch {} seq {}", key, env->epoch, env->seq);
  }
  probe.state = env->kind == SlotKind::kPoison ? SlotState::kPoison : SlotState::kFlight;
  probe.envelope = *env;
  return probe;
}

namespace {

// Runs fn(seq) for seqs [first, first + n) concurrently, one thread each, and
// returns the results in seq order. n is small (RetryPolicy::parallelism).
// Out of threads, the calling thread runs the seqs no thread took.
template <typename Fn>
auto InParallel(uint64_t first, uint64_t n, Fn&& fn) -> std::vector<decltype(fn(first))> {
  std::vector<std::optional<decltype(fn(first))>> slots(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  uint64_t started = 0;
  for (; started < n; ++started) {
    try {
      threads.emplace_back([&, i = started] { slots[i].emplace(fn(first + i)); });
    } catch (const std::system_error&) {
      break;
    }
  }
  for (uint64_t i = started; i < n; ++i) slots[i].emplace(fn(first + i));
  for (auto& t : threads) t.join();
  std::vector<decltype(fn(first))> out;
  out.reserve(n);
  for (auto& r : slots) out.push_back(std::move(*r));
  return out;
}

}  // namespace

Result<FenceResult> Fence(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from,
                          uint64_t fencer_nonce, const RetryPolicy& retry) {
  WEIR_RETURN_IF_ERROR(ValidateNodeId(chain.node));
  const uint64_t width = static_cast<uint64_t>(std::max(retry.parallelism, 1));
  for (uint64_t base = from;; base += width) {
    // Probe a run of seqs at once; decide in order.
    auto probes = InParallel(base, width, [&](uint64_t seq) { return ProbeSlot(store, chain, seq, retry); });
    for (uint64_t i = 0; i < width; ++i) {
      uint64_t seq = base + i;
      if (!probes[i].ok()) return probes[i].status();
      SlotProbe probe = *probes[i];
      while (true) {
        if (probe.state == SlotState::kFlight) break;
        if (probe.state == SlotState::kPoison) return FenceResult{seq, false};
        std::string key = SlotKey(chain.node, chain.epoch, seq);
        std::string poison = EncodePoison(chain.epoch, seq, fencer_nonce);
        objstore::PutOptions po;
        po.if_none_match = true;
        auto put = WithRetry(retry, [&] { return StatusBox{store.Put(key, poison, po)}; });
        if (put.ok()) {
          Log().info("fenced WAL chain {}/{} at slot {}", chain.node, chain.epoch, seq);
          return FenceResult{seq, true};
        }
        if (put.st.code() != Code::kPreconditionFailed) return put.st.WithContext("writing poison " + key);
        // Someone wrote the slot meanwhile (the writer's flight, another
        // fencer's poison, or our own ambiguous poison): look again.
        WEIR_ASSIGN_OR_RETURN(probe, ProbeSlot(store, chain, seq, retry));
      }
    }
  }
}

Status Walk(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from, uint64_t cut,
            const SlotVisitor& visit, const RetryPolicy& retry) {
  const uint64_t width = static_cast<uint64_t>(std::max(retry.parallelism, 1));
  for (uint64_t base = from; base < cut; base += width) {
    uint64_t n = std::min(width, cut - base);
    auto objects = InParallel(base, n, [&](uint64_t seq) {
      return WithRetry(retry, [&] { return store.Get(SlotKey(chain.node, chain.epoch, seq)); });
    });
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t seq = base + i;
      std::string key = SlotKey(chain.node, chain.epoch, seq);
      if (!objects[i].ok()) return objects[i].status().WithContext("walking committed slot " + key);
      const std::string& data = *objects[i];
      WEIR_ASSIGN_OR_RETURN(SlotIndex index, DecodeSlot(key, data));
      if (index.envelope.kind != SlotKind::kFlight || index.envelope.epoch != chain.epoch ||
          index.envelope.seq != seq) {
        return Corruption("slot {} below the cut is not this chain's flight", key);
      }
      WEIR_RETURN_IF_ERROR(visit(seq, index, data));
    }
  }
  return Status::Ok();
}

Result<FenceResult> FenceAndWalk(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from,
                                 uint64_t fencer_nonce, const SlotVisitor& visit, const RetryPolicy& retry) {
  WEIR_RETURN_IF_ERROR(ValidateNodeId(chain.node));
  const uint64_t width = static_cast<uint64_t>(std::max(retry.parallelism, 1));
  for (uint64_t base = from;; base += width) {
    auto objects = InParallel(base, width, [&](uint64_t seq) {
      return WithRetry(retry, [&] { return store.Get(SlotKey(chain.node, chain.epoch, seq)); });
    });
    for (uint64_t i = 0; i < width; ++i) {
      uint64_t seq = base + i;
      std::string key = SlotKey(chain.node, chain.epoch, seq);
      if (!objects[i].ok() && objects[i].status().code() != Code::kNotFound) {
        return objects[i].status().WithContext("reading slot " + key);
      }
      if (!objects[i].ok()) {
        // The first missing seq: poison it (Fence settles a race with a late writer).
        WEIR_ASSIGN_OR_RETURN(FenceResult fence, Fence(store, chain, seq, fencer_nonce, retry));
        if (fence.cut == seq) return fence;
        // A flight landed there meanwhile: it and what follows are committed; walk them too.
        WEIR_RETURN_IF_ERROR(Walk(store, chain, seq, fence.cut, visit, retry));
        return fence;
      }
      const std::string& data = *objects[i];
      WEIR_ASSIGN_OR_RETURN(SlotIndex index, DecodeSlot(key, data));
      if (index.envelope.epoch != chain.epoch || index.envelope.seq != seq) {
        return Corruption("slot {}: envelope names epoch {} seq {}", key, index.envelope.epoch, index.envelope.seq);
      }
      if (index.envelope.kind == SlotKind::kPoison) return FenceResult{seq, false};
      WEIR_RETURN_IF_ERROR(visit(seq, index, data));
    }
  }
}

Result<uint64_t> DeleteGarbage(objstore::ObjectStore& store, const ChainRef& chain, uint64_t cut,
                               uint64_t window, const RetryPolicy& retry) {
  uint64_t deleted = 0;
  for (uint64_t seq = cut + 1; seq <= cut + window; ++seq) {
    std::string key = SlotKey(chain.node, chain.epoch, seq);
    auto head = WithRetry(retry, [&] { return store.Head(key); });
    if (!head.ok()) {
      if (head.status().code() == Code::kNotFound) continue;
      return head.status().WithContext("garbage probe " + key);
    }
    auto del = WithRetry(retry, [&] { return StatusBox{store.Delete(key)}; });
    if (!del.ok()) return del.st.WithContext("deleting garbage slot " + key);
    ++deleted;
  }
  return deleted;
}

}  // namespace weir::wal
