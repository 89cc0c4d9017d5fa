// One conformance suite, run against every ObjectStore backend. To cover a new
// backend, add one factory to Backends() below. s3:// runs when the s3 CTest
// fixture provides a server (WEIR_TEST_S3_ENV; see s3_test_env.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "metastore/postgres_db.h"
#include "pg_test_env.h"
#include "s3_test_env.h"
#include "test_support.h"
#include "objstore/fault_store.h"
#include "objstore/file_store.h"
#include "objstore/mem_store.h"
#include "objstore/object_store.h"

namespace weir::objstore {
namespace {

namespace fs = std::filesystem;

using TempDir = ::weir::testing::TempDir;

// One backend under test: the store plus whatever it lives in (a temp dir).
struct BackendEnv {
  std::unique_ptr<TempDir> dir;  // destroyed after the store (declared first)
  std::shared_ptr<ObjectStore> store;
};

struct BackendFactory {
  std::string name;
  // Returns an env with a null store to skip (e.g. s3 with no endpoint configured).
  std::function<BackendEnv()> make;
};

using ::weir::testing::PostgresBaseUri;
using ::weir::testing::PostgresExec;

std::vector<BackendFactory> Backends() {
  std::vector<BackendFactory> backends = {
      {"mem", [] { return BackendEnv{nullptr, NewMemStore()}; }},
      {"file",
       [] {
         auto dir = std::make_unique<TempDir>();
         auto store = OpenFileStore(dir->path() + "/store");
         if (!store.ok()) {
           ADD_FAILURE() << store.status().ToString();
           return BackendEnv{std::move(dir), nullptr};
         }
         return BackendEnv{std::move(dir), *store};
       }},
      {"fault_over_mem",
       [] { return BackendEnv{nullptr, std::make_shared<FaultStore>(NewMemStore(), FaultOptions{})}; }},
  };
  if (const std::string pg = PostgresBaseUri(); !pg.empty()) {
    // The WAL store on PostgreSQL: each test gets a schema of its own.
    backends.push_back({"postgres", [pg] {
                          static int n = 0;
                          const std::string schema = fmt::format("objstore_{}_{}", ::getpid(), ++n);
                          if (!PostgresExec(pg, "CREATE SCHEMA " + schema)) return BackendEnv{nullptr, nullptr};
                          auto store = ::weir::metastore::OpenPostgresWalStore(pg + "?options=-csearch_path%3D" + schema);
                          if (!store.ok()) {
                            ADD_FAILURE() << store.status().ToString();
                            return BackendEnv{nullptr, nullptr};
                          }
                          return BackendEnv{nullptr, *store};
                        }});
  }
  if (auto s3 = ::weir::testing::LoadS3TestEnv()) {
    // Each test gets a fresh bucket (emptied and removed afterwards).
    backends.push_back({"s3", [env = *s3] {
                          auto store = ::weir::testing::NewS3TestStore(env);
                          if (!store.ok()) {
                            ADD_FAILURE() << store.status().ToString();
                            return BackendEnv{nullptr, nullptr};
                          }
                          return BackendEnv{nullptr, *store};
                        }});
  }
  return backends;
}

class ObjectStoreConformance : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    env_ = GetParam().make();
    if (!env_.store) GTEST_SKIP() << "backend " << GetParam().name << " is not available";
  }
  void TearDown() override { env_.store.reset(); }

  ObjectStore& s() { return *env_.store; }

  std::string MustGet(std::string_view key, std::optional<ByteRange> range = std::nullopt) {
    auto r = s().Get(key, range);
    EXPECT_TRUE(r.ok()) << "Get " << key << ": " << r.status().ToString();
    return r.ok() ? *r : std::string("<error>");
  }

  Code GetCode(std::string_view key, std::optional<ByteRange> range = std::nullopt) {
    return s().Get(key, range).status().code();
  }

  // Keys of one List call.
  std::vector<std::string> Keys(std::string_view prefix, std::string_view start_after = {}) {
    auto page = s().List(prefix, start_after, 1000);
    EXPECT_TRUE(page.ok()) << "List " << prefix << ": " << page.status().ToString();
    std::vector<std::string> keys;
    if (!page.ok()) return keys;
    EXPECT_TRUE(page->next_start_after.empty());
    for (const ObjectInfo& o : page->objects) keys.push_back(o.key);
    return keys;
  }

  BackendEnv env_;
};

TEST_P(ObjectStoreConformance, PutGetRoundTrip) {
  ASSERT_OK(s().Put("a/b/hello", "hello world"));
  EXPECT_EQ(MustGet("a/b/hello"), "hello world");

  ASSERT_OK(s().Put("empty", ""));
  EXPECT_EQ(MustGet("empty"), "");

  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  binary += std::string("\0\0\0tail\0", 8);
  ASSERT_OK(s().Put("bin/all-bytes", binary));
  EXPECT_EQ(MustGet("bin/all-bytes"), binary);

  std::string big(3 * 1024 * 1024 + 17, '\0');
  std::mt19937_64 rng(42);
  for (char& c : big) c = static_cast<char>(rng());
  ASSERT_OK(s().Put("bin/big", big));
  EXPECT_TRUE(MustGet("bin/big") == big);
}

