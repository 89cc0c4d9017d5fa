#include "base/histogram.h"

#include <cmath>

#include <bit>

namespace weir {

int Histogram::BucketOf(uint64_t v) {
  if (v < static_cast<uint64_t>(kSub)) return static_cast<int>(v);
  int msb = 63 - std::countl_zero(v);  // >= kSubBits
  int shift = msb - kSubBits;
  int sub = static_cast<int>((v >> shift) & (kSub - 1));
  return (shift + 1) * kSub + sub;
}

uint64_t Histogram::BucketUpperBound(int bucket) {
  if (bucket < kSub) return static_cast<uint64_t>(bucket);
  int shift = bucket / kSub - 1;
  uint64_t sub = static_cast<uint64_t>(bucket % kSub);
  uint64_t lower = (static_cast<uint64_t>(kSub) + sub) << shift;
  return lower + ((uint64_t{1} << shift) - 1);
}

void Histogram::Record(uint64_t v) {
  buckets_[static_cast<size_t>(BucketOf(v))].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  uint64_t m = max_.load(std::memory_order_relaxed);
  while (v > m && !max_.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
  }
}

uint64_t Histogram::Quantile(double q) const {
  uint64_t total = 0;
  for (const auto& b : buckets_) total += b.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  if (q < 0) q = 0;
  if (q > 1) q = 1;
  // Nearest rank: the ceil(q * total)-th smallest value (the 0-based index
  // one less); the epsilon keeps 0.99 * 100 from rounding up to 100.
  auto nth = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total) - 1e-9));
  uint64_t rank = nth == 0 ? 0 : nth - 1;
  if (rank >= total) rank = total - 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
    if (seen > rank) {
      uint64_t ub = BucketUpperBound(i);
      uint64_t m = max();
      return ub < m ? ub : m;
    }
  }
  return max();
}

uint64_t Histogram::CountAtOrBelow(uint64_t value) const {
  uint64_t n = 0;
  for (int i = 0; i < kBuckets && BucketUpperBound(i) <= value; ++i) {
    n += buckets_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
  }
  return n;
}

void Histogram::Reset() {
  for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
  count_.store(0);
  sum_.store(0);
  max_.store(0);
}

}  // namespace weir
