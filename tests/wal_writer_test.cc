// Writer behaviour: ordered release, group commit, size cap, linger, budget,
// retries, ambiguous PUTs, halts on a foreign occupant, resume, stress.
// Runs on mem://, and on s3:// (radosgw) under the s3 CTest fixture: each
// test's store comes from testing::NewTestStore().
#include "wal/writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "objstore/fault_store.h"
#include "objstore/mem_store.h"
#include "s3_test_env.h"
#include "test_util.h"
#include "wal/fence.h"
#include "wal/slot_format.h"

namespace weir::wal {
namespace {

using namespace std::chrono_literals;
using testing::GatedStore;
using testing::OneRecordBatch;
using testing::ValueOf;

// Collects acknowledgements in the order the writer delivers them.
class Acks {
 public:
  struct Ack {
    int id;
    Status status;
    AckInfo info;
  };

  AckCallback For(int id) {
    return [this, id](const Status& st, const AckInfo& info) {
      std::lock_guard lk(mu_);
      acks_.push_back(Ack{id, st, info});
      cv_.notify_all();
    };
  }
  // Waits until at least n acks arrived; false on a 60 s timeout.
  bool WaitFor(size_t n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 60s, [&] { return acks_.size() >= n; });
  }
  std::vector<Ack> Snapshot() {
    std::lock_guard lk(mu_);
    return acks_;
  }
  size_t size() {
    std::lock_guard lk(mu_);
    return acks_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Ack> acks_;
};

WriterOptions Opts(uint64_t epoch = 1) {
  WriterOptions o;
  o.node = "n1";
  o.epoch = epoch;
  o.retry_initial = 1ms;
  o.retry_max = 10ms;
  return o;
}

TimePoint Later() { return Now() + 60s; }

// Stores slot `seq` of chain n1/1 as another writer's (same node and epoch,
// another nonce) would: this writer's PUT of it halts the chain.
Status PutForeignSlot(objstore::ObjectStore& store, uint64_t seq) {
  SlotBuilder b;
  std::string other = OneRecordBatch("other");
  b.Add(1, other, 1, 1);
  return store.Put(SlotKey("n1", 1, seq), b.Finish(1, seq, 12345));
}

// Reads back the bytes an ack points at.
std::string Stored(objstore::ObjectStore& store, const std::string& node, const AckInfo& info) {
  auto obj = store.Get(SlotKey(node, info.epoch, info.seq));
  if (!obj.ok()) return "<missing slot>";
  return obj->substr(info.offset, info.length);
}

TEST(WalWriter, AcksAfterDurableAndPointsAtStoredBytes) {
  auto mem = testing::NewTestStore();
  auto w = Writer::Start(mem, Opts());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Acks acks;
  std::string batch = OneRecordBatch("hello");
  ASSERT_TRUE((*w)->Append(7, batch, acks.For(0), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(1));
  auto a = acks.Snapshot()[0];
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.info.epoch, 1u);
  EXPECT_EQ(a.info.seq, 0u);
  EXPECT_EQ(Stored(*mem, "n1", a.info), batch);
  auto obj = mem->Get(SlotKey("n1", 1, 0));
  ASSERT_TRUE(obj.ok());
  auto index = DecodeSlot("s", *obj);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_EQ(index->chunks.size(), 1u);
  EXPECT_EQ(index->chunks[0].stream_id, 7u);
  EXPECT_EQ(index->envelope.nonce, (*w)->nonce());
}

TEST(WalWriter, OrderedReleaseWhenPutsCompleteOutOfOrder) {
  auto mem = testing::NewTestStore();
  auto gated = std::make_shared<GatedStore>(mem);
  gated->Gate(SlotKey("n1", 1, 0));
  auto w = Writer::Start(gated, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  // Slot 0 holds entry 0 and blocks; later entries ride later slots.
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("a"), acks.For(0), Later()).ok());
  ASSERT_TRUE(gated->WaitBlocked(SlotKey("n1", 1, 0)));
  for (int i = 1; i <= 20; ++i) {
    ASSERT_TRUE((*w)->Append(static_cast<uint64_t>(i % 3), OneRecordBatch("v" + std::to_string(i)),
                             acks.For(i), Later())
                    .ok());
  }
  // Wait until later slots are durable in the store while slot 0 is blocked.
  for (int tries = 0; tries < 6000; ++tries) {
    auto page = mem->List("wal/n1/");
    if (page.ok() && !page->objects.empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  auto page = mem->List("wal/n1/");
  ASSERT_TRUE(page.ok());
  ASSERT_FALSE(page->objects.empty()) << "later slots never became durable";
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(acks.size(), 0u) << "an ack was released before slot 0 was durable";
  gated->Open(SlotKey("n1", 1, 0));
  ASSERT_TRUE(acks.WaitFor(21));
  auto got = acks.Snapshot();
  uint64_t last_seq = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, static_cast<int>(i)) << "acks out of append order";
    EXPECT_TRUE(got[i].status.ok());
    EXPECT_GE(got[i].info.seq, last_seq);
    last_seq = got[i].info.seq;
    EXPECT_EQ(ValueOf(Stored(*mem, "n1", got[i].info)), i == 0 ? "a" : "v" + std::to_string(i));
  }
  EXPECT_GT(got.back().info.seq, 0u);
}

TEST(WalWriter, SizeCapBoundsEverySlot) {
  auto mem = testing::NewTestStore();
  auto gated = std::make_shared<GatedStore>(mem);
  gated->Gate(SlotKey("n1", 1, 0));
  WriterOptions o = Opts();
  o.slot_cap_bytes = 4096;
  o.budget_bytes = 1 << 20;
  auto w = Writer::Start(gated, o);
  ASSERT_TRUE(w.ok());
  Acks acks;
  std::string value(900, 'x');
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch(value), acks.For(0), Later()).ok());
  ASSERT_TRUE(gated->WaitBlocked(SlotKey("n1", 1, 0)));
  const int n = 60;
  for (int i = 1; i < n; ++i) ASSERT_TRUE((*w)->Append(static_cast<uint64_t>(i % 4), OneRecordBatch(value), acks.For(i), Later()).ok());
  gated->Open(SlotKey("n1", 1, 0));
  ASSERT_TRUE(acks.WaitFor(n));
  auto page = mem->List("wal/n1/");
  ASSERT_TRUE(page.ok());
  size_t multi = 0;
  for (const auto& obj : page->objects) {
    EXPECT_LE(obj.size, 4096u) << obj.key;
    auto data = mem->Get(obj.key);
    ASSERT_TRUE(data.ok());
    auto index = DecodeSlot(obj.key, *data);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    uint32_t batches = 0;
    for (const auto& c : index->chunks) batches += c.batch_count;
    if (batches > 1) ++multi;
  }
  EXPECT_GT(multi, 0u) << "no slot grouped several appends";
  EXPECT_EQ(page->objects.size(), (*w)->metrics().slots.load());
}

