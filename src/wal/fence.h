// Fence, walk and garbage probe: what a successor (or a restarting node) runs
// against a previous epoch's chain (DESIGN.md §5). Only point GETs and
// conditional PUTs, never a LIST. Stateless functions; thread-safe; they block
// on the store and retry transient errors a bounded number of times.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "objstore/object_store.h"
#include "wal/slot_format.h"

namespace weir::wal {

struct ChainRef {
  std::string node;
  uint64_t epoch = 0;
};

struct RetryPolicy {
  int attempts = 8;  // per store call
  int parallelism = 16;  // point GETs in flight during Fence and Walk
  Duration initial = std::chrono::milliseconds(20);
  Duration max = std::chrono::seconds(1);
};

enum class SlotState { kMissing, kFlight, kPoison };
struct SlotProbe {
  SlotState state = SlotState::kMissing;
  Envelope envelope;  // valid unless kMissing
};

// One bounded GET of the envelope at offset 0. A corrupt envelope, or one whose
// epoch/seq disagree with the key, is kCorruption.
Result<SlotProbe> ProbeSlot(objstore::ObjectStore& store, const ChainRef& chain, uint64_t seq,
                            const RetryPolicy& retry = {});

struct FenceResult {
  uint64_t cut = 0;  // slots [from, cut) are committed; slot `cut` is poisoned
  bool poisoned_here = false;  // false: a poison was already at `cut`
};

// Walks the chain from `from` (the checkpoint) by point GETs (`parallelism`
// probes at a time, decided in seq order) and writes a
// poison (create-only, carrying `fencer_nonce`) into the first missing seq.
// Afterwards the chain's owner can never extend it past `cut`.
Result<FenceResult> Fence(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from,
                          uint64_t fencer_nonce, const RetryPolicy& retry = {});

// Reads, verifies and hands over every committed slot in [from, cut), in
// order, fetching up to `parallelism` slots at once.
// A missing or corrupt slot stops the walk with its error.
using SlotVisitor = std::function<Status(uint64_t seq, const SlotIndex& index, std::string_view bytes)>;
Status Walk(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from, uint64_t cut,
            const SlotVisitor& visit, const RetryPolicy& retry = {});

// Fence and Walk in one pass, for recovery: reads whole slots from `from`
// (`parallelism` at a time), hands each committed one to `visit` in order, and
// poisons the first missing seq. Half the round trips of Fence then Walk.
Result<FenceResult> FenceAndWalk(objstore::ObjectStore& store, const ChainRef& chain, uint64_t from,
                                 uint64_t fencer_nonce, const SlotVisitor& visit, const RetryPolicy& retry = {});

// Deletes whatever is at seqs cut+1 .. cut+window, without reading it: flights
// that landed past the cut were never acknowledged. Returns how many it
// deleted.
Result<uint64_t> DeleteGarbage(objstore::ObjectStore& store, const ChainRef& chain, uint64_t cut,
                               uint64_t window, const RetryPolicy& retry = {});

}  // namespace weir::wal
