// Fence, walk and the garbage probe over a chain in a store.
// Runs on mem://, and on s3:// (radosgw) under the s3 CTest fixture: each
// test's store comes from testing::NewTestStore().
#include "wal/fence.h"

#include <gtest/gtest.h>

#include "objstore/fault_store.h"
#include "objstore/mem_store.h"
#include "s3_test_env.h"
#include "test_util.h"
#include "wal/writer.h"

namespace weir::wal {
namespace {

using namespace std::chrono_literals;
using testing::OneRecordBatch;
using testing::ValueOf;

// Writes `n` slots (one value each) as a writer with `nonce` would.
void WriteChain(objstore::ObjectStore& store, const ChainRef& c, uint64_t from, uint64_t n, uint64_t nonce) {
  for (uint64_t s = from; s < from + n; ++s) {
    SlotBuilder b;
    std::string batch = OneRecordBatch("v" + std::to_string(s));
    b.Add(s % 3, batch, 1, 1);
    ASSERT_TRUE(store.Put(SlotKey(c.node, c.epoch, s), b.Finish(c.epoch, s, nonce)).ok());
  }
}

TEST(Fence, EmptyChainIsPoisonedAtTheCheckpoint) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 4};
  auto f = Fence(*mem, c, 10, 5);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cut, 10u);
  EXPECT_TRUE(f->poisoned_here);
  auto probe = ProbeSlot(*mem, c, 10);
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->state, SlotState::kPoison);
  EXPECT_EQ(probe->envelope.nonce, 5u);
}

TEST(Fence, FindsTheFirstMissingSlotAndIsIdempotent) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 2};
  WriteChain(*mem, c, 3, 5, 77);  // slots 3..7
  auto f = Fence(*mem, c, 3, 1);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->cut, 8u);
  EXPECT_TRUE(f->poisoned_here);
  auto again = Fence(*mem, c, 3, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cut, 8u);
  EXPECT_FALSE(again->poisoned_here);
  // The chain's owner can no longer extend it: create-only at the cut fails.
  objstore::PutOptions po;
  po.if_none_match = true;
  EXPECT_EQ(mem->Put(SlotKey("n1", 2, 8), "x", po).code(), Code::kPreconditionFailed);
}

TEST(Fence, RetriesTransientErrorsAndAmbiguousPoison) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 1};
  WriteChain(*mem, c, 0, 3, 77);
  objstore::FaultOptions fo;
  fo.seed = 11;
  fo.get_error_rate = 0.3;
  fo.put_ambiguous_rate = 1.0;  // the poison lands but is reported as failed
  objstore::FaultStore faulty(mem, fo);
  RetryPolicy rp;
  rp.attempts = 50;
  rp.initial = 1ms;
  rp.max = 2ms;
  auto f = Fence(faulty, c, 0, 9, rp);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cut, 3u);
  auto probe = ProbeSlot(*mem, c, 3);
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->state, SlotState::kPoison);
}

TEST(Fence, CorruptEnvelopeStopsTheFence) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 1};
  WriteChain(*mem, c, 0, 2, 77);
  ASSERT_TRUE(mem->Put(SlotKey("n1", 1, 1), std::string(80, 'z')).ok());
  auto f = Fence(*mem, c, 0, 9);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kCorruption);
  EXPECT_NE(f.status().message().find(SlotKey("n1", 1, 1)), std::string::npos) << f.status().message();
  // Nothing was poisoned.
  EXPECT_EQ(ProbeSlot(*mem, c, 2)->state, SlotState::kMissing);
}

TEST(Fence, EnvelopeMustMatchItsKey) {
  auto mem = testing::NewTestStore();
  SlotBuilder b;
  std::string batch = OneRecordBatch("x");
  b.Add(1, batch, 1, 1);
  ASSERT_TRUE(mem->Put(SlotKey("n1", 1, 0), b.Finish(1, 5, 1)).ok());  // says seq 5
  EXPECT_EQ(ProbeSlot(*mem, ChainRef{"n1", 1}, 0).status().code(), Code::kCorruption);
}

TEST(Walk, VisitsCommittedSlotsInOrderAndVerifiesThem) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 1};
  WriteChain(*mem, c, 0, 6, 77);
  auto f = Fence(*mem, c, 2, 1);
  ASSERT_TRUE(f.ok());
  std::vector<std::string> values;
  Status st = Walk(*mem, c, 2, f->cut, [&](uint64_t seq, const SlotIndex& index, std::string_view bytes) {
    EXPECT_EQ(index.envelope.seq, seq);
    const ChunkInfo& ch = index.chunks.at(0);
    values.push_back(ValueOf(bytes.substr(ch.offset, ch.length)));
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(values, (std::vector<std::string>{"v2", "v3", "v4", "v5"}));

  // A corrupted committed slot stops the walk with a precise error.
  auto obj = mem->Get(SlotKey("n1", 1, 4));
  std::string bad = *obj;
  bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 1);
  ASSERT_TRUE(mem->Put(SlotKey("n1", 1, 4), bad).ok());
  int visited = 0;
  st = Walk(*mem, c, 2, f->cut, [&](uint64_t, const SlotIndex&, std::string_view) {
    ++visited;
    return Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find(SlotKey("n1", 1, 4)), std::string::npos) << st.message();
  EXPECT_EQ(visited, 2);
  // A missing committed slot is an error too.
  ASSERT_TRUE(mem->Delete(SlotKey("n1", 1, 3)).ok());
  st = Walk(*mem, c, 2, f->cut, [](uint64_t, const SlotIndex&, std::string_view) { return Status::Ok(); });
  EXPECT_EQ(st.code(), Code::kNotFound);
}

TEST(DeleteGarbage, RemovesFlightsPastTheCutWithinTheWindow) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 1};
  WriteChain(*mem, c, 0, 2, 77);   // 0, 1 committed
  WriteChain(*mem, c, 3, 2, 77);   // 3, 4 landed after a gap at 2
  WriteChain(*mem, c, 20, 1, 77);  // far past the window: never looked at
  auto f = Fence(*mem, c, 0, 1);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->cut, 2u);
  auto n = DeleteGarbage(*mem, c, f->cut, 8);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(ProbeSlot(*mem, c, 3)->state, SlotState::kMissing);
  EXPECT_EQ(ProbeSlot(*mem, c, 2)->state, SlotState::kPoison);
  EXPECT_EQ(ProbeSlot(*mem, c, 1)->state, SlotState::kFlight);
}

