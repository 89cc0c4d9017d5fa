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

// A connection's ordered work, suspended (the Kafka Reply's or the HTTP
// Exchange's SuspendInOrder): held by whoever waits on that work's behalf,
// who calls Resume once, from any thread; `fn` then runs on a worker as the
// rest of the work, and the connection's later ordered work runs only
// after it. Destroyed without a Resume, it resumes with nothing to run.
class SuspendedWork {
 public:
  // How the connection goes on: runs `fn` (may be empty) on a worker, then
  // its later ordered work.
  using ResumeFn = std::function<void(std::function<void()> fn)>;
  explicit SuspendedWork(ResumeFn resume) : resume_(std::move(resume)) {}
  ~SuspendedWork() { Resume(nullptr); }
  SuspendedWork(const SuspendedWork&) = delete;
  SuspendedWork& operator=(const SuspendedWork&) = delete;

  void Resume(std::function<void()> fn) {
    if (!resumed_.exchange(true)) resume_(std::move(fn));
  }

 private:
  ResumeFn resume_;
  std::atomic<bool> resumed_{false};
};

// Owned by a connection; any thread calls it. Push queues a function and
// says whether the caller must start a drain: one task on its pool that
// calls RunSome, and posts itself again while RunSome answers true (so a
// connection that keeps queueing takes turns with the pool's other work).
// At most one drain runs at a time. Busy is true from a Push until that
// function has returned. Functions must not throw. Holds no reference to any
// pool, so it may outlive one; Drop forgets what never ran, which may hold
// the owner itself, and ends the drain (the next Push starts one): call it
// once the pool was joined, or while the drain is parked (RunSomeUnless
// answered kPaused and none was started since).
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

  // Runs the functions queued when it was called, in order; true if more
  // were queued meanwhile (the drain goes on: post it again).
  bool RunSome() { return RunSomeUnless([] { return false; }) == Turn::kMore; }

  enum class Turn { kDone, kMore, kPaused };
  // As RunSome, but checks `pause()` before each function and stops while it
  // is true, answering kPaused: the drain is then parked, not over (Push
  // starts no other), and the owner starts it again (RunSomeUnless on its
  // pool) once pause() turns false.
  template <typename Pause>
  Turn RunSomeUnless(Pause pause) {
    size_t n = 0;
    {
      std::lock_guard lk(mu_);
      n = queue_.size();
    }
    for (size_t i = 0; i < n; ++i) {
      if (pause()) return Turn::kPaused;
      std::function<void()> fn;
      {
        std::lock_guard lk(mu_);
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
      pending_--;
    }
    std::lock_guard lk(mu_);
    if (!queue_.empty()) return Turn::kMore;
    running_ = false;
    return Turn::kDone;
  }

  bool Busy() const { return pending_.load() > 0; }

  void Drop() {
    std::deque<std::function<void()>> dropped;
    std::lock_guard lk(mu_);
    pending_ -= static_cast<uint32_t>(queue_.size());
    dropped.swap(queue_);
    running_ = false;
  }

 private:
  std::mutex mu_;
  std::deque<std::function<void()>> queue_;  // mu_
  bool running_ = false;                     // a drain is running (mu_)
  std::atomic<uint32_t> pending_{0};
};

}  // namespace weir