TEST(WalWriter, RejectsAppendLargerThanASlot) {
  WriterOptions o = Opts();
  o.slot_cap_bytes = 4096;
  o.budget_bytes = 1 << 20;
  auto mem = testing::NewTestStore();
  auto w = Writer::Start(mem, o);
  ASSERT_TRUE(w.ok());
  Status st = (*w)->Append(1, OneRecordBatch(std::string(5000, 'x')), nullptr, Later());
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("largest slot payload"), std::string::npos) << st.ToString();
  EXPECT_EQ((*w)->metrics().appends.load(), 0u);
}

TEST(WalWriter, RejectsBadInputAndChangesNothing) {
  auto mem = testing::NewTestStore();
  auto w = Writer::Start(mem, Opts());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->Append(1, "", nullptr, Later()).code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->Append(1, "not a record batch at all, clearly", nullptr, Later()).code(),
            Code::kInvalidArgument);
  std::string good = OneRecordBatch("x");
  EXPECT_EQ((*w)->Append(1, good + "tail", nullptr, Later()).code(), Code::kInvalidArgument);
  (*w)->Close();
  EXPECT_EQ((*w)->metrics().appends.load(), 0u);
  auto page = mem->List("");
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->objects.empty());
  EXPECT_EQ((*w)->Append(1, good, nullptr, Later()).code(), Code::kCancelled);
}

TEST(WalWriter, RejectsBadOptions) {
  auto mem = testing::NewTestStore();
  WriterOptions o = Opts();
  o.node = "bad/node";
  EXPECT_EQ(Writer::Start(mem, o).status().code(), Code::kInvalidArgument);
  o = Opts();
  o.window = 0;
  EXPECT_EQ(Writer::Start(mem, o).status().code(), Code::kInvalidArgument);
  o = Opts();
  o.budget_bytes = o.slot_cap_bytes - 1;
  EXPECT_EQ(Writer::Start(mem, o).status().code(), Code::kInvalidArgument);
}

TEST(WalWriter, LingerGroupsAppendsIntoOneSlot) {
  auto mem = testing::NewTestStore();
  WriterOptions o = Opts();
  o.linger = 3s;  // long enough that a loaded machine still appends all five inside it
  auto w = Writer::Start(mem, o);
  ASSERT_TRUE(w.ok());
  Acks acks;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*w)->Append(1, OneRecordBatch("l"), acks.For(i), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(5));
  for (const auto& a : acks.Snapshot()) {
    EXPECT_TRUE(a.status.ok());
    EXPECT_EQ(a.info.seq, 0u);
  }
  EXPECT_EQ((*w)->metrics().slots.load(), 1u);
}

TEST(WalWriter, IdleWriterFlushesAtOnceWithoutLinger) {
  // With linger 0 a lone append is cut immediately: it acks although nothing else arrives.
  auto mem = testing::NewTestStore();
  auto w = Writer::Start(mem, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*w)->Append(1, OneRecordBatch("i"), acks.For(i), Later()).ok());
    ASSERT_TRUE(acks.WaitFor(static_cast<size_t>(i + 1)));
  }
  EXPECT_EQ((*w)->metrics().slots.load(), 3u);
}

// A writer with a budget of 8192 bytes (slots of 4096) over `gated`, whose
// first slot's PUT is held until the test opens it.
Result<std::unique_ptr<Writer>> SmallWriterHeldAtSlot0(const std::shared_ptr<GatedStore>& gated) {
  gated->Gate(SlotKey("n1", 1, 0));
  WriterOptions o = Opts();
  o.slot_cap_bytes = 4096;
  o.budget_bytes = 8192;
  return Writer::Start(gated, o);
}

TEST(WalWriter, BudgetBlocksThenFailsWithDiagnosis) {
  auto gated = std::make_shared<GatedStore>(testing::NewTestStore());
  auto w = SmallWriterHeldAtSlot0(gated);
  ASSERT_TRUE(w.ok());
  Acks acks;
  std::string batch = OneRecordBatch(std::string(1000, 'b'));
  int admitted = 0;
  Status st;
  while (admitted < 100) {
    st = (*w)->Append(1, batch, acks.For(admitted), Now() + 200ms);
    if (!st.ok()) break;
    ++admitted;
  }
  ASSERT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("pool budget of 8192 bytes is full"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("slots in flight"), std::string::npos) << st.message();
  EXPECT_GE((*w)->metrics().admission_timeouts.load(), 1u);
  EXPECT_GE((*w)->metrics().stall_budget_uploads.load(), 1u);
  EXPECT_LE(admitted, 8);
  // A blocked append proceeds once the stuck upload completes.
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    gated->Open(SlotKey("n1", 1, 0));
  });
  Status late = (*w)->Append(1, batch, acks.For(admitted), Later());
  opener.join();
  EXPECT_TRUE(late.ok()) << late.ToString();
  ASSERT_TRUE(acks.WaitFor(static_cast<size_t>(admitted + 1)));
  for (const auto& a : acks.Snapshot()) EXPECT_TRUE(a.status.ok());
}

