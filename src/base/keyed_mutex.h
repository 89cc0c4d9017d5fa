// Mutual exclusion per key (a name), for check-then-write sequences that
// must not interleave for the same key but may run in parallel for others.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace weir {

// Lock(key) blocks until no other guard of that key is alive. A key's entry
// exists only while a guard holds or waits for it, so memory follows the
// keys in use, not every key ever seen. Owned by its user; any thread.
// Guards must not outlive the KeyedMutex.
class KeyedMutex {
  struct Entry {
    std::mutex mu;
    size_t users = 0;  // guards holding or waiting; under KeyedMutex::mu_
  };

 public:
  // Holds one key's lock: made by Lock, owned by its caller. Destroy it on
  // the thread that took it (it unlocks a std::mutex), before the
  // KeyedMutex goes; a moved-from Guard releases nothing.
  class Guard {
   public:
    Guard(Guard&& o) noexcept : owner_(o.owner_), it_(o.it_) { o.owner_ = nullptr; }
    Guard& operator=(Guard&&) = delete;
    Guard(const Guard&) = delete;
    ~Guard() {
      if (owner_ != nullptr) owner_->Release(it_);
    }

   private:
    friend class KeyedMutex;
    using Iter = std::map<std::string, std::unique_ptr<Entry>, std::less<>>::iterator;
    Guard(KeyedMutex* owner, Iter it) : owner_(owner), it_(it) {}
    KeyedMutex* owner_;
    Iter it_;
  };

  [[nodiscard]] Guard Lock(std::string_view key) {
    Guard::Iter it;
    {
      std::lock_guard lk(mu_);
      it = entries_.find(key);
      if (it == entries_.end()) it = entries_.emplace(std::string(key), std::make_unique<Entry>()).first;
      it->second->users++;
    }
    it->second->mu.lock();  // map iterators stay valid while users > 0
    return Guard(this, it);
  }

  size_t keys_in_use() const {
    std::lock_guard lk(mu_);
    return entries_.size();
  }

 private:
  void Release(Guard::Iter it) {
    it->second->mu.unlock();
    std::lock_guard lk(mu_);
    if (--it->second->users == 0) entries_.erase(it);
  }

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>, std::less<>> entries_;
};

}  // namespace weir