// Parts of many sizes (empty ones too), and more parts than one writev takes.
TEST_P(ObjectStoreConformance, PutPartsWritesTheConcatenation) {
  std::mt19937_64 rng(7);
  auto random_bytes = [&](size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(rng());
    return out;
  };
  const std::vector<std::vector<size_t>> layouts = {
      {},                                    // no parts: an empty object
      {5},                                   // one small part
      {0, 1, 4095, (1u << 20) + 3, 70000, 0, 5},
      {65536, 65536},                        // a whole number of blocks
      {1u << 20},                            // exactly one bounce buffer
      {(1u << 20) - 1, 1, 4096, 3 << 20},
      std::vector<size_t>(3000, 7),          // over IOV_MAX (1024) parts
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE(i);
    std::vector<std::string> owned;
    for (size_t n : layouts[i]) owned.push_back(random_bytes(n));
    std::vector<std::string_view> parts(owned.begin(), owned.end());
    std::string joined;
    for (const auto& p : owned) joined += p;
    const std::string key = "parts/" + std::to_string(i);
    ASSERT_OK(s().PutParts(key, parts));
    EXPECT_TRUE(MustGet(key) == joined) << "object of " << joined.size() << " bytes differs";
    auto head = s().Head(key);
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    EXPECT_EQ(head->size, joined.size());
  }
  // Create-only through PutParts: the existing object stays.
  const std::string first = MustGet("parts/2");
  const std::string other(100000, 'x');
  const std::string_view one[] = {other};
  EXPECT_EQ(s().PutParts("parts/2", one, PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
  EXPECT_TRUE(MustGet("parts/2") == first);
  ASSERT_OK(s().PutParts("parts/new", one, PutOptions{.if_none_match = true}));
  EXPECT_EQ(MustGet("parts/new"), other);
}

TEST_P(ObjectStoreConformance, OverwriteReplacesWholeObject) {
  ASSERT_OK(s().Put("k", "a much longer first version"));
  ASSERT_OK(s().Put("k", "short"));
  EXPECT_EQ(MustGet("k"), "short");
  ASSERT_OK(s().Put("k", "longer again, longer than before"));
  EXPECT_EQ(MustGet("k"), "longer again, longer than before");
  ASSERT_OK(s().Put("k", ""));
  EXPECT_EQ(MustGet("k"), "");
}

TEST_P(ObjectStoreConformance, CreateOnly) {
  const PutOptions create_only{.if_none_match = true};
  ASSERT_OK(s().Put("wal/n1/00000001", "first", create_only));
  EXPECT_EQ(MustGet("wal/n1/00000001"), "first");

  const Status again = s().Put("wal/n1/00000001", "second", create_only);
  EXPECT_EQ(again.code(), Code::kPreconditionFailed) << again.ToString();
  EXPECT_EQ(MustGet("wal/n1/00000001"), "first");

  // A plain Put still overwrites.
  ASSERT_OK(s().Put("wal/n1/00000001", "third"));
  EXPECT_EQ(MustGet("wal/n1/00000001"), "third");

  // Create-only of an empty object.
  ASSERT_OK(s().Put("wal/n1/empty", "", create_only));
  EXPECT_EQ(s().Put("wal/n1/empty", "x", create_only).code(), Code::kPreconditionFailed);
  EXPECT_EQ(MustGet("wal/n1/empty"), "");
}

TEST_P(ObjectStoreConformance, ConcurrentCreateOnlyHasExactlyOneWinner) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = "race/r" + std::to_string(round) + "/slot";
    std::latch start(kThreads);
    std::vector<Status> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        results[t] = s().Put(key, "writer-" + std::to_string(t), PutOptions{.if_none_match = true});
      });
    }
    for (auto& th : threads) th.join();
    int winner = -1;
    for (int t = 0; t < kThreads; ++t) {
      if (results[t].ok()) {
        EXPECT_EQ(winner, -1) << "two winners for " << key;
        winner = t;
      } else {
        EXPECT_EQ(results[t].code(), Code::kPreconditionFailed) << results[t].ToString();
      }
    }
    ASSERT_NE(winner, -1) << "no winner for " << key;
    EXPECT_EQ(MustGet(key), "writer-" + std::to_string(winner));
  }
}

TEST_P(ObjectStoreConformance, ConcurrentPutsIntoNewDirectories) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 6;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i) {
        const std::string suffix = std::to_string(t) + "-" + std::to_string(i);
        if (!s().Put("shared/deep/dir/" + suffix, suffix).ok()) ++failures;
        if (!s().Put("own/" + std::to_string(t) + "/" + std::to_string(i), suffix).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(Keys("shared/").size(), size_t{kThreads * kPerThread});
  EXPECT_EQ(Keys("own/").size(), size_t{kThreads * kPerThread});
  EXPECT_EQ(MustGet("shared/deep/dir/3-4"), "3-4");
}

TEST_P(ObjectStoreConformance, ReadersSeeOldOrNewBytesNeverAMix) {
  const std::string a(256 * 1024, 'A');
  const std::string b(256 * 1024, 'B');
  ASSERT_OK(s().Put("atomic", a));
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done.load()) {
      auto r = s().Get("atomic");
      if (!r.ok() || (*r != a && *r != b)) ++torn;
    }
  });
  for (int i = 0; i < 30; ++i) {
    EXPECT_OK(s().Put("atomic", i % 2 ? a : b));
  }
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

TEST_P(ObjectStoreConformance, MissingKeys) {
  EXPECT_EQ(GetCode("nope"), Code::kNotFound);
  EXPECT_EQ(GetCode("no/such/dir/key"), Code::kNotFound);
  EXPECT_EQ(GetCode("nope", ByteRange{0, 1}), Code::kNotFound);
  EXPECT_EQ(s().Head("nope").status().code(), Code::kNotFound);
  ASSERT_OK(s().Put("dir/key", "x"));
  // "dir" is only a prefix, not an object.
  EXPECT_EQ(GetCode("dir"), Code::kNotFound);
  EXPECT_EQ(s().Head("dir").status().code(), Code::kNotFound);
  // A key below an existing object.
  EXPECT_EQ(GetCode("dir/key/below"), Code::kNotFound);
  EXPECT_EQ(s().Head("dir/key/below").status().code(), Code::kNotFound);
}

TEST_P(ObjectStoreConformance, HeadReportsSize) {
  ASSERT_OK(s().Put("h/ten", "0123456789"));
  ASSERT_OK(s().Put("h/empty", ""));
  auto ten = s().Head("h/ten");
  ASSERT_TRUE(ten.ok()) << ten.status().ToString();
  EXPECT_EQ(ten->key, "h/ten");
  EXPECT_EQ(ten->size, 10u);
  auto empty = s().Head("h/empty");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->size, 0u);
}