TEST(WalWriter, ReservationsHoldRoomAndGiveBackWhatIsNotUsed) {
  auto gated = std::make_shared<GatedStore>(testing::NewTestStore());
  auto w = SmallWriterHeldAtSlot0(gated);
  ASSERT_TRUE(w.ok());
  Acks acks;
  const std::string batch = OneRecordBatch(std::string(1000, 'r'));
  auto big = (*w)->Reserve(3000, Later());  // more than the batch: the rest goes back
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  const int64_t pooled = (*w)->metrics().pool_bytes.load();
  ASSERT_TRUE((*w)->Append(1, std::make_shared<const std::string>(batch), acks.For(0), &*big).ok());
  EXPECT_EQ((*w)->metrics().pool_bytes.load(), pooled);  // the append came out of the reservation
  EXPECT_GT(big->bytes(), 0u);
  *big = Writer::Reservation();  // gives the rest back
  EXPECT_LT((*w)->metrics().pool_bytes.load(), pooled);
  // The budget counts reservations: with slot 0 held, room runs out.
  std::vector<Writer::Reservation> held;
  Status st;
  for (int i = 0; i < 20; ++i) {
    auto r = (*w)->Reserve(1000, Now() + 100ms);
    if (!r.ok()) {
      st = r.status();
      break;
    }
    held.push_back(std::move(*r));
  }
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_FALSE(held.empty());
  // More than the whole budget: no wait could make room, so no retry either.
  auto never = (*w)->Reserve(1 << 30, Later());
  EXPECT_EQ(never.status().code(), Code::kInvalidArgument) << never.status().ToString();
  // An append past its (empty) reservation never waits: no room now is an error.
  Writer::Reservation none = std::move(held.back());
  held.pop_back();
  ASSERT_TRUE((*w)->Append(1, std::make_shared<const std::string>(batch), acks.For(1), &none).ok());
  Status over = (*w)->Append(1, std::make_shared<const std::string>(batch), acks.For(2), &none);
  EXPECT_EQ(over.code(), Code::kResourceExhausted) << over.ToString();
  // Dropping reservations makes room again.
  held.clear();
  EXPECT_TRUE((*w)->Append(1, std::make_shared<const std::string>(batch), acks.For(3), &none).ok());
  gated->Open(SlotKey("n1", 1, 0));
  ASSERT_TRUE(acks.WaitFor(3));
  for (const auto& a : acks.Snapshot()) EXPECT_TRUE(a.status.ok()) << a.status.ToString();
}

// Every appended value appears exactly once across the chain's slots.
void ExpectEachValueOnce(objstore::ObjectStore& store, const std::string& prefix, int n) {
  std::map<std::string, int> seen;
  std::string after;
  while (true) {
    auto page = store.List(prefix, after, 1000);
    ASSERT_TRUE(page.ok());
    for (const auto& obj : page->objects) {
      auto data = store.Get(obj.key);
      ASSERT_TRUE(data.ok());
      auto index = DecodeSlot(obj.key, *data);
      ASSERT_TRUE(index.ok()) << index.status().ToString();
      if (index->envelope.kind == SlotKind::kPoison) continue;
      for (const auto& c : index->chunks) {
        Status st = ForEachBatch(std::string_view(*data).substr(c.offset, c.length),
                                 [&](const BatchHeader&, std::string_view b) {
                                   ++seen[ValueOf(b)];
                                   return Status::Ok();
                                 });
        ASSERT_TRUE(st.ok());
      }
    }
    if (page->next_start_after.empty()) break;
    after = page->next_start_after;
  }
  ASSERT_EQ(seen.size(), static_cast<size_t>(n));
  for (const auto& [v, count] : seen) EXPECT_EQ(count, 1) << "value " << v << " stored " << count << " times";
}

TEST(WalWriter, TransientPutErrorsAreRetriedWithoutDuplicateSlots) {
  auto mem = testing::NewTestStore();
  objstore::FaultOptions fo;
  fo.seed = 42;
  fo.put_error_rate = 0.3;
  fo.put_timeout_rate = 0.1;
  auto faulty = std::make_shared<objstore::FaultStore>(mem, fo);
  auto w = Writer::Start(faulty, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  const int n = 300;
  // Groups of three, each waited for, so there are ~100 slots to fail on.
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE((*w)->Append(static_cast<uint64_t>(i % 5), OneRecordBatch("t" + std::to_string(i)), acks.For(i), Later()).ok());
    if (i % 3 == 2) {
      ASSERT_TRUE(acks.WaitFor(static_cast<size_t>(i + 1)));
    }
  }
  ASSERT_TRUE(acks.WaitFor(n));
  (*w)->Close();
  EXPECT_TRUE((*w)->closed_clean());
  auto got = acks.Snapshot();
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(got[static_cast<size_t>(i)].status.ok());
    EXPECT_EQ(got[static_cast<size_t>(i)].id, i);
  }
  EXPECT_GT(faulty->counters().put_errors.load() + faulty->counters().put_timeouts.load(), 0u);
  EXPECT_GT((*w)->metrics().put_retries.load(), 0u);
  auto page = mem->List("wal/n1/");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->objects.size(), (*w)->metrics().slots.load());
  // Slot seqs are dense: 0..slots-1.
  for (size_t i = 0; i < page->objects.size(); ++i) EXPECT_EQ(page->objects[i].key, SlotKey("n1", 1, i));
  ExpectEachValueOnce(*mem, "wal/n1/", n);
}

// The pace's PUT latency estimate: one stalled PUT moves it little.
TEST(WalWriter, PutEstimateClipsAStall) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  EXPECT_EQ(NextPutEstimate(Duration::zero(), milliseconds(20)), milliseconds(20));
  EXPECT_EQ(NextPutEstimate(Duration::zero(), seconds(20)), milliseconds(50)) << "a cold first PUT";
  EXPECT_EQ(NextPutEstimate(milliseconds(80), milliseconds(160)), milliseconds(90));
  EXPECT_EQ(NextPutEstimate(milliseconds(80), seconds(20)), milliseconds(110)) << "clipped to 4 x 80 ms";
  EXPECT_EQ(NextPutEstimate(milliseconds(80), milliseconds(0)), milliseconds(70));
  // A store that is truly slower is followed within a few PUTs.
  Duration e = milliseconds(20);
  int puts = 0;
  while (e < milliseconds(300) && puts < 100) {
    e = NextPutEstimate(e, milliseconds(400));
    ++puts;
  }
  EXPECT_LE(puts, 14);  // 10 unclipped
}

