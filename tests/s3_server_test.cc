// s3:// against a real S3 server (the s3 CTest fixture's radosgw): clear
// errors for bad credentials and a missing bucket, the start-up probe,
// prefixes, keys that need encoding, listing and deleting past 1000 keys,
// metrics and connection reuse. The ObjectStore conformance suite runs on the
// same server from objstore_conformance_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "objstore/object_store.h"
#include "objstore/s3_store.h"
#include "s3_test_env.h"
#include "test_support.h"

namespace weir::objstore {
namespace {

using ::weir::testing::MustLoadS3TestEnv;
using ::weir::testing::S3TestEnv;

// An s3:// URI on the fixture's shared bucket.
std::string Uri(const S3TestEnv& env, const std::string& prefix, const std::string& secret) {
  return fmt::format("s3://{}/{}?endpoint={}&region={}&access_key={}&secret_key={}", env.bucket, prefix, env.endpoint,
                     env.region, env.access_key, secret);
}

std::shared_ptr<S3Store> FreshStore() {
  auto s = ::weir::testing::NewS3TestStore(MustLoadS3TestEnv());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : nullptr;
}

std::vector<std::string> AllKeys(ObjectStore& s, const std::string& prefix = "") {
  std::vector<std::string> keys;
  std::string after;
  while (true) {
    auto page = s.List(prefix, after, 1000);
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    if (!page.ok()) return keys;
    for (const auto& o : page->objects) keys.push_back(o.key);
    if (page->next_start_after.empty()) return keys;
    after = page->next_start_after;
  }
}

TEST(S3Server, WrongSecretKeyIsAClearAuthenticationError) {
  const S3TestEnv env = MustLoadS3TestEnv();
  const Status st = OpenObjectStore(Uri(env, "auth", "not-the-secret")).status();
  EXPECT_EQ(st.code(), Code::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("S3 authentication failed"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("secret access key is probably wrong"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("SignatureDoesNotMatch"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find("not-the-secret"), std::string::npos) << "the secret must not leak";

  const Status unknown = OpenObjectStore(fmt::format("s3://{}/auth?endpoint={}&access_key=NOSUCHKEY&secret_key=x",
                                                     env.bucket, env.endpoint))
                             .status();
  EXPECT_EQ(unknown.code(), Code::kIOError) << unknown.ToString();
  EXPECT_NE(unknown.message().find("access key ID"), std::string::npos) << unknown.ToString();
}

TEST(S3Server, MissingBucketIsNamed) {
  const S3TestEnv env = MustLoadS3TestEnv();
  const Status st =
      OpenObjectStore(fmt::format("s3://no-such-bucket-here?endpoint={}&access_key={}&secret_key={}", env.endpoint,
                                  env.access_key, env.secret_key))
          .status();
  EXPECT_EQ(st.code(), Code::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("bucket does not exist"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("no-such-bucket-here"), std::string::npos) << st.ToString();
}

TEST(S3Server, ProbePassesAndPrefixesIsolateStores) {
  const S3TestEnv env = MustLoadS3TestEnv();
  auto a = OpenObjectStore(Uri(env, "iso/a", env.secret_key));
  auto b = OpenObjectStore(Uri(env, "iso/b/", env.secret_key));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE((*a)->Describe().find("s3://weir-test/iso/a"), std::string::npos) << (*a)->Describe();
  ASSERT_OK((*a)->Put("k", "from a"));
  ASSERT_OK((*b)->Put("k", "from b"));
  EXPECT_EQ(*(*a)->Get("k"), "from a");
  EXPECT_EQ(*(*b)->Get("k"), "from b");
  EXPECT_EQ(AllKeys(**a), std::vector<std::string>{"k"});  // no probe object left behind
  ASSERT_OK((*a)->Delete("k"));
  EXPECT_EQ(*(*b)->Get("k"), "from b");
  ASSERT_OK((*b)->Delete("k"));
}

TEST(S3Server, KeysThatNeedEncodingRoundTrip) {
  auto s = FreshStore();
  ASSERT_TRUE(s);
  std::vector<std::string> keys = {"sp ace", "pl+us", "per%cent", "amp&er=sand?q", "lt<gt>\"quote'", "tilde~star*",
                                   "unicode/\xe1\x88\xb4/\xf0\x9f\x98\x80", "ctrl\x01key", "tab\tkey", "a/b/c"};
  for (const auto& k : keys) ASSERT_OK(s->Put(k, "v:" + k));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(AllKeys(*s), keys);
  for (const auto& k : keys) {
    auto got = s->Get(k);
    ASSERT_TRUE(got.ok()) << k << ": " << got.status().ToString();
    EXPECT_EQ(*got, "v:" + k);
  }
  EXPECT_EQ(AllKeys(*s, "pl+"), std::vector<std::string>{"pl+us"});
  ASSERT_OK(s->DeleteMany(keys));
  EXPECT_TRUE(AllKeys(*s).empty());
}

TEST(S3Server, ListAndDeletePastOneThousandKeys) {
  auto s = FreshStore();
  ASSERT_TRUE(s);
  constexpr int kKeys = 1234;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(fmt::format("many/{:05}", i));
  std::atomic<int> next{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < kKeys;) {
        if (!s->Put(keys[static_cast<size_t>(i)], "x").ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  auto first = s->List("many/", {}, 1000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->objects.size(), 1000u);
  EXPECT_EQ(first->next_start_after, keys[999]);
  auto second = s->List("many/", first->next_start_after, 1000);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->objects.size(), size_t{kKeys - 1000});
  EXPECT_TRUE(second->next_start_after.empty());
  EXPECT_EQ(AllKeys(*s), keys);
  const uint64_t batches_before = s->metrics().Requests(S3Metrics::kDeleteMany);
  ASSERT_OK(s->DeleteMany(keys));
  EXPECT_EQ(s->metrics().Requests(S3Metrics::kDeleteMany) - batches_before, 2u);  // 1000 + 234
  EXPECT_TRUE(AllKeys(*s).empty());
}

TEST(S3Server, LargeObjectsAndRangedReads) {
  auto s = FreshStore();
  ASSERT_TRUE(s);
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  ASSERT_OK(s->Put("big", big, PutOptions{.if_none_match = true}));
  for (uint64_t off : {uint64_t{0}, uint64_t{12345}, uint64_t{(8 << 20) - 65536}}) {
    auto r = s->Get("big", ByteRange{off, 65536});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(*r == big.substr(off, 65536)) << off;
  }
  auto whole = s->Get("big");
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(*whole == big);
}

TEST(S3Server, MetricsAndConnectionReuse) {
  auto s = FreshStore();
  ASSERT_TRUE(s);
  const S3Metrics& m = s->metrics();
  const uint64_t connections0 = m.connections_opened.load();
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(s->Put(fmt::format("m/{}", i), std::string(1000, 'x')));
    ASSERT_TRUE(s->Get(fmt::format("m/{}", i)).ok());
  }
  EXPECT_EQ(s->Get("m/none").status().code(), Code::kNotFound);
  EXPECT_GE(m.requests[S3Metrics::kPut][S3Metrics::k2xx].load(), 20u);
  EXPECT_EQ(m.requests[S3Metrics::kGet][S3Metrics::k2xx].load(), 20u);
  EXPECT_EQ(m.requests[S3Metrics::kGet][S3Metrics::k404].load(), 1u);
  EXPECT_GE(m.bytes_sent.load(), 20000u);
  EXPECT_GE(m.bytes_received.load(), 20000u);
  EXPECT_GE(m.latency_ns[S3Metrics::kPut].count(), 20u);
  EXPECT_GT(m.latency_ns[S3Metrics::kPut].Quantile(0.5), 0u);
  // Forty sequential requests ride one kept-alive connection.
  EXPECT_LE(m.connections_opened.load() - connections0, 1u);
  EXPECT_EQ(m.in_flight.load(), 0u);
}

}  // namespace
}  // namespace weir::objstore