TEST_P(ObjectStoreConformance, ByteRanges) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  ASSERT_OK(s().Put("r", "0123456789"));
  EXPECT_EQ(MustGet("r", ByteRange{2, 3}), "234");
  EXPECT_EQ(MustGet("r", ByteRange{0, 10}), "0123456789");
  EXPECT_EQ(MustGet("r", ByteRange{9, 1}), "9");
  EXPECT_EQ(MustGet("r", ByteRange{7, 100}), "789");  // truncated at the end
  EXPECT_EQ(MustGet("r", ByteRange{0, kMax}), "0123456789");
  EXPECT_EQ(MustGet("r", ByteRange{5, kMax}), "56789");
  EXPECT_EQ(MustGet("r", ByteRange{3, 0}), "");
  EXPECT_EQ(GetCode("r", ByteRange{10, 1}), Code::kOutOfRange);
  EXPECT_EQ(GetCode("r", ByteRange{11, 1}), Code::kOutOfRange);
  EXPECT_EQ(GetCode("r", ByteRange{kMax, 1}), Code::kOutOfRange);

  ASSERT_OK(s().Put("r-empty", ""));
  EXPECT_EQ(MustGet("r-empty", ByteRange{0, 5}), "");
  EXPECT_EQ(GetCode("r-empty", ByteRange{1, 1}), Code::kOutOfRange);
}

class ListTest : public ObjectStoreConformance {
 protected:
  void SetUp() override {
    ObjectStoreConformance::SetUp();
    if (IsSkipped()) return;
    for (const std::string& key : kKeys) ASSERT_OK(s().Put(key, "v:" + key));
  }

