// client: the JSON codec, S2 error bodies as Status, the SSE parser,
// URL building, how a connection names a connect that never completed. The
// end-to-end CLI test is cli_test.py.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <vector>

#include "client/client.h"
#include "client/codec.h"
#include "client/http.h"
#include "test_support.h"

namespace weir::client {
namespace {

TEST(Codec, AppendInputIsBase64WithConditions) {
  AppendRecord r;
  r.body = std::string("\0\xff", 2);
  r.headers = {{"k", "v"}};
  r.timestamp = 5;
  AppendOptions o;
  o.match_seq_num = 3;
  o.fencing_token = "tok";
  EXPECT_EQ(EncodeAppendInput({r, AppendRecord{}}, o),
            R"({"fencing_token":"tok","match_seq_num":3,"records":[{"body":"AP8=","headers":[["aw==","dg=="]],)"
            R"("timestamp":5},{"body":""}]})");
}

TEST(Codec, DecodesReadBatchAndAck) {
  ASSERT_OK_AND_ASSIGN(
      ReadBatch b,
      DecodeReadBatch(R"({"records":[{"seq_num":7,"timestamp":9,"headers":[["","dHJpbQ=="]],"body":"AP8="},)"
                      R"({"seq_num":8,"timestamp":9,"headers":[],"body":"aGk="}],"tail":{"seq_num":9,"timestamp":9}})"));
  ASSERT_EQ(b.records.size(), 2u);
  EXPECT_EQ(b.records[0].seq_num, 7u);
  EXPECT_EQ(b.records[0].body, std::string("\0\xff", 2));
  EXPECT_TRUE(b.records[0].IsCommand());
  EXPECT_EQ(b.records[1].body, "hi");
  EXPECT_FALSE(b.records[1].IsCommand());
  ASSERT_TRUE(b.tail.has_value());
  EXPECT_EQ(b.tail->seq_num, 9u);

  ASSERT_OK_AND_ASSIGN(AppendAck ack, DecodeAppendAck(R"({"start":{"seq_num":1,"timestamp":2},)"
                                                      R"("end":{"seq_num":3,"timestamp":2},)"
                                                      R"("tail":{"seq_num":3,"timestamp":2},"duplicated":true})"));
  EXPECT_EQ(ack.start.seq_num, 1u);
  EXPECT_EQ(ack.end.seq_num, 3u);
  EXPECT_TRUE(ack.duplicated);

  EXPECT_EQ(DecodeReadBatch(R"({"records":[{"seq_num":1,"body":"not base64!"}]})").status().code(), Code::kInternal);
  EXPECT_EQ(DecodeAppendAck("<html>").status().code(), Code::kInternal);
}

TEST(Codec, StreamConfigDefaultsAndInfinite) {
  ASSERT_OK_AND_ASSIGN(StreamConfig c, DecodeStreamConfig(R"({"storage_class":"express",)"
                                                          R"("retention_policy":{"infinite":{}},)"
                                                          R"("timestamping":{"mode":"arrival","uncapped":true}})"));
  EXPECT_EQ(c.storage_class, "express");
  EXPECT_FALSE(c.retention_age_s.has_value());
  EXPECT_EQ(c.timestamping_mode, "arrival");
  EXPECT_TRUE(c.timestamping_uncapped);
  ASSERT_OK_AND_ASSIGN(StreamConfig d, DecodeStreamConfig("{}"));
  EXPECT_EQ(d.retention_age_s, 7 * 24 * 3600);
  EXPECT_EQ(d.timestamping_mode, "client-prefer");
}

TEST(Codec, ErrorsAreOneLineNamingTheSubject) {
  Status st = ApiError(404, R"({"code":"stream_not_found","message":"no such stream"})", {"", "s1"});
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(), R"(stream "s1" not found (404 stream_not_found))");
  st = ApiError(404, R"({"code":"basin_not_found","message":"x"})", {"my-basin", "s1"});
  EXPECT_EQ(st.message(), R"(basin "my-basin" not found (404 basin_not_found))");
  st = ApiError(409, R"({"code":"resource_already_exists","message":"x"})", {"", "s1"});
  EXPECT_EQ(st.code(), Code::kAlreadyExists);
  EXPECT_EQ(st.message(), R"(stream "s1" already exists (409 resource_already_exists))");
  st = ApiError(412, R"({"seq_num_mismatch":5})", {"", "s1"});
  EXPECT_EQ(st.code(), Code::kPreconditionFailed);
  EXPECT_EQ(st.message(), R"(seq_num mismatch: stream "s1" has its tail at 5 (412 seq_num_mismatch))");
  st = ApiError(412, R"({"fencing_token_mismatch":"abc"})", {"", "s1"});
  EXPECT_EQ(st.message(), R"(fencing token mismatch: stream "s1" has token "abc" (412 fencing_token_mismatch))");
  st = ApiError(416, R"({"code":"range_not_satisfiable","tail":{"seq_num":4,"timestamp":0}})", {"", "s1"});
  EXPECT_EQ(st.code(), Code::kOutOfRange);
  EXPECT_EQ(st.message(),
            R"(the read starts past the tail of stream "s1" (next seq_num 4) (416 range_not_satisfiable))");
  st = ApiError(422, R"({"code":"invalid","message":"basin name too short"})", {"ab", ""});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "basin name too short (422 invalid)");
  EXPECT_EQ(ApiError(429, R"({"code":"backpressure","message":"busy"})", {}).code(), Code::kResourceExhausted);
  EXPECT_EQ(ApiError(503, "", {}).code(), Code::kUnavailable);
  EXPECT_EQ(ApiError(503, "", {}).message(), "the server answered HTTP 503 (503)");
  // Not JSON (another server, a proxy's page): said so, without its HTML.
  EXPECT_EQ(ApiError(502, "<html>\nbad gateway</html>", {}).message(),
            "the server answered HTTP 502 with a body that is not JSON: is it a weir server? (and no proxy in "
            "between)");
  EXPECT_EQ(ApiError(502, "<html>\nbad gateway</html>", {}).code(), Code::kUnavailable);
  EXPECT_EQ(ApiError(409, R"({"code":"invalid_producer_epoch","message":"m"})", {}).code(), Code::kFenced);
  EXPECT_EQ(ApiError(409, R"({"code":"out_of_order_sequence","message":"m"})", {}).code(),
            Code::kPreconditionFailed);
  EXPECT_NE(ApiError(401, R"({"code":"unauthorized","message":"bad token"})", {}).message().find("--auth-token"),
            std::string::npos);
}

