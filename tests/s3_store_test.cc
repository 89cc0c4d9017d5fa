// The S3 client's behaviour under scripted faults, against FakeS3 (no real
// server needed): retries and their bounds, ambiguous create-only PUTs (never
// reported as success; the WAL settles them by nonce), connection reuse,
// bounded concurrency, timeouts, and the conditional-PUT probe.
#include "objstore/s3_store.h"

#include <gtest/gtest.h>

#include <latch>
#include <thread>

#include "fake_s3.h"
#include "test_support.h"
#include "test_util.h"
#include "wal/writer.h"

namespace weir::objstore {
namespace {

using namespace std::chrono_literals;
using Fault = ::weir::testing::FakeS3::Fault;

S3Options FakeOptions(const ::weir::testing::FakeS3& fake) {
  S3Options o;
  o.bucket = "bkt";
  o.prefix = "pre";
  o.endpoint = fake.endpoint();
  o.access_key = "AKFAKE";
  o.secret_key = "secret";
  o.retry_initial = 1ms;
  o.retry_max = 5ms;
  o.probe_conditional_put = false;
  return o;
}

std::shared_ptr<S3Store> Open(const S3Options& o) {
  auto s = OpenS3Store(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : nullptr;
}

uint64_t Count(const S3Store& s, S3Metrics::Op op, S3Metrics::Outcome outcome) {
  return s.metrics().requests[op][outcome].load();
}

TEST(S3Client, BasicOperationsAgainstTheFake) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_TRUE(s);
  ASSERT_OK(s->Put("a/b", "hello"));
  auto got = s->Get("a/b");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "hello");
  EXPECT_EQ(*s->Get("a/b", ByteRange{1, 3}), "ell");
  EXPECT_EQ(s->Head("a/b")->size, 5u);
  EXPECT_EQ(s->Get("missing").status().code(), Code::kNotFound);
  EXPECT_EQ(s->Head("missing").status().code(), Code::kNotFound);
  EXPECT_EQ(s->Put("a/b", "x", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
  ASSERT_OK(s->Delete("a/b"));
  EXPECT_EQ(fake.objects(), 0u);
  EXPECT_EQ(Count(*s, S3Metrics::kPut, S3Metrics::k2xx), 1u);
  EXPECT_EQ(Count(*s, S3Metrics::kPut, S3Metrics::k412), 1u);
  EXPECT_EQ(Count(*s, S3Metrics::kGet, S3Metrics::k404), 1u);
  EXPECT_EQ(s->metrics().bytes_sent.load(), 6u);
  EXPECT_GE(s->metrics().latency_ns[S3Metrics::kGet].count(), 3u);
}

TEST(S3Client, RetriesThrottlingAndCountsIt) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  fake.Inject(Fault::k503SlowDown);
  fake.Inject(Fault::k503SlowDown);
  ASSERT_OK(s->Put("k", "v"));
  EXPECT_EQ(s->metrics().retries[S3Metrics::kPut].load(), 2u);
  EXPECT_EQ(Count(*s, S3Metrics::kPut, S3Metrics::k503), 2u);
  EXPECT_EQ(Count(*s, S3Metrics::kPut, S3Metrics::k2xx), 1u);
}

TEST(S3Client, RetriesOutlastAShortBurstOfThrottling) {
  // Seven 503s in a row (about 2.6 to 5 s with the real backoff): the eighth
  // attempt gets through.
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  for (int i = 0; i < 7; ++i) fake.Inject(Fault::k503SlowDown);
  ASSERT_OK(s->Put("k", "v"));
  EXPECT_EQ(fake.requests(), 8);
}

TEST(S3Client, ABodyThatChangedOnTheWayIsSentAgain) {
  // BadDigest / XAmzContentSHA256Mismatch / IncompleteBody: nothing was
  // stored, and the retry sends the same bytes.
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  for (const char* code : {"BadDigest", "XAmzContentSHA256Mismatch", "IncompleteBody"}) {
    fake.Script(400, fmt::format("<?xml version=\"1.0\"?><Error><Code>{}</Code><Message>m</Message></Error>", code));
    ASSERT_OK(s->Put(std::string("k-") + code, "v"));
    auto got = s->Get(std::string("k-") + code);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, "v");
  }
  EXPECT_EQ(s->metrics().retries[S3Metrics::kPut].load(), 3u);
}

TEST(S3Client, ADeleteTheServiceWasTooBusyForIsRetryable) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  fake.Script(200,
              "<DeleteResult><Deleted><Key>pre/a</Key></Deleted><Error><Key>pre/b</Key><Code>InternalError</Code>"
              "<Message>busy</Message></Error></DeleteResult>");
  const std::vector<std::string> keys{"a", "b"};
  Status st = s->DeleteMany(keys);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  fake.Script(200,
              "<DeleteResult><Error><Key>pre/b</Key><Code>AccessDenied</Code><Message>no</Message></Error>"
              "</DeleteResult>");
  st = s->DeleteMany(keys);
  EXPECT_EQ(st.code(), Code::kIOError) << st.ToString();
}

