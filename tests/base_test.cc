// base: Status/Result, CRC-32C, byte encoding, histogram.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <filesystem>
#include <fstream>
#include <vector>

#include "test_support.h"
#include "base/byte_budget.h"
#include "base/bytes.h"
#include "base/crc32c.h"
#include "base/fs.h"
#include "base/histogram.h"
#include "base/keyed_mutex.h"
#include "base/ordered_queue.h"
#include "base/secret.h"
#include "base/status.h"

namespace weir {
namespace {

// A ByteBudget waiter that records what it was admitted.
struct Waiter {
  size_t admitted = 0;
  void Admitted(size_t n) { admitted += n; }
};

TEST(ByteBudget, FirstComeFirstServedAndAloneAlwaysFits) {
  std::atomic<int64_t> used{0};
  std::atomic<uint64_t> waits{0};
  ByteBudget<std::shared_ptr<Waiter>> budget(1000, &used, &waits);
  auto a = std::make_shared<Waiter>(), b = std::make_shared<Waiter>(), c = std::make_shared<Waiter>();
  EXPECT_TRUE(budget.ReserveOrWait(a, 600));
  EXPECT_FALSE(budget.ReserveOrWait(b, 600));  // does not fit
  EXPECT_FALSE(budget.ReserveOrWait(c, 100));  // would fit, but b came first
  EXPECT_EQ(used.load(), 600);
  EXPECT_EQ(waits.load(), 2u);
  budget.Release(600);  // b and then c fit
  EXPECT_EQ(b->admitted, 600u);
  EXPECT_EQ(c->admitted, 100u);
  EXPECT_EQ(used.load(), 700);
  budget.Release(700);
  EXPECT_EQ(used.load(), 0);
  EXPECT_TRUE(budget.ReserveOrWait(a, 5000));  // larger than the budget, but alone
  EXPECT_FALSE(budget.ReserveOrWait(b, 1));
  budget.Release(5000);
  EXPECT_EQ(b->admitted, 601u);
  budget.Release(1);
  EXPECT_EQ(used.load(), 0);
}

TEST(ByteBudget, TryReserveNeverWaitsAndMayGoAheadOfWaiters) {
  std::atomic<int64_t> used{0};
  std::atomic<uint64_t> waits{0};
  ByteBudget<std::shared_ptr<Waiter>> budget(1000, &used, &waits);
  auto w = std::make_shared<Waiter>();
  EXPECT_TRUE(budget.TryReserve(500));
  EXPECT_FALSE(budget.TryReserve(600));               // does not fit
  EXPECT_TRUE(budget.TryReserve(600, 500));           // it does beside the caller's own bytes alone
  EXPECT_FALSE(budget.ReserveOrWait(w, 100));         // queued
  EXPECT_FALSE(budget.TryReserve(1, 1100));           // behind the waiter
  EXPECT_TRUE(budget.TryReserve(1, 1100, true));      // alone, ahead of it
  budget.Release(1101);
  EXPECT_EQ(w->admitted, 100u);
  EXPECT_FALSE(budget.ReserveOrWait(w, 950));         // 100 + 950 > 1000: queued
  EXPECT_TRUE(budget.TryReserve(800, 0, true));       // fits ahead of it
  EXPECT_FALSE(budget.TryReserve(200, 0, true));      // but never past the limit
  EXPECT_EQ(used.load(), 900);
  budget.Release(900);  // the 800 and w's first 100
  EXPECT_EQ(w->admitted, 1050u);
  budget.Release(950);
  EXPECT_EQ(used.load(), 0);
}

TEST(ByteBudget, WeakWaitersThatAreGoneAreSkipped) {
  std::atomic<int64_t> used{0};
  std::atomic<uint64_t> waits{0};
  ByteBudget<std::weak_ptr<Waiter>> budget(1000, &used, &waits);
  auto a = std::make_shared<Waiter>(), b = std::make_shared<Waiter>(), c = std::make_shared<Waiter>();
  EXPECT_TRUE(budget.ReserveOrWait(a, 900));
  EXPECT_FALSE(budget.ReserveOrWait(b, 900));
  EXPECT_FALSE(budget.ReserveOrWait(c, 900));
  std::weak_ptr<Waiter> gone = b;
  b.reset();
  budget.Release(900);  // b is skipped without taking its bytes; c is admitted
  EXPECT_TRUE(gone.expired());
  EXPECT_EQ(c->admitted, 900u);
  EXPECT_EQ(used.load(), 900);
  budget.Release(900);
  EXPECT_EQ(used.load(), 0);
}

TEST(OrderedQueue, RunsInOrderOneDrainAtATimeAndCountsUntilDone) {
  OrderedQueue q;
  std::vector<int> ran;
  EXPECT_FALSE(q.Busy());
  EXPECT_TRUE(q.Push([&] { ran.push_back(1); }));  // the caller starts the drain
  EXPECT_FALSE(q.Push([&] {
    ran.push_back(2);
    // Work queued during a turn runs in the drain's next turn.
    EXPECT_FALSE(q.Push([&] { ran.push_back(4); }));
  }));
  EXPECT_FALSE(q.Push([&] { ran.push_back(3); }));
  EXPECT_TRUE(q.Busy());
  EXPECT_TRUE(q.RunSome());  // more was queued: the drain posts itself again
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(q.Busy());
  EXPECT_FALSE(q.RunSome());
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_FALSE(q.Busy());
  EXPECT_TRUE(q.Push([] {}));  // no drain runs: the next Push starts one
  EXPECT_FALSE(q.RunSome());
  EXPECT_FALSE(q.Busy());
  // Work a joined pool will never run is dropped, and counts no more.
  auto held = std::make_shared<int>(0);
  EXPECT_TRUE(q.Push([held] {}));
  q.Drop();
  EXPECT_FALSE(q.Busy());
  EXPECT_EQ(held.use_count(), 1);
}

TEST(OrderedQueue, ADrainPausesBeforeAFunctionAndResumesWhereItStopped) {
  OrderedQueue q;
  std::vector<int> ran;
  bool pause = false;
  EXPECT_TRUE(q.Push([&] {
    ran.push_back(1);
    pause = true;  // e.g. its answer is now waiting to be written
  }));
  EXPECT_FALSE(q.Push([&] { ran.push_back(2); }));
  EXPECT_EQ(q.RunSomeUnless([&] { return pause; }), OrderedQueue::Turn::kPaused);
  EXPECT_EQ(ran, (std::vector<int>{1}));
  // Parked, not over: a Push starts no second drain.
  EXPECT_FALSE(q.Push([&] { ran.push_back(3); }));
  EXPECT_TRUE(q.Busy());
  pause = false;
  EXPECT_EQ(q.RunSomeUnless([&] { return pause; }), OrderedQueue::Turn::kDone);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(q.Busy());
  // A parked drain's work may be dropped (its owner went away).
  EXPECT_TRUE(q.Push([&] { pause = true; }));
  auto held = std::make_shared<int>(0);
  EXPECT_FALSE(q.Push([held] {}));
  EXPECT_EQ(q.RunSomeUnless([&] { return pause; }), OrderedQueue::Turn::kPaused);
  q.Drop();
  EXPECT_FALSE(q.Busy());
  EXPECT_EQ(held.use_count(), 1);
}

TEST(Status, OkIsCheapAndNamed) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.code(), Code::kOk);
  EXPECT_EQ(ok.ToString(), "OK");
  EXPECT_TRUE(ok.message().empty());
}

