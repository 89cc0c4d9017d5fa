// QuorumStore: K object stores presented to the WAL as one (quorum_store.h).
// Each test has three (or four) mem:// stores, each behind a FaultStore (to
// fail its calls) and a GateStore (to hold its PUTs), and a QuorumStore over
// those. Tests plant slot copies straight into the mem:// stores (behind the
// quorum's back) and look at the copies there.
#include "wal/quorum_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "objstore/fault_store.h"
#include "objstore/object_store.h"
#include "objstore/mem_store.h"
#include "test_support.h"
#include "test_util.h"
#include "wal/fence.h"
#include "wal/slot_format.h"
#include "wal/writer.h"

namespace weir::wal {
namespace {

using namespace std::chrono_literals;
using objstore::ByteRange;
using testing::OneRecordBatch;
using testing::ValueOf;

constexpr objstore::PutOptions kCreateOnly{.if_none_match = true};
// Bounds every wait for background work; a wait that runs out fails the test.
constexpr auto kPatience = 30s;

// Polls `done` until it holds (true) or kPatience has passed (false).
template <typename Pred>
bool Eventually(Pred&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Slot `seq` of a chain in `epoch`, as the writer with `nonce` builds it.
std::string MakeFlight(uint64_t epoch, uint64_t seq, uint64_t nonce) {
  const std::string batch = OneRecordBatch("value " + std::to_string(seq));
  SlotBuilder b;
  b.Add(/*stream_id=*/1, batch, /*batch_count=*/1, /*record_count=*/1);
  return b.Finish(epoch, seq, nonce);
}

// The envelope at the start of `slot` (a test failure if it does not decode).
Envelope EnvelopeOf(std::string_view slot) {
  auto env = DecodeEnvelope(slot);
  if (!env.ok()) {
    ADD_FAILURE() << "not a slot: " << env.status().ToString();
    return Envelope{};
  }
  return *env;
}

std::vector<std::shared_ptr<objstore::ObjectStore>> MemStores(size_t n) {
  std::vector<std::shared_ptr<objstore::ObjectStore>> stores;
  for (size_t i = 0; i < n; ++i) stores.push_back(objstore::NewMemStore());
  return stores;
}

// Forwards to an inner store. While its gate is closed, PUTs wait at the gate
// before they reach the inner store (a slow store). After
// FailReadsPastEnvelope, GETs of any byte past the envelope fail
// (kUnavailable): a store that answers the probe, then fails the data.
class GateStore final : public objstore::ObjectStore {
 public:
  explicit GateStore(std::shared_ptr<objstore::ObjectStore> inner) : inner_(std::move(inner)) {}

  void CloseGate() {
    std::lock_guard lk(mu_);
    closed_ = true;
  }
  void OpenGate() {
    std::lock_guard lk(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  // Waits (up to kPatience) until a PUT is held at the closed gate.
  bool WaitBlocked() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kPatience, [&] { return blocked_ > 0; });
  }
  void FailReadsPastEnvelope() { fail_past_envelope_ = true; }
  void FailDeletes() { fail_deletes_ = true; }

  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& o = {}) override {
    {
      std::unique_lock lk(mu_);
      if (closed_) {
        ++blocked_;
        cv_.notify_all();
        cv_.wait(lk, [&] { return !closed_; });
        --blocked_;
      }
    }
    return inner_->Put(key, data, o);
  }
  Result<std::string> Get(std::string_view key, std::optional<ByteRange> range = std::nullopt) override {
    if (fail_past_envelope_ && (!range || range->offset + range->length > kEnvelopeSize)) {
      return Unavailable("test: the read of {} past its envelope failed", key);
    }
    return inner_->Get(key, range);
  }
  Result<objstore::ObjectInfo> Head(std::string_view key) override { return inner_->Head(key); }
  Result<objstore::ListPage> List(std::string_view prefix, std::string_view start_after = {},
                                  size_t max_keys = 1000) override {
    return inner_->List(prefix, start_after, max_keys);
  }
  Status Delete(std::string_view key) override {
    return fail_deletes_ ? Unavailable("test: deletes fail") : inner_->Delete(key);
  }
  Status DeleteMany(std::span<const std::string> keys) override {
    return fail_deletes_ ? Unavailable("test: deletes fail") : inner_->DeleteMany(keys);
  }
  std::string Describe() const override { return "gate(" + inner_->Describe() + ")"; }
  std::string Location() const override { return inner_->Location(); }

 private:
  std::shared_ptr<objstore::ObjectStore> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int blocked_ = 0;  // PUTs waiting at the gate
  std::atomic<bool> fail_past_envelope_{false};
  std::atomic<bool> fail_deletes_{false};
};

class QuorumStoreTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kEpoch = 1;
  static constexpr uint64_t kNonce = 77;       // the writer's
  static constexpr uint64_t kOtherNonce = 78;  // another writer's, same chain
  static constexpr uint64_t kFencer = 999;
  const ChainRef chain{"n1", kEpoch};

  QuorumStoreTest() { UseStores(3); }
  void TearDown() override {
    // The QuorumStore's destructor joins its threads, which a closed gate holds.
    for (auto& g : gate) g->OpenGate();
    q.reset();
  }

