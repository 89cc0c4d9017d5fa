// S3 wire formats without a server: XML parsing, ListObjectsV2 and
// DeleteObjects bodies, error mapping, s3:// URI parsing.
#include "objstore/s3_protocol.h"

#include <stdlib.h>

#include <gtest/gtest.h>

#include "objstore/object_store.h"
#include "objstore/s3_store.h"
#include "objstore/xml.h"
#include "test_support.h"

namespace weir::objstore {
namespace {

TEST(Xml, ParsesNestedElementsAndEntities) {
  auto doc = xml::Parse(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<A xmlns=\"urn:x\"><B>one &amp; two</B><C><D>3</D></C><B>x</B></A>");
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(doc->name, "A");
  ASSERT_EQ(doc->children.size(), 3u);
  EXPECT_EQ(doc->TextOf("B"), "one & two");
  EXPECT_EQ(doc->Find("C")->TextOf("D"), "3");
  EXPECT_EQ(doc->TextOf("missing"), "");
  EXPECT_EQ(doc->Find("missing"), nullptr);
}

TEST(Xml, RejectsMalformedAndDeepDocuments) {
  for (const char* bad : {"", "<A>", "<A></B>", "not xml", "<A><B></A>"}) {
    EXPECT_EQ(xml::Parse(bad).status().code(), Code::kCorruption) << bad;
  }
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  for (int i = 0; i < 100; ++i) deep += "</a>";
  const Status st = xml::Parse(deep).status();
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("deeper"), std::string::npos) << st.message();
}

// A DTD's entities could blow a small body up a hundredfold, and even short
// tags cost a tree node each: both are refused.
TEST(Xml, RejectsDtdsAndTooManyElements) {
  const Status dtd = xml::Parse("<?xml version=\"1.0\"?><!DOCTYPE K [<!ENTITY a \"aaaaaaaa\">]><K>&a;&a;</K>").status();
  EXPECT_EQ(dtd.code(), Code::kCorruption);
  EXPECT_NE(dtd.message().find("DTD"), std::string::npos) << dtd.message();
  std::string wide = "<K>";
  for (int i = 0; i < 300000; ++i) wide += "<a/>";
  wide += "</K>";
  const Status st = xml::Parse(wide).status();
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("elements"), std::string::npos) << st.message();
}

TEST(Xml, EscapeRoundTrips) {
  const std::string text = "a<b>&\"c'd";
  EXPECT_EQ(xml::Escape(text), "a&lt;b&gt;&amp;&quot;c&apos;d");
  auto doc = xml::Parse("<K>" + xml::Escape(text) + "</K>");
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(doc->text, text);
}

TEST(S3Protocol, ListObjectsV2) {
  const std::string body = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>p%2F</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>
  <EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>
  <NextContinuationToken>tok/en==</NextContinuationToken>
  <Contents><Key>p/a%20b</Key><Size>10</Size><ETag>"x"</ETag></Contents>
  <Contents><Key>p/c+d%2Be</Key><Size>0</Size></Contents>
  <Contents><Key>p/%E1%88%B4</Key><Size>12345678901</Size></Contents>
</ListBucketResult>)";
  auto r = s3::ParseListObjectsV2(body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->truncated);
  EXPECT_EQ(r->next_continuation_token, "tok/en==");
  ASSERT_EQ(r->objects.size(), 3u);
  EXPECT_EQ(r->objects[0].key, "p/a b");
  EXPECT_EQ(r->objects[0].size, 10u);
  EXPECT_EQ(r->objects[1].key, "p/c d+e");
  EXPECT_EQ(r->objects[2].key, "p/\xe1\x88\xb4");
  EXPECT_EQ(r->objects[2].size, 12345678901u);

  auto plain = s3::ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a+b%20</Key><Size>1</Size></Contents>"
      "</ListBucketResult>");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->truncated);
  EXPECT_EQ(plain->objects[0].key, "a+b%20");  // not url-encoded: taken as is
}

TEST(S3Protocol, ListObjectsV2Errors) {
  EXPECT_EQ(s3::ParseListObjectsV2("<Error/>").status().code(), Code::kCorruption);
  EXPECT_EQ(s3::ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>")
                .status()
                .code(),
            Code::kCorruption);  // truncated without a token would loop forever
  EXPECT_EQ(s3::ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents>"
                                   "</ListBucketResult>")
                .status()
                .code(),
            Code::kCorruption);
  EXPECT_EQ(s3::ParseListObjectsV2("<ListBucketResult><EncodingType>url</EncodingType><Contents><Key>%G1</Key>"
                                   "<Size>1</Size></Contents></ListBucketResult>")
                .status()
                .code(),
            Code::kCorruption);
}

