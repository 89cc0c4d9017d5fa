// QuorumStore: the express storage class's WAL store (DESIGN.md §6,
// docs/storage-classes.md). It presents K object stores as one ObjectStore to
// the WAL writer, fence and walk:
//  - a create-only slot PUT goes to all K; a flight is durable once W copies
//    landed (W = the write quorum), a poison once K-W+1 did. The PUT returns
//    then: a slow or failed store is invisible to the writer, and the copies
//    still on their way finish in the background (or are tolerated absent).
//    A store answering 412 with the writer's own envelope (an earlier attempt
//    landed; for a poison, any fencer's poison of the slot) counts as a copy;
//    K-W+1 foreign occupants (W for a poison) make the PUT
//    kPreconditionFailed.
//  - a GET or a probe classifies the slot from the K envelopes: committed (W
//    copies of one flight), dead (K-W+1 poisons), or, when no flight has W
//    copies and the stores yet to answer could not change that, kNotFound
//    (the fence then poisons it; its create-only PUT settles a race with a
//    late writer). A slot no writer or fencer can decide any
//    more is kCorruption; one that a store's failure leaves undecided is that
//    failure (retryable). Bytes beyond the envelope are read from a store
//    holding the decided copy, falling through the rest on failure.
//  - HEAD finds an object in any store; LIST merges the stores' listings
//    (a key's size is the smallest listed); DELETE goes to all of them. Each
//    waits `straggler_grace` at most for the stores still out once W have
//    answered (a slow store's leftovers are garbage a later listing finds).
// Open refuses a store named twice (by Location()).
// Only create-only PUTs of WAL slots are taken (kInvalidArgument otherwise):
// the quorum rules above are the slot format's.
//
// Owned by the engine (shared with the WAL writer); every method is
// thread-safe. Each store has threads of its own (`threads_per_store`), so one
// store's latency never holds another's requests; bytes of writes still queued
// or running for a store are bounded (`backlog_bytes`): past it, a copy for
// that store is given up at once and counted as a failure of that store.
// Reads, listings and deletes go ahead of slot copies on a store's threads;
// those queued for a store are bounded too (`max_queued_requests`).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "objstore/object_store.h"

namespace weir::wal {

struct QuorumOptions {
  // W: copies that make a flight durable. 0 = a majority (K/2 + 1).
  size_t write_quorum = 0;
  size_t threads_per_store = 16;
  // Per store: bytes of slot copies queued or being written. A store past it
  // (slow or down) gets no new copies until it catches up.
  size_t backlog_bytes = size_t{256} << 20;
  // How long a listing, a delete or a HEAD finding nothing waits for the
  // stores still out once W have answered.
  std::chrono::milliseconds straggler_grace{500};
  // Per store: reads, listings and deletes queued and not yet started. Past
  // it (a store that stopped answering, whose calls its callers no longer
  // wait for), a new one fails at once for that store.
  size_t max_queued_requests = 1024;
};

// Per store, for /metrics.
struct QuorumStoreCounters {
  std::atomic<uint64_t> copies{0};          // slot copies written (or found ours)
  std::atomic<uint64_t> copy_failures{0};   // slot copies that failed
  std::atomic<uint64_t> copies_skipped{0};  // slot copies given up: the store's backlog was full
  std::atomic<uint64_t> backlog_bytes{0};   // bytes of slot copies queued or being written
  std::atomic<uint64_t> requests_refused{0};  // reads, listings, deletes failed at once: too many queued
};

class QuorumStore final : public objstore::ObjectStore {
 public:
  static constexpr size_t kMaxStores = 32;
  // 2 to kMaxStores stores; 1 <= write_quorum <= stores.size().
  static Result<std::shared_ptr<QuorumStore>> Open(std::vector<std::shared_ptr<objstore::ObjectStore>> stores,
                                                   QuorumOptions options = {});
  ~QuorumStore() override;
  QuorumStore(const QuorumStore&) = delete;
  QuorumStore& operator=(const QuorumStore&) = delete;

  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& options = {}) override;
  Result<std::string> Get(std::string_view key, std::optional<objstore::ByteRange> range = std::nullopt) override;
  Result<objstore::ObjectInfo> Head(std::string_view key) override;
  Result<objstore::ListPage> List(std::string_view prefix, std::string_view start_after = {},
                                  size_t max_keys = 1000) override;
  Status Delete(std::string_view key) override;
  Status DeleteMany(std::span<const std::string> keys) override;
  // "quorum(2 of 3: file:///a, file:///b, file:///c)"
  std::string Describe() const override;
  // The same, from the stores' Location()s, sorted.
  std::string Location() const override;
  size_t PreferredParallelPuts() const override;

  size_t store_count() const;
  size_t write_quorum() const;
  // Store `i` itself (no lane, no quorum): for what is not a slot, such as a
  // start's deployment marker in each store.
  objstore::ObjectStore& store(size_t i) const;
  const QuorumStoreCounters& counters(size_t store) const;

 private:
  struct Impl;
  explicit QuorumStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weir::wal