  // k fresh stores: gate[i] -> fault[i] -> mem[i].
  void UseStores(size_t k) {
    mem.clear();
    fault.clear();
    gate.clear();
    for (size_t i = 0; i < k; ++i) {
      mem.push_back(objstore::NewMemStore());
      fault.push_back(std::make_shared<objstore::FaultStore>(mem[i], objstore::FaultOptions{}));
      gate.push_back(std::make_shared<GateStore>(fault[i]));
    }
  }
  // q: a QuorumStore over gate[0..k). Listings and deletes wait for every
  // store (unless a test says otherwise): these stores all answer.
  static QuorumOptions Patient() {
    QuorumOptions o;
    o.straggler_grace = std::chrono::duration_cast<std::chrono::milliseconds>(kPatience);
    return o;
  }
  bool OpenQuorum(QuorumOptions options = Patient()) {
    std::vector<std::shared_ptr<objstore::ObjectStore>> stores(gate.begin(), gate.end());
    auto opened = QuorumStore::Open(std::move(stores), options);
    if (!opened.ok()) {
      ADD_FAILURE() << "QuorumStore::Open: " << opened.status().ToString();
      return false;
    }
    q = std::move(*opened);
    return true;
  }
  // From now on store i fails every PUT and/or every GET, HEAD and LIST (kUnavailable).
  void Fail(size_t i, bool puts, bool reads) {
    objstore::FaultOptions fo;
    fo.put_error_rate = puts ? 1 : 0;
    fo.get_error_rate = reads ? 1 : 0;
    fault[i]->SetOptions(fo);
  }

  std::string Key(uint64_t seq) const { return SlotKey(chain.node, chain.epoch, seq); }
  std::string Flight(uint64_t seq, uint64_t nonce = kNonce) const { return MakeFlight(kEpoch, seq, nonce); }
  std::string Poison(uint64_t seq, uint64_t nonce = kFencer) const { return EncodePoison(kEpoch, seq, nonce); }

  // The create-only PUT of slot `seq` through q. kTimeout if it has not
  // returned after kPatience (it is then let go: every gate opens).
  Status PutSlot(uint64_t seq, const std::string& data) {
    auto put = std::async(std::launch::async, [&] { return q->Put(Key(seq), data, kCreateOnly); });
    if (put.wait_for(kPatience) == std::future_status::ready) return put.get();
    for (auto& g : gate) g->OpenGate();
    put.wait();
    return Timeout("the PUT of slot {} did not return", seq);
  }

  // Writes `data` at `key` straight into the given stores.
  void Plant(std::initializer_list<size_t> stores, const std::string& key, const std::string& data) {
    for (size_t i : stores) ASSERT_OK(mem[i]->Put(key, data));
  }
  bool Holds(size_t i, const std::string& key, const std::string& data) {
    auto got = mem[i]->Get(key);
    return got.ok() && *got == data;
  }
  bool Absent(size_t i, const std::string& key) { return mem[i]->Head(key).status().code() == Code::kNotFound; }
  size_t SlotCount(size_t i) {
    auto page = mem[i]->List("wal/");
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    return page.ok() ? page->objects.size() : 0;
  }
  const QuorumStoreCounters& counters(size_t i) const { return q->counters(i); }

  // Every key with `prefix` through q, paged max_keys at a time.
  Result<std::vector<std::string>> ListAll(std::string_view prefix, size_t max_keys) {
    std::vector<std::string> keys;
    std::string after;
    for (int pages = 0; pages < 100; ++pages) {
      WEIR_ASSIGN_OR_RETURN(objstore::ListPage page, q->List(prefix, after, max_keys));
      EXPECT_LE(page.objects.size(), max_keys);
      for (const auto& o : page.objects) keys.push_back(o.key);
      if (page.next_start_after.empty()) return keys;
      after = page.next_start_after;
    }
    return Internal("the listing never ended");
  }

  std::vector<std::shared_ptr<objstore::ObjectStore>> mem;
  std::vector<std::shared_ptr<objstore::FaultStore>> fault;
  std::vector<std::shared_ptr<GateStore>> gate;
  std::shared_ptr<QuorumStore> q;
};

// ---- Open ---------------------------------------------------------------------

TEST(QuorumStoreOpen, ChecksTheStoreCountAndTheWriteQuorum) {
  const QuorumOptions one_thread{.threads_per_store = 1};
  for (size_t n : {0u, 1u, 33u}) {
    EXPECT_EQ(QuorumStore::Open(MemStores(n), one_thread).status().code(), Code::kInvalidArgument) << n << " stores";
  }
  struct Case {
    size_t stores, asked, expected;
  };
  for (const auto& [stores, asked, expected] :
       {Case{2, 0, 2}, Case{3, 0, 2}, Case{4, 0, 3}, Case{5, 0, 3}, Case{32, 0, 17}, Case{3, 1, 1}, Case{3, 3, 3}}) {
    QuorumOptions o = one_thread;
    o.write_quorum = asked;
    auto q = QuorumStore::Open(MemStores(stores), o);
    ASSERT_TRUE(q.ok()) << stores << " stores, W " << asked << ": " << q.status().ToString();
    EXPECT_EQ((*q)->store_count(), stores);
    EXPECT_EQ((*q)->write_quorum(), expected) << stores << " stores, W " << asked;
  }
  QuorumOptions too_many = one_thread;
  too_many.write_quorum = 4;
  EXPECT_EQ(QuorumStore::Open(MemStores(3), too_many).status().code(), Code::kInvalidArgument);
}

TEST(QuorumStoreOpen, DescribeNamesTheQuorumAndEveryStoreInOrder) {
  auto stores = MemStores(3);
  stores[1] = std::make_shared<objstore::FaultStore>(stores[1], objstore::FaultOptions{});
  auto majority = QuorumStore::Open(stores);
  ASSERT_TRUE(majority.ok()) << majority.status().ToString();
  EXPECT_EQ((*majority)->Describe(), "quorum(2 of 3: mem://, fault(mem://), mem://)");
  auto all = QuorumStore::Open(MemStores(3), QuorumOptions{.write_quorum = 3});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)->Describe(), "quorum(3 of 3: mem://, mem://, mem://)");
}

