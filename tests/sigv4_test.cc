// SigV4 against published vectors: AWS's Signature Version 4 test suite
// (credentials AKIDEXAMPLE, 2015-08-30T12:36:00Z, us-east-1, service
// "service") and the worked S3 examples of the S3 API reference
// ("examplebucket", 2013-05-24). Expected signatures are AWS's, not ours.
#include "objstore/sigv4.h"

#include <gtest/gtest.h>

namespace weir::objstore::sigv4 {
namespace {

const Credentials kSuite{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
constexpr std::string_view kSuiteDate = "20150830T123600Z";
const Credentials kS3Docs{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr std::string_view kS3Date = "20130524T000000Z";

// A suite request: Host and X-Amz-Date plus `extra` headers.
Request Suite(std::string method, Pairs query = {}, Pairs extra = {}, std::string_view body = "") {
  Request r;
  r.method = std::move(method);
  r.canonical_uri = "/";
  r.query = std::move(query);
  r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", std::string(kSuiteDate)}};
  for (auto& h : extra) r.headers.push_back(std::move(h));
  r.payload_sha256 = Sha256Hex(body);
  return r;
}

Signed SignSuite(const Request& r) { return Sign(r, kSuite, "us-east-1", "service", kSuiteDate); }

// An S3 docs request to examplebucket with x-amz-date and x-amz-content-sha256.
Request S3Example(std::string method, std::string uri, Pairs query, Pairs extra, std::string_view body) {
  Request r;
  r.method = std::move(method);
  r.canonical_uri = std::move(uri);
  r.query = std::move(query);
  r.payload_sha256 = Sha256Hex(body);
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-date", std::string(kS3Date)},
               {"x-amz-content-sha256", r.payload_sha256}};
  for (auto& h : extra) r.headers.push_back(std::move(h));
  return r;
}

Signed SignS3(const Request& r) { return Sign(r, kS3Docs, "us-east-1", "s3", kS3Date); }

TEST(SigV4Suite, GetVanilla) {
  const Signed s = SignSuite(Suite("GET"));
  EXPECT_EQ(s.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(s.string_to_sign.substr(0, s.string_to_sign.rfind('\n')),
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, "
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST(SigV4Suite, GetVanillaQueryOrderKeyCase) {
  const Signed s = SignSuite(Suite("GET", {{"Param2", "value2"}, {"Param1", "value1"}}));
  EXPECT_NE(s.canonical_request.find("\nParam1=value1&Param2=value2\n"), std::string::npos) << s.canonical_request;
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
            "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0");
  EXPECT_EQ(s.signature, "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST(SigV4Suite, PostVanilla) {
  EXPECT_EQ(SignSuite(Suite("POST")).signature, "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

TEST(SigV4Suite, PostVanillaQuery) {
  EXPECT_EQ(SignSuite(Suite("POST", {{"Param1", "value1"}})).signature,
            "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11");
}

TEST(SigV4Suite, PostHeaderKeyCaseAndSort) {
  // Header names are lowercased and sorted, whatever their case and order.
  for (const char* name : {"My-Header1", "MY-HEADER1", "my-header1"}) {
    const Signed s = SignSuite(Suite("POST", {}, {{name, "value1"}}));
    EXPECT_EQ(s.signed_headers, "host;my-header1;x-amz-date");
    EXPECT_EQ(s.signature, "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c") << name;
  }
}

TEST(SigV4Suite, PostHeaderValueCase) {
  // Values keep their case.
  EXPECT_EQ(SignSuite(Suite("POST", {}, {{"My-Header1", "VALUE1"}})).signature,
            "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d");
}

TEST(SigV4Suite, GetHeaderKeyDuplicate) {
  // Repeated headers join their values with commas, in order.
  const Signed joined = SignSuite(Suite("GET", {}, {{"My-Header1", "value2,value2,value1"}}));
  const Signed repeated =
      SignSuite(Suite("GET", {}, {{"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}}));
  EXPECT_EQ(joined.signature, "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea");
  EXPECT_EQ(repeated.signature, joined.signature);
}

TEST(SigV4Suite, PostXWwwFormUrlencoded) {
  const Signed s = SignSuite(Suite("POST", {}, {{"Content-Type", "application/x-www-form-urlencoded"}}, "Param1=value1"));
  EXPECT_EQ(Sha256Hex("Param1=value1"), "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
  // The same digest from pieces (s3:// PutParts hashes a segment this way).
  const std::string_view pieces[] = {"Param", "", "1=val", "ue1"};
  EXPECT_EQ(Sha256Hex(std::span<const std::string_view>(pieces)),
            "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
  EXPECT_EQ(Sha256Hex(std::span<const std::string_view>()), std::string(kEmptySha256));
  EXPECT_EQ(s.canonical_request,
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
            "x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n"
            "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
            "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=content-type;host;x-amz-date, "
            "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a");
}

TEST(SigV4Suite, HeaderValuesAreTrimmedAndSpacesCollapsed) {
  const Signed a = SignSuite(Suite("GET", {}, {{"My-Header1", "  a   b  c "}}));
  EXPECT_NE(a.canonical_request.find("\nmy-header1:a b c\n"), std::string::npos) << a.canonical_request;
}

TEST(SigV4S3Examples, GetObjectWithRange) {
  const Signed s = SignS3(S3Example("GET", "/test.txt", {}, {{"Range", "bytes=0-9"}}, ""));
  EXPECT_EQ(s.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4S3Examples, PutObjectWithPayload) {
  const std::string body = "Welcome to Amazon S3.";
  EXPECT_EQ(Sha256Hex(body), "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  const Signed s = SignS3(S3Example("PUT", "/" + UriEncode("test$file.text", false), {},
                                    {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
                                    body));
  EXPECT_TRUE(s.canonical_request.starts_with("PUT\n/test%24file.text\n\n")) << s.canonical_request;
  EXPECT_EQ(s.signed_headers, "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(s.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4S3Examples, GetBucketLifecycle) {
  const Signed s = SignS3(S3Example("GET", "/", {{"lifecycle", ""}}, {}, ""));
  EXPECT_NE(s.canonical_request.find("\nlifecycle=\n"), std::string::npos);
  EXPECT_EQ(Sha256Hex(s.canonical_request), "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca");
  EXPECT_EQ(s.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4S3Examples, ListObjects) {
  const Signed s = SignS3(S3Example("GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}, ""));
  EXPECT_NE(s.canonical_request.find("\nmax-keys=2&prefix=J\n"), std::string::npos);
  EXPECT_EQ(s.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4S3Examples, SessionTokenIsSigned) {
  Request r = S3Example("GET", "/test.txt", {}, {{"x-amz-security-token", "token"}}, "");
  const Signed with = SignS3(r);
  EXPECT_NE(with.signed_headers.find("x-amz-security-token"), std::string::npos);
  EXPECT_NE(with.signature, SignS3(S3Example("GET", "/test.txt", {}, {}, "")).signature);
}

TEST(SigV4Encoding, UriEncode) {
  EXPECT_EQ(UriEncode("AZaz09-._~", true), "AZaz09-._~");
  EXPECT_EQ(UriEncode("a b+c=d&e/f", false), "a%20b%2Bc%3Dd%26e/f");
  EXPECT_EQ(UriEncode("a/b", true), "a%2Fb");
  EXPECT_EQ(UriEncode("\xe1\x88\xb4", false), "%E1%88%B4");
  EXPECT_EQ(UriEncode(std::string("\x00\xff", 2), true), "%00%FF");
  EXPECT_EQ(UriEncode("$*'()!", true), "%24%2A%27%28%29%21");
}

TEST(SigV4Encoding, CanonicalQuerySortsEncodedNames) {
  EXPECT_EQ(CanonicalQuery({{"b", "2"}, {"a", "1"}, {"A", "0"}}), "A=0&a=1&b=2");
  EXPECT_EQ(CanonicalQuery({{"prefix", "a b/c"}, {"list-type", "2"}, {"delete", ""}}),
            "delete=&list-type=2&prefix=a%20b%2Fc");
  EXPECT_EQ(CanonicalQuery({}), "");
}

TEST(SigV4Encoding, HashesAndDates) {
  EXPECT_EQ(Sha256Hex(""), kEmptySha256);
  EXPECT_EQ(Md5Base64(""), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(Md5Base64("The quick brown fox jumps over the lazy dog"), "nhB9nTcrtoJr2B01QqQZ1g==");
  // RFC 4231 test case 2.
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(AmzDate(std::chrono::system_clock::time_point(std::chrono::seconds(1440938160))), "20150830T123600Z");
}

}  // namespace
}  // namespace weir::objstore::sigv4