// The linger follows a slow store's PUTs (a share of the estimate, capped),
// never below the configured one; a share outside 0..1 is refused.
TEST(WalWriter, LingerFollowsThePutEstimate) {
  using std::chrono::milliseconds;
  WriterOptions o;
  o.node = "n1";
  o.linger = milliseconds(1);
  EXPECT_EQ(EffectiveLinger(o, milliseconds(60)), milliseconds(1)) << "no share: the linger as set";
  o.linger_put_share = 0.05;
  EXPECT_EQ(EffectiveLinger(o, Duration::zero()), milliseconds(1)) << "no PUT yet";
  EXPECT_EQ(EffectiveLinger(o, milliseconds(10)), milliseconds(1)) << "a fast store: the linger as set";
  EXPECT_EQ(EffectiveLinger(o, milliseconds(60)), milliseconds(3));
  EXPECT_EQ(EffectiveLinger(o, std::chrono::seconds(10)), kMaxLingerFromPuts) << "a stalled store";
  o.linger = milliseconds(30);
  EXPECT_EQ(EffectiveLinger(o, std::chrono::seconds(10)), milliseconds(30)) << "the cap is on the share only";
  EXPECT_TRUE(ValidateWriterOptions(o).ok());
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    o.linger_put_share = bad;
    EXPECT_EQ(ValidateWriterOptions(o).code(), Code::kInvalidArgument) << bad;
  }
}

// StalledFor tells how long a slot not yet durable has waited (what /health
// and weir_wal_stalled_seconds show), and is zero again once it lands.
TEST(WalWriter, StalledForShowsASlotWhosePutsFail) {
  auto faulty = std::make_shared<objstore::FaultStore>(testing::NewTestStore(), objstore::FaultOptions{});
  auto w = Writer::Start(faulty, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("fine"), acks.For(0), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(1));
  EXPECT_EQ((*w)->StalledFor(Now()), Duration::zero());
  objstore::FaultOptions failing;
  failing.put_error_rate = 1.0;
  faulty->SetOptions(failing);
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("waits"), acks.For(1), Later()).ok());
  for (int i = 0; i < 6000 && (*w)->metrics().put_retries.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_GT((*w)->metrics().put_retries.load(), 0u);
  EXPECT_GT((*w)->StalledFor(Now() + std::chrono::hours(1)), std::chrono::minutes(59));
  faulty->SetOptions(objstore::FaultOptions{});
  ASSERT_TRUE(acks.WaitFor(2));
  EXPECT_TRUE(acks.Snapshot()[1].status.ok());
  for (int i = 0; i < 6000 && (*w)->StalledFor(Now()) != Duration::zero(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ((*w)->StalledFor(Now()), Duration::zero());
  (*w)->Close();
}

// A PUT that hangs (no failure, no retry) shows too, once nothing was
// released for as long: the slots behind it land but wait for it.
TEST(WalWriter, StalledForShowsAPutThatHangs) {
  auto mem = testing::NewTestStore();
  auto gated = std::make_shared<GatedStore>(mem);
  gated->Gate(SlotKey("n1", 1, 1));
  auto w = Writer::Start(gated, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("lands"), acks.For(0), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(1));
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("hangs"), acks.For(1), Later()).ok());
  ASSERT_TRUE(gated->WaitBlocked(SlotKey("n1", 1, 1)));
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("behind"), acks.For(2), Later()).ok());
  EXPECT_GT((*w)->StalledFor(Now() + std::chrono::hours(1)), std::chrono::minutes(59));
  EXPECT_EQ((*w)->metrics().put_retries.load(), 0u);
  gated->Open(SlotKey("n1", 1, 1));
  ASSERT_TRUE(acks.WaitFor(3));
  for (int i = 0; i < 6000 && (*w)->StalledFor(Now()) != Duration::zero(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ((*w)->StalledFor(Now()), Duration::zero());
  (*w)->Close();
}

TEST(WalWriter, CloseGivesUpOnAStoreThatTakesNoWrite) {
  // A slot lands, then the store fails every PUT: Close waits its
  // close_timeout, then fails what is not durable (kUnavailable) and returns;
  // the slot that landed stays acknowledged.
  auto faulty = std::make_shared<objstore::FaultStore>(testing::NewTestStore(), objstore::FaultOptions{});
  WriterOptions o = Opts();
  o.close_timeout = 200ms;
  auto w = Writer::Start(faulty, o);
  ASSERT_TRUE(w.ok());
  Acks acks;
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("kept"), acks.For(0), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(1));
  objstore::FaultOptions failing;
  failing.put_error_rate = 1.0;
  faulty->SetOptions(failing);
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("never"), acks.For(1), Later()).ok());
  ASSERT_TRUE((*w)->Append(2, OneRecordBatch("never either"), acks.For(2), Later()).ok());
  (*w)->Close();  // returns: the test would hang otherwise
  EXPECT_FALSE((*w)->closed_clean());
  ASSERT_TRUE(acks.WaitFor(3));
  auto got = acks.Snapshot();
  EXPECT_TRUE(got[0].status.ok());
  EXPECT_EQ(got[1].status.code(), Code::kUnavailable) << got[1].status.ToString();
  EXPECT_EQ(got[2].status.code(), Code::kUnavailable) << got[2].status.ToString();
}

// Slot 0's PUT held at a gate while slot 1 meets another writer's flight and
// halts the chain: x0 sits in slot 0, x1 in slot 1, neither acknowledged.
// However a test ends, the gate opens before the writer closes.
struct HeldBelowAHalt {
  std::shared_ptr<objstore::ObjectStore> mem = testing::NewTestStore();
  std::shared_ptr<GatedStore> gated = std::make_shared<GatedStore>(mem);
  const std::string s0 = SlotKey("n1", 1, 0);
  std::atomic<int> halts{0};
  std::atomic<uint64_t> first_halt{~uint64_t{0}};
  Status first_reason;  // set by the first halt, before `halts` counts it
  std::unique_ptr<Writer> w;
  Acks acks;
  std::shared_ptr<void> open_gate;