  // Expected result: kKeys filtered and sorted by byte order.
  static std::vector<std::string> Expected(std::string_view prefix, std::string_view start_after = {}) {
    std::vector<std::string> out;
    for (const std::string& k : kKeys) {
      if (k.starts_with(prefix) && k > start_after) out.push_back(k);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  inline static const std::vector<std::string> kKeys = {
      "wal/n1/00000002", "wal/n1/00010000", "wal/n1/00000001", "wal/n10/00000001", "wal/n2/00000001",
      "walrus",          "meta/streams/x",  "a0",              "a/b",              "a.b",
      "a-b",             "a/b.c/d",         "z",
  };
};

TEST_P(ListTest, ByteOrder) {
  const std::vector<std::string> all = Keys("");
  EXPECT_EQ(all, Expected(""));
  // '-' < '.' < '/' < '0': a directory walk that lists "a/" as a unit must not
  // put "a/b" before "a-b" or after "a0".
  EXPECT_EQ(Keys("a"), (std::vector<std::string>{"a-b", "a.b", "a/b", "a/b.c/d", "a0"}));
}

TEST_P(ListTest, Prefixes) {
  EXPECT_EQ(Keys("wal/n1/0000"), (std::vector<std::string>{"wal/n1/00000001", "wal/n1/00000002"}));
  EXPECT_EQ(Keys("wal/n1/0001"), (std::vector<std::string>{"wal/n1/00010000"}));
  EXPECT_EQ(Keys("wal/n1/"), Expected("wal/n1/"));
  EXPECT_EQ(Keys("wal/n1"), Expected("wal/n1"));  // includes wal/n10/
  EXPECT_EQ(Keys("wal/n1").size(), 4u);
  EXPECT_EQ(Keys("wal"), Expected("wal"));  // includes walrus
  EXPECT_EQ(Keys("wal/"), Expected("wal/"));
  EXPECT_EQ(Keys("a/"), (std::vector<std::string>{"a/b", "a/b.c/d"}));
  EXPECT_EQ(Keys("a/b"), (std::vector<std::string>{"a/b", "a/b.c/d"}));
  EXPECT_EQ(Keys("wal/n1/00000001"), (std::vector<std::string>{"wal/n1/00000001"}));
  for (const char* none : {"zz", "wal/n3/", "wal/n1/00000001/", "nothing/here/", "../", "/", "a//", "./a"}) {
    EXPECT_TRUE(Keys(none).empty()) << none;
  }
  EXPECT_TRUE(Keys(std::string_view("a\0", 2)).empty());
}

TEST_P(ListTest, ReportsSizes) {
  auto page = s().List("wal/n1/", {}, 1000);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->objects.size(), 3u);
  for (const ObjectInfo& o : page->objects) EXPECT_EQ(o.size, ("v:" + o.key).size()) << o.key;
}

TEST_P(ListTest, PagesOfTwoCoverEverythingOnce) {
  for (std::string_view prefix : {"", "wal/", "a", "wal/n1/0000"}) {
    std::vector<std::string> seen;
    std::string start_after;
    int pages = 0;
    while (true) {
      auto page = s().List(prefix, start_after, 2);
      ASSERT_TRUE(page.ok()) << page.status().ToString();
      ASSERT_LE(page->objects.size(), 2u);
      ++pages;
      ASSERT_LE(pages, 20) << "paging does not terminate";
      for (const ObjectInfo& o : page->objects) seen.push_back(o.key);
      if (page->next_start_after.empty()) break;
      ASSERT_FALSE(page->objects.empty());
      EXPECT_EQ(page->next_start_after, page->objects.back().key);
      start_after = page->next_start_after;
    }
    EXPECT_EQ(seen, Expected(prefix)) << "prefix " << prefix;
    EXPECT_EQ(pages, std::max<int>(1, static_cast<int>((Expected(prefix).size() + 1) / 2))) << prefix;
  }
}

TEST_P(ListTest, StartAfter) {
  EXPECT_EQ(Keys("", "a0"), Expected("", "a0"));
  EXPECT_EQ(Keys("wal/", "wal/n1/00000002"), Expected("wal/", "wal/n1/00000002"));
  EXPECT_EQ(Keys("wal/", "wal/n1/00000001x"), Expected("wal/", "wal/n1/00000001x"));  // not a key
  EXPECT_EQ(Keys("wal/", "wal/n1/"), Expected("wal/", "wal/n1/"));
  EXPECT_EQ(Keys("wal/", "wal/n1"), Expected("wal/", "wal/n1"));
  EXPECT_EQ(Keys("wal", "a"), Expected("wal"));  // start_after before the prefix
  EXPECT_TRUE(Keys("a", "b").empty());              // start_after past the prefix
  EXPECT_TRUE(Keys("", "z").empty());
  EXPECT_EQ(Keys("", "a/b"), Expected("", "a/b"));
  EXPECT_TRUE(Keys("wal/n1/00000001", "wal/n1/00000001").empty());  // start_after equal to the prefix
  EXPECT_EQ(Keys("wal/n1/", "wal/n1/"), Expected("wal/n1/"));
}

TEST_P(ListTest, MaxKeysLimits) {
  EXPECT_EQ(s().List("", {}, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(s().List("", {}, 1001).status().code(), Code::kInvalidArgument);
  auto one = s().List("", {}, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ(one->objects.size(), 1u);
  EXPECT_EQ(one->objects[0].key, Expected("")[0]);
  EXPECT_EQ(one->next_start_after, Expected("")[0]);
}

TEST_P(ObjectStoreConformance, ListEmptyStore) {
  auto page = s().List("", {}, 1000);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_TRUE(page->objects.empty());
  EXPECT_TRUE(page->next_start_after.empty());
}

TEST_P(ObjectStoreConformance, Delete) {
  ASSERT_OK(s().Put("d/one", "1"));
  ASSERT_OK(s().Put("d/two", "2"));
  ASSERT_OK(s().Delete("d/one"));
  EXPECT_EQ(GetCode("d/one"), Code::kNotFound);
  EXPECT_EQ(s().Head("d/one").status().code(), Code::kNotFound);
  EXPECT_EQ(Keys("d/"), (std::vector<std::string>{"d/two"}));
  EXPECT_OK(s().Delete("d/one"));             // again
  EXPECT_OK(s().Delete("never/existed/key"));  // missing, missing parents
  EXPECT_OK(s().Delete("d"));                  // a prefix, not an object: nothing happens
  EXPECT_EQ(MustGet("d/two"), "2");
  // The key can be created again, create-only.
  ASSERT_OK(s().Put("d/one", "1 again", PutOptions{.if_none_match = true}));
  EXPECT_EQ(MustGet("d/one"), "1 again");
}

TEST_P(ObjectStoreConformance, DeleteMany) {
  for (int i = 1; i <= 5; ++i) ASSERT_OK(s().Put("m/k" + std::to_string(i), "v"));
  const std::vector<std::string> doomed = {"m/k1", "m/k3", "m/missing", "gone/too", "m/k5"};
  ASSERT_OK(s().DeleteMany(doomed));
  EXPECT_EQ(Keys("m/"), (std::vector<std::string>{"m/k2", "m/k4"}));
  ASSERT_OK(s().DeleteMany(std::vector<std::string>{}));

  // A bad key fails the call, but every other key is still attempted.
  const std::vector<std::string> mixed = {"m/k2", "bad//key", "m/k4"};
  EXPECT_EQ(s().DeleteMany(mixed).code(), Code::kInvalidArgument);
  EXPECT_TRUE(Keys("m/").empty());
}

TEST_P(ObjectStoreConformance, InvalidKeysAreRejectedAndNothingIsWritten) {
  const std::vector<std::string> bad = {
      "",     "/a",  "/",    "..",  ".",    "a/..", "a/../b", "./a", "a/.", "a//b",
      "a/",   "//",  "a/b/", std::string("a\0b", 3), std::string("\0", 1), std::string(1025, 'k'),
  };
  for (const std::string& key : bad) {
    SCOPED_TRACE(::testing::PrintToString(key));
    EXPECT_EQ(s().Put(key, "data").code(), Code::kInvalidArgument);
    EXPECT_EQ(s().Put(key, "data", PutOptions{.if_none_match = true}).code(), Code::kInvalidArgument);
    EXPECT_EQ(GetCode(key), Code::kInvalidArgument);
    EXPECT_EQ(s().Head(key).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(s().Delete(key).code(), Code::kInvalidArgument);
    EXPECT_EQ(s().DeleteMany(std::vector<std::string>{key}).code(), Code::kInvalidArgument);
  }
  auto page = s().List("", {}, 1000);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_TRUE(page->objects.empty());
}

TEST_P(ObjectStoreConformance, LongestValidKey) {
  // 1024 bytes in segments short enough for any filesystem.
  std::string key;
  while (key.size() + 201 <= 1024) key += std::string(200, 's') + "/";
  key += std::string(1024 - key.size(), 'e');
  ASSERT_EQ(key.size(), 1024u);
  ASSERT_OK(s().Put(key, "long"));
  EXPECT_EQ(MustGet(key), "long");
  EXPECT_EQ(Keys(key.substr(0, 500)), (std::vector<std::string>{key}));
  ASSERT_OK(s().Delete(key));
}

TEST_P(ObjectStoreConformance, DescribeIsNotEmpty) { EXPECT_FALSE(s().Describe().empty()); }

std::string BackendName(const ::testing::TestParamInfo<BackendFactory>& p) { return p.param.name; }

INSTANTIATE_TEST_SUITE_P(Backends, ObjectStoreConformance, ::testing::ValuesIn(Backends()), BackendName);
INSTANTIATE_TEST_SUITE_P(Backends, ListTest, ::testing::ValuesIn(Backends()), BackendName);

// ---- ValidateKey messages ---------------------------------------------------

TEST(ValidateKeyTest, MessagesNameTheRuleAndTheKey) {
  const Status dots = ValidateKey("a/../b");
  EXPECT_EQ(dots.code(), Code::kInvalidArgument);
  EXPECT_EQ(dots.message(), "invalid object key \"a/../b\": '..' segments are not allowed");
  EXPECT_NE(ValidateKey("a//b").message().find("empty path segment"), std::string::npos);
  EXPECT_NE(ValidateKey("/a").message().find("'/'"), std::string::npos);
  EXPECT_NE(ValidateKey("./a").message().find("'.'"), std::string::npos);
  EXPECT_NE(ValidateKey("").message().find("empty"), std::string::npos);
  const Status nul = ValidateKey(std::string("a\0b", 3));
  EXPECT_NE(nul.message().find("NUL"), std::string::npos);
  EXPECT_NE(nul.message().find("a\\x00b"), std::string::npos) << nul.message();
  const Status longer = ValidateKey(std::string(2000, 'k'));
  EXPECT_NE(longer.message().find("1024"), std::string::npos);
  EXPECT_LT(longer.message().size(), 300u) << "long keys are abbreviated";
  EXPECT_OK(ValidateKey("wal/n1/00000001"));
  EXPECT_OK(ValidateKey("a..b/.c/..d/e."));
  EXPECT_OK(ValidateKey(std::string(1024, 'k')));
}

// ---- file:// specifics ------------------------------------------------------

class FileStoreTest : public ::testing::Test {
 protected:
  std::string Root() const { return tmp_.path() + "/store"; }
  std::shared_ptr<ObjectStore> Open() {
    auto r = OpenFileStore(Root());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : nullptr;
  }
  // The files in .weir-tmp, but for the owner files of open stores unless asked.
  std::vector<std::string> TempFiles(bool with_owner_files = false) const {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(Root() + "/.weir-tmp", ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (with_owner_files || !name.starts_with("owner-")) names.push_back(std::move(name));
    }
    EXPECT_FALSE(ec) << ec.message();
    return names;
  }

  TempDir tmp_;
};

TEST_F(FileStoreTest, DataSurvivesReopen) {
  {
    auto store = Open();
    ASSERT_TRUE(store);
    ASSERT_OK(store->Put("wal/n1/00000001", "persisted"));
    ASSERT_OK(store->Put("top", ""));
  }
  auto store = Open();
  ASSERT_TRUE(store);
  auto got = store->Get("wal/n1/00000001");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "persisted");
  auto page = store->List("", {}, 1000);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "top");
  EXPECT_EQ(page->objects[1].key, "wal/n1/00000001");
  EXPECT_EQ(store->Put("top", "x", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
}

TEST_F(FileStoreTest, OneFilePerKeyAndNoTempFilesLeft) {
  auto store = Open();
  ASSERT_TRUE(store);
  const PutOptions create_only{.if_none_match = true};
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(store->Put("k/" + std::to_string(i % 5), std::string(i * 100, 'x')));
    EXPECT_EQ(store->Put("k/0", "y", create_only).code(), Code::kPreconditionFailed);
    ASSERT_OK(store->Put("c/" + std::to_string(i), "z", create_only));
  }
  EXPECT_EQ(store->Put("bad//key", "q").code(), Code::kInvalidArgument);
  EXPECT_TRUE(TempFiles().empty()) << TempFiles().size() << " temp files left";
  EXPECT_TRUE(fs::is_regular_file(Root() + "/k/3"));
  EXPECT_EQ(fs::file_size(Root() + "/k/4"), 1900u);
}

TEST_F(FileStoreTest, ReservedTempDirKeys) {
  auto store = Open();
  ASSERT_TRUE(store);
  for (const char* key : {".weir-tmp/x", ".weir-tmp", ".weir-tmp/a/b"}) {
    SCOPED_TRACE(key);
    const Status put = store->Put(key, "data");
    EXPECT_EQ(put.code(), Code::kInvalidArgument);
    EXPECT_NE(put.message().find("reserved"), std::string::npos) << put.message();
    EXPECT_EQ(store->Get(key).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(store->Head(key).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(store->Delete(key).code(), Code::kInvalidArgument);
  }
  // Only the first segment is reserved.
  ASSERT_OK(store->Put(".weir-tmpx", "ok"));
  ASSERT_OK(store->Put("a/.weir-tmp/b", "ok"));
  // A stray file in the temp dir is never listed.
  { std::ofstream(Root() + "/.weir-tmp/stray") << "junk"; }
  auto all = store->List("", {}, 1000);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->objects.size(), 2u);
  EXPECT_EQ(all->objects[0].key, ".weir-tmpx");
  EXPECT_EQ(all->objects[1].key, "a/.weir-tmp/b");
  auto tmp = store->List(".weir-tmp/", {}, 1000);
  ASSERT_TRUE(tmp.ok());
  EXPECT_TRUE(tmp->objects.empty());
  auto dot = store->List(".weir", {}, 1000);
  ASSERT_TRUE(dot.ok());
  ASSERT_EQ(dot->objects.size(), 1u);
}

TEST_F(FileStoreTest, SegmentsLongerThanNameMaxAreInvalid) {
  auto store = Open();
  ASSERT_TRUE(store);
  const std::string key = "a/" + std::string(256, 'n');
  EXPECT_EQ(store->Put(key, "x").code(), Code::kInvalidArgument);
  ASSERT_OK(store->Put("a/" + std::string(255, 'n'), "x"));
  auto page = store->List("a/" + std::string(300, 'n') + "/", {}, 1000);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_TRUE(page->objects.empty());
}

TEST_F(FileStoreTest, KeyThatIsAlsoADirectoryIsNotSupported) {
  auto store = Open();
  ASSERT_TRUE(store);
  ASSERT_OK(store->Put("a", "file a"));
  EXPECT_EQ(store->Put("a/b", "x").code(), Code::kNotSupported);
  EXPECT_EQ(store->Put("a/b/c", "x").code(), Code::kNotSupported);
  EXPECT_EQ(store->Get("a/b").status().code(), Code::kNotFound);

  ASSERT_OK(store->Put("d/e", "file d/e"));
  EXPECT_EQ(store->Put("d", "x").code(), Code::kNotSupported);
  EXPECT_EQ(store->Put("d", "x", PutOptions{.if_none_match = true}).code(), Code::kNotSupported);
  EXPECT_EQ(store->Get("d").status().code(), Code::kNotFound);
  EXPECT_OK(store->Delete("d"));
  auto e = store->Get("d/e");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, "file d/e");
  auto a = store->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, "file a");
  EXPECT_TRUE(TempFiles().empty());
}

// Deleted small objects become free files that a later Put rewrites in place
// (after a quarantine of 250 ms): same inode, new bytes, exact new size.
TEST_F(FileStoreTest, DeletedFilesAreReusedWithTheirNewContents) {
  auto store = Open();
  ASSERT_TRUE(store);
  const PutOptions create_only{.if_none_match = true};
  ASSERT_OK(store->Put("wal/a", std::string(100000, 'a'), create_only));
  ASSERT_OK(store->Put("wal/b", "bb", create_only));
  struct stat a{};
  ASSERT_EQ(::stat((Root() + "/wal/a").c_str(), &a), 0);
  ASSERT_OK(store->Delete("wal/a"));
  ASSERT_OK(store->DeleteMany(std::vector<std::string>{"wal/b", "wal/missing"}));
  EXPECT_EQ(store->Get("wal/a").status().code(), Code::kNotFound);
  EXPECT_EQ(store->Head("wal/b").status().code(), Code::kNotFound);
  EXPECT_EQ(TempFiles().size(), 2u);  // the two free files
  auto page = store->List("", {}, 1000);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->objects.empty());

  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 250 ms quarantine
  ASSERT_OK(store->Put("wal/c", "shorter than before", create_only));
  struct stat c{};
  ASSERT_EQ(::stat((Root() + "/wal/c").c_str(), &c), 0);
  EXPECT_EQ(c.st_ino, a.st_ino) << "the oldest free file is reused";
  EXPECT_EQ(c.st_nlink, 1u);
  auto got = store->Get("wal/c");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "shorter than before");
  auto head = store->Head("wal/c");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size, 19u);
  // A create-only conflict on a rewritten free file removes it.
  EXPECT_EQ(store->Put("wal/c", "again", create_only).code(), Code::kPreconditionFailed);
  EXPECT_EQ(TempFiles().size(), 0u);
  auto still = store->Get("wal/c");
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(*still, "shorter than before");
  // A plain put and an overwrite rewrite free files too (each past its
  // quarantine); a closed store leaves none behind.
  ASSERT_OK(store->Delete("wal/c"));
  EXPECT_EQ(TempFiles().size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 250 ms quarantine
  ASSERT_OK(store->Put("k", "v1"));
  EXPECT_EQ(TempFiles().size(), 0u) << "the put did not take the free file";
  ASSERT_OK(store->Put("x", "x"));
  ASSERT_OK(store->Delete("x"));
  EXPECT_EQ(TempFiles().size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ASSERT_OK(store->Put("k", "v2"));
  EXPECT_EQ(TempFiles().size(), 0u) << "the overwrite did not take the free file";
  ASSERT_OK(store->Put("y", "y"));
  ASSERT_OK(store->Delete("y"));
  EXPECT_EQ(TempFiles().size(), 1u);
  store.reset();
  EXPECT_TRUE(TempFiles().empty());
  store = Open();
  ASSERT_TRUE(store);
  auto k = store->Get("k");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, "v2");
}

// Objects up to a WAL slot's default cap (8 MiB) are kept as free files when
// deleted; larger ones are removed.
TEST_F(FileStoreTest, DeletedObjectsUpToTheSlotCapBecomeFreeFiles) {
  auto store = Open();
  ASSERT_TRUE(store);
  constexpr size_t kSlotCap = 8u << 20;
  ASSERT_OK(store->Put("wal/cap", std::string(kSlotCap, 's')));
  ASSERT_OK(store->Put("wal/over", std::string(kSlotCap + 1, 'o')));
  ASSERT_OK(store->DeleteMany(std::vector<std::string>{"wal/cap", "wal/over"}));
  const std::vector<std::string> left = TempFiles();
  ASSERT_EQ(left.size(), 1u) << "only the object of the slot cap's size is kept";
  EXPECT_TRUE(left[0].starts_with("free-")) << left[0];
  struct stat kept{};
  ASSERT_EQ(::stat((Root() + "/.weir-tmp/" + left[0]).c_str(), &kept), 0);
  EXPECT_EQ(static_cast<size_t>(kept.st_size), kSlotCap);
}

// A reader that opened a file and stalls past the quarantine while the file
// is deleted and rewritten as another object must not return that object's
// bytes: it sees the file changed and reads the key again.
TEST_F(FileStoreTest, AStalledReaderNeverReturnsTheBytesOfAReusedFile) {
  auto store = Open();
  ASSERT_TRUE(store);
  const PutOptions create_only{.if_none_match = true};
  for (bool key_put_again : {false, true}) {
    SCOPED_TRACE(key_put_again ? "the key is put again" : "the key stays deleted");
    const std::string key = key_put_again ? "wal/r2" : "wal/r1";
    const std::string other = key + "-other";
    ASSERT_OK(store->Put(key, std::string(5000, 'o'), create_only));
    struct stat old_file{};
    ASSERT_EQ(::stat((Root() + "/" + key).c_str(), &old_file), 0);

    std::mutex mu;
    std::condition_variable cv;
    bool opened = false, release = false;
    int calls = 0;
    SetFileStoreReadHookForTest([&](const std::string& path) {
      if (path != Root() + "/" + key) return;
      std::unique_lock lk(mu);
      if (calls++ > 0) return;  // stall the first attempt only
      opened = true;
      cv.notify_all();
      cv.wait(lk, [&] { return release; });
    });
    Result<std::string> got = NotFound("not read");
    std::thread reader([&] { got = store->Get(key); });
    {
      std::unique_lock lk(mu);
      ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return opened; }));
    }
    ASSERT_OK(store->Delete(key));
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 250 ms quarantine
    ASSERT_OK(store->Put(other, std::string(5000, 'x'), create_only));
    struct stat reused{};
    ASSERT_EQ(::stat((Root() + "/" + other).c_str(), &reused), 0);
    EXPECT_EQ(reused.st_ino, old_file.st_ino) << "the deleted file was not reused; the test proves nothing";
    if (key_put_again) ASSERT_OK(store->Put(key, "new bytes", create_only));
    {
      std::lock_guard lk(mu);
      release = true;
    }
    cv.notify_all();
    reader.join();
    SetFileStoreReadHookForTest(nullptr);
    EXPECT_GE(calls, key_put_again ? 2 : 1);
    if (key_put_again) {
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(*got == "new bytes") << "read " << got->size() << " bytes: " << got->substr(0, 20);
    } else {
      EXPECT_EQ(got.status().code(), Code::kNotFound) << (got.ok() ? got->substr(0, 10) : "");
    }
  }
}

