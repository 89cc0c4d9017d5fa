#include "log/producer_window.h"

#include <algorithm>
#include <vector>

#include "base/bytes.h"

namespace weir::log {

namespace {
int32_t NextSeq(int32_t last) { return last == INT32_MAX ? 0 : last + 1; }
}  // namespace

bool operator==(const ProducerBatch& a, const ProducerBatch& b) {
  return a.first_seq == b.first_seq && a.last_seq == b.last_seq && a.start_offset == b.start_offset &&
         a.end_offset == b.end_offset && a.first_timestamp_ms == b.first_timestamp_ms &&
         a.last_timestamp_ms == b.last_timestamp_ms;
}

bool operator==(const ProducerWindows& a, const ProducerWindows& b) {
  if (a.producers_.size() != b.producers_.size()) return false;
  for (const auto& [id, p] : a.producers_) {
    auto it = b.producers_.find(id);
    if (it == b.producers_.end() || it->second.epoch != p.epoch || it->second.batches != p.batches) return false;
  }
  return true;
}

Result<ProducerCheck> ProducerWindows::Check(uint64_t producer_id, int16_t epoch, int32_t first_seq,
                                             int32_t count, bool unknown_starts_anywhere) const {
  if (epoch < 0 || first_seq < 0 || count <= 0) {
    return InvalidArgument("producer {}: epoch {} / sequence {} / count {} must be non-negative", producer_id,
                           epoch, first_seq, count);
  }
  auto it = producers_.find(producer_id);
  if (it == producers_.end() && unknown_starts_anywhere) return ProducerCheck{};
  if (it == producers_.end() || epoch > it->second.epoch) {
    if (first_seq != 0) {
      return OutOfRange("producer {} epoch {}: first batch must have sequence 0, got {}", producer_id, epoch,
                        first_seq);
    }
    return ProducerCheck{};
  }
  const Producer& p = it->second;
  if (epoch < p.epoch) {
    return Fenced("producer {} epoch {} is fenced by epoch {}", producer_id, epoch, p.epoch);
  }
  for (const ProducerBatch& b : p.batches) {
    if (b.first_seq == first_seq) {
      if (b.last_seq != LastSeq(first_seq, count)) {
        return OutOfRange("producer {}: retry of sequence {} has {} records, the original had a different count",
                          producer_id, first_seq, count);
      }
      return ProducerCheck{ProducerCheck::kDuplicate, b};
    }
  }
  int32_t expected = NextSeq(p.batches.empty() ? -1 : p.batches.back().last_seq);
  if (first_seq == expected) return ProducerCheck{};
  return OutOfRange("producer {} epoch {}: out-of-order sequence {}, expected {}", producer_id, epoch, first_seq,
                    expected);
}

void ProducerWindows::Record(uint64_t producer_id, int16_t epoch, const ProducerBatch& batch, TimePoint now) {
  Producer& p = producers_[producer_id];
  if (epoch != p.epoch) {
    p.epoch = epoch;
    p.batches.clear();
  }
  p.batches.push_back(batch);
  p.last_append = now;
  while (p.batches.size() > kProducerWindowBatches) p.batches.pop_front();
  if (producers_.size() <= kMaxProducersPerStream) return;
  const bool over_hard_bound = producers_.size() > kMaxRecentProducersPerStream;
  if (!over_hard_bound && now < next_forget_pass_) return;
  // Forget down to 7/8 of the bound at once, so this O(n) pass runs about
  // once per n/8 new producers.
  std::vector<std::pair<uint64_t, uint64_t>> by_end;  // (end of newest batch, id), of those that may go
  by_end.reserve(producers_.size());
  for (const auto& [id, q] : producers_) {
    if (over_hard_bound || now - q.last_append >= kProducerRecentWindow) {
      by_end.emplace_back(q.batches.empty() ? 0 : q.batches.back().end_offset, id);
    }
  }
  const size_t target = (over_hard_bound ? kMaxRecentProducersPerStream : kMaxProducersPerStream) * 7 / 8;
  const size_t wanted = producers_.size() - target;
  const size_t drop = std::min(wanted, by_end.size());
  next_forget_pass_ = drop < wanted ? now + std::chrono::seconds(1) : TimePoint{};
  std::nth_element(by_end.begin(), by_end.begin() + static_cast<std::ptrdiff_t>(drop), by_end.end());
  for (size_t i = 0; i < drop; ++i) producers_.erase(by_end[i].second);
}

// Format: u32 producer count, then per producer: id u64, epoch u16, n u8, then
// n batches (first_seq i32, last_seq i32, start u64, end u64, first_ts i64, last_ts i64).
std::string ProducerWindows::Serialize() const {
  std::string out;
  PutLE32(&out, static_cast<uint32_t>(producers_.size()));
  for (const auto& [id, p] : producers_) {
    PutLE64(&out, id);
    PutLE16(&out, static_cast<uint16_t>(p.epoch));
    out.push_back(static_cast<char>(p.batches.size()));
    for (const ProducerBatch& b : p.batches) {
      PutLE32(&out, static_cast<uint32_t>(b.first_seq));
      PutLE32(&out, static_cast<uint32_t>(b.last_seq));
      PutLE64(&out, b.start_offset);
      PutLE64(&out, b.end_offset);
      PutLE64(&out, static_cast<uint64_t>(b.first_timestamp_ms));
      PutLE64(&out, static_cast<uint64_t>(b.last_timestamp_ms));
    }
  }
  return out;
}

Result<ProducerWindows> ProducerWindows::Deserialize(std::string_view data) {
  ProducerWindows w;
  if (data.empty()) return w;
  ByteReader r(data);
  uint32_t n = 0;
  if (!r.GetLE32(&n)) return Corruption("producer state truncated");
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t id = 0;
    uint16_t epoch = 0;
    uint8_t count = 0;
    if (!r.GetLE64(&id) || !r.GetLE16(&epoch) || !r.GetU8(&count) || count > kProducerWindowBatches) {
      return Corruption("producer state: bad entry {}", i);
    }
    Producer& p = w.producers_[id];
    p.epoch = static_cast<int16_t>(epoch);
    p.last_append = Now();
    for (uint8_t j = 0; j < count; ++j) {
      ProducerBatch b;
      uint32_t fs = 0, ls = 0;
      uint64_t fts = 0, lts = 0;
      if (!r.GetLE32(&fs) || !r.GetLE32(&ls) || !r.GetLE64(&b.start_offset) || !r.GetLE64(&b.end_offset) ||
          !r.GetLE64(&fts) || !r.GetLE64(&lts)) {
        return Corruption("producer state: truncated batch {} of producer {}", j, id);
      }
      b.first_seq = static_cast<int32_t>(fs);
      b.last_seq = static_cast<int32_t>(ls);
      b.first_timestamp_ms = static_cast<int64_t>(fts);
      b.last_timestamp_ms = static_cast<int64_t>(lts);
      p.batches.push_back(b);
    }
  }
  if (r.remaining() != 0) return Corruption("producer state: {} trailing bytes", r.remaining());
  return w;
}

}  // namespace weir::log
