#include "log/segment_index_cache.h"

namespace weir::log {

size_t SegmentIndexCache::Cost(const std::string& key, const Entry& e) {
  // The entry, its index and key, and the list and map nodes around them.
  return sizeof(Entry) + e.index.size() * sizeof(SegmentIndexEntry) + key.size() * 2 + 160;
}

std::shared_ptr<const SegmentIndexCache::Entry> SegmentIndexCache::Find(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->entry;
}

void SegmentIndexCache::Insert(const std::string& key, std::shared_ptr<const Entry> entry) {
  const size_t cost = Cost(key, *entry);
  std::lock_guard lk(mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) EraseLocked(it);
  if (cost > max_bytes_) return;
  while (bytes_ + cost > max_bytes_ && !lru_.empty()) EraseLocked(by_key_.find(lru_.back().key));
  lru_.push_front(Slot{key, std::move(entry), cost});
  by_key_.emplace(key, lru_.begin());
  bytes_ += cost;
}

void SegmentIndexCache::Erase(const std::string& key) {
  std::lock_guard lk(mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) EraseLocked(it);
}

void SegmentIndexCache::EraseLocked(std::unordered_map<std::string, std::list<Slot>::iterator>::iterator it) {
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  by_key_.erase(it);
}

size_t SegmentIndexCache::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

size_t SegmentIndexCache::size() const {
  std::lock_guard lk(mu_);
  return lru_.size();
}

}  // namespace weir::log