TEST(QuorumStoreOpen, OneStoreTwiceIsRefusedAndTheOrderIsNoPartOfTheLocation) {
  auto stores = MemStores(2);
  // A decorator is the store it decorates: named twice, its own copy's 412
  // would count as a second copy.
  auto twice = QuorumStore::Open({stores[0], stores[1],
                                  std::make_shared<objstore::FaultStore>(stores[0], objstore::FaultOptions{})});
  EXPECT_EQ(twice.status().code(), Code::kInvalidArgument);
  auto a = QuorumStore::Open({stores[0], stores[1]});
  auto b = QuorumStore::Open({stores[1], stores[0]});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->Location(), (*b)->Location());
  EXPECT_NE((*a)->Location(), (*QuorumStore::Open({stores[1], MemStores(1)[0]}))->Location());
}

TEST(QuorumStoreOpen, OneDirectoryThroughTwoPathsIsRefused) {
  // A symlink to another member's directory: each PUT would land once and
  // the second lane's 412 (with our own nonce read back) count as a copy.
  weir::testing::TempDir dir;
  std::filesystem::create_directory(dir.path() + "/real");
  std::filesystem::create_directory_symlink(dir.path() + "/real", dir.path() + "/link");
  std::vector<std::shared_ptr<objstore::ObjectStore>> stores;
  for (const char* name : {"/real", "/link", "/other"}) {
    auto s = objstore::OpenObjectStore("file://" + dir.path() + name);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stores.push_back(*s);
  }
  auto opened = QuorumStore::Open(stores);
  ASSERT_EQ(opened.status().code(), Code::kInvalidArgument) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("same directory"), std::string::npos) << opened.status().ToString();
  // Through a decorator too; and two directories are two stores.
  stores[1] = std::make_shared<objstore::FaultStore>(stores[1], objstore::FaultOptions{});
  EXPECT_EQ(QuorumStore::Open(stores).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(QuorumStore::Open({stores[0], stores[2]}).ok());
}

// ---- PUT ----------------------------------------------------------------------

TEST_F(QuorumStoreTest, FlightReadsBackAndReachesEveryStore) {
  ASSERT_TRUE(OpenQuorum());
  const std::string slot = Flight(0);
  ASSERT_OK(PutSlot(0, slot));
  ASSERT_OK_AND_ASSIGN(std::string whole, q->Get(Key(0)));
  EXPECT_EQ(whole, slot);
  ASSERT_OK_AND_ASSIGN(std::string envelope, q->Get(Key(0), ByteRange{0, kEnvelopeSize}));
  EXPECT_EQ(envelope, slot.substr(0, kEnvelopeSize));
  EXPECT_EQ(EnvelopeOf(envelope).nonce, kNonce);
  ASSERT_OK_AND_ASSIGN(objstore::ObjectInfo info, q->Head(Key(0)));
  EXPECT_EQ(info.size, slot.size());
  // The copy beyond the quorum may land after the PUT returned.
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(Eventually([&] { return Holds(i, Key(0), slot); })) << "store " << i << " never got its copy";
    EXPECT_TRUE(Eventually([&] { return counters(i).copies.load() == 1; })) << "store " << i;
    EXPECT_EQ(counters(i).copy_failures.load(), 0u);
  }
}

TEST_F(QuorumStoreTest, TakesOnlyCreateOnlyPutsOfSlots) {
  ASSERT_TRUE(OpenQuorum());
  EXPECT_EQ(q->Put(Key(0), Flight(0)).code(), Code::kInvalidArgument);  // not create-only
  EXPECT_EQ(q->Put(Key(0), "not a slot at all", kCreateOnly).code(), Code::kInvalidArgument);
  std::string broken = Flight(0);
  broken[10] = static_cast<char>(broken[10] ^ 1);  // the envelope's CRC no longer holds
  EXPECT_EQ(q->Put(Key(0), broken, kCreateOnly).code(), Code::kInvalidArgument);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(SlotCount(i), 0u) << "store " << i;
    EXPECT_EQ(counters(i).copies.load(), 0u);
  }
}

TEST_F(QuorumStoreTest, OneFailedStoreIsInvisibleToWritesReadsAndTheFence) {
  Fail(0, /*puts=*/true, /*reads=*/true);
  ASSERT_TRUE(OpenQuorum());
  constexpr uint64_t n = 5;
  for (uint64_t s = 0; s < n; ++s) ASSERT_OK(PutSlot(s, Flight(s)));
  ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(2)));
  EXPECT_EQ(got, Flight(2));
  ASSERT_OK_AND_ASSIGN(objstore::ObjectInfo info, q->Head(Key(2)));
  EXPECT_EQ(info.size, Flight(2).size());

  std::vector<uint64_t> seen;
  auto f = FenceAndWalk(*q, chain, 0, kFencer, [&](uint64_t seq, const SlotIndex&, std::string_view bytes) {
    seen.push_back(seq);
    EXPECT_EQ(bytes, Flight(seq));
    return Status::Ok();
  });
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cut, n);
  EXPECT_TRUE(f->poisoned_here);
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  auto probe = ProbeSlot(*q, chain, n);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_EQ(probe->state, SlotState::kPoison);
  EXPECT_EQ(probe->envelope.nonce, kFencer);
  // A second fence finds that poison.
  auto again = Fence(*q, chain, 0, kFencer + 1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->cut, n);
  EXPECT_FALSE(again->poisoned_here);
  EXPECT_EQ(SlotCount(0), 0u) << "the failed store took a write";
}