TEST(S3Client, ARangedReadGetsTheWindowItAskedFor) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  // Another window than the one asked for.
  fake.Script(206, "abc", "Content-Range: bytes 5-7/100\r\n");
  EXPECT_EQ(s->Get("k", ByteRange{0, 3}).status().code(), Code::kCorruption);
  // Fewer bytes than asked, with more in the object: not the object's end.
  fake.Script(206, "ab", "Content-Range: bytes 0-1/100\r\n");
  EXPECT_EQ(s->Get("k", ByteRange{0, 10}).status().code(), Code::kUnavailable);
  // Fewer bytes because the object ends there.
  fake.Script(206, "ab", "Content-Range: bytes 0-1/2\r\n");
  auto got = s->Get("k", ByteRange{0, 10});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "ab");
  // The total unknown: a short window is the object's end.
  fake.Script(206, "ab", "Content-Range: bytes 0-1/*\r\n");
  got = s->Get("k", ByteRange{0, 10});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "ab");
  // A Content-Range that does not match the body.
  fake.Script(206, "abcd", "Content-Range: bytes 0-2/100\r\n");
  EXPECT_EQ(s->Get("k", ByteRange{0, 4}).status().code(), Code::kCorruption);
  // The fake's own ranged answers pass.
  ASSERT_OK(s->Put("k", "0123456789"));
  got = s->Get("k", ByteRange{3, 4});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "3456");
}

TEST(S3Client, RetriesAreBounded) {
  ::weir::testing::FakeS3 fake;
  S3Options o = FakeOptions(fake);
  o.max_attempts = 3;
  auto s = Open(o);
  for (int i = 0; i < 5; ++i) fake.Inject(Fault::k503SlowDown);
  // (A PUT's 5xx may have been applied: a PUT would end kTimeout.)
  const Status st = s->Get("k").status();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("SlowDown"), std::string::npos) << st.ToString();
  EXPECT_EQ(fake.requests(), 3);
}

TEST(S3Client, RetriesDroppedConnections) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_OK(s->Put("k", "value"));
  fake.Inject(Fault::kDropBeforeApply);
  auto got = s->Get("k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "value");
  // On a kept-alive connection libcurl resends by itself; counted as a retry.
  EXPECT_EQ(s->metrics().retries[S3Metrics::kGet].load(), 1u);
  fake.Inject(Fault::kDropBeforeApply);
  ASSERT_OK(s->Put("k2", "v2", PutOptions{.if_none_match = true}));
}