// A deleted file is rewritten for another object only once its removal is
// durable: a crash could otherwise bring the old key back onto the new
// object's bytes. A delete whose directory sync fails removes the file.
TEST_F(FileStoreTest, AFileJoinsTheFreePoolOnlyOnceItsRemovalIsDurable) {
  auto store = Open();
  ASSERT_TRUE(store);
  auto free_files = [&] {
    size_t n = 0;
    for (const std::string& name : TempFiles()) n += name.starts_with("free-");
    return n;
  };
  ASSERT_OK(store->Put("seg/a", std::string(5000, 'a')));
  ASSERT_OK(store->Put("seg/b", std::string(5000, 'b')));
  ASSERT_OK(store->Put("seg/c", std::string(5000, 'c')));
  std::atomic<int> syncs{0};
  SetFileStoreDirSyncHookForTest([&](const std::string& dir) -> Status {
    if (dir != Root() + "/seg") return Status::Ok();
    syncs++;
    return IOError("injected: sync of {} failed", dir);
  });
  EXPECT_EQ(store->Delete("seg/a").code(), Code::kIOError);
  EXPECT_EQ(free_files(), 0u) << "a file whose removal is not durable was kept for reuse";
  // The store refuses deletes and writes from then on, without syncing
  // (a later sync could pass without making the removal durable).
  const int before = syncs.load();
  EXPECT_EQ(store->DeleteMany(std::vector<std::string>{"seg/b"}).code(), Code::kIOError);
  EXPECT_EQ(store->Delete("seg/a").code(), Code::kIOError);
  EXPECT_EQ(store->Put("seg/d", "d").code(), Code::kIOError);
  EXPECT_EQ(syncs.load(), before);
  EXPECT_EQ(*store->Get("seg/b"), std::string(5000, 'b'));  // reads go on
  SetFileStoreDirSyncHookForTest(nullptr);
  EXPECT_EQ(store->Delete("seg/b").code(), Code::kIOError);  // until a new store
  store.reset();
  store = Open();
  ASSERT_TRUE(store);
  // A retry finds the key gone, and still syncs before it says so.
  ASSERT_OK(store->Delete("seg/a"));
  ASSERT_OK(store->Delete("seg/b"));
  ASSERT_OK(store->Delete("seg/c"));
  EXPECT_EQ(free_files(), 2u);
  EXPECT_EQ(store->Get("seg/b").status().code(), Code::kNotFound);
  EXPECT_EQ(store->Get("seg/d").status().code(), Code::kNotFound);
}

