// mem://: a std::map of immutable blobs under one mutex.
#include "objstore/mem_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "objstore/internal.h"

namespace weir::objstore {

namespace {

using internal::CatchAll;

// MemStore: owned by its shared_ptr holders; called from any thread. Each
// object is an immutable shared string: Put swaps the pointer under mu_, and
// readers copy bytes out after dropping the lock, so a reader sees whole old
// or whole new bytes. Nothing is durable beyond the process.
class MemStore final : public ObjectStore {
 public:
  Status Put(std::string_view key, std::string_view data, const PutOptions& options) override {
    return CatchAll("mem:// Put", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(ValidateKey(key));
      auto blob = std::make_shared<const std::string>(data);  // copy outside the lock
      std::shared_ptr<const std::string> old;  // released after unlocking
      std::lock_guard lock(mu_);
      auto it = objects_.find(key);
      if (it == objects_.end()) {
        objects_.emplace(std::string(key), std::move(blob));
        return Status::Ok();
      }
      if (options.if_none_match) return PreconditionFailed("object {} already exists", key);
      old = std::exchange(it->second, std::move(blob));
      return Status::Ok();
    });
  }

  Result<std::string> Get(std::string_view key, std::optional<ByteRange> range) override {
    return CatchAll("mem:// Get", [&]() -> Result<std::string> {
      WEIR_RETURN_IF_ERROR(ValidateKey(key));
      std::shared_ptr<const std::string> blob = Find(key);
      if (!blob) return NotFound("object {} not found in mem://", key);
      if (!range) return std::string(*blob);
      const uint64_t size = blob->size();
      if (range->offset > 0 && range->offset >= size) {
        return OutOfRange("range offset {} is past the end of object {} ({} bytes)", range->offset, key, size);
      }
      const uint64_t n = std::min(range->length, size - range->offset);
      return blob->substr(range->offset, n);
    });
  }

  Result<ObjectInfo> Head(std::string_view key) override {
    return CatchAll("mem:// Head", [&]() -> Result<ObjectInfo> {
      WEIR_RETURN_IF_ERROR(ValidateKey(key));
      std::shared_ptr<const std::string> blob = Find(key);
      if (!blob) return NotFound("object {} not found in mem://", key);
      return ObjectInfo{std::string(key), blob->size()};
    });
  }

  Result<ListPage> List(std::string_view prefix, std::string_view start_after, size_t max_keys) override {
    return CatchAll("mem:// List", [&]() -> Result<ListPage> {
      if (max_keys < 1 || max_keys > 1000) return InvalidArgument("List max_keys {} is not in 1..1000", max_keys);
      ListPage page;
      std::lock_guard lock(mu_);
      auto it = start_after >= prefix ? objects_.upper_bound(start_after) : objects_.lower_bound(prefix);
      for (; it != objects_.end() && it->first.starts_with(prefix); ++it) {
        if (page.objects.size() == max_keys) {
          page.next_start_after = page.objects.back().key;
          break;
        }
        page.objects.push_back(ObjectInfo{it->first, it->second->size()});
      }
      return page;
    });
  }

  Status Delete(std::string_view key) override {
    return CatchAll("mem:// Delete", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(ValidateKey(key));
      std::shared_ptr<const std::string> old;  // released after unlocking
      std::lock_guard lock(mu_);
      auto it = objects_.find(key);
      if (it != objects_.end()) {
        old = std::move(it->second);
        objects_.erase(it);
      }
      return Status::Ok();
    });
  }

  Status DeleteMany(std::span<const std::string> keys) override {
    Status first;
    for (const std::string& key : keys) {
      Status st = Delete(key);
      if (first.ok() && !st.ok()) first = std::move(st);
    }
    return first;
  }

  std::string Describe() const override { return "mem://"; }
  // Each store in memory is a store of its own.
  std::string Location() const override { return fmt::format("mem://{}", static_cast<const void*>(this)); }

 private:
  std::shared_ptr<const std::string> Find(std::string_view key) {
    std::lock_guard lock(mu_);
    auto it = objects_.find(key);
    return it == objects_.end() ? nullptr : it->second;
  }

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const std::string>, std::less<>> objects_;
};

}  // namespace

std::shared_ptr<ObjectStore> NewMemStore() { return std::make_shared<MemStore>(); }

}  // namespace weir::objstore
