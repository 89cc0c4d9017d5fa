// A byte budget shared by many waiters, first come, first served: the
// listeners' memory bound for request bytes read and not yet answered.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace weir {

// Owned by a listener; any thread calls it. Guarantees: at most `limit` bytes
// are reserved at once, except that a reservation alone always fits (so a
// request larger than the whole budget still makes progress); a reservation
// that does not fit waits behind every earlier waiter, and is handed to its
// waiter with `T::Admitted(size_t n)`, called outside the lock, once it fits.
//
// `Ptr` is std::shared_ptr<T> (the queue keeps a waiter alive: use it when
// nothing else does) or std::weak_ptr<T> (a waiter that is gone is skipped).
// `used` and `waits` are the owner's metrics: bytes reserved now, and
// reservations that had to wait.
template <typename Ptr>
class ByteBudget {
 public:
  ByteBudget(size_t limit, std::atomic<int64_t>* used, std::atomic<uint64_t>* waits)
      : limit_(limit), used_metric_(used), waits_metric_(waits) {}

  // Reserves `n` bytes now (true), or queues `waiter` to be admitted (false).
  bool ReserveOrWait(Ptr waiter, size_t n) {
    std::lock_guard lk(mu_);
    if (waiters_.empty() && (used_ == 0 || used_ + n <= limit_)) {
      Take(n);
      return true;
    }
    waits_metric_->fetch_add(1);
    waiters_.emplace_back(std::move(waiter), n);
    return false;
  }

  // Reserves `n` bytes if they fit now (true); never waits. They fit within
  // the limit, or whatever the limit when nothing but the caller's own
  // `already` bytes is reserved (a reservation alone always fits; a caller
  // that counts its own generously only fits alone more readily); and only
  // behind no waiter, unless `ahead_of_waiters`: for bytes that are in
  // memory already (a streamed body's, refused only by ending its session),
  // where waiters hold nothing yet.
  bool TryReserve(size_t n, size_t already = 0, bool ahead_of_waiters = false) {
    std::lock_guard lk(mu_);
    if ((!ahead_of_waiters && !waiters_.empty()) || (used_ > already && used_ + n > limit_)) return false;
    Take(n);
    return true;
  }

  // Returns `n` reserved bytes, and admits the waiters that now fit.
  void Release(size_t n) {
    std::vector<std::pair<std::shared_ptr<Element>, size_t>> admitted;
    {
      std::lock_guard lk(mu_);
      used_ -= n;
      used_metric_->fetch_sub(static_cast<int64_t>(n));
      while (!waiters_.empty()) {
        auto& [waiter, want] = waiters_.front();
        std::shared_ptr<Element> w = Strong(waiter);
        if (w && used_ != 0 && used_ + want > limit_) break;
        if (w) {
          Take(want);
          admitted.emplace_back(std::move(w), want);
        }
        waiters_.pop_front();
      }
    }
    for (auto& [w, want] : admitted) w->Admitted(want);
  }

  // Takes `waiter` out of the queue (true), or finds it no longer there
  // (false: admitted, or dropped). Those behind it that now fit are admitted.
  bool Cancel(const typename Ptr::element_type* waiter) {
    {
      std::lock_guard lk(mu_);
      auto it = waiters_.begin();
      while (it != waiters_.end() && Strong(it->first).get() != waiter) ++it;
      if (it == waiters_.end()) return false;
      waiters_.erase(it);
    }
    Release(0);
    return true;
  }

  // Forgets every waiter (at shutdown); they are released outside the lock.
  void DropWaiters() {
    std::deque<std::pair<Ptr, size_t>> dropped;
    std::lock_guard lk(mu_);
    dropped.swap(waiters_);
  }

 private:
  using Element = typename Ptr::element_type;
  static std::shared_ptr<Element> Strong(const std::shared_ptr<Element>& p) { return p; }
  static std::shared_ptr<Element> Strong(const std::weak_ptr<Element>& p) { return p.lock(); }

  void Take(size_t n) {
    used_ += n;
    used_metric_->fetch_add(static_cast<int64_t>(n));
  }

  const size_t limit_;
  std::atomic<int64_t>* const used_metric_;
  std::atomic<uint64_t>* const waits_metric_;
  std::mutex mu_;
  size_t used_ = 0;                            // guarded by mu_
  std::deque<std::pair<Ptr, size_t>> waiters_;  // guarded by mu_
};

}  // namespace weir