// "Already exists" is answered only once the existing object's name is
// durable: a WAL writer retrying a create whose sync failed reads the slot
// back and acknowledges it. After a failed directory sync the store answers
// no write at all: a later sync on a new descriptor may pass without making
// the link durable (Linux reports a writeback error only to descriptors
// open when it happened), so "exists" would be a lie.
TEST_F(FileStoreTest, ACreateOnlyPutWhoseSyncFailedIsNeverAnsweredExists) {
  auto store = Open();
  ASSERT_TRUE(store);
  PutOptions create_only;
  create_only.if_none_match = true;
  bool fail = true;
  int syncs = 0;
  SetFileStoreDirSyncHookForTest([&](const std::string& dir) -> Status {
    if (dir != Root() + "/wal") return Status::Ok();
    syncs++;
    return fail ? IOError("injected: sync of {} failed", dir) : Status::Ok();
  });
  EXPECT_EQ(store->Put("wal/1", "slot", create_only).code(), Code::kIOError);  // linked, not synced
  fail = false;                                                                  // as a new descriptor's sync
  syncs = 0;
  const Status again = store->Put("wal/1", "slot", create_only);
  EXPECT_EQ(again.code(), Code::kIOError) << again.ToString();
  EXPECT_NE(again.message().find("directory sync failed"), std::string::npos) << again.ToString();
  EXPECT_EQ(store->Put("wal/2", "slot", create_only).code(), Code::kIOError);
  EXPECT_EQ(syncs, 0);
  EXPECT_EQ(*store->Get("wal/1"), "slot");
  // A new store (a restart) syncs the existing name before saying it exists.
  store.reset();
  store = Open();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->Put("wal/1", "slot", create_only).code(), Code::kPreconditionFailed);
  EXPECT_EQ(syncs, 1);
  ASSERT_OK(store->Put("wal/2", "slot", create_only));
  SetFileStoreDirSyncHookForTest(nullptr);
}

