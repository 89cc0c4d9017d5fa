// FaultStore: seeded, reproducible fault and latency injection. Timing checks
// assert lower bounds only (the test machine may be loaded).
#include "objstore/fault_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "objstore/mem_store.h"

namespace weir {
// Lets gtest print codes by name in failed EXPECT_EQs.
inline void PrintTo(Code code, std::ostream* os) { *os << CodeName(code); }
}  // namespace weir

namespace weir::objstore {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

FaultOptions Faulty(uint64_t seed) {
  FaultOptions o;
  o.seed = seed;
  o.put_error_rate = 0.15;
  o.put_timeout_rate = 0.15;
  o.put_ambiguous_rate = 0.15;
  o.get_error_rate = 0.3;
  return o;
}

// Runs a fixed mix of calls and records every outcome, then the inner keys.
std::vector<std::string> Trace(uint64_t seed) {
  FaultStore store(NewMemStore(), Faulty(seed));
  std::vector<std::string> trace;
  for (int i = 0; i < 150; ++i) {
    const std::string key = "k/" + std::to_string(i % 40);
    trace.emplace_back(CodeName(store.Put(key, "v" + std::to_string(i)).code()));
    trace.emplace_back(CodeName(store.Get(key).status().code()));
    trace.emplace_back(CodeName(store.Head(key).status().code()));
    trace.emplace_back(CodeName(store.List("k/").status().code()));
  }
  auto page = store.inner().List("", {}, 1000);
  EXPECT_TRUE(page.ok());
  for (const ObjectInfo& o : page->objects) trace.push_back(o.key + "=" + *store.inner().Get(o.key));
  return trace;
}

TEST(FaultStoreTest, SameSeedSameFaults) {
  const std::vector<std::string> a = Trace(7);
  const std::vector<std::string> b = Trace(7);
  EXPECT_EQ(a, b);
  const std::vector<std::string> c = Trace(8);
  EXPECT_NE(a, c);
  // Faults did happen, and so did successes.
  EXPECT_NE(std::count(a.begin(), a.end(), "Unavailable"), 0);
  EXPECT_NE(std::count(a.begin(), a.end(), "Timeout"), 0);
  EXPECT_NE(std::count(a.begin(), a.end(), "OK"), 0);
}

TEST(FaultStoreTest, RatesAreRoughlyHonored) {
  FaultOptions o;
  o.seed = 12345;
  o.put_error_rate = 0.1;
  o.put_timeout_rate = 0.1;
  o.put_ambiguous_rate = 0.1;
  o.get_error_rate = 0.25;
  FaultStore store(NewMemStore(), o);
  constexpr int kCalls = 2000;
  int ok = 0, unavailable = 0, timeout = 0, other = 0;
  for (int i = 0; i < kCalls; ++i) {
    const Status st = store.Put("p/" + std::to_string(i), "x");
    if (st.ok()) {
      ++ok;
    } else if (st.code() == Code::kUnavailable) {
      ++unavailable;
    } else if (st.code() == Code::kTimeout) {
      ++timeout;
    } else {
      ++other;
    }
  }
  const FaultCounters& c = store.counters();
  EXPECT_EQ(c.puts.load(), uint64_t{kCalls});
  EXPECT_EQ(other, 0);
  EXPECT_EQ(c.put_errors.load(), static_cast<uint64_t>(unavailable));
  EXPECT_EQ(c.put_timeouts.load() + c.put_ambiguous.load(), static_cast<uint64_t>(timeout));
  // Expected 200 each (sd ~13); bounds are very loose.
  for (uint64_t n : {c.put_errors.load(), c.put_timeouts.load(), c.put_ambiguous.load()}) {
    EXPECT_GE(n, 120u);
    EXPECT_LE(n, 280u);
  }
  EXPECT_GE(ok, 1200);
  EXPECT_LE(ok, 1600);
  // Every successful or ambiguous PUT reached the inner store.
  size_t stored = 0;
  std::string after;
  while (true) {
    auto page = store.inner().List("p/", after, 1000);
    ASSERT_TRUE(page.ok());
    stored += page->objects.size();
    if (page->next_start_after.empty()) break;
    after = page->next_start_after;
  }
  EXPECT_EQ(stored, static_cast<size_t>(ok) + c.put_ambiguous.load());

  int get_errors = 0;
  for (int i = 0; i < kCalls; ++i) {
    if (store.Get("p/0").status().code() == Code::kUnavailable) ++get_errors;
  }
  EXPECT_EQ(c.gets.load(), uint64_t{kCalls});
  EXPECT_EQ(c.get_errors.load(), static_cast<uint64_t>(get_errors));
  EXPECT_GE(get_errors, 400);  // expected 500
  EXPECT_LE(get_errors, 600);
}

TEST(FaultStoreTest, AmbiguousPutIsAppliedButReportsTimeout) {
  FaultOptions o;
  o.put_ambiguous_rate = 1.0;
  FaultStore store(NewMemStore(), o);
  const Status st = store.Put("amb", "data");
  EXPECT_EQ(st.code(), Code::kTimeout);
  EXPECT_TRUE(st.retryable());
  EXPECT_NE(st.message().find("applied"), std::string::npos) << st.message();
  auto got = store.inner().Get("amb");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "data");
  EXPECT_EQ(store.counters().put_ambiguous.load(), 1u);