TEST(Status, CodesMessagesAndRetryability) {
  Status st = NotFound("object {} not found", "a/b");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.ToString(), "NotFound: object a/b not found");
  EXPECT_FALSE(st.retryable());
  EXPECT_TRUE(Timeout("t").retryable());
  EXPECT_TRUE(Unavailable("u").retryable());
  EXPECT_TRUE(ResourceExhausted("r").retryable());
  for (Status s : {InvalidArgument("x"), AlreadyExists("x"), PreconditionFailed("x"), Corruption("x"),
                   Fenced("x"), IOError("x"), Internal("x"), OutOfRange("x")}) {
    EXPECT_FALSE(s.retryable()) << s.ToString();
  }
  EXPECT_EQ(st.WithContext("reading").ToString(), "NotFound: reading: object a/b not found");
  EXPECT_TRUE(Status().WithContext("ctx").ok());
  EXPECT_EQ(CodeName(Code::kPreconditionFailed), "PreconditionFailed");
}

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("{} is odd", x);
  return x / 2;
}

Result<int> Quarter(int x) {
  WEIR_ASSIGN_OR_RETURN(int h, Half(x));
  WEIR_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  WEIR_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(Result, ValueOrStatusAndMacros) {
  auto r = Quarter(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 2);
  auto bad = Quarter(6);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "3 is odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), Code::kInvalidArgument);
  Result<std::string> s = std::string("move me");
  std::string taken = std::move(s).value();
  EXPECT_EQ(taken, "move me");
}

TEST(Crc32c, KnownVectorsAndExtension) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  std::mt19937 rng(1);
  std::string data(100000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{99999}}) {
    uint32_t a = Crc32c(data.data(), cut);
    EXPECT_EQ(Crc32cExtend(a, data.data() + cut, data.size() - cut), Crc32c(data));
  }
}