TEST(Fence, RealWriterChainRecoversEveryAcknowledgedEntry) {
  auto mem = testing::NewTestStore();
  WriterOptions o;
  o.node = "n9";
  o.epoch = 3;
  auto w = Writer::Start(mem, o);
  ASSERT_TRUE(w.ok());
  std::mutex mu;
  std::vector<std::string> acked;
  for (int i = 0; i < 50; ++i) {
    std::string v = "r" + std::to_string(i);
    ASSERT_TRUE((*w)->Append(1, OneRecordBatch(v), [&, v](const Status& st, const AckInfo&) {
      std::lock_guard lk(mu);
      if (st.ok()) acked.push_back(v);
    }, Now() + 60s).ok());
  }
  (*w)->Close();
  ChainRef c{"n9", 3};
  auto f = Fence(*mem, c, 0, 1);
  ASSERT_TRUE(f.ok());
  std::vector<std::string> replayed;
  ASSERT_TRUE(Walk(*mem, c, 0, f->cut, [&](uint64_t, const SlotIndex& index, std::string_view bytes) {
    for (const auto& ch : index.chunks) {
      Status st = ForEachBatch(bytes.substr(ch.offset, ch.length), [&](const BatchHeader&, std::string_view b) {
        replayed.push_back(ValueOf(b));
        return Status::Ok();
      });
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }).ok());
  EXPECT_EQ(replayed, acked);
  EXPECT_EQ(acked.size(), 50u);
}

TEST(FenceAndWalk, VisitsInOrderAcrossParallelBatchesAndPoisonsTheGap) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 2};
  WriteChain(*mem, c, 0, 40, 77);
  WriteChain(*mem, c, 41, 3, 77);  // landed past a gap: never acknowledged
  RetryPolicy rp;
  rp.parallelism = 16;
  std::vector<uint64_t> seen;
  auto f = FenceAndWalk(*mem, c, 0, 5, [&](uint64_t seq, const SlotIndex& index, std::string_view) {
    EXPECT_EQ(index.envelope.seq, seq);
    seen.push_back(seq);
    return Status::Ok();
  }, rp);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cut, 40u);
  EXPECT_TRUE(f->poisoned_here);
  ASSERT_EQ(seen.size(), 40u);
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(ProbeSlot(*mem, c, 40)->state, SlotState::kPoison);
  // Again: the poison is found, the same slots are visited.
  seen.clear();
  auto again = FenceAndWalk(*mem, c, 10, 6, [&](uint64_t seq, const SlotIndex&, std::string_view) {
    seen.push_back(seq);
    return Status::Ok();
  }, rp);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cut, 40u);
  EXPECT_FALSE(again->poisoned_here);
  EXPECT_EQ(seen.size(), 30u);
}

TEST(FenceAndWalk, StopsOnCorruptionAndVisitorErrors) {
  auto mem = testing::NewTestStore();
  ChainRef c{"n1", 1};
  WriteChain(*mem, c, 0, 5, 77);
  auto obj = mem->Get(SlotKey("n1", 1, 3));
  std::string bad = *obj;
  bad[bad.size() - 20] = static_cast<char>(bad[bad.size() - 20] ^ 1);
  ASSERT_TRUE(mem->Put(SlotKey("n1", 1, 3), bad).ok());
  int visited = 0;
  auto f = FenceAndWalk(*mem, c, 0, 5, [&](uint64_t, const SlotIndex&, std::string_view) {
    ++visited;
    return Status::Ok();
  });
  EXPECT_EQ(f.status().code(), Code::kCorruption);
  EXPECT_EQ(visited, 3);
  EXPECT_EQ(ProbeSlot(*mem, c, 5)->state, SlotState::kMissing) << "nothing poisoned after a failed walk";
  auto stop = FenceAndWalk(*mem, c, 0, 5, [&](uint64_t seq, const SlotIndex&, std::string_view) {
    return seq == 1 ? Internal("visitor says stop") : Status::Ok();
  });
  EXPECT_EQ(stop.status().code(), Code::kInternal);
}

}  // namespace
}  // namespace weir::wal
