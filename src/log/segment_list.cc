#include "log/segment_list.h"

#include <algorithm>
#include <utility>

namespace weir::log {

void SegmentList::Assign(std::vector<metastore::SegmentInfo> rows) {
  rows_ = std::move(rows);
  Reindex(0);
}

void SegmentList::Append(metastore::SegmentInfo segment) {
  rows_.push_back(std::move(segment));
  Reindex(rows_.size() - 1);
}

void SegmentList::EraseFront(size_t n) {
  n = std::min(n, rows_.size());
  rows_.erase(rows_.begin(), rows_.begin() + static_cast<std::ptrdiff_t>(n));
  Reindex(0);
}

void SegmentList::ReplaceRun(const_iterator at, size_t n, metastore::SegmentInfo merged) {
  const size_t i = static_cast<size_t>(at - rows_.cbegin());
  rows_[i] = std::move(merged);
  rows_.erase(rows_.begin() + static_cast<std::ptrdiff_t>(i + 1), rows_.begin() + static_cast<std::ptrdiff_t>(i + n));
  Reindex(i);
}

SegmentList::const_iterator SegmentList::FirstReaching(int64_t time_ms) const {
  // max_time_ ascends; the first entry that reaches the time is where the
  // newest record time first reaches it.
  auto it = std::lower_bound(max_time_.begin(), max_time_.end(), time_ms);
  return rows_.begin() + (it - max_time_.begin());
}

void SegmentList::Reindex(size_t from) {
  ++changes_;
  max_time_.resize(rows_.size());
  for (size_t i = from; i < rows_.size(); ++i) {
    max_time_[i] = i == 0 ? rows_[i].last_timestamp_ms : std::max(max_time_[i - 1], rows_[i].last_timestamp_ms);
  }
}

}  // namespace weir::log