TEST(S3Protocol, DeleteObjectsBodyAndResult) {
  const std::vector<std::string> keys = {"p/a", "p/<&>\"'", "p/\xe1\x88\xb4"};
  const std::string body = s3::DeleteObjectsBody(keys);
  auto doc = xml::Parse(body);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString() << body;
  EXPECT_EQ(doc->name, "Delete");
  EXPECT_EQ(doc->TextOf("Quiet"), "true");
  std::vector<std::string> parsed;
  for (const auto& c : doc->children) {
    if (c.name == "Object") parsed.emplace_back(c.TextOf("Key"));
  }
  EXPECT_EQ(parsed, keys);

  auto errors = s3::ParseDeleteResult(
      "<DeleteResult><Deleted><Key>x</Key></Deleted><Error><Key>p/a</Key><Code>AccessDenied</Code>"
      "<Message>no</Message></Error></DeleteResult>");
  ASSERT_TRUE(errors.ok());
  ASSERT_EQ(errors->size(), 1u);
  EXPECT_EQ((*errors)[0].key, "p/a");
  EXPECT_EQ((*errors)[0].code, "AccessDenied");
  EXPECT_TRUE(s3::ParseDeleteResult("<DeleteResult/>")->empty());
  EXPECT_FALSE(s3::ParseDeleteResult("<Other/>").ok());
  EXPECT_TRUE(s3::XmlSafe("a b/c"));
  EXPECT_FALSE(s3::XmlSafe("a\x01"));
  EXPECT_FALSE(s3::XmlSafe("a\rb"));
  EXPECT_FALSE(s3::XmlSafe("x/\xEF\xBF\xBF"));  // U+FFFF
  EXPECT_FALSE(s3::XmlSafe("\xEF\xBF\xBEx"));   // U+FFFE
  EXPECT_TRUE(s3::XmlSafe("x/\xEF\xBF\xBD"));   // U+FFFD is a character
  EXPECT_TRUE(s3::XmlSafe("x/\xEF\xBF"));
}

s3::Error Err(long status, std::string code) {
  return s3::ParseError(status,
                        "<?xml version=\"1.0\"?><Error><Code>" + code + "</Code><Message>msg</Message>"
                        "<RequestId>rid</RequestId></Error>",
                        "");
}

TEST(S3Protocol, ErrorsMapToStatus) {
  const s3::Error e = Err(403, "SignatureDoesNotMatch");
  EXPECT_EQ(e.code, "SignatureDoesNotMatch");
  EXPECT_EQ(e.message, "msg");
  EXPECT_EQ(e.request_id, "rid");
  const Status auth = s3::ToStatus(e, "GET s3://b/k");
  EXPECT_EQ(auth.code(), Code::kIOError);
  EXPECT_NE(auth.message().find("authentication failed"), std::string::npos) << auth.message();
  EXPECT_NE(auth.message().find("secret access key"), std::string::npos) << auth.message();
  EXPECT_NE(auth.message().find("GET s3://b/k"), std::string::npos) << auth.message();
  EXPECT_NE(s3::ToStatus(Err(403, "InvalidAccessKeyId"), "x").message().find("access key ID"), std::string::npos);
  EXPECT_EQ(s3::ToStatus(s3::ParseError(403, "", "r1"), "HEAD x").code(), Code::kIOError);  // HEAD: no body

  EXPECT_EQ(s3::ToStatus(Err(404, "NoSuchKey"), "x").code(), Code::kNotFound);
  const Status bucket = s3::ToStatus(Err(404, "NoSuchBucket"), "x");
  EXPECT_EQ(bucket.code(), Code::kIOError);  // not a missing object
  EXPECT_NE(bucket.message().find("bucket does not exist"), std::string::npos);
  EXPECT_EQ(s3::ToStatus(Err(412, "PreconditionFailed"), "x").code(), Code::kPreconditionFailed);
  EXPECT_EQ(s3::ToStatus(Err(416, "InvalidRange"), "x").code(), Code::kOutOfRange);
  EXPECT_EQ(s3::ToStatus(Err(400, "RequestTimeout"), "x").code(), Code::kTimeout);
  EXPECT_EQ(s3::ToStatus(Err(400, "KeyTooLongError"), "x").code(), Code::kInvalidArgument);
  EXPECT_EQ(s3::ToStatus(Err(503, "SlowDown"), "x").code(), Code::kUnavailable);
  EXPECT_EQ(s3::ToStatus(Err(500, "InternalError"), "x").code(), Code::kUnavailable);
  EXPECT_EQ(s3::ToStatus(Err(409, "ConditionalRequestConflict"), "x").code(), Code::kUnavailable);
  EXPECT_EQ(s3::ToStatus(Err(409, "BucketNotEmpty"), "x").code(), Code::kPreconditionFailed);
  // Not "the key exists": a create that gets it must not count as landed.
  EXPECT_EQ(s3::ToStatus(Err(409, "InvalidBucketState"), "x").code(), Code::kIOError);
  EXPECT_EQ(s3::ToStatus(Err(409, "XMinioObjectExistsAsDirectory"), "x").code(), Code::kIOError);
  EXPECT_EQ(s3::ToStatus(s3::ParseError(409, "", "r1"), "x").code(), Code::kIOError);
  EXPECT_EQ(s3::ToStatus(Err(501, "NotImplemented"), "x").code(), Code::kNotSupported);
  const Status moved = s3::ToStatus(Err(301, "PermanentRedirect"), "x");
  EXPECT_EQ(moved.code(), Code::kIOError);  // a wrong region is not worth retrying
  EXPECT_NE(moved.message().find("region="), std::string::npos) << moved.message();

  for (auto [status, code] : std::vector<std::pair<long, std::string>>{
           {500, "InternalError"}, {503, "SlowDown"}, {400, "RequestTimeout"}, {409, "ConditionalRequestConflict"},
           {408, ""}, {400, "IncompleteBody"}, {400, "BadDigest"}, {400, "XAmzContentSHA256Mismatch"}}) {
    EXPECT_TRUE(s3::IsRetryable(Err(status, code))) << code;
  }
  for (auto [status, code] : std::vector<std::pair<long, std::string>>{
           {403, "AccessDenied"}, {404, "NoSuchKey"}, {412, "PreconditionFailed"}, {400, "InvalidArgument"},
           {501, "NotImplemented"}}) {
    EXPECT_FALSE(s3::IsRetryable(Err(status, code))) << code;
  }
  EXPECT_TRUE(s3::MayHaveBeenApplied(Err(500, "InternalError")));
  EXPECT_FALSE(s3::MayHaveBeenApplied(Err(409, "ConditionalRequestConflict")));  // refused, not applied
  const s3::Error junk = s3::ParseError(502, "<html>bad gateway</html>", "");
  EXPECT_TRUE(junk.code.empty());
  EXPECT_EQ(s3::ToStatus(junk, "x").code(), Code::kUnavailable);
}

