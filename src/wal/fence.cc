#include "wal/fence.h"

#include <thread>

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

Result<FenceResult> Fence(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from,
                          uint64_t fencer_nonce, const RetryPolicy& retry) {
  WEIR_RETURN_IF_ERROR(ValidateNodeId(chain.node));
  for (uint64_t seq = from;; ++seq) {
    WEIR_ASSIGN_OR_RETURN(SlotProbe probe, ProbeSlot(store, chain, seq, retry));
    if (probe.state == SlotState::kFlight) continue;
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
    // Someone wrote the slot meanwhile (the writer's flight, another fencer's
    // poison, or our own ambiguous poison): look again at the same seq.
    --seq;
  }
}

Status Walk(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from, uint64_t cut,
            const SlotVisitor& visit, const RetryPolicy& retry) {
  for (uint64_t seq = from; seq < cut; ++seq) {
    std::string key = SlotKey(chain.node, chain.epoch, seq);
    auto data = WithRetry(retry, [&] { return store.Get(key); });
    if (!data.ok()) return data.status().WithContext("walking committed slot " + key);
    WEIR_ASSIGN_OR_RETURN(SlotIndex index, DecodeSlot(key, *data));
    if (index.envelope.kind != SlotKind::kFlight || index.envelope.epoch != chain.epoch ||
        index.envelope.seq != seq) {
      return Corruption("slot {} below the cut is not this chain's flight", key);
    }
    WEIR_RETURN_IF_ERROR(visit(seq, index, *data));
  }
  return Status::Ok();
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