TEST_F(QuorumStoreTest, SlowStoreDoesNotHoldThePut) {
  ASSERT_TRUE(OpenQuorum());
  gate[1]->CloseGate();
  const std::string slot = Flight(0);
  ASSERT_OK(PutSlot(0, slot));  // stores 0 and 2 make the quorum
  ASSERT_TRUE(gate[1]->WaitBlocked()) << "the slow store's copy was never sent";
  EXPECT_TRUE(Absent(1, Key(0)));
  EXPECT_EQ(counters(1).copies.load(), 0u);
  ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(0)));
  EXPECT_EQ(got, slot);
  gate[1]->OpenGate();
  EXPECT_TRUE(Eventually([&] { return Holds(1, Key(0), slot); })) << "the held copy never landed";
  EXPECT_TRUE(Eventually([&] { return counters(1).copies.load() == 1; }));
}

TEST_F(QuorumStoreTest, OwnCopiesOfAnEarlierAttemptCount) {
  Plant({0, 1}, Key(0), Flight(0));
  Fail(2, /*puts=*/true, /*reads=*/false);
  ASSERT_TRUE(OpenQuorum());
  // Only the two stores answering 412 with this writer's envelope can make the quorum.
  EXPECT_OK(PutSlot(0, Flight(0)));
  EXPECT_TRUE(Eventually([&] { return counters(0).copies.load() == 1 && counters(1).copies.load() == 1; }));
  // A retried PUT that had succeeded succeeds again.
  Fail(2, false, false);
  ASSERT_OK(PutSlot(1, Flight(1)));
  EXPECT_OK(PutSlot(1, Flight(1)));
  ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(1)));
  EXPECT_EQ(got, Flight(1));
}

TEST_F(QuorumStoreTest, ForeignOccupantsFailThePut) {
  ASSERT_TRUE(OpenQuorum());
  Plant({0, 2}, Key(0), Flight(0, kOtherNonce));
  EXPECT_EQ(PutSlot(0, Flight(0)).code(), Code::kPreconditionFailed);
  ASSERT_OK_AND_ASSIGN(std::string other, q->Get(Key(0)));
  EXPECT_EQ(other, Flight(0, kOtherNonce));

  Plant({1, 2}, Key(1), Poison(1));
  EXPECT_EQ(PutSlot(1, Flight(1)).code(), Code::kPreconditionFailed);
  ASSERT_OK_AND_ASSIGN(std::string dead, q->Get(Key(1)));
  EXPECT_EQ(dead, Poison(1));
  EXPECT_EQ(EnvelopeOf(dead).kind, SlotKind::kPoison);
}

TEST_F(QuorumStoreTest, AnotherFencersPoisonCountsTowardsDead) {
  // One store holds another fencer's poison and one is down: this fencer's
  // poison lands in the third, and the slot is dead at two poisons.
  Plant({0}, Key(0), Poison(0, kOtherNonce));
  Fail(2, /*puts=*/true, /*reads=*/true);
  ASSERT_TRUE(OpenQuorum());
  ASSERT_OK(PutSlot(0, Poison(0)));
  ASSERT_OK_AND_ASSIGN(std::string dead, q->Get(Key(0)));
  EXPECT_EQ(EnvelopeOf(dead).kind, SlotKind::kPoison);
  // And a flight can no longer be durable there.
  EXPECT_EQ(PutSlot(0, Flight(0)).code(), Code::kPreconditionFailed);
}

// With K = 4 and W = 3 the two thresholds differ: a flight needs W copies and
// fails on K-W+1 = 2 foreign occupants; a poison needs K-W+1 = 2 copies and
// fails on W foreign occupants.
TEST_F(QuorumStoreTest, FlightNeedsWCopiesAndPoisonKMinusWPlusOne) {
  UseStores(4);
  ASSERT_TRUE(OpenQuorum());
  ASSERT_EQ(q->write_quorum(), 3u);

  Plant({0, 1}, Key(0), Flight(0, kOtherNonce));
  EXPECT_EQ(PutSlot(0, Flight(0)).code(), Code::kPreconditionFailed) << "2 free stores cannot make 3 copies";

  Plant({0, 1}, Key(1), Flight(1));
  EXPECT_EQ(q->Get(Key(1)).status().code(), Code::kNotFound) << "2 of 4 copies commit nothing";
  ASSERT_OK(PutSlot(1, Poison(1)));
  EXPECT_TRUE(Holds(2, Key(1), Poison(1)));
  EXPECT_TRUE(Holds(3, Key(1), Poison(1)));
  ASSERT_OK_AND_ASSIGN(std::string dead, q->Get(Key(1)));
  EXPECT_EQ(dead, Poison(1));

  Plant({0, 1, 2}, Key(2), Flight(2));
  EXPECT_EQ(PutSlot(2, Poison(2)).code(), Code::kPreconditionFailed) << "a committed flight was poisoned";
  ASSERT_OK_AND_ASSIGN(std::string committed, q->Get(Key(2)));
  EXPECT_EQ(committed, Flight(2));
}