TEST(S3Client, AmbiguousCreateIsNeverReportedAsSuccess) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  // The first attempt lands but its answer is lost; the retry meets our own object.
  fake.Inject(Fault::kDropAfterApply);
  const Status st = s->Put("wal/1", "mine", PutOptions{.if_none_match = true});
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("may have been applied"), std::string::npos) << st.ToString();
  EXPECT_EQ(s->metrics().ambiguous_creates.load(), 1u);
  EXPECT_EQ(*s->Get("wal/1"), "mine");
  // Asked again, the store gives the plain answer: it exists.
  EXPECT_EQ(s->Put("wal/1", "mine", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);

  // A 500 may have been applied too.
  fake.Inject(Fault::k500AfterApply);
  EXPECT_EQ(s->Put("wal/2", "mine", PutOptions{.if_none_match = true}).code(), Code::kTimeout);
  // A plain PUT retried after an applied attempt simply succeeds.
  fake.Inject(Fault::kDropAfterApply);
  ASSERT_OK(s->Put("wal/3", "v"));
  EXPECT_EQ(s->metrics().ambiguous_creates.load(), 2u);
}

TEST(S3Client, AmbiguousCreateOnAKeptAliveConnection) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_OK(s->Put("warm", "x"));  // the next request reuses this connection
  // libcurl itself resends a request whose reused connection died; that copy's
  // 412 must not pass for a definite answer either.
  fake.Inject(Fault::kDropAfterApply);
  const Status st = s->Put("wal/1", "mine", PutOptions{.if_none_match = true});
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_EQ(s->metrics().ambiguous_creates.load(), 1u);
  EXPECT_EQ(fake.connections(), 2);
}

// An attempt that may have landed makes the PUT's outcome unknown whatever
// the last attempt met: a refusal (an expired token, a denied request) or
// the retries running out is no proof that nothing was written.
TEST(S3Client, APutThatMayHaveLandedIsNeverAPlainFailure) {
  ::weir::testing::FakeS3 fake;
  S3Options o = FakeOptions(fake);
  o.max_attempts = 2;
  auto s = Open(o);
  fake.Inject(Fault::kDropAfterApply);
  fake.Inject(Fault::k403Denied);
  Status st = s->Put("wal/1", "mine", PutOptions{.if_none_match = true});
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("AccessDenied"), std::string::npos) << st.ToString();
  EXPECT_EQ(*s->Get("wal/1"), "mine");

  fake.Inject(Fault::k500AfterApply);
  fake.Inject(Fault::k503SlowDown);
  st = s->Put("wal/2", "mine", PutOptions{.if_none_match = true});
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_EQ(*s->Get("wal/2"), "mine");
  EXPECT_EQ(s->metrics().ambiguous_creates.load(), 2u);

  // A plain PUT too: it may have replaced the object.
  fake.Inject(Fault::k500AfterApply);
  fake.Inject(Fault::k503SlowDown);
  st = s->Put("k", "new");
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_EQ(*s->Get("k"), "new");

  // The last attempt's 500 may have been applied too (the one before was
  // refused unapplied).
  fake.Inject(Fault::k409Conflict);
  fake.Inject(Fault::k500AfterApply);
  st = s->Put("wal/4", "mine", PutOptions{.if_none_match = true});
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_EQ(*s->Get("wal/4"), "mine");
  EXPECT_EQ(s->metrics().ambiguous_creates.load(), 3u);

  // Nothing applied: the plain answers stay.
  fake.Inject(Fault::k403Denied);
  EXPECT_EQ(s->Put("wal/3", "mine", PutOptions{.if_none_match = true}).code(), Code::kIOError);
  EXPECT_EQ(s->Head("wal/3").status().code(), Code::kNotFound);
}