  // Starts the writer with `close_timeout` and halts it as above.
  void Start(Duration close_timeout) {
    gated->Gate(s0);
    ASSERT_TRUE(PutForeignSlot(*mem, 1).ok());
    WriterOptions o = Opts();
    o.close_timeout = close_timeout;
    o.on_halt = [this](uint64_t epoch, uint64_t seq, const Status& why) {
      if (halts.load() == 0) {
        EXPECT_EQ(epoch, 1u);
        first_reason = why;
        first_halt = seq;
      }
      ++halts;
    };
    auto started = Writer::Start(gated, o);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    w = std::move(*started);
    open_gate = std::shared_ptr<void>(nullptr, [g = gated, key = s0](void*) { g->Open(key); });
    ASSERT_TRUE(w->Append(1, OneRecordBatch("x0"), acks.For(0), Later()).ok());
    ASSERT_TRUE(gated->WaitBlocked(s0));
    ASSERT_TRUE(w->Append(1, OneRecordBatch("x1"), acks.For(1), Later()).ok());
    for (int i = 0; i < 6000 && halts.load() == 0; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(w->halted_seq(), std::optional<uint64_t>(1));
  }
  ~HeldBelowAHalt() {
    open_gate.reset();
    if (w) w->Close();
  }
};

TEST(WalWriter, CloseOfAHaltedChainGivesUpOnASlotBelowTheHaltThatNeverLands) {
  // Nothing resumes the chain (the metastore is down, say). Close waits its
  // close_timeout for slot 0, then fails both appends (kUnavailable: slot 0
  // may still land) instead of waiting for ever.
  HeldBelowAHalt h;
  ASSERT_NO_FATAL_FAILURE(h.Start(200ms));
  auto closed = std::async(std::launch::async, [&] { h.w->Close(); });
  // Both appends fail while slot 0's PUT still hangs (Close then waits for
  // its uploader, which the open gate lets go).
  const bool failed_in_time = h.acks.WaitFor(2);
  h.gated->Open(h.s0);
  closed.wait();
  ASSERT_TRUE(failed_in_time) << "Close waited for a slot below the halt that never landed";
  for (const auto& a : h.acks.Snapshot()) EXPECT_EQ(a.status.code(), Code::kUnavailable) << a.status.ToString();
}

TEST(WalWriter, AmbiguousPutsAreResolvedByNonce) {
  auto mem = testing::NewTestStore();
  objstore::FaultOptions fo;
  fo.seed = 7;
  fo.put_ambiguous_rate = 0.5;
  auto faulty = std::make_shared<objstore::FaultStore>(mem, fo);
  auto w = Writer::Start(faulty, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  const int n = 200;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE((*w)->Append(1, OneRecordBatch("a" + std::to_string(i)), acks.For(i), Later()).ok());
    if (i % 2 == 1) {
      ASSERT_TRUE(acks.WaitFor(static_cast<size_t>(i + 1)));
    }
  }
  ASSERT_TRUE(acks.WaitFor(n));
  (*w)->Close();
  for (const auto& a : acks.Snapshot()) ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_GT(faulty->counters().put_ambiguous.load(), 0u);
  EXPECT_EQ((*w)->metrics().put_ambiguous_resolved.load(), faulty->counters().put_ambiguous.load());
  EXPECT_EQ((*w)->metrics().halts.load(), 0u);
  ExpectEachValueOnce(*mem, "wal/n1/", n);
}

// Slot 0 of chain n1/1: its first PUT lands and answers an error (the retry
// then meets 412), and the first `garbled` ranged reads of it answer bytes
// that are no envelope (a short body, a proxy's page).
class GarbledEnvelopeStore : public testing::GatedStore {
 public:
  // `as_error`: the reads fail with it instead (a slot an express quorum
  // can no longer decide answers kCorruption).
  GarbledEnvelopeStore(std::shared_ptr<objstore::ObjectStore> inner, int garbled, Status as_error = Status::Ok())
      : GatedStore(std::move(inner)), garbled_(garbled), as_error_(std::move(as_error)) {}
  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& o = {}) override {
    Status st = GatedStore::Put(key, data, o);
    if (st.ok() && key == slot0_ && !lost_.exchange(true)) return Unavailable("the answer was lost");
    return st;
  }
  Result<std::string> Get(std::string_view key, std::optional<objstore::ByteRange> r = std::nullopt) override {
    if (key == slot0_ && r && garbled_reads.load() < garbled_) {
      ++garbled_reads;
      if (!as_error_.ok()) return as_error_;
      return std::string("<html>502 Bad Gateway</html>");
    }
    return GatedStore::Get(key, r);
  }
  std::atomic<int> garbled_reads{0};

 private:
  const std::string slot0_ = SlotKey("n1", 1, 0);
  const int garbled_;
  const Status as_error_;
  std::atomic<bool> lost_{false};
};

// Slot 0's read-backs after a 412 go wrong (garbled bytes, or `as_error`):
// two that do are read again and the append is acknowledged; ones that keep
// going wrong halt the chain after kUnreadableEnvelopeReads reads, with a
// reason naming `why`.
void ExpectReadBackFailuresHaltOnlyIfTheyLast(const Status& as_error, const std::string& why) {
  auto mem = testing::NewTestStore();
  auto store = std::make_shared<GarbledEnvelopeStore>(mem, 2, as_error);
  auto w = Writer::Start(store, Opts());
  ASSERT_TRUE(w.ok());
  Acks acks;
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("mine"), acks.For(0), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(1));
  EXPECT_TRUE(acks.Snapshot()[0].status.ok()) << acks.Snapshot()[0].status.ToString();
  EXPECT_EQ(store->garbled_reads.load(), 2);
  EXPECT_EQ((*w)->metrics().put_ambiguous_resolved.load(), 1u);
  EXPECT_EQ((*w)->metrics().halts.load(), 0u);
  (*w)->Close();

  auto mem2 = testing::NewTestStore();
  auto always = std::make_shared<GarbledEnvelopeStore>(mem2, 1 << 30, as_error);
  std::atomic<int> halts{0};
  WriterOptions o = Opts();
  o.on_halt = [&](uint64_t, uint64_t seq, const Status& reason) {
    EXPECT_EQ(seq, 0u);
    EXPECT_NE(reason.message().find(why), std::string::npos) << reason.message();
    ++halts;
  };
  auto w2 = Writer::Start(always, o);
  ASSERT_TRUE(w2.ok());
  Acks acks2;
  ASSERT_TRUE((*w2)->Append(1, OneRecordBatch("mine"), acks2.For(0), Later()).ok());
  for (int i = 0; i < 6000 && halts.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(halts.load(), 1);
  EXPECT_EQ(always->garbled_reads.load(), Writer::kUnreadableEnvelopeReads);
  (*w2)->Close();
}

