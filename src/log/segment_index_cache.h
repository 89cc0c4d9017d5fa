#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "log/segment_format.h"

namespace weir::log {

// The footers and indexes of settled segments read by range, by object key,
// so that a reader paging through a large segment GETs its footer and index
// once instead of on every page. Segment objects are written once and never
// changed (their key names the stream, offsets and epoch), so an entry stays
// true until its object is deleted; a reader that then misses the object, or
// finds its bytes not as the entry says, drops the entry (Erase).
//
// Owned by the Engine; any thread. Holds at most `max_bytes` of entries (an
// estimate: the index, the key and a fixed overhead), dropping the least
// recently used first; 0 keeps nothing.
class SegmentIndexCache {
 public:
  struct Entry {
    uint64_t object_bytes = 0;  // the object's size, which its footer was checked against
    SegmentFooter footer;       // checked against the segment's row
    std::vector<SegmentIndexEntry> index;
  };

  explicit SegmentIndexCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  std::shared_ptr<const Entry> Find(const std::string& key);
  void Insert(const std::string& key, std::shared_ptr<const Entry> entry);
  void Erase(const std::string& key);

  size_t bytes() const;
  size_t size() const;

 private:
  struct Slot {
    std::string key;
    std::shared_ptr<const Entry> entry;
    size_t bytes = 0;
  };
  static size_t Cost(const std::string& key, const Entry& e);
  void EraseLocked(std::unordered_map<std::string, std::list<Slot>::iterator>::iterator it);

  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Slot> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Slot>::iterator> by_key_;
  size_t bytes_ = 0;
};

}  // namespace weir::log