TEST(S3Protocol, ContentRange) {
  auto r = s3::ParseContentRange("bytes 5-9/100");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, 5u);
  EXPECT_EQ(r->last, 9u);
  EXPECT_EQ(r->total, std::optional<uint64_t>(100));
  r = s3::ParseContentRange("bytes 0-0/*");
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->total.has_value());
  for (const char* bad : {"", "bytes", "bytes 5-4/10", "bytes 5-9/9", "bytes -9/10", "bytes 1-2", "items 0-1/2",
                          "bytes 0-1/x", "bytes 0-1/2 "}) {
    EXPECT_FALSE(s3::ParseContentRange(bad).has_value()) << bad;
  }
}

TEST(S3Protocol, UrlDecode) {
  EXPECT_EQ(*s3::UrlDecode("a%20b+c%2b"), "a b c+");
  EXPECT_EQ(*s3::UrlDecode("a+b", false), "a+b");
  EXPECT_FALSE(s3::UrlDecode("%").ok());
  EXPECT_FALSE(s3::UrlDecode("%4").ok());
  EXPECT_FALSE(s3::UrlDecode("%zz").ok());
}

// Sets or clears an environment variable for one test, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(S3Uri, DefaultsAndParameters) {
  ScopedEnv a("AWS_ACCESS_KEY_ID", "envkey"), b("AWS_SECRET_ACCESS_KEY", "envsecret"), c("AWS_SESSION_TOKEN", "tok"),
      d("AWS_REGION", nullptr);
  auto o = ParseS3Uri("s3://bucket");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->bucket, "bucket");
  EXPECT_EQ(o->prefix, "");
  EXPECT_EQ(o->endpoint, "");
  EXPECT_EQ(o->region, "us-east-1");
  EXPECT_FALSE(o->path_style.has_value());
  EXPECT_EQ(o->access_key, "envkey");
  EXPECT_EQ(o->secret_key, "envsecret");
  EXPECT_EQ(o->session_token, "tok");
  EXPECT_FALSE(o->allow_unconditional_put);

  o = ParseS3Uri(
      "s3://b/some/prefix/?endpoint=http%3A%2F%2F127.0.0.1%3A7480/&region=eu-west-3&path_style=false"
      "&access_key=AK&secret_key=a%2Bb/c+d&allow_unconditional_put=true&max_connections=8");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->prefix, "some/prefix");
  EXPECT_EQ(o->endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(o->region, "eu-west-3");
  EXPECT_EQ(o->path_style, false);
  EXPECT_EQ(o->access_key, "AK");
  EXPECT_EQ(o->secret_key, "a+b/c+d");  // '+' is literal in parameters
  EXPECT_EQ(o->session_token, "");      // URI credentials do not mix with the environment's
  EXPECT_TRUE(o->allow_unconditional_put);
  EXPECT_EQ(o->max_connections, 8);
}