// An envelope read back after a 412 that does not decode is read again: a
// read that went wrong once does not halt the chain; one that stays
// unreadable does, after kUnreadableEnvelopeReads reads.
TEST(WalWriter, AnUnreadableEnvelopeAfterA412IsReadAgainBeforeAHalt) {
  ExpectReadBackFailuresHaltOnlyIfTheyLast(Status::Ok(), "unreadable envelope");
}

// So is a read back that keeps failing for good (not a transient error, not
// a missing object: an express slot no quorum can decide), instead of the
// slot retrying for ever.
TEST(WalWriter, AReadBackAfterA412ThatKeepsFailingHaltsTheChain) {
  ExpectReadBackFailuresHaltOnlyIfTheyLast(Corruption("slot cannot be decided: 2 copies of ours, 3 of others"),
                                           "cannot be read back after a 412");
}

TEST(WalWriter, ForeignFlightHaltsTheChain) {
  auto mem = testing::NewTestStore();
  // Another writer (same node and epoch, different nonce) already owns slot 0.
  ASSERT_TRUE(PutForeignSlot(*mem, 0).ok());
  std::atomic<int> halts{0};
  WriterOptions o = Opts();
  o.on_halt = [&](uint64_t, uint64_t seq, const Status& why) {
    EXPECT_EQ(seq, 0u);
    EXPECT_EQ(why.code(), Code::kFenced);
    EXPECT_NE(why.message().find("another writer"), std::string::npos) << why.message();
    ++halts;
  };
  auto w = Writer::Start(mem, o);
  ASSERT_TRUE(w.ok());
  Acks acks;
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("mine"), acks.For(0), Later()).ok());
  for (int i = 0; i < 6000 && halts.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(halts.load(), 1);
  EXPECT_EQ((*w)->halted_seq(), std::optional<uint64_t>(0));
  EXPECT_EQ(acks.size(), 0u);
  (*w)->Close();
  auto got = acks.Snapshot();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status.code(), Code::kCancelled);
  EXPECT_FALSE((*w)->closed_clean());
  // Close decided the halted chain's end: a late Resume changes nothing.
  EXPECT_EQ((*w)->Resume(2, 0).code(), Code::kPreconditionFailed);
  EXPECT_EQ((*w)->halted_seq(), std::optional<uint64_t>(0));
}

// The successor scenario: slots 0 and 1 land, slot 2's PUT is delayed, a
// successor fences the chain (poisoning slot 2). The writer must halt at 2 and
// release nothing at or after it; Resume re-publishes into the next epoch.
class PoisonTest : public ::testing::TestWithParam<bool> {};

TEST_P(PoisonTest, SuccessorPoisonHaltsWriterAndNoLaterAckIsReleased) {
  const bool resume = GetParam();
  auto mem = testing::NewTestStore();
  auto gated = std::make_shared<GatedStore>(mem);
  const std::string slot2 = SlotKey("n1", 1, 2);
  gated->Gate(slot2);
  std::atomic<int> halted{0};
  WriterOptions o = Opts();
  o.on_halt = [&](uint64_t epoch, uint64_t seq, const Status&) {
    EXPECT_EQ(epoch, 1u);
    EXPECT_EQ(seq, 2u);
    ++halted;
  };
  auto w = Writer::Start(gated, o);
  ASSERT_TRUE(w.ok());
  Acks acks;
  // One append per slot for slots 0 and 1 (wait for each ack so they cut alone).
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("s0"), acks.For(0), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(1));
  ASSERT_TRUE((*w)->Append(2, OneRecordBatch("s1"), acks.For(1), Later()).ok());
  ASSERT_TRUE(acks.WaitFor(2));
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("s2"), acks.For(2), Later()).ok());
  ASSERT_TRUE(gated->WaitBlocked(slot2));
  // More appends ride slots 3.. which may land, but must never ack.
  for (int i = 3; i < 10; ++i) ASSERT_TRUE((*w)->Append(3, OneRecordBatch("s" + std::to_string(i)), acks.For(i), Later()).ok());
  // The successor fences from checkpoint 0: slots 0 and 1 are committed, 2 is missing.
  auto fence = Fence(*mem, ChainRef{"n1", 1}, 0, /*fencer_nonce=*/999);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  EXPECT_EQ(fence->cut, 2u);
  EXPECT_TRUE(fence->poisoned_here);
  gated->Open(slot2);
  for (int i = 0; i < 6000 && halted.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(halted.load(), 1);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(acks.size(), 2u) << "an ack was released at or after the poisoned slot";
  // Appends are still admitted while halted (they wait for the resume).
  ASSERT_TRUE((*w)->Append(4, OneRecordBatch("s10"), acks.For(10), Now() + 1s).ok());
  if (resume) {
    ASSERT_TRUE((*w)->Resume(2, fence->cut).ok());
    ASSERT_TRUE(acks.WaitFor(11));
    auto got = acks.Snapshot();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].id, static_cast<int>(i));
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.ToString();
      EXPECT_EQ(got[i].info.epoch, i < 2 ? 1u : 2u);
      EXPECT_EQ(ValueOf(Stored(*mem, "n1", got[i].info)), "s" + std::to_string(i));
    }
    EXPECT_EQ((*w)->metrics().republished_entries.load(), 8u);  // ids 2..9; id 10 was still pooled
    EXPECT_EQ((*w)->epoch(), 2u);
  } else {
    ASSERT_TRUE((*w)->Abandon(fence->cut, Fenced("lost leadership")).ok());
    ASSERT_TRUE(acks.WaitFor(11));
    for (const auto& a : acks.Snapshot()) {
      if (a.id < 2) {
        EXPECT_TRUE(a.status.ok());
      } else {
        EXPECT_EQ(a.status.code(), Code::kFenced) << a.id;
      }
    }
    EXPECT_EQ((*w)->Append(1, OneRecordBatch("x"), nullptr, Later()).code(), Code::kFenced);
  }
  (*w)->Close();
}