TEST(Crc32c, CombineMatchesTheConcatenation) {
  std::mt19937 rng(2);
  std::string data(3 << 20, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{21}, size_t{4096}, size_t{1 << 20}, data.size() - 3, data.size()}) {
    const uint32_t a = Crc32c(data.data(), cut);
    const uint32_t b = Crc32c(data.data() + cut, data.size() - cut);
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - cut), Crc32c(data)) << "cut at " << cut;
  }
  // Many pieces, as a segment's batches are combined one after another.
  uint32_t crc = 0;
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t n = std::min<size_t>(1 + rng() % 70000, data.size() - pos);
    crc = Crc32cCombine(crc, Crc32c(data.data() + pos, n), n);
    pos += n;
  }
  EXPECT_EQ(crc, Crc32c(data));
}

TEST(Bytes, FixedWidthRoundTrip) {
  std::string b;
  PutLE16(&b, 0x1234);
  PutLE32(&b, 0xdeadbeef);
  PutLE64(&b, 0x0102030405060708ull);
  PutBE16(&b, 0x1234);
  PutBE32(&b, 0xdeadbeef);
  PutBE64(&b, 0x0102030405060708ull);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 0x34);
  EXPECT_EQ(static_cast<uint8_t>(b[14]), 0x12);
  ByteReader r(b);
  uint16_t a16;
  uint32_t a32;
  uint64_t a64;
  ASSERT_TRUE(r.GetLE16(&a16) && r.GetLE32(&a32) && r.GetLE64(&a64));
  EXPECT_EQ(a16, 0x1234);
  EXPECT_EQ(a32, 0xdeadbeefu);
  EXPECT_EQ(a64, 0x0102030405060708ull);
  ASSERT_TRUE(r.GetBE16(&a16) && r.GetBE32(&a32) && r.GetBE64(&a64));
  EXPECT_EQ(a16, 0x1234);
  EXPECT_EQ(a32, 0xdeadbeefu);
  EXPECT_EQ(a64, 0x0102030405060708ull);
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_FALSE(r.GetU8(nullptr));
  EXPECT_TRUE(r.failed());
}