TEST(S3Client, ConflictIsRetriedAndA412AfterItIsDefinite) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_OK(s->Put("k", "first", PutOptions{.if_none_match = true}));
  // 409 ConditionalRequestConflict means "not applied": the 412 after it is real.
  fake.Inject(Fault::k409Conflict);
  EXPECT_EQ(s->Put("k", "second", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
  EXPECT_EQ(s->metrics().retries[S3Metrics::kPut].load(), 1u);
  EXPECT_EQ(Count(*s, S3Metrics::kPut, S3Metrics::k409), 1u);
  EXPECT_EQ(*s->Get("k"), "first");
}

// A 409 other than ConditionalRequestConflict (a bucket in a bad state, a
// key that is a directory) is not "the key exists": a create that gets one
// must not count as landed (settle would drop the slots of a segment never
// written).
TEST(S3Client, AConflictOnACreateIsNotReportedAsTheKeyExisting) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_TRUE(s);
  fake.Script(409, "<?xml version=\"1.0\"?><Error><Code>InvalidBucketState</Code><Message>m</Message></Error>");
  const Status st = s->Put("seg", "data", PutOptions{.if_none_match = true});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.code(), Code::kPreconditionFailed) << st.ToString();
  EXPECT_EQ(s->Head("seg").status().code(), Code::kNotFound);
}

std::string ListPage(const std::vector<std::string>& keys, bool truncated, const std::string& token) {
  std::string body = "<?xml version=\"1.0\"?><ListBucketResult><Name>bkt</Name>";
  for (const std::string& k : keys) body += "<Contents><Key>" + k + "</Key><Size>1</Size></Contents>";
  body += std::string("<IsTruncated>") + (truncated ? "true" : "false") + "</IsTruncated>";
  if (!token.empty()) body += "<NextContinuationToken>" + token + "</NextContinuationToken>";
  return body + "</ListBucketResult>";
}

// A faulty service's listing fails loudly instead of looping: a truncated
// page that does not move on, or keys that ignore start-after.
TEST(S3Client, ListRefusesPagesThatDoNotMoveOn) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_TRUE(s);
  fake.Script(200, ListPage({}, true, "t1"));
  fake.Script(200, ListPage({}, true, "t1"));
  EXPECT_EQ(s->List("", "", 10).status().code(), Code::kCorruption);
  fake.Script(200, ListPage({}, true, ""));
  EXPECT_EQ(s->List("", "", 10).status().code(), Code::kCorruption);
  fake.Script(200, ListPage({"pre/a", "pre/b"}, false, ""));
  EXPECT_EQ(s->List("", "b", 10).status().code(), Code::kCorruption);  // "a" and "b" are not after "b"
  fake.Script(200, ListPage({"pre/c", "pre/b"}, false, ""));
  EXPECT_EQ(s->List("", "", 10).status().code(), Code::kCorruption);  // not ascending
  // Tokens that go round in a circle (t1, t2, t1) on empty pages.
  fake.Script(200, ListPage({}, true, "t1"));
  fake.Script(200, ListPage({}, true, "t2"));
  fake.Script(200, ListPage({}, true, "t1"));
  EXPECT_EQ(s->List("", "", 10).status().code(), Code::kCorruption);
  // Keys outside the prefix asked for (the service ignored prefix=).
  fake.Script(200, ListPage({"pre/seg/1", "pre/wal/2"}, false, ""));
  EXPECT_EQ(s->List("wal/", "", 10).status().code(), Code::kCorruption);
  // A well-behaved page still lists.
  fake.Script(200, ListPage({"pre/c", "pre/d"}, false, ""));
  auto page = s->List("", "b", 10);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[1].key, "d");
}