TEST_F(QuorumStoreTest, RacingFlightAndPoisonExactlyOneWins) {
  ASSERT_TRUE(OpenQuorum());
  for (uint64_t s = 0; s < 20; ++s) {
    Status flight_put, poison_put;
    std::thread writer([&] { flight_put = q->Put(Key(s), Flight(s), kCreateOnly); });
    std::thread fencer([&] { poison_put = q->Put(Key(s), Poison(s), kCreateOnly); });
    writer.join();
    fencer.join();
    ASSERT_NE(flight_put.ok(), poison_put.ok())
        << "slot " << s << ": flight " << flight_put.ToString() << ", poison " << poison_put.ToString();
    const Status& lost = flight_put.ok() ? poison_put : flight_put;
    EXPECT_EQ(lost.code(), Code::kPreconditionFailed) << lost.ToString();
    ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(s)));
    EXPECT_EQ(got, flight_put.ok() ? Flight(s) : Poison(s)) << "slot " << s;
  }
}

// ---- GET: classification ------------------------------------------------------

TEST_F(QuorumStoreTest, FlightInOneStoreIsNotFoundAndTheFenceKillsIt) {
  ASSERT_TRUE(OpenQuorum());
  EXPECT_EQ(q->Get(Key(0)).status().code(), Code::kNotFound);
  Plant({0}, Key(0), Flight(0));  // a late writer's first copy
  EXPECT_EQ(q->Get(Key(0)).status().code(), Code::kNotFound);
  EXPECT_EQ(q->Get(Key(0), ByteRange{0, kEnvelopeSize}).status().code(), Code::kNotFound);
  auto probe = ProbeSlot(*q, chain, 0);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_EQ(probe->state, SlotState::kMissing);

  auto f = Fence(*q, chain, 0, kFencer);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cut, 0u);
  EXPECT_TRUE(f->poisoned_here);
  EXPECT_TRUE(Holds(1, Key(0), Poison(0)));
  EXPECT_TRUE(Holds(2, Key(0), Poison(0)));
  // The late writer's retry loses, and readers see the poison.
  EXPECT_EQ(PutSlot(0, Flight(0)).code(), Code::kPreconditionFailed);
  ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(0)));
  EXPECT_EQ(EnvelopeOf(got).kind, SlotKind::kPoison);
  EXPECT_EQ(got, Poison(0));
}

TEST_F(QuorumStoreTest, FlightInWStoresIsCommitted) {
  ASSERT_TRUE(OpenQuorum());
  Plant({0, 2}, Key(0), Flight(0));  // the third store has nothing
  Plant({0, 1}, Key(1), Flight(1));
  Plant({2}, Key(1), Poison(1));  // the third store has a poison
  for (uint64_t s = 0; s < 2; ++s) {
    auto probe = ProbeSlot(*q, chain, s);
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    EXPECT_EQ(probe->state, SlotState::kFlight) << "slot " << s;
    EXPECT_EQ(probe->envelope.nonce, kNonce);
    ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(s)));
    EXPECT_EQ(got, Flight(s));
  }
}

TEST_F(QuorumStoreTest, SlotNoOneCanDecideIsCorruption) {
  ASSERT_TRUE(OpenQuorum());
  Plant({0}, Key(0), Flight(0, 1));
  Plant({1}, Key(0), Flight(0, 2));
  Plant({2}, Key(0), Poison(0));
  EXPECT_EQ(q->Get(Key(0)).status().code(), Code::kCorruption);
  EXPECT_EQ(q->Get(Key(0), ByteRange{0, kEnvelopeSize}).status().code(), Code::kCorruption);
  EXPECT_EQ(ProbeSlot(*q, chain, 0).status().code(), Code::kCorruption);
}

TEST_F(QuorumStoreTest, SlotAFailingStoreLeavesUndecidedIsThatFailure) {
  Fail(2, /*puts=*/false, /*reads=*/true);
  ASSERT_TRUE(OpenQuorum());
  Plant({0}, Key(0), Flight(0));  // store 1 has nothing; store 2 may hold the second copy
  for (auto range : {std::optional<ByteRange>{}, std::optional<ByteRange>{ByteRange{0, kEnvelopeSize}}}) {
    auto got = q->Get(Key(0), range);
    ASSERT_FALSE(got.ok()) << "decided a slot a failing store leaves open";
    EXPECT_TRUE(got.status().retryable()) << got.status().ToString();
  }
  // Once store 2 answers (with nothing), the slot is decided.
  Fail(2, false, false);
  EXPECT_EQ(q->Get(Key(0)).status().code(), Code::kNotFound);
}

// ---- GET: the bytes -----------------------------------------------------------

