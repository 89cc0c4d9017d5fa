// Histogram: a lock-free log-linear histogram of non-negative integer values
// (latencies in nanoseconds, sizes in bytes), owned by the metrics struct that
// holds it. 32 linear sub-buckets per power of two, so a reported percentile
// is within ~3% of the true value. Any thread may Record concurrently; readers
// get a consistent-enough snapshot.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace weir {

class Histogram {
 public:
  static constexpr int kSubBits = 5;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kBuckets = (64 - kSubBits + 1) * kSub;

  void Record(uint64_t value);

  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t max() const { return max_.load(std::memory_order_relaxed); }
  // Value at quantile q in [0,1] (upper edge of its bucket, capped at max); 0 if empty.
  uint64_t Quantile(double q) const;
  // Recorded values whose bucket lies wholly at or below `value` (for
  // exporting cumulative buckets; exact only when `value` is a bucket's
  // upper bound: values in the bucket holding `value` are left out).
  uint64_t CountAtOrBelow(uint64_t value) const;
  void Reset();

  // Bucket helpers, exposed for tests and exporters.
  static int BucketOf(uint64_t value);
  static uint64_t BucketUpperBound(int bucket);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> max_{0};
};

}  // namespace weir