TEST(S3Client, ResponseBodiesAreBounded) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  ASSERT_TRUE(s);
  // A service that ignores Range: only the bytes the range needs are kept.
  const std::string big(3u << 20, 'z');
  fake.Script(200, "0123456789" + big);
  auto got = s->Get("k", ByteRange{2, 5});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "23456");
  EXPECT_LT(s->metrics().bytes_received.load(), 100u);
  fake.Script(200, "0123456789");
  EXPECT_EQ(s->Get("k", ByteRange{10, 5}).status().code(), Code::kOutOfRange);
  // A 206 longer than the range asked for is not the range.
  fake.Script(206, "0123456789");
  EXPECT_EQ(s->Get("k", ByteRange{0, 5}).status().code(), Code::kCorruption);
  // An error body is kept only up to its first 64 KiB.
  const uint64_t before = s->metrics().bytes_received.load();
  fake.Script(403, "<Error><Code>AccessDenied</Code></Error>" + big);
  EXPECT_EQ(s->Get("k").status().code(), Code::kIOError);
  EXPECT_LE(s->metrics().bytes_received.load() - before, 64u << 10);
  // An XML answer of more than 16 MiB is refused, not buffered.
  fake.Script(200, std::string(17u << 20, ' '));
  auto listed = s->List("", "", 10);
  EXPECT_EQ(listed.status().code(), Code::kCorruption);
  EXPECT_NE(listed.status().message().find("larger than"), std::string::npos) << listed.status().ToString();
  // The client still works afterwards.
  ASSERT_OK(s->Put("a", "hello"));
  EXPECT_EQ(*s->Get("a", ByteRange{1, 3}), "ell");
}

TEST(S3Client, ReusesConnections) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK(s->Put("k" + std::to_string(i), "v"));
    ASSERT_TRUE(s->Get("k" + std::to_string(i)).ok());
  }
  EXPECT_EQ(fake.requests(), 100);
  EXPECT_EQ(fake.connections(), 1);
  EXPECT_EQ(s->metrics().connections_opened.load(), 1u);
}

TEST(S3Client, BoundsConcurrency) {
  ::weir::testing::FakeS3 fake;
  fake.SetDelay(20ms);
  S3Options o = FakeOptions(fake);
  o.max_connections = 3;
  auto s = Open(o);
  constexpr int kThreads = 12;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < 4; ++i) {
        if (!s->Put(fmt::format("c/{}/{}", t, i), "v").ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fake.requests(), kThreads * 4);
  EXPECT_LE(fake.max_concurrent(), 3);
  EXPECT_GE(fake.max_concurrent(), 2);
  EXPECT_LE(fake.connections(), 3);
}

TEST(S3Client, RequestTimeout) {
  ::weir::testing::FakeS3 fake;
  S3Options o = FakeOptions(fake);
  ASSERT_OK(Open(o)->Put("k", "v"));  // set up with the default timeout
  o.request_timeout = 2500ms;
  o.max_attempts = 1;
  auto s = Open(o);
  // The server would answer after 10 s; the request gives up long before.
  fake.Inject(Fault::kStall);
  const Status st = s->Get("k").status();
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
}