TEST(Bytes, VarintsRoundTripAndSizes) {
  const std::vector<int64_t> values = {0, 1, -1, 63, -64, 64, 300, -300, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
  std::string b;
  for (int64_t v : values) {
    size_t before = b.size();
    PutVarint(&b, v);
    EXPECT_EQ(b.size() - before, VarintSize(v)) << v;
  }
  ByteReader r(b);
  for (int64_t v : values) {
    int64_t got;
    ASSERT_TRUE(r.GetVarint(&got));
    EXPECT_EQ(got, v);
  }
  std::string one;
  PutVarint(&one, -1);
  EXPECT_EQ(one, std::string("\x01", 1));  // zigzag
  const std::string too_long(11, '\x80'), cut("\x80", 1);
  ByteReader bad(too_long);
  uint64_t u;
  EXPECT_FALSE(bad.GetUVarint(&u));
  ByteReader truncated(cut);
  EXPECT_FALSE(truncated.GetUVarint(&u));
}

TEST(Secret, ConstantTimeEqualAndAuthCredentials) {
  EXPECT_TRUE(ConstantTimeEqual("s3cret", "s3cret"));
  EXPECT_TRUE(ConstantTimeEqual("", ""));
  EXPECT_FALSE(ConstantTimeEqual("s3cret", "s3creT"));
  EXPECT_FALSE(ConstantTimeEqual("s3cret", "s3cret "));
  EXPECT_FALSE(ConstantTimeEqual("", "x"));
  EXPECT_EQ(AuthCredentials("Bearer abc", "bearer"), "abc");
  EXPECT_EQ(AuthCredentials("bEaReR abc def", "Bearer"), "abc def");
  EXPECT_EQ(AuthCredentials("Basic ", "basic"), "");
  EXPECT_EQ(AuthCredentials("Bearerabc", "bearer"), std::nullopt);
  EXPECT_EQ(AuthCredentials("Bearer", "bearer"), std::nullopt);
  EXPECT_EQ(AuthCredentials("Basic abc", "bearer"), std::nullopt);
  EXPECT_EQ(AuthCredentials("", "basic"), std::nullopt);
}

TEST(Secret, RedactUriHidesPasswordsAndSecretParameters) {
  EXPECT_EQ(RedactUri("postgres://weir:hunter2@db:5432/weir?sslmode=require"),
            "postgres://weir:***@db:5432/weir?sslmode=require");
  EXPECT_EQ(RedactUri("postgresql://u:p@ss@db/x"), "postgresql://u:***@db/x");  // the last @ ends the user info
  EXPECT_EQ(RedactUri("postgres://weir@db/weir"), "postgres://weir@db/weir");
  EXPECT_EQ(RedactUri("postgres://db/weir?user=u&password=pw&sslpassword=k"),
            "postgres://db/weir?user=u&password=***&sslpassword=***");
  EXPECT_EQ(RedactUri("s3://bucket/prefix?access_key=AK&secret_key=SK&session_token=T&region=r"),
            "s3://bucket/prefix?access_key=AK&secret_key=***&session_token=***&region=r");
  EXPECT_EQ(RedactUri("s3://bucket?secret_key=SK"), "s3://bucket?secret_key=***");
  EXPECT_EQ(RedactUri("s3://b/p?x=1&my_secret_key=v"), "s3://b/p?x=1&my_secret_key=v");  // names match whole
  EXPECT_EQ(RedactUri("file:///data/a@b:c/objects"), "file:///data/a@b:c/objects");     // @ past the host
  EXPECT_EQ(RedactUri("mem://"), "mem://");
  EXPECT_EQ(RedactUri("postgress://u:pw@h/d"), "postgress://u:***@h/d");
  // Passwords holding '?', '/' or '@'.
  EXPECT_EQ(RedactUri("postgres://u:pa?ss@host/db"), "postgres://u:***@host/db");
  EXPECT_EQ(RedactUri("postgres://u:pa/ss@host/db"), "postgres://u:***@host/db");
  EXPECT_EQ(RedactUri("postgres://u:a/b?c@d@host:5432/db?sslmode=require"),
            "postgres://u:***@host:5432/db?sslmode=require");
  EXPECT_EQ(RedactUri("postgres://u@[::1]:5432/db"), "postgres://u@[::1]:5432/db");
  EXPECT_EQ(RedactUri("postgres://u:p@[::1]:5432/db"), "postgres://u:***@[::1]:5432/db");
  // Secrets holding '@' after a ':' (a port, an endpoint) are hidden whole.
  EXPECT_EQ(RedactUri("postgresql://host:5432/db?password=p@ssw0rd"), "postgresql://host:5432/db?password=***");
  EXPECT_EQ(RedactUri("s3://bkt/p?endpoint=http://minio:9000&secret_key=abc@def"),
            "s3://bkt/p?endpoint=http://minio:9000&secret_key=***");
  EXPECT_EQ(RedactUri("s3://b?x=1?secret_key=k"), "s3://b?x=1?secret_key=***");
  EXPECT_EQ(RedactUri("s3://b/p?access_key=A&secret_key=ab?cd&region=r"), "s3://b/p?access_key=A&secret_key=***&region=r");
  // Parameter names percent-encoded.
  EXPECT_EQ(RedactUri("postgres://db/x?pass%77ord=pw&secret%5Fkey=k"), "postgres://db/x?pass%77ord=***&secret%5Fkey=***");
}

TEST(Histogram, BucketsBoundRelativeError) {
  for (uint64_t v : std::vector<uint64_t>{0, 1, 15, 16, 17, 1000, 123456789, UINT64_MAX}) {
    int b = Histogram::BucketOf(v);
    ASSERT_LT(b, Histogram::kBuckets);
    uint64_t ub = Histogram::BucketUpperBound(b);
    EXPECT_GE(ub, v);
    EXPECT_LE(static_cast<double>(ub - v), static_cast<double>(v) / 32.0 + 1) << v;
  }
}

TEST(Histogram, QuantilesAndConcurrentRecords) {
  Histogram h;
  EXPECT_EQ(h.Quantile(0.5), 0u);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (uint64_t v = 1; v <= 10000; ++v) h.Record(v);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(h.count(), 40000u);
  EXPECT_EQ(h.max(), 10000u);
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.5)), 5000, 5000 * 0.04);
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.99)), 9900, 9900 * 0.04);
  EXPECT_EQ(h.Quantile(1.0), 10000u);
  h.Reset();
  EXPECT_EQ(h.count(), 0u);
  // Nearest rank: of 1,000 values, p99.9 is the 999th (not the one outlier),
  // and of 100 values p99 the 99th.
  for (uint64_t v = 1; v <= 999; ++v) h.Record(v * 1000);
  h.Record(10'000'000);
  EXPECT_LT(h.Quantile(0.999), 1'100'000u);
  EXPECT_GE(h.Quantile(0.999), 999'000u);
  h.Reset();
  for (uint64_t v = 1; v <= 99; ++v) h.Record(v * 1000);
  h.Record(10'000'000);
  EXPECT_LT(h.Quantile(0.99), 110'000u);
  EXPECT_EQ(h.Quantile(1.0), 10'000'000u);
}

TEST(KeyedMutex, OneHolderPerKeyAndEntriesOnlyWhileInUse) {
  KeyedMutex km;
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  std::atomic<int> other_key_runs{0};
  {
    auto held = km.Lock("g");
    // Another key is not held up by "g".
    std::thread other([&] {
      auto g = km.Lock("h");
      other_key_runs++;
    });
    other.join();
    EXPECT_EQ(other_key_runs.load(), 1);
    EXPECT_EQ(km.keys_in_use(), 1u);
  }
  EXPECT_EQ(km.keys_in_use(), 0u);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto g = km.Lock("g");
        int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        --inside;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 1) << "two guards of one key were alive at once";
  EXPECT_EQ(km.keys_in_use(), 0u);
}

TEST(FsTest, MakeDirsSyncedMakesEveryMissingDirectory) {
  testing::TempDir dir;
  const std::string deep = dir.path() + "/a/b/c";
  ASSERT_TRUE(MakeDirsSynced(deep).ok());
  EXPECT_TRUE(std::filesystem::is_directory(deep));
  EXPECT_TRUE(MakeDirsSynced(deep).ok());  // already there
  EXPECT_TRUE(MakeDirsSynced(deep + "/").ok());
  {
    std::ofstream(dir.path() + "/a/file") << "x";
  }
  Status st = MakeDirsSynced(dir.path() + "/a/file/d");
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("is not a directory"), std::string::npos) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/a/file/d"));
  EXPECT_TRUE(FsyncDir(dir.path()).ok());
  EXPECT_EQ(FsyncDir(dir.path() + "/missing").code(), Code::kIOError);
}

}  // namespace
}  // namespace weir