std::vector<SseEvent> ParseInChunks(std::string_view text, size_t chunk) {
  SseParser p;
  std::vector<SseEvent> out;
  for (size_t i = 0; i < text.size(); i += chunk) {
    p.Feed(text.substr(i, chunk), [&](const SseEvent& e) {
      out.push_back(e);
      return true;
    });
  }
  return out;
}

TEST(Sse, ParsesEventsSplitAnywhere) {
  const std::string text =
      ": a comment\r\n"
      "event: batch\r\nid: 3,3,30\r\ndata: {\"records\":[]}\r\n\r\n"
      "event: ping\ndata: {\"timestamp\": 1}\n\n"
      "data: line1\rdata:line2\r\r"
      "event: done\ndata: [DONE]\n\n";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    auto ev = ParseInChunks(text, chunk);
    ASSERT_EQ(ev.size(), 4u) << chunk;
    EXPECT_EQ(ev[0].event, "batch");
    EXPECT_EQ(ev[0].id, "3,3,30");
    EXPECT_EQ(ev[0].data, "{\"records\":[]}");
    EXPECT_EQ(ev[1].event, "ping");
    EXPECT_EQ(ev[1].id, "");
    EXPECT_EQ(ev[2].event, "message");
    EXPECT_EQ(ev[2].data, "line1\nline2");
    EXPECT_EQ(ev[3].event, "done");
    EXPECT_EQ(ev[3].data, "[DONE]");
  }
}

TEST(Sse, StopsWhenTheCallbackSaysSo) {
  SseParser p;
  int seen = 0;
  EXPECT_FALSE(p.Feed("data: a\n\ndata: b\n\n", [&](const SseEvent&) { return ++seen < 1; }));
  EXPECT_EQ(seen, 1);
}

TEST(Url, EncodesNamesAndReadTargets) {
  EXPECT_EQ(UrlEncode("a b/c%é"), "a%20b%2Fc%25%C3%A9");
  EXPECT_EQ(UrlEncode("Az09-._~"), "Az09-._~");
  ReadOptions o;
  EXPECT_EQ(ReadTarget("s 1", o), "/v1/streams/s%201/records?seq_num=0");  // the server's default is the tail
  o.start = {ReadStart::Kind::kTailOffset, 5};
  o.count = 10;
  o.clamp = true;
  o.wait_s = 2;
  EXPECT_EQ(ReadTarget("s", o), "/v1/streams/s/records?tail_offset=5&count=10&clamp=true&wait=2");
}

// A listener whose accept queue is full: the kernel drops further SYNs, so a
// connect to it times out.
TEST(HttpConnection, AConnectThatTimesOutIsCannotConnectOnAConnectionThatNeverConnected) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&sa), len), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  // Connect until one does not complete: the queue is full from then on.
  std::vector<int> fillers;
  bool full = false;
  for (int i = 0; i < 16 && !full; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    fillers.push_back(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) continue;
    ASSERT_EQ(errno, EINPROGRESS);
    pollfd p{fd, POLLOUT, 0};
    full = ::poll(&p, 1, 1000) == 0;
  }
  ASSERT_TRUE(full) << "the accept queue never filled";

  auto conn = HttpConnection::Open("http://127.0.0.1:" + std::to_string(ntohs(sa.sin_port)));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  HttpRequest req;  // not a fresh connection: a kept-alive one is allowed
  req.target = "/health";
  req.connect_timeout_ms = 200;
  req.timeout_ms = 10000;
  auto resp = (*conn)->Do(req);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), Code::kUnavailable) << resp.status().ToString();
  EXPECT_TRUE(resp.status().message().starts_with("cannot connect to")) << resp.status().ToString();
  EXPECT_TRUE((*conn)->failed_before_connect());
  for (int fd : fillers) ::close(fd);
  ::close(listener);
}

}  // namespace
}  // namespace weir::client
