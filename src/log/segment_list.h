#pragma once

#include <cstdint>
#include <vector>

#include "metastore/metastore.h"

namespace weir::log {

// A stream's settled segments in offset order, with the running maximum of
// their newest record times, so that a lookup by time is a binary search
// rather than a scan (segments' times need not ascend: Kafka producers set
// their own). Owned by its stream, guarded by the stream's mutex; not
// thread-safe itself. Every change keeps the running maximum whole (a change
// at index i recomputes it from i on).
class SegmentList {
 public:
  using const_iterator = std::vector<metastore::SegmentInfo>::const_iterator;

  const std::vector<metastore::SegmentInfo>& rows() const { return rows_; }
  const_iterator begin() const { return rows_.begin(); }
  const_iterator end() const { return rows_.end(); }
  bool empty() const { return rows_.empty(); }
  size_t size() const { return rows_.size(); }
  const metastore::SegmentInfo& front() const { return rows_.front(); }
  const metastore::SegmentInfo& back() const { return rows_.back(); }

  void Assign(std::vector<metastore::SegmentInfo> rows);
  void Append(metastore::SegmentInfo segment);
  // Drops the first n segments (at most all of them).
  void EraseFront(size_t n);
  // Replaces the n segments from `at` (at + n <= size(), n >= 1) with `merged`.
  void ReplaceRun(const_iterator at, size_t n, metastore::SegmentInfo merged);

  // The first segment holding a record at or after `time_ms` (its
  // last_timestamp_ms, the newest record's time, reaches it), or end().
  const_iterator FirstReaching(int64_t time_ms) const;

  // How many changes the list has had: a reader whose object went missing
  // tells a race (settle, a merge or retention moved the sources since it
  // collected them) from a loss.
  uint64_t changes() const { return changes_; }

 private:
  // Recomputes max_time_ from index `from` on.
  void Reindex(size_t from);

  std::vector<metastore::SegmentInfo> rows_;
  std::vector<int64_t> max_time_;  // [i]: the largest last_timestamp_ms of rows_[0..i]
  uint64_t changes_ = 0;
};

}  // namespace weir::log