TEST_F(QuorumStoreTest, RangedGetReadsAHolderOfTheCommittedCopy) {
  ASSERT_TRUE(OpenQuorum());
  const std::string slot = Flight(0);
  ASSERT_OK(PutSlot(0, slot));
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(Eventually([&] { return Holds(i, Key(0), slot); }));
  ASSERT_OK(mem[0]->Delete(Key(0)));  // a holder lost its copy; stores 1 and 2 still commit it
  ASSERT_OK_AND_ASSIGN(std::string part, q->Get(Key(0), ByteRange{kEnvelopeSize, 10}));
  EXPECT_EQ(part, slot.substr(kEnvelopeSize, 10));
  ASSERT_OK_AND_ASSIGN(std::string tail, q->Get(Key(0), ByteRange{kEnvelopeSize, 1 << 20}));
  EXPECT_EQ(tail, slot.substr(kEnvelopeSize)) << "a range past the end is cut at the end";
  ASSERT_OK_AND_ASSIGN(std::string whole, q->Get(Key(0)));
  EXPECT_EQ(whole, slot);
  EXPECT_EQ(q->Get(Key(0), ByteRange{slot.size() + 1, 10}).status().code(), Code::kOutOfRange);
}

TEST_F(QuorumStoreTest, ReadOfTheDataFallsThroughAHolderThatFails) {
  ASSERT_TRUE(OpenQuorum());
  const std::string slot = Flight(0);
  Plant({0, 1, 2}, Key(0), slot);
  gate[0]->FailReadsPastEnvelope();  // store 0 answers the probe, then fails the data
  ASSERT_OK_AND_ASSIGN(std::string part, q->Get(Key(0), ByteRange{kEnvelopeSize, 10}));
  EXPECT_EQ(part, slot.substr(kEnvelopeSize, 10));
  ASSERT_OK_AND_ASSIGN(std::string whole, q->Get(Key(0)));
  EXPECT_EQ(whole, slot);
}

// A holder whose copy is damaged past the envelope (the probe reads only
// the envelope, so the slot still counts as committed there): reads go to
// the next holder instead of failing the fence's walk or settle.
TEST_F(QuorumStoreTest, ReadOfTheDataPassesOverAHolderWithADamagedCopy) {
  ASSERT_TRUE(OpenQuorum());
  const std::string slot = Flight(0);
  std::string damaged = slot;
  damaged.back() ^= 0x01;
  Plant({0}, Key(0), damaged);
  Plant({1, 2}, Key(0), slot);
  ASSERT_OK_AND_ASSIGN(std::string whole, q->Get(Key(0)));
  EXPECT_EQ(whole, slot);
  // A short answer to a range: the next holder's.
  std::string cut = slot.substr(0, slot.size() - 1);
  ASSERT_OK(mem[0]->Put(Key(0), cut));
  ASSERT_OK_AND_ASSIGN(std::string tail, q->Get(Key(0), ByteRange{kEnvelopeSize, 1 << 20}));
  EXPECT_EQ(tail, slot.substr(kEnvelopeSize));
  // The same for a slot this process wrote (its holders are remembered).
  const std::string own = Flight(1);
  ASSERT_OK(PutSlot(1, own));
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(Eventually([&] { return Holds(i, Key(1), own); }));
  ASSERT_OK(mem[0]->Put(Key(1), own.substr(0, own.size() - 1)));
  ASSERT_OK_AND_ASSIGN(std::string own_tail, q->Get(Key(1), ByteRange{kEnvelopeSize, own.size() - kEnvelopeSize}));
  EXPECT_EQ(own_tail, own.substr(kEnvelopeSize));
  // Damaged everywhere: Corruption, naming a store.
  for (size_t i : {1, 2}) ASSERT_OK(mem[i]->Put(Key(0), damaged));
  auto bad = q->Get(Key(0));
  EXPECT_EQ(bad.status().code(), Code::kCorruption) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("the copy in store"), std::string::npos) << bad.status().ToString();
}

// ---- HEAD, LIST, DELETE -------------------------------------------------------

TEST_F(QuorumStoreTest, ListMergesTheStoresListings) {
  ASSERT_TRUE(OpenQuorum());
  // Key, size: p/a 1 ... p/g 7, spread over the stores.
  Plant({0, 2}, "p/a", "1");
  Plant({1}, "p/b", "22");
  Plant({0}, "p/c", "333");
  Plant({1}, "p/d", "4444");
  Plant({0}, "p/e", "55555");
  Plant({1, 2}, "p/f", "666666");
  Plant({2}, "p/g", "7777777");
  Plant({0, 1, 2}, "q/z", "other prefix");
  const std::vector<std::string> all = {"p/a", "p/b", "p/c", "p/d", "p/e", "p/f", "p/g"};

  ASSERT_OK_AND_ASSIGN(objstore::ListPage page, q->List("p/"));
  ASSERT_EQ(page.objects.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(page.objects[i].key, all[i]);
    EXPECT_EQ(page.objects[i].size, i + 1) << all[i];
  }
  EXPECT_TRUE(page.next_start_after.empty());
  for (size_t max_keys : {1u, 2u, 3u}) {
    ASSERT_OK_AND_ASSIGN(std::vector<std::string> paged, ListAll("p/", max_keys));
    EXPECT_EQ(paged, all) << "pages of " << max_keys;
  }
  ASSERT_OK_AND_ASSIGN(objstore::ListPage rest, q->List("p/", "p/c"));
  ASSERT_EQ(rest.objects.size(), 4u);
  EXPECT_EQ(rest.objects.front().key, "p/d");
  EXPECT_EQ(rest.objects.back().key, "p/g");

  // K-W = 1 store may fail: the others answer (p/g was only in the failed one).
  Fail(2, /*puts=*/false, /*reads=*/true);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> degraded, ListAll("p/", 2));
  EXPECT_EQ(degraded, (std::vector<std::string>{"p/a", "p/b", "p/c", "p/d", "p/e", "p/f"}));
  // Two may not.
  Fail(1, false, true);
  auto failed = q->List("p/");
  ASSERT_FALSE(failed.ok()) << "listed with 2 of 3 stores failing";
  EXPECT_TRUE(failed.status().retryable()) << failed.status().ToString();
}