// Many threads putting, reading and deleting their own keys while deleted
// files are reused: every read returns exactly its key's bytes.
TEST_F(FileStoreTest, ReusedFilesNeverLeakIntoOtherKeys) {
  auto store = Open();
  ASSERT_TRUE(store);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
        // Sizes cycle, so a rewritten file is shorter or longer than before.
        auto body = [&](int j) {
          return fmt::format("t{}/{}:{}", t, j, std::string(static_cast<size_t>(j % 7) * 1000, 'x'));
        };
        const std::string key = fmt::format("t{}/{}", t, i);
        if (!store->Put(key, body(i), PutOptions{.if_none_match = true}).ok()) wrong++;
        for (int back = 0; back < 3 && back <= i; ++back) {
          auto got = store->Get(fmt::format("t{}/{}", t, i - back));
          if (!got.ok() || *got != body(i - back)) wrong++;
        }
        if (i >= 2) (void)store->Delete(fmt::format("t{}/{}", t, i - 2));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(FileStoreTest, StaleTempFilesAreRemovedOnOpen) {
  ASSERT_TRUE(Open());
  const std::string stale = Root() + "/.weir-tmp/999-1-00.tmp";
  const std::string fresh = Root() + "/.weir-tmp/999-2-00.tmp";
  { std::ofstream(stale) << "old"; }
  { std::ofstream(fresh) << "new"; }
  const timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 2 * 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, stale.c_str(), times, 0), 0);
  // Free files of a store that is gone go too, whatever its pid was (a
  // restarted container's process often has the crashed one's): one whose
  // owner file nobody holds locked, or that has none (an older version's
  // name). A live store's stay, however old.
  auto live = Open();
  ASSERT_TRUE(live);
  ASSERT_OK(live->Put("obj", std::string(5000, 'x')));
  ASSERT_OK(live->Delete("obj"));
  auto free_files = [&] {
    std::vector<std::string> names;
    for (const std::string& name : TempFiles()) {
      if (name.starts_with("free-")) names.push_back(name);
    }
    return names;
  };
  ASSERT_EQ(free_files().size(), 1u);
  const std::string live_free = Root() + "/.weir-tmp/" + free_files().front();
  ASSERT_EQ(::utimensat(AT_FDCWD, live_free.c_str(), times, 0), 0);
  const std::string crashed_owner = Root() + "/.weir-tmp/owner-00000000000000aa";
  const std::string crashed_free = Root() + "/.weir-tmp/free-00000000000000aa-1";
  const std::string old_format = Root() + "/.weir-tmp/free-" + std::to_string(::getpid()) + "-1-00";
  // A crashed store's temp files go however recent (a quick restart after
  // a crash); a live store's stay.
  const std::string crashed_tmp = Root() + "/.weir-tmp/tmp-00000000000000aa-5.tmp";
  const std::string live_tmp = Root() + "/.weir-tmp/tmp-" + free_files().front().substr(5, 16) + "-999.tmp";
  { std::ofstream(crashed_owner) << ""; }
  { std::ofstream(crashed_free) << "old object"; }
  { std::ofstream(old_format) << "old object"; }
  { std::ofstream(crashed_tmp) << "half a slot"; }
  { std::ofstream(live_tmp) << "being written"; }
  ASSERT_TRUE(Open());
  EXPECT_FALSE(fs::exists(crashed_tmp));
  EXPECT_TRUE(fs::exists(live_tmp));
  fs::remove(live_tmp);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_FALSE(fs::exists(crashed_free));
  EXPECT_FALSE(fs::exists(crashed_owner));
  EXPECT_FALSE(fs::exists(old_format));
  EXPECT_TRUE(fs::exists(live_free));
  // A store closed removes its free files and its owner file.
  live.reset();
  EXPECT_EQ(free_files(), std::vector<std::string>{});
  for (const std::string& name : TempFiles(true)) EXPECT_FALSE(name.starts_with("owner-")) << name;
}

