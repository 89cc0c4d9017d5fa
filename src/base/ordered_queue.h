// Work that must run one function at a time, in the order it was queued, on
// a thread pool: a connection's requests moved off its I/O thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>

namespace weir {

// Owned by a connection; any thread calls it. Push queues a function and
// says whether the caller must start a drain (one task on its pool that
// calls RunAll); RunAll runs the queued functions in order until none is
// left, so at most one drain runs at a time. Busy is true from a Push until
// that function has returned (or thrown). Holds no reference to any pool,
// so it may outlive one.
class OrderedQueue {
 public:
  bool Push(std::function<void()> fn) {
    std::lock_guard lk(mu_);
    pending_++;
    queue_.push_back(std::move(fn));
    if (running_) return false;
    running_ = true;
    return true;
  }

  void RunAll() {
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard lk(mu_);
        if (queue_.empty()) {
          running_ = false;
          return;
        }
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      struct Done {  // counted down however fn ends, or later work would wait for ever
        std::atomic<uint32_t>* pending;
        ~Done() { (*pending)--; }
      } done{&pending_};
      fn();
    }
  }

  bool Busy() const { return pending_.load() > 0; }

 private:
  std::mutex mu_;
  std::deque<std::function<void()>> queue_;  // mu_
  bool running_ = false;                     // a drain is running (mu_)
  std::atomic<uint32_t> pending_{0};
};

}  // namespace weir