TEST_F(QuorumStoreTest, HeadFindsAnyCopy) {
  ASSERT_TRUE(OpenQuorum());
  Plant({2}, Key(0), Flight(0));
  ASSERT_OK_AND_ASSIGN(objstore::ObjectInfo info, q->Head(Key(0)));
  EXPECT_EQ(info.size, Flight(0).size());
  EXPECT_EQ(q->Head(Key(1)).status().code(), Code::kNotFound);
  Fail(0, /*puts=*/false, /*reads=*/true);
  EXPECT_TRUE(q->Head(Key(0)).ok()) << "another store's failure hid the copy";
}

// One failing store (of K-W that may fail) is invisible to the garbage
// probe: W stores without the slot make it absent, and W stores that
// deleted make a delete done (what the failing store keeps is garbage a
// later sweep finds). Two failing stores of three are not.
TEST_F(QuorumStoreTest, OneFailingStoreFailsNeitherTheGarbageProbeNorItsDeletes) {
  ASSERT_TRUE(OpenQuorum());
  Plant({1, 2}, Key(2), Flight(2));  // landed past a cut of 1
  Fail(0, /*puts=*/false, /*reads=*/true);
  gate[0]->FailDeletes();
  EXPECT_EQ(q->Head(Key(3)).status().code(), Code::kNotFound);
  ASSERT_OK(q->DeleteMany(std::vector<std::string>{Key(2)}));
  EXPECT_TRUE(Absent(1, Key(2)) && Absent(2, Key(2)));
  Plant({1, 2}, Key(2), Flight(2));
  RetryPolicy quick;
  quick.initial = std::chrono::milliseconds(1);
  quick.max = std::chrono::milliseconds(1);
  auto deleted = DeleteGarbage(*q, chain, /*cut=*/1, /*window=*/4, quick);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(*deleted, 1u);
  EXPECT_TRUE(Absent(1, Key(2)) && Absent(2, Key(2)));

  Fail(1, /*puts=*/false, /*reads=*/true);
  gate[1]->FailDeletes();
  EXPECT_EQ(q->Head(Key(3)).status().code(), Code::kUnavailable);
  Plant({2}, Key(4), Flight(4));
  EXPECT_EQ(q->DeleteMany(std::vector<std::string>{Key(4)}).code(), Code::kUnavailable);
}

TEST_F(QuorumStoreTest, DeleteRemovesEveryCopy) {
  ASSERT_TRUE(OpenQuorum());
  Plant({0, 1, 2}, Key(0), Flight(0));
  ASSERT_OK(q->Delete(Key(0)));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(Absent(i, Key(0))) << "store " << i;

  Plant({0, 1}, Key(1), Flight(1));
  Plant({2}, Key(2), Flight(2));
  Plant({1, 2}, Key(3), Poison(3));
  const std::vector<std::string> keys = {Key(1), Key(2), Key(3), Key(4) /* nowhere */};
  ASSERT_OK(q->DeleteMany(keys));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(SlotCount(i), 0u) << "store " << i;
}

// ---- Backlog ------------------------------------------------------------------

TEST_F(QuorumStoreTest, FullBacklogGivesUpCopiesForASlowStore) {
  const size_t slot_size = Flight(0).size();  // every Flight(0..9) has this size
  QuorumOptions o = Patient();
  o.backlog_bytes = slot_size;
  ASSERT_TRUE(OpenQuorum(o));
  gate[2]->CloseGate();
  constexpr uint64_t n = 6;
  for (uint64_t s = 0; s < n; ++s) {
    // The fast stores' previous copies have left their backlogs.
    ASSERT_TRUE(Eventually([&] { return counters(0).backlog_bytes.load() == 0 && counters(1).backlog_bytes.load() == 0; }));
    ASSERT_OK(PutSlot(s, Flight(s)));
    EXPECT_LE(counters(2).backlog_bytes.load(), slot_size);
  }
  EXPECT_TRUE(Eventually([&] { return counters(2).copies_skipped.load() > 0; }));
  EXPECT_EQ(counters(0).copies_skipped.load(), 0u);
  EXPECT_EQ(counters(1).copies_skipped.load(), 0u);

  gate[2]->OpenGate();
  ASSERT_TRUE(Eventually([&] {
    return counters(2).backlog_bytes.load() == 0 && counters(2).copies.load() + counters(2).copies_skipped.load() == n;
  })) << "copies " << counters(2).copies.load() << ", skipped " << counters(2).copies_skipped.load();
  EXPECT_LT(counters(2).copies.load(), n);
  EXPECT_EQ(SlotCount(2), counters(2).copies.load()) << "a given-up copy was written";
  for (uint64_t s = 0; s < n; ++s) {
    ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(s)));
    EXPECT_EQ(got, Flight(s));
  }
}

