// `weir bench http`'s response parser (bench/http_bench.h).
#include <gtest/gtest.h>

#include <string>

#include "bench/http_bench.h"

namespace weir::bench {
namespace {

TEST(BenchHttpParse, ContentLengthBodies) {
  const std::string ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 5\r\n\r\nhello";
  Response r;
  EXPECT_EQ(ParseResponse(ok, &r), Parsed::kDone);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(ok.substr(r.body_start, r.end - r.body_start), "hello");
  EXPECT_EQ(r.end, ok.size());
  EXPECT_FALSE(r.close);
  for (size_t cut = 0; cut < ok.size(); ++cut) {
    Response partial;
    EXPECT_EQ(ParseResponse(ok.substr(0, cut), &partial), Parsed::kIncomplete) << cut;
  }
  Response closing;
  EXPECT_EQ(ParseResponse("HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", &closing),
            Parsed::kDone);
  EXPECT_EQ(closing.status, 429);
  EXPECT_TRUE(closing.close);
  Response old;
  EXPECT_EQ(ParseResponse("HTTP/1.0 204 No Content\r\n\r\n", &old), Parsed::kDone);
  EXPECT_TRUE(old.close);
}

TEST(BenchHttpParse, ChunkedBodiesAndBodiesUntilClose) {
  const std::string chunked =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n";
  Response r;
  EXPECT_EQ(ParseResponse(chunked, &r), Parsed::kDone);
  EXPECT_EQ(r.end, chunked.size());
  for (size_t cut = 0; cut < chunked.size(); ++cut) {
    Response partial;
    EXPECT_EQ(ParseResponse(chunked.substr(0, cut), &partial), Parsed::kIncomplete) << cut;
  }
  const std::string trailers = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n\r\n";
  EXPECT_EQ(ParseResponse(trailers, &r), Parsed::kDone);
  EXPECT_EQ(r.end, trailers.size());
  Response open;
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\n\r\nsome", &open), Parsed::kIncomplete);
  EXPECT_TRUE(open.until_close);
}

TEST(BenchHttpParse, MalformedResponsesAreRejected) {
  Response r;
  EXPECT_EQ(ParseResponse("HTTX/1.1 200 OK\r\n\r\n", &r), Parsed::kBad);
  EXPECT_EQ(ParseResponse("HTTP/1.1 2x0 OK\r\n\r\n", &r), Parsed::kBad);
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\nno colon\r\n\r\n", &r), Parsed::kBad);
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", &r), Parsed::kBad);
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", &r), Parsed::kBad);
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc", &r), Parsed::kBad);
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\n" + std::string(70000, 'h'), &r), Parsed::kBad);  // head too long
  // Sizes that would wrap an offset past SIZE_MAX: never a finished response.
  EXPECT_EQ(ParseResponse("HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n", &r), Parsed::kBad);
  EXPECT_NE(ParseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffe\r\n0\r\n\r\n", &r),
            Parsed::kDone);
}

}  // namespace
}  // namespace weir::bench
