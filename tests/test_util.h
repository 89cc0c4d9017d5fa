// Helpers shared by the unit tests: a store whose PUTs the test releases by
// hand (to force out-of-order completion), and record-batch builders.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "objstore/object_store.h"
#include "wal/record_batch.h"

namespace weir::testing {

// Forwards to an inner store; PUTs of keys the test has gated block until the
// test opens the gate. Thread-safe.
class GatedStore : public objstore::ObjectStore {
 public:
  explicit GatedStore(std::shared_ptr<objstore::ObjectStore> inner) : inner_(std::move(inner)) {}

  // PUTs of `key` block before reaching the inner store; with after_apply they
  // reach it first and then block (a PUT that landed but has not returned).
  void Gate(const std::string& key, bool after_apply = false) {
    std::lock_guard lk(mu_);
    gated_.insert(key);
    if (after_apply) after_apply_.insert(key);
  }
  void Open(const std::string& key) {
    std::lock_guard lk(mu_);
    gated_.erase(key);
    cv_.notify_all();
  }
  // Waits until a PUT of `key` is blocked at the gate.
  bool WaitBlocked(const std::string& key, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return blocked_.count(key) > 0; });
  }
  int puts(const std::string& key) {
    std::lock_guard lk(mu_);
    return put_count_[key];
  }

  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& o = {}) override {
    std::string k(key);
    bool after;
    {
      std::lock_guard lk(mu_);
      ++put_count_[k];
      after = after_apply_.count(k) > 0;
    }
    Status st = after ? inner_->Put(key, data, o) : Status::Ok();
    {
      std::unique_lock lk(mu_);
      if (gated_.count(k)) {
        blocked_.insert(k);
        cv_.notify_all();
        cv_.wait(lk, [&] { return gated_.count(k) == 0; });
        blocked_.erase(k);
      }
    }
    return after ? st : inner_->Put(key, data, o);
  }
  // GETs so far of keys starting with `prefix`.
  int gets(const std::string& prefix) {
    std::lock_guard lk(mu_);
    int n = 0;
    for (auto it = get_count_.lower_bound(prefix); it != get_count_.end() && it->first.starts_with(prefix); ++it) {
      n += it->second;
    }
    return n;
  }

  // Bytes returned by GETs so far.
  uint64_t got_bytes() {
    std::lock_guard lk(mu_);
    return got_bytes_;
  }

  Result<std::string> Get(std::string_view key, std::optional<objstore::ByteRange> r = std::nullopt) override {
    {
      std::lock_guard lk(mu_);
      ++get_count_[std::string(key)];
    }
    auto got = inner_->Get(key, r);
    if (got.ok()) {
      std::lock_guard lk(mu_);
      got_bytes_ += got->size();
    }
    return got;
  }
  Result<objstore::ObjectInfo> Head(std::string_view key) override { return inner_->Head(key); }
  Result<objstore::ListPage> List(std::string_view p, std::string_view s = {}, size_t m = 1000) override {
    return inner_->List(p, s, m);
  }
  Status Delete(std::string_view key) override { return inner_->Delete(key); }
  // Runs once, before the next DeleteMany reaches the inner store, then is cleared.
  void BeforeDeleteMany(std::function<void()> fn) {
    std::lock_guard lk(mu_);
    before_delete_many_ = std::move(fn);
  }
  Status DeleteMany(std::span<const std::string> keys) override {
    std::function<void()> fn;
    {
      std::lock_guard lk(mu_);
      fn = std::exchange(before_delete_many_, nullptr);
    }
    if (fn) fn();
    return inner_->DeleteMany(keys);
  }
  std::string Describe() const override { return "gated(" + inner_->Describe() + ")"; }

 private:
  std::shared_ptr<objstore::ObjectStore> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> gated_, blocked_, after_apply_;
  std::map<std::string, int> put_count_, get_count_;
  uint64_t got_bytes_ = 0;
  std::function<void()> before_delete_many_;
};

// One batch of one record whose value is `value`.
inline std::string OneRecordBatch(const std::string& value, int64_t base_offset = 0) {
  std::vector<wal::Record> recs(1);
  recs[0].value = value;
  recs[0].timestamp = 1700000000000;
  wal::EncodeOptions eo;
  eo.base_offset = base_offset;
  std::string out;
  Status st = wal::EncodeRecordBatch(recs, eo, &out);
  if (!st.ok()) std::abort();
  return out;
}

// The value of the single record in a batch.
inline std::string ValueOf(std::string_view batch) {
  auto recs = wal::DecodeRecords(batch);
  if (!recs.ok() || recs->size() != 1 || !(*recs)[0].record.value) return "<bad batch>";
  return *(*recs)[0].record.value;
}

}  // namespace weir::testing