TEST_F(QuorumStoreTest, AStoreBehindOnCopiesStillAnswersReadsListsAndDeletes) {
  // Reads, listings and deletes go ahead of copies: store 2, with more copies
  // held at its gate than it has threads, still deletes what only it holds.
  Plant({2}, Key(100), Flight(100));
  ASSERT_TRUE(OpenQuorum());
  gate[2]->CloseGate();
  for (uint64_t s = 0; s < 20; ++s) ASSERT_OK(PutSlot(s, Flight(s)));
  ASSERT_OK_AND_ASSIGN(std::string got, q->Get(Key(19)));
  EXPECT_EQ(got, Flight(19));
  ASSERT_OK(q->Head(Key(100)).status());
  ASSERT_OK_AND_ASSIGN(auto page, q->List("wal/", "", 1000));
  EXPECT_EQ(page.objects.size(), 21u);
  ASSERT_OK(q->DeleteMany(std::vector<std::string>{Key(0), Key(100)}));
  EXPECT_TRUE(Absent(2, Key(100)));
  EXPECT_TRUE(Absent(0, Key(0)) && Absent(1, Key(0)));
}

TEST_F(QuorumStoreTest, RequestsQueuedForAStoreThatStoppedAnsweringAreBounded) {
  // Store 2's one thread is held by a copy at its gate: its requests queue,
  // and past two of them fail at once, while listings answer from the others.
  QuorumOptions o;
  o.threads_per_store = 1;
  o.straggler_grace = std::chrono::milliseconds(1);
  o.max_queued_requests = 2;
  ASSERT_TRUE(OpenQuorum(o));
  gate[2]->CloseGate();
  ASSERT_OK(PutSlot(0, Flight(0)));
  ASSERT_TRUE(gate[2]->WaitBlocked());
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(auto page, q->List("wal/", "", 1000));
    EXPECT_EQ(page.objects.size(), 1u);
  }
  EXPECT_EQ(counters(2).requests_refused.load(), 3u);
  EXPECT_EQ(counters(0).requests_refused.load(), 0u);
  gate[2]->OpenGate();
  ASSERT_TRUE(Eventually([&] { return Holds(2, Key(0), Flight(0)); }));
}

TEST_F(QuorumStoreTest, ListGivesASlotWithOneFlightCopyAndThePoisonsThePoisonsSize) {
  // What a crash mid-PUT and the fence leave: the sweep must take it for a
  // poison (which it keeps), whichever store answers first.
  Plant({0}, Key(0), Flight(0));
  Plant({1, 2}, Key(0), Poison(0));
  ASSERT_TRUE(OpenQuorum());
  ASSERT_OK_AND_ASSIGN(auto page, q->List("wal/", "", 1000));
  ASSERT_EQ(page.objects.size(), 1u);
  EXPECT_EQ(page.objects[0].size, kEnvelopeSize);
}

// ---- With the WAL writer ------------------------------------------------------

TEST_F(QuorumStoreTest, WriterOverADeadStoreAcksAndASuccessorRecoversEveryAck) {
  Fail(1, /*puts=*/true, /*reads=*/true);
  ASSERT_TRUE(OpenQuorum());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> acked;  // values, in acknowledgement order
  size_t failed = 0;
  auto wait_acks = [&](size_t count) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, kPatience, [&] { return acked.size() + failed >= count; });
  };
  WriterOptions o;
  o.node = chain.node;
  o.epoch = chain.epoch;
  o.retry_initial = 1ms;
  o.retry_max = 10ms;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Writer> writer, Writer::Start(q, o));
  constexpr size_t n = 40;
  for (size_t i = 0; i < n; ++i) {
    const std::string v = "r" + std::to_string(i);
    ASSERT_OK(writer->Append(1, OneRecordBatch(v), [&, v](const Status& ack, const AckInfo&) {
      std::lock_guard lk(mu);
      if (ack.ok()) {
        acked.push_back(v);
      } else {
        ++failed;
      }
      cv.notify_all();
    }, Now() + kPatience));
    if (i % 4 == 3) {
      ASSERT_TRUE(wait_acks(i + 1));  // so the entries span several slots
    }
  }
  ASSERT_TRUE(wait_acks(n));
  writer->Close();
  const uint64_t slots = writer->metrics().slots.load();
  writer.reset();
  {
    std::lock_guard lk(mu);
    EXPECT_EQ(failed, 0u);
    ASSERT_EQ(acked.size(), n);
  }
  EXPECT_GT(slots, 1u);

  // A successor: a new QuorumStore over the same stores, a new fencer.
  q.reset();
  ASSERT_TRUE(OpenQuorum());
  std::vector<uint64_t> seqs;
  std::vector<std::string> replayed;
  auto f = FenceAndWalk(*q, chain, 0, kFencer, [&](uint64_t seq, const SlotIndex& index, std::string_view bytes) {
    seqs.push_back(seq);
    for (const ChunkInfo& ch : index.chunks) {
      Status batches = ForEachBatch(bytes.substr(ch.offset, ch.length), [&](const BatchHeader&, std::string_view b) {
        replayed.push_back(ValueOf(b));
        return Status::Ok();
      });
      if (!batches.ok()) return batches;
    }
    return Status::Ok();
  });
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cut, slots);
  EXPECT_TRUE(f->poisoned_here);
  ASSERT_EQ(seqs.size(), slots);
  for (uint64_t i = 0; i < slots; ++i) EXPECT_EQ(seqs[i], i);
  EXPECT_EQ(replayed, acked);
  auto probe = ProbeSlot(*q, chain, slots);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_EQ(probe->state, SlotState::kPoison);
  EXPECT_EQ(probe->envelope.nonce, kFencer);
  EXPECT_EQ(SlotCount(1), 0u) << "the dead store took a write";
}

}  // namespace
}  // namespace weir::wal