TEST(S3Uri, ErrorsNameTheProblemAndHideSecrets) {
  ScopedEnv a("AWS_ACCESS_KEY_ID", nullptr), b("AWS_SECRET_ACCESS_KEY", nullptr);
  const Status none = ParseS3Uri("s3://bucket/p").status();
  EXPECT_EQ(none.code(), Code::kInvalidArgument);
  EXPECT_NE(none.message().find("AWS_ACCESS_KEY_ID"), std::string::npos) << none.message();

  const Status bad = ParseS3Uri("s3://b?secret_key=hunter2&access_key=a&bogus=1&session_token=zz9sessionzz").status();
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("bogus"), std::string::npos) << bad.message();
  EXPECT_EQ(bad.message().find("hunter2"), std::string::npos) << bad.message();
  EXPECT_EQ(bad.message().find("zz9sessionzz"), std::string::npos) << bad.message();
  const Status bad2 = OpenObjectStore("s3://b?access_key=a&secret_key=hunter2&endpoint=ftp://x").status();
  EXPECT_NE(bad2.message().find("http"), std::string::npos) << bad2.message();
  EXPECT_EQ(bad2.message().find("hunter2"), std::string::npos) << bad2.message();

  for (const char* uri : {"s3://", "s3:///p", "s3://b?path_style=yes&access_key=a&secret_key=s",
                          "s3://b?max_connections=0&access_key=a&secret_key=s", "s3://b/a//c?access_key=a&secret_key=s",
                          "s3://b?region=&access_key=a&secret_key=s", "s3://b?endpoint=%zz"}) {
    EXPECT_EQ(ParseS3Uri(uri).status().code(), Code::kInvalidArgument) << uri;
  }
}

// Options for bucket `bucket` at `endpoint` ("" = AWS) with dummy credentials.
S3Options DummyOptions(std::string bucket, std::string endpoint) {
  S3Options o;
  o.bucket = std::move(bucket);
  o.endpoint = std::move(endpoint);
  o.access_key = "a";
  o.secret_key = "topsecret";
  return o;
}

TEST(S3Uri, AStoreThatCannotConnectFailsToOpenClearly) {
  // Port 1 on loopback refuses connections: the probe fails with the cause.
  S3Options o = DummyOptions("b", "http://127.0.0.1:1");
  o.max_attempts = 2;
  o.retry_initial = std::chrono::milliseconds(1);
  auto store = OpenS3Store(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Code::kUnavailable) << store.status().ToString();
  EXPECT_NE(store.status().message().find("probing the object store"), std::string::npos)
      << store.status().ToString();
  EXPECT_NE(store.status().message().find("127.0.0.1:1"), std::string::npos) << store.status().ToString();
}

TEST(S3Uri, DescribeShowsWhereButNoSecrets) {
  S3Options o = DummyOptions("bkt", "");
  o.prefix = "pre";
  o.probe_conditional_put = false;
  auto aws = OpenS3Store(o);
  ASSERT_TRUE(aws.ok());
  EXPECT_EQ((*aws)->Describe(), "s3://bkt/pre (endpoint https://s3.us-east-1.amazonaws.com, region us-east-1, virtual host)");
  // A dotted bucket on AWS goes path style (its name is no single host label
  // the certificate covers), unless asked otherwise.
  S3Options dotted = DummyOptions("weir.prod", "");
  dotted.probe_conditional_put = false;
  auto dotted_aws = OpenS3Store(dotted);
  ASSERT_TRUE(dotted_aws.ok());
  EXPECT_EQ((*dotted_aws)->Describe(),
            "s3://weir.prod/ (endpoint https://s3.us-east-1.amazonaws.com, region us-east-1, path style)");
  dotted.path_style = false;
  auto dotted_virtual = OpenS3Store(dotted);
  ASSERT_TRUE(dotted_virtual.ok());
  EXPECT_NE((*dotted_virtual)->Describe().find("virtual host"), std::string::npos);
  o.endpoint = "http://localhost:9000";
  auto local = OpenS3Store(o);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)->Describe(), "s3://bkt/pre (endpoint http://localhost:9000, region us-east-1, path style)");
  EXPECT_EQ((*local)->Put("a//b", "x").code(), Code::kInvalidArgument);
  EXPECT_EQ((*local)->Put(std::string(1022, 'k'), "x").code(), Code::kInvalidArgument);  // with "pre/": 1026
  EXPECT_EQ((*local)->Put("bad\xff", "x").code(), Code::kInvalidArgument);
  EXPECT_EQ((*local)->List("", {}, 0).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace weir::objstore