// A deleted object that is also linked elsewhere (a hard-link backup of
// the data directory, `cp -al`) is not rewritten in place later: the
// backup keeps its bytes.
TEST_F(FileStoreTest, AFileLinkedElsewhereIsNotReused) {
  auto store = Open();
  ASSERT_TRUE(store);
  const PutOptions create_only{.if_none_match = true};
  ASSERT_OK(store->Put("wal/a", "the backed-up bytes", create_only));
  const std::string backup = tmp_.path() + "/backup-of-a";
  ASSERT_EQ(::link((Root() + "/wal/a").c_str(), backup.c_str()), 0);
  ASSERT_OK(store->Delete("wal/a"));
  EXPECT_TRUE(TempFiles().empty()) << "pooled";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the quarantine
  ASSERT_OK(store->Put("wal/b", "new bytes", create_only));
  std::ifstream in(backup);
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "the backed-up bytes");
}

TEST_F(FileStoreTest, OpenCreatesNestedDirsAndRejectsFiles) {
  auto r = OpenFileStore(tmp_.path() + "/x/y/z/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->Describe(), "file://" + tmp_.path() + "/x/y/z");
  EXPECT_TRUE(fs::is_directory(tmp_.path() + "/x/y/z/.weir-tmp"));

  { std::ofstream(tmp_.path() + "/plain") << "not a dir"; }
  EXPECT_FALSE(OpenFileStore(tmp_.path() + "/plain").ok());
  EXPECT_FALSE(OpenFileStore(tmp_.path() + "/plain/sub").ok());
  EXPECT_EQ(OpenFileStore("").status().code(), Code::kInvalidArgument);
}

// ---- OpenObjectStore ----------------------------------------------------------

TEST(OpenObjectStoreTest, MemSchemeGivesFreshStores) {
  auto a = OpenObjectStore("mem://");
  auto b = OpenObjectStore("mem://");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->Describe(), "mem://");
  ASSERT_OK((*a)->Put("k", "v"));
  EXPECT_EQ((*b)->Get("k").status().code(), Code::kNotFound);
  EXPECT_EQ(OpenObjectStore("mem://extra").status().code(), Code::kInvalidArgument);
}

TEST(OpenObjectStoreTest, FileSchemeAbsoluteAndRelative) {
  TempDir tmp;
  auto abs = OpenObjectStore("file://" + tmp.path() + "/abs");
  ASSERT_TRUE(abs.ok()) << abs.status().ToString();
  EXPECT_EQ((*abs)->Describe(), "file://" + tmp.path() + "/abs");
  ASSERT_OK((*abs)->Put("x/y", "abs"));
  EXPECT_TRUE(fs::is_regular_file(tmp.path() + "/abs/x/y"));

  const fs::path old_cwd = fs::current_path();
  fs::current_path(tmp.path());
  auto rel = OpenObjectStore("file://rel/dir");
  fs::current_path(old_cwd);
  ASSERT_TRUE(rel.ok()) << rel.status().ToString();
  EXPECT_EQ((*rel)->Describe(), "file://" + tmp.path() + "/rel/dir");
  ASSERT_OK((*rel)->Put("k", "rel"));  // the path was made absolute at open
  EXPECT_TRUE(fs::is_regular_file(tmp.path() + "/rel/dir/k"));
}

TEST(OpenObjectStoreTest, BadUris) {
  for (const char* uri : {"", "file://", "/tmp/no-scheme", "mem:", "FILE:///x", "http://x", "s3://", "s3:///prefix",
                          "s3://b?endpoint=ftp://x&access_key=a&secret_key=s", "s3://b?bogus=1",
                          "s3://b?path_style=maybe&access_key=a&secret_key=s", "s3://b/a//b?access_key=a&secret_key=s"}) {
    SCOPED_TRACE(uri);
    const Status st = OpenObjectStore(uri).status();
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  }
  const std::string msg = OpenObjectStore("gopher://bucket/prefix").status().message();
  EXPECT_NE(msg.find("file://DIR"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mem://"), std::string::npos) << msg;
  EXPECT_NE(msg.find("s3://"), std::string::npos) << msg;
  // Only the scheme is named (the rest may hold secrets).
  EXPECT_NE(msg.find("\"gopher://\""), std::string::npos) << msg;
  EXPECT_EQ(msg.find("bucket"), std::string::npos) << msg;
  const std::string no_scheme = OpenObjectStore("s3:/b?secret_key=SEKRIT").status().message();
  EXPECT_EQ(no_scheme.find("SEKRIT"), std::string::npos) << no_scheme;
  EXPECT_NE(no_scheme.find("does not start with one"), std::string::npos) << no_scheme;
  const std::string late = OpenObjectStore("s3:/b?secret_key=SEKRIT&endpoint=http://h:9000").status().message();
  EXPECT_EQ(late.find("SEKRIT"), std::string::npos) << late;
}

}  // namespace
}  // namespace weir::objstore
