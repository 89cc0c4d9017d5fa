// Idempotent-producer windows (Kafka semantics): per producer id, the epoch
// and the last 5 batches appended to one stream. Decides whether a batch is
// new, a retry of a recent batch (return its original offsets), out of order,
// or from a fenced (older) producer epoch. Sequences count records, as Kafka's
// baseSequence does: a batch of n records starting at s covers s..s+n-1 and
// the next batch must start at s+n (mod 2^31).
//
// Owned by one stream; not thread-safe (the stream's sequencer lock guards it).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "base/clock.h"
#include "base/status.h"

namespace weir::log {

inline constexpr size_t kProducerWindowBatches = 5;
// At most this many producers are remembered per stream: past it, the ones
// that appended least recently (by offset) are forgotten, so a stream's state
// stays bounded however many producers come and go.
inline constexpr size_t kMaxProducersPerStream = 1024;
// Except producers that appended within this (by this process's clock): a
// client retries a batch within its delivery timeout (librdkafka 5 min,
// Java 2 min), and a forgotten producer's retry of its first batch would be
// appended again. They are kept past kMaxProducersPerStream, up to
// kMaxRecentProducersPerStream.
inline constexpr Duration kProducerRecentWindow = std::chrono::minutes(5);
inline constexpr size_t kMaxRecentProducersPerStream = 8 * kMaxProducersPerStream;

// Sequence of the last record of a batch of `count` records starting at
// `first` (sequences wrap from INT32_MAX to 0, as Kafka's do).
inline int32_t LastSeq(int32_t first, int64_t count) {
  return static_cast<int32_t>((static_cast<int64_t>(first) + count - 1) % (int64_t{INT32_MAX} + 1));
}

struct ProducerBatch {
  int32_t first_seq = 0;
  int32_t last_seq = 0;
  uint64_t start_offset = 0;
  uint64_t end_offset = 0;  // exclusive
  int64_t first_timestamp_ms = 0;
  int64_t last_timestamp_ms = 0;
};

struct ProducerCheck {
  enum Kind { kNew, kDuplicate } kind = kNew;
  ProducerBatch original;  // for kDuplicate
};

class ProducerWindows {
 public:
  // kNew, kDuplicate, or an error: kFenced (epoch older than the producer's
  // current one), kOutOfRange (sequence gap or too old to tell: out of order).
  // `unknown_starts_anywhere`: a producer not known here takes any first
  // sequence (else it must start at 0); a known one's new epoch starts at 0.
  Result<ProducerCheck> Check(uint64_t producer_id, int16_t epoch, int32_t first_seq, int32_t count,
                              bool unknown_starts_anywhere = false) const;
  // Records an appended batch (after Check said kNew) at `now`. Past
  // kMaxProducersPerStream producers, forgets those that did not append
  // within kProducerRecentWindow, down to 7/8 of the bound, the ones whose
  // newest batch ends earliest first; past kMaxRecentProducersPerStream,
  // any. Offsets, not record timestamps, order them (clients set those).
  // Producers restored by Deserialize count as having appended then.
  void Record(uint64_t producer_id, int16_t epoch, const ProducerBatch& batch, TimePoint now = Now());

  bool Knows(uint64_t producer_id) const { return producers_.count(producer_id) != 0; }
  bool empty() const { return producers_.empty(); }
  size_t size() const { return producers_.size(); }

  // Compact binary form for the stream's settled state, and back.
  std::string Serialize() const;
  static Result<ProducerWindows> Deserialize(std::string_view data);

  friend bool operator==(const ProducerWindows& a, const ProducerWindows& b);

 private:
  struct Producer {
    int16_t epoch = 0;
    std::deque<ProducerBatch> batches;  // oldest first, at most kProducerWindowBatches
    TimePoint last_append;              // not serialized
  };
  std::map<uint64_t, Producer> producers_;
  // After a pass that found too few producers to forget, the next one waits
  // until then (or the hard bound), so appends stay O(log n) meanwhile.
  TimePoint next_forget_pass_;
};

bool operator==(const ProducerBatch& a, const ProducerBatch& b);

}  // namespace weir::log