TEST(S3Client, ProbeAcceptsAStoreThatHonoursIfNoneMatch) {
  ::weir::testing::FakeS3 fake;
  S3Options o = FakeOptions(fake);
  o.probe_conditional_put = true;
  auto s = OpenS3Store(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(fake.objects(), 0u);  // the probe object is removed
}

// One lost answer during the probe (either PUT) made start-up fail and left
// the probe object behind; an undecided probe is now done again.
TEST(S3Client, ProbeSurvivesAnAmbiguousAnswer) {
  for (int lost : {0, 1}) {
    ::weir::testing::FakeS3 fake;
    S3Options o = FakeOptions(fake);
    auto s = Open(o);
    if (lost == 1) {
      fake.Inject(Fault::kNone);  // the first PUT goes through
    }
    fake.Inject(Fault::kDropAfterApply);
    const Status probed = s->ProbeConditionalPut();
    EXPECT_TRUE(probed.ok()) << "lost answer of PUT " << lost + 1 << ": " << probed.ToString();
    EXPECT_EQ(fake.objects(), 0u) << "the probe objects are removed";
  }
}

TEST(S3Client, ProbeRefusesAStoreThatIgnoresIfNoneMatch) {
  ::weir::testing::FakeS3 fake(/*honour_if_none_match=*/false);
  S3Options o = FakeOptions(fake);
  o.probe_conditional_put = true;
  const Status st = OpenS3Store(o).status();
  EXPECT_EQ(st.code(), Code::kNotSupported) << st.ToString();
  EXPECT_NE(st.message().find("ignores If-None-Match"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fencing"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--allow-unconditional-put"), std::string::npos) << st.message();

  // Allowed: create-only PUTs are emulated (HEAD, then PUT).
  o.allow_unconditional_put = true;
  auto s = OpenS3Store(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_OK((*s)->Put("k", "first", PutOptions{.if_none_match = true}));
  EXPECT_EQ((*s)->Put("k", "second", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
  EXPECT_EQ(*(*s)->Get("k"), "first");

  // The same through OpenObjectStore's option.
  const std::string uri = fmt::format("s3://bkt/pre?endpoint={}&access_key=a&secret_key=s", fake.endpoint());
  EXPECT_EQ(OpenObjectStore(uri).status().code(), Code::kNotSupported);
  EXPECT_TRUE(OpenObjectStore(uri, OpenOptions{.allow_unconditional_put = true}).ok());
  EXPECT_TRUE(OpenObjectStore(uri + "&allow_unconditional_put=true").ok());
}

// A service that refuses If-None-Match outright (501) is one without
// conditional writes too: refused, unless allow_unconditional_put.
TEST(S3Client, ProbeTreatsAStoreThatRefusesIfNoneMatchAsOneThatIgnoresIt) {
  ::weir::testing::FakeS3 fake;
  S3Options o = FakeOptions(fake);
  o.probe_conditional_put = true;
  const std::string not_implemented =
      "<?xml version=\"1.0\"?><Error><Code>NotImplemented</Code><Message>m</Message></Error>";
  fake.Script(501, not_implemented);
  const Status refused = OpenS3Store(o).status();
  EXPECT_EQ(refused.code(), Code::kNotSupported) << refused.ToString();
  EXPECT_NE(refused.message().find("refuses If-None-Match"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("--allow-unconditional-put"), std::string::npos) << refused.message();
  o.allow_unconditional_put = true;
  fake.Script(501, not_implemented);
  auto s = OpenS3Store(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // Emulated from now on: HEAD, then a PUT without the header (two requests).
  const int before = fake.requests();
  ASSERT_OK((*s)->Put("k", "first", PutOptions{.if_none_match = true}));
  EXPECT_EQ(fake.requests() - before, 2);
  EXPECT_EQ((*s)->Put("k", "second", PutOptions{.if_none_match = true}).code(), Code::kPreconditionFailed);
  // Any other refusal of the probe is an error, flag or not.
  fake.Script(400, "<?xml version=\"1.0\"?><Error><Code>InvalidRequest</Code><Message>m</Message></Error>");
  EXPECT_EQ(OpenS3Store(o).status().code(), Code::kInvalidArgument);
}

// The WAL over s3://: a slot PUT that lands but loses its answer is resolved by
// reading the envelope back (our nonce), acknowledged once, not duplicated.
TEST(S3Client, WalResolvesAnAmbiguousSlotPutByNonce) {
  ::weir::testing::FakeS3 fake;
  auto s = Open(FakeOptions(fake));
  wal::WriterOptions wo;
  wo.node = "n1";
  wo.epoch = 1;
  wo.retry_initial = 1ms;
  wo.retry_max = 5ms;
  auto w = wal::Writer::Start(s, wo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  fake.Inject(Fault::kDropAfterApply);
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> ack;
  ASSERT_OK((*w)->Append(1, ::weir::testing::OneRecordBatch("x"),
                         [&](const Status& st, const wal::AckInfo&) {
                           std::lock_guard lk(mu);
                           ack = st;
                           cv.notify_all();
                         },
                         Now() + 30s));
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 30s, [&] { return ack.has_value(); }));
  }
  EXPECT_TRUE(ack->ok()) << ack->ToString();
  EXPECT_EQ((*w)->metrics().put_ambiguous_resolved.load(), 1u);
  EXPECT_EQ(s->metrics().ambiguous_creates.load(), 1u);
  (*w)->Close();
}

}  // namespace
}  // namespace weir::objstore