  // A create-only retry after an ambiguous PUT finds the object: the inner
  // store's answer wins and it is not counted as ambiguous.
  EXPECT_EQ(store.Put("amb", "data", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
  EXPECT_EQ(store.counters().put_ambiguous.load(), 1u);
}

TEST(FaultStoreTest, ErrorAndTimeoutPutsLeaveNothing) {
  FaultOptions o;
  o.put_error_rate = 1.0;
  FaultStore errors(NewMemStore(), o);
  const Status e = errors.Put("k", "v");
  EXPECT_EQ(e.code(), Code::kUnavailable);
  EXPECT_NE(e.message().find("k"), std::string::npos);
  EXPECT_EQ(errors.inner().Head("k").status().code(), Code::kNotFound);
  EXPECT_EQ(errors.counters().put_errors.load(), 1u);

  o = {};
  o.put_timeout_rate = 1.0;
  FaultStore timeouts(NewMemStore(), o);
  EXPECT_EQ(timeouts.Put("k", "v").code(), Code::kTimeout);
  EXPECT_EQ(timeouts.inner().Head("k").status().code(), Code::kNotFound);
  EXPECT_EQ(timeouts.counters().put_timeouts.load(), 1u);
}

TEST(FaultStoreTest, GetErrorsCoverGetHeadListButNotDeletes) {
  auto inner = NewMemStore();
  ASSERT_TRUE(inner->Put("a", "1").ok());
  ASSERT_TRUE(inner->Put("b", "2").ok());
  FaultOptions o;
  o.get_error_rate = 1.0;
  FaultStore store(inner, o);
  EXPECT_EQ(store.Get("a").status().code(), Code::kUnavailable);
  EXPECT_EQ(store.Head("a").status().code(), Code::kUnavailable);
  EXPECT_EQ(store.List("").status().code(), Code::kUnavailable);
  EXPECT_EQ(store.counters().gets.load(), 3u);
  EXPECT_EQ(store.counters().get_errors.load(), 3u);
  EXPECT_TRUE(store.Delete("a").ok());
  EXPECT_TRUE(store.DeleteMany(std::vector<std::string>{"b", "missing"}).ok());
  EXPECT_EQ(inner->Head("a").status().code(), Code::kNotFound);
  EXPECT_EQ(inner->Head("b").status().code(), Code::kNotFound);
}

TEST(FaultStoreTest, SetOptionsTakesEffect) {
  FaultOptions o;
  o.put_error_rate = 1.0;
  FaultStore store(NewMemStore(), o);
  EXPECT_EQ(store.Put("k", "v").code(), Code::kUnavailable);
  store.SetOptions(FaultOptions{});
  EXPECT_TRUE(store.Put("k", "v").ok());
  auto got = store.Get("k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "v");
}

TEST(FaultStoreTest, InvalidKeysAreRejectedBeforeAnyFault) {
  FaultOptions o;
  o.put_error_rate = 1.0;
  o.get_error_rate = 1.0;
  FaultStore store(NewMemStore(), o);
  EXPECT_EQ(store.Put("a//b", "v").code(), Code::kInvalidArgument);
  EXPECT_EQ(store.Get("/a").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(store.Head("..").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(store.counters().puts.load(), 0u);
  EXPECT_EQ(store.counters().gets.load(), 0u);
}

TEST(FaultStoreTest, DescribeWrapsInner) {
  FaultStore store(NewMemStore(), FaultOptions{});
  EXPECT_EQ(store.Describe(), "fault(mem://)");
}

TEST(FaultStoreTest, FixedLatencyIsApplied) {
  FaultOptions o;
  o.put_latency = LatencySpec::Fixed(30);
  o.get_latency = LatencySpec::Fixed(20);
  FaultStore store(NewMemStore(), o);
  auto start = Clock::now();
  ASSERT_TRUE(store.Put("k", "v").ok());
  EXPECT_GE(MsSince(start), 30.0);

  start = Clock::now();
  ASSERT_TRUE(store.Get("k").ok());
  EXPECT_GE(MsSince(start), 20.0);
  start = Clock::now();
  ASSERT_TRUE(store.Head("k").ok());
  EXPECT_GE(MsSince(start), 20.0);
  start = Clock::now();
  ASSERT_TRUE(store.List("").ok());
  EXPECT_GE(MsSince(start), 20.0);

  // Injected failures take the latency too.
  o.put_error_rate = 1.0;
  store.SetOptions(o);
  start = Clock::now();
  EXPECT_EQ(store.Put("k2", "v").code(), Code::kUnavailable);
  EXPECT_GE(MsSince(start), 30.0);
}

TEST(FaultStoreTest, LogNormalLatencyHasTheRightShape) {
  // p50 = 1 ms, p99 = 10 ms: sigma ~ 0.99, so P(latency >= 3 ms) ~ 13%.
  FaultOptions o;
  o.get_latency = LatencySpec{1.0, 10.0};
  FaultStore store(NewMemStore(), o);
  ASSERT_TRUE(store.inner().Put("k", "v").ok());
  constexpr int kSamples = 300;
  std::vector<double> ms;
  for (int i = 0; i < kSamples; ++i) {
    const auto start = Clock::now();
    ASSERT_TRUE(store.Get("k").ok());
    ms.push_back(MsSince(start));
  }
  std::sort(ms.begin(), ms.end());
  // Sleeps only ever run long, so these are lower bounds with wide margins.
  EXPECT_GE(ms[kSamples / 2], 0.7) << "median";
  const auto slow = std::count_if(ms.begin(), ms.end(), [](double v) { return v >= 3.0; });
  EXPECT_GE(slow, 12) << "expected ~40 of 300 at or above 3 ms";
}

TEST(FaultStoreTest, ConcurrentCallersAreCounted) {
  FaultStore store(NewMemStore(), Faulty(99));
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string key = "c/" + std::to_string(t) + "/" + std::to_string(i);
        (void)store.Put(key, "v");
        (void)store.Get(key);
      }
    });
  }
  for (auto& th : threads) th.join();
  const FaultCounters& c = store.counters();
  EXPECT_EQ(c.puts.load(), uint64_t{kThreads * kPerThread});
  EXPECT_EQ(c.gets.load(), uint64_t{kThreads * kPerThread});
  EXPECT_GT(c.put_errors.load(), 0u);
  EXPECT_GT(c.get_errors.load(), 0u);
}

}  // namespace
}  // namespace weir::objstore