INSTANTIATE_TEST_SUITE_P(ResumeOrAbandon, PoisonTest, ::testing::Bool());

// A second, lower halt (Halt's `slot->seq < *halted_seq_`): slot 1 meets
// another writer's flight and halts the chain while slot 0's PUT is held; a
// fencer then finds slot 0 missing and poisons it, and the held PUT meets the
// poison. The halt moves down to slot 0 (on_halt fires once, for the first);
// a cut at the first halt (1) is refused, since slot 0 was never committed;
// and however the chain ends, neither append is acknowledged in epoch 1.
enum class HaltedChainEnd { kResume, kAbandon, kClose };

class LowerHaltTest : public ::testing::TestWithParam<HaltedChainEnd> {};

TEST_P(LowerHaltTest, AHaltBelowTheFirstLowersTheCut) {
  HeldBelowAHalt h;
  // Never reached when the cut moves down as it should: Close then returns
  // at once. Had it to wait for slot 0, it would fail both with kUnavailable.
  ASSERT_NO_FATAL_FAILURE(h.Start(30s));
  EXPECT_EQ(h.first_reason.code(), Code::kFenced) << h.first_reason.ToString();
  auto& mem = h.mem;
  auto& acks = h.acks;
  auto& halts = h.halts;
  auto& first_halt = h.first_halt;
  auto* w = &h.w;
  // A fencer walks the chain: slot 0 is missing (its PUT is held), so it is poisoned.
  auto fence = Fence(*mem, ChainRef{"n1", 1}, 0, /*fencer_nonce=*/999);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  ASSERT_EQ(fence->cut, 0u);
  ASSERT_TRUE(fence->poisoned_here);
  h.gated->Open(h.s0);
  for (int i = 0; i < 6000 && (*w)->halted_seq() != std::optional<uint64_t>(0); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ((*w)->halted_seq(), std::optional<uint64_t>(0)) << "the halt did not move down to the poisoned slot";
  EXPECT_EQ(halts.load(), 1) << "on_halt fires once per halt, not again for a lower slot";
  EXPECT_EQ(first_halt.load(), 1u);
  EXPECT_EQ((*w)->metrics().halts.load(), 1u);
  EXPECT_EQ(acks.size(), 0u);
  switch (GetParam()) {
    case HaltedChainEnd::kResume: {
      // Slot 0 holds the poison: a cut taken from the first halt would
      // acknowledge x0 as committed in epoch 1.
      EXPECT_EQ((*w)->Resume(2, 1).code(), Code::kInvalidArgument);
      ASSERT_TRUE((*w)->Resume(2, fence->cut).ok());
      ASSERT_TRUE(acks.WaitFor(2));
      auto got = acks.Snapshot();
      ASSERT_EQ(got.size(), 2u);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].id, static_cast<int>(i));
        ASSERT_TRUE(got[i].status.ok()) << got[i].status.ToString();
        EXPECT_EQ(got[i].info.epoch, 2u) << "acknowledged in the fenced epoch";
        EXPECT_EQ(ValueOf(Stored(*mem, "n1", got[i].info)), "x" + std::to_string(i));
      }
      break;
    }
    case HaltedChainEnd::kAbandon: {
      EXPECT_EQ((*w)->Abandon(1, Fenced("lost leadership")).code(), Code::kInvalidArgument);
      ASSERT_TRUE((*w)->Abandon(fence->cut, Fenced("lost leadership")).ok());
      ASSERT_TRUE(acks.WaitFor(2));
      for (const auto& a : acks.Snapshot()) EXPECT_EQ(a.status.code(), Code::kFenced) << a.id << ": " << a.status.ToString();
      break;
    }
    case HaltedChainEnd::kClose: {
      (*w)->Close();
      EXPECT_FALSE((*w)->closed_clean());
      ASSERT_TRUE(acks.WaitFor(2));
      for (const auto& a : acks.Snapshot()) {
        EXPECT_EQ(a.status.code(), Code::kCancelled) << a.id << ": " << a.status.ToString();
      }
      break;
    }
  }
  (*w)->Close();
  EXPECT_EQ(halts.load(), 1);
  EXPECT_EQ(acks.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(ResumeAbandonOrClose, LowerHaltTest,
                         ::testing::Values(HaltedChainEnd::kResume, HaltedChainEnd::kAbandon,
                                           HaltedChainEnd::kClose),
                         [](const ::testing::TestParamInfo<HaltedChainEnd>& p) {
                           switch (p.param) {
                             case HaltedChainEnd::kResume: return "Resume";
                             case HaltedChainEnd::kAbandon: return "Abandon";
                             case HaltedChainEnd::kClose: return "Close";
                           }
                           return "Unknown";
                         });

TEST(WalWriter, ClosingAHaltedChainLowersItsCutWhenASlotBelowMeetsAPoison) {
  // Close's wait for the slots below the halt (below_done): the chain halted
  // at slot 1 (another writer's flight) and Close waits for slot 0, whose
  // PUT is held. A fencer poisons slot 0 and the PUT meets the poison: the
  // cut moves down to 0 and Close fails both appends at once (kCancelled),
  // rather than waiting out close_timeout for a slot that never lands.
  HeldBelowAHalt h;
  ASSERT_NO_FATAL_FAILURE(h.Start(30s));
  auto& mem = h.mem;
  auto& acks = h.acks;
  auto& halts = h.halts;
  auto* w = &h.w;
  auto closed = std::async(std::launch::async, [&] { (*w)->Close(); });
  // Close stops admission and takes the cut (1) under one lock: once
  // appends are refused, it has its cut and waits for slot 0.
  for (int i = 0; i < 60000 && !(*w)->takes_no_appends(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE((*w)->takes_no_appends());
  EXPECT_EQ(acks.size(), 0u);
  auto fence = Fence(*mem, ChainRef{"n1", 1}, 0, /*fencer_nonce=*/999);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  ASSERT_EQ(fence->cut, 0u);
  h.gated->Open(h.s0);
  ASSERT_EQ(closed.wait_for(60s), std::future_status::ready) << "Close kept waiting for the poisoned slot 0";
  EXPECT_EQ((*w)->halted_seq(), std::optional<uint64_t>(0));
  EXPECT_EQ(halts.load(), 1);
  EXPECT_FALSE((*w)->closed_clean());
  ASSERT_TRUE(acks.WaitFor(2));
  for (const auto& a : acks.Snapshot()) {
    // kUnavailable would mean Close gave up at close_timeout instead.
    EXPECT_EQ(a.status.code(), Code::kCancelled) << a.id << ": " << a.status.ToString();
  }
}

TEST(WalWriter, ResumeAcksSlotsBelowTheCutEvenIfTheirPutIsStuck) {
  // Slot 0 landed but its PUT has not returned; slot 1 gets poisoned. The fence
  // finds 0 committed, so Resume acknowledges it and re-publishes slot 1's entry.
  auto mem = testing::NewTestStore();
  auto gated = std::make_shared<GatedStore>(mem);
  const std::string s0 = SlotKey("n1", 1, 0), s1 = SlotKey("n1", 1, 1);
  gated->Gate(s0, /*after_apply=*/true);
  gated->Gate(s1);
  std::atomic<int> halted{0};
  WriterOptions o = Opts();
  o.on_halt = [&](uint64_t, uint64_t, const Status&) { ++halted; };
  auto w = Writer::Start(gated, o);
  ASSERT_TRUE(w.ok());
  Acks acks;
  EXPECT_EQ((*w)->Resume(2, 0).code(), Code::kPreconditionFailed);  // not halted
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("x0"), acks.For(0), Later()).ok());
  ASSERT_TRUE(gated->WaitBlocked(s0));
  ASSERT_TRUE((*w)->Append(1, OneRecordBatch("x1"), acks.For(1), Later()).ok());
  ASSERT_TRUE(gated->WaitBlocked(s1));
  auto fence = Fence(*mem, ChainRef{"n1", 1}, 0, 999);
  ASSERT_TRUE(fence.ok());
  EXPECT_EQ(fence->cut, 1u);
  gated->Open(s1);
  for (int i = 0; i < 6000 && halted.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(halted.load(), 1);
  EXPECT_EQ((*w)->Resume(2, 2).code(), Code::kInvalidArgument);  // a cut past the halt
  // ... also when what was read back starts past the halt (it moved lower).
  EXPECT_EQ((*w)->Resume(2, 2, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->Resume(1, 1).code(), Code::kInvalidArgument);  // epoch must grow
  ASSERT_TRUE((*w)->Resume(2, fence->cut).ok());
  ASSERT_TRUE(acks.WaitFor(2));
  auto got = acks.Snapshot();
  EXPECT_EQ(got[0].id, 0);
  EXPECT_TRUE(got[0].status.ok());
  EXPECT_EQ(got[0].info.epoch, 1u);
  EXPECT_EQ(got[1].id, 1);
  EXPECT_TRUE(got[1].status.ok());
  EXPECT_EQ(got[1].info.epoch, 2u);
  EXPECT_EQ(ValueOf(Stored(*mem, "n1", got[1].info)), "x1");
  gated->Open(s0);
  (*w)->Close();
}

TEST(WalWriter, ConcurrentAppendersStress) {
  auto mem = testing::NewTestStore();
  objstore::FaultOptions fo;
  fo.seed = 3;
  fo.put_latency = objstore::LatencySpec{0.2, 2};
  fo.put_error_rate = 0.05;
  fo.put_ambiguous_rate = 0.05;
  auto faulty = std::make_shared<objstore::FaultStore>(mem, fo);
  WriterOptions o = Opts();
  o.slot_cap_bytes = 64 << 10;
  o.budget_bytes = 256 << 10;
  auto w = Writer::Start(faulty, o);
  ASSERT_TRUE(w.ok());
  const int threads = 16;
  const int per_thread = 300;
  std::mutex mu;
  std::map<int, std::vector<int>> order;  // thread -> ack order of its appends
  std::map<std::string, AckInfo> where;
  std::atomic<int> done{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < per_thread; ++i) {
        std::string value = "t" + std::to_string(t) + "-" + std::to_string(i) + "-" +
                            std::string(rng() % 2000, static_cast<char>('a' + t));
        Status st = (*w)->Append(static_cast<uint64_t>(t % 5), OneRecordBatch(value),
                                 [&, t, i, value](const Status& s, const AckInfo& info) {
                                   std::lock_guard lk(mu);
                                   if (!s.ok()) ++failures;
                                   order[t].push_back(i);
                                   where[value] = info;
                                   ++done;
                                 },
                                 Later());
        if (!st.ok()) ++failures;
      }
    });
  }
  for (auto& t : ts) t.join();
  (*w)->Close();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_EQ(done.load(), threads * per_thread);
  for (const auto& [t, seq] : order) {
    for (size_t i = 0; i < seq.size(); ++i) ASSERT_EQ(seq[i], static_cast<int>(i)) << "thread " << t;
  }
  for (const auto& [value, info] : where) ASSERT_EQ(ValueOf(Stored(*mem, "n1", info)), value);
  ExpectEachValueOnce(*mem, "wal/n1/", threads * per_thread);
  EXPECT_LE((*w)->metrics().pool_bytes.load(), static_cast<int64_t>(o.budget_bytes));
}

}  // namespace
}  // namespace weir::wal
