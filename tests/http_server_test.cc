// The HTTP server's transport (src/http/server.h): the request body budget
// across connections and the connection limit, over real sockets.
#include "http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "socket_util.h"

namespace weir::http {
namespace {

using weir::testing::ClosedByPeer;
using weir::testing::Connect;
using weir::testing::SendAll;
using weir::testing::ServerSideKeepsAlive;
using weir::testing::WaitUntil;

using namespace std::chrono_literals;

// Holds every request unanswered until told to answer; echoes the body.
class HoldingHandler : public Handler {
 public:
  void Handle(Request req, std::shared_ptr<Exchange> ex) override {
    std::lock_guard lk(mu_);
    heads_.push_back(std::move(req.headers));
    held_.emplace_back(std::move(req.body), std::move(ex));
    cv_.notify_all();
  }
  bool WaitFor(size_t n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return held_.size() >= n; });
  }
  size_t count() {
    std::lock_guard lk(mu_);
    return held_.size();
  }
  void Answer(size_t i) {
    std::lock_guard lk(mu_);
    held_[i].second->Respond(Response{200, "text/plain", held_[i].first, {}});
  }
  std::shared_ptr<Exchange> exchange(size_t i) {
    std::lock_guard lk(mu_);
    return held_[i].second;
  }
  std::string body(size_t i) {
    std::lock_guard lk(mu_);
    return held_[i].first;
  }
  HeaderList headers(size_t i) {
    std::lock_guard lk(mu_);
    return heads_[i];
  }
  void AnswerAll() {
    std::lock_guard lk(mu_);
    for (auto& [body, ex] : held_) ex->Respond(Response{200, "text/plain", body, {}});
  }
  void Clear() {
    std::lock_guard lk(mu_);
    held_.clear();
    heads_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, std::shared_ptr<Exchange>>> held_;
  std::vector<HeaderList> heads_;  // each held request's headers
};

class HttpServerLimits : public ::testing::Test {
 protected:
  void Start(ServerOptions o) {
    o.port = 0;
    o.io_threads = 1;
    o.worker_threads = 1;
    auto s = HttpServer::Start(o, &handler);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(*s);
    addr = server->address();
  }
  void TearDown() override {
    if (server) server->Stop();
    handler.Clear();
    server.reset();
  }
  const HttpServerMetrics& metrics() { return server->metrics(); }

  HoldingHandler handler;
  std::unique_ptr<HttpServer> server;
  std::string addr;
};

std::string PostHead(size_t length, bool expect_continue = false) {
  return "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(length) + "\r\n" +
         (expect_continue ? "Expect: 100-continue\r\n" : "") + "\r\n";
}

// Reads until `fd` has sent `until` (a whole response head, or the body of a
// response with Content-Length); "" on EOF, error or timeout.
std::string ReadUntil(int fd, const std::string& until, int timeout_ms = 10000) {
  std::string out;
  while (out.find(until) == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return "";
    char buf[4096];
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) return "";
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// Everything `fd` sends until it closes (or goes silent for 10 s).
std::string ReadUntilClosed(int fd) {
  std::string out;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return out;
    char buf[4096];
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) return out;
    out.append(buf, static_cast<size_t>(r));
  }
}

// What a client read of a response of 'z's: how many, and whether the
// connection ended (EOF or reset) rather than going silent for 10 s.
struct ReadZs {
  size_t zs = 0;
  bool ended = false;
};
ReadZs ReadToEnd(int fd) {
  ReadZs out;
  std::vector<char> buf(65536);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return out;
    ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
    if (r <= 0) {
      out.ended = true;
      return out;
    }
    out.zs += static_cast<size_t>(std::count(buf.begin(), buf.begin() + r, 'z'));
  }
}

// Nothing arrives on `fd` within `ms`.
bool Silent(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 0;
}

// A client gone without a FIN or RST (its host lost) is found by TCP
// keep-alive; a quiet connection would otherwise be held for good.
TEST_F(HttpServerLimits, AcceptedConnectionsKeepAlive) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ServerSideKeepsAlive(fd));
  ::close(fd);
}

TEST_F(HttpServerLimits, BodiesOverTheBudgetWaitUnreadUntilEarlierRequestsAreAnswered) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .max_in_flight_bytes = 1000}));
  int a = Connect(addr), b = Connect(addr), c = Connect(addr);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_GE(c, 0);
  ASSERT_TRUE(SendAll(a, PostHead(600) + std::string(600, 'a')));
  ASSERT_TRUE(handler.WaitFor(1));
  // b asks to continue with 600 bytes: 600 + 600 > 1000, so it waits, and
  // hears no 100 Continue meanwhile.
  ASSERT_TRUE(SendAll(b, PostHead(600, /*expect_continue=*/true)));
  ASSERT_TRUE(WaitUntil([&] { return metrics().budget_waits.load() == 1; }));
  ASSERT_TRUE(SendAll(c, PostHead(300) + std::string(300, 'c')));  // would fit, but b came first
  ASSERT_TRUE(WaitUntil([&] { return metrics().budget_waits.load() == 2; }));
  EXPECT_TRUE(Silent(b, 200));
  EXPECT_EQ(handler.count(), 1u);
  EXPECT_EQ(metrics().in_flight_bytes.load(), 600);

  handler.Answer(0);  // frees 600: b (600) is admitted, then c (300) fits too
  EXPECT_NE(ReadUntil(a, std::string(600, 'a')), "");
  EXPECT_NE(ReadUntil(b, "100 Continue\r\n\r\n"), "");
  ASSERT_TRUE(SendAll(b, std::string(600, 'b')));
  ASSERT_TRUE(handler.WaitFor(3));
  EXPECT_EQ(metrics().in_flight_bytes.load(), 900);
  handler.AnswerAll();
  EXPECT_NE(ReadUntil(b, std::string(600, 'b')), "");
  EXPECT_NE(ReadUntil(c, std::string(300, 'c')), "");
  EXPECT_TRUE(WaitUntil([&] { return metrics().in_flight_bytes.load() == 0; }));

  // A body larger than the whole budget is read when it is alone.
  ASSERT_TRUE(SendAll(a, PostHead(5000) + std::string(5000, 'x')));
  ASSERT_TRUE(handler.WaitFor(4));
  EXPECT_EQ(metrics().in_flight_bytes.load(), 5000);
  handler.AnswerAll();
  EXPECT_NE(ReadUntil(a, std::string(5000, 'x')), "");
  EXPECT_TRUE(WaitUntil([&] { return metrics().in_flight_bytes.load() == 0; }));
  for (int fd : {a, b, c}) ::close(fd);
}

// A chunked body counts as the limit only until its size is known, and a
// GET's body (meaningless to every handler) not at all once dispatched: a
// held read (an SSE session, a long poll) keeps none of the budget.
TEST_F(HttpServerLimits, HeldRequestsKeepOnlyTheBodyBytesTheyUse) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .max_in_flight_bytes = 15000}));
  int a = Connect(addr), b = Connect(addr), c = Connect(addr), d = Connect(addr);
  for (int fd : {a, b, c, d}) ASSERT_GE(fd, 0);
  const std::string chunked_head = "Host: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  ASSERT_TRUE(SendAll(a, "GET /x HTTP/1.1\r\n" + chunked_head + "0\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  ASSERT_TRUE(SendAll(b, "GET /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n" + std::string(5000, 'g')));
  ASSERT_TRUE(handler.WaitFor(2));
  ASSERT_TRUE(SendAll(c, "POST /x HTTP/1.1\r\n" + chunked_head + "3\r\nabc\r\n0\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(3));
  EXPECT_EQ(metrics().in_flight_bytes.load(), 3);
  // With three requests held, a body of nearly the whole budget still gets in.
  ASSERT_TRUE(SendAll(d, PostHead(9000) + std::string(9000, 'd')));
  ASSERT_TRUE(handler.WaitFor(4));
  EXPECT_EQ(metrics().budget_waits.load(), 0);
  handler.AnswerAll();
  EXPECT_NE(ReadUntil(c, "abc"), "");
  EXPECT_NE(ReadUntil(d, std::string(9000, 'd')), "");
  EXPECT_TRUE(WaitUntil([&] { return metrics().in_flight_bytes.load() == 0; }));
  for (int fd : {a, b, c, d}) ::close(fd);
}

// A request that waits for the budget longer than the stall timeout is
// refused (429), and the one behind it, which now fits, is read.
TEST_F(HttpServerLimits, ARequestWaitingForTheBudgetPastTheStallTimeoutGets429) {
  ServerOptions o;
  o.max_request_bytes = 10000;
  o.max_in_flight_bytes = 1000;
  o.stall_timeout = std::chrono::seconds(10);  // c must queue behind b within it
  ASSERT_NO_FATAL_FAILURE(Start(o));
  int a = Connect(addr), b = Connect(addr), c = Connect(addr);
  for (int fd : {a, b, c}) ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(a, PostHead(600) + std::string(600, 'a')));
  ASSERT_TRUE(handler.WaitFor(1));  // held: 600 of 1000 in use
  ASSERT_TRUE(SendAll(b, PostHead(900) + std::string(900, 'b')));
  ASSERT_TRUE(WaitUntil([&] { return metrics().budget_waits.load() == 1; }));
  ASSERT_TRUE(SendAll(c, PostHead(300) + std::string(300, 'c')));  // fits, but waits behind b
  ASSERT_TRUE(WaitUntil([&] { return metrics().budget_waits.load() == 2; }));
  const std::string refused = ReadUntilClosed(b);
  EXPECT_NE(refused.find("HTTP/1.1 429"), std::string::npos) << refused;
  EXPECT_NE(refused.find("rate_limited"), std::string::npos) << refused;
  EXPECT_NE(refused.find("\r\nRetry-After: 1\r\n"), std::string::npos) << refused;  // as every other 429
  EXPECT_GE(metrics().budget_timeouts.load(), 1u);
  ASSERT_TRUE(handler.WaitFor(2));  // c was read once b left the queue
  handler.AnswerAll();
  EXPECT_NE(ReadUntil(a, std::string(600, 'a')), "");
  EXPECT_NE(ReadUntil(c, std::string(300, 'c')), "");
  EXPECT_EQ(handler.count(), 2u);
  EXPECT_TRUE(WaitUntil([&] { return metrics().in_flight_bytes.load() == 0; }));
  for (int fd : {a, b, c}) ::close(fd);
}

TEST_F(HttpServerLimits, AWaitingConnectionThatClosesGivesItsTurnAway) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .max_in_flight_bytes = 1000}));
  int a = Connect(addr), b = Connect(addr), c = Connect(addr);
  ASSERT_TRUE(SendAll(a, PostHead(900) + std::string(900, 'a')));
  ASSERT_TRUE(handler.WaitFor(1));
  ASSERT_TRUE(SendAll(b, PostHead(900)));  // waits, and leaves before sending its body
  ASSERT_TRUE(WaitUntil([&] { return metrics().budget_waits.load() == 1; }));
  ASSERT_TRUE(SendAll(c, PostHead(900) + std::string(900, 'c')));
  ASSERT_TRUE(WaitUntil([&] { return metrics().budget_waits.load() == 2; }));
  ::close(b);
  handler.Answer(0);
  EXPECT_NE(ReadUntil(a, std::string(900, 'a')), "");
  ASSERT_TRUE(handler.WaitFor(2));  // b's turn came, its read failed, and c was read
  handler.Answer(1);
  EXPECT_NE(ReadUntil(c, std::string(900, 'c')), "");
  EXPECT_EQ(handler.count(), 2u);
  EXPECT_TRUE(WaitUntil([&] { return metrics().in_flight_bytes.load() == 0; }));
  ::close(a);
  ::close(c);
}

TEST_F(HttpServerLimits, ConnectionsOverTheLimitAreClosed) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 2}));
  int a = Connect(addr), b = Connect(addr);
  ASSERT_TRUE(SendAll(a, PostHead(3) + "one"));
  ASSERT_TRUE(SendAll(b, PostHead(3) + "two"));
  ASSERT_TRUE(handler.WaitFor(2));  // both accepted
  int c = Connect(addr);
  ASSERT_GE(c, 0);  // the kernel accepts; the server closes it at once
  EXPECT_TRUE(ClosedByPeer(c));
  EXPECT_EQ(metrics().rejected_connections.load(), 1u);
  handler.AnswerAll();
  EXPECT_NE(ReadUntil(a, "one"), "");
  EXPECT_NE(ReadUntil(b, "two"), "");
  ::close(c);
  // A place frees up when a connection closes.
  ::close(a);
  ASSERT_TRUE(WaitUntil([&] { return metrics().open_connections.load() < 2; }));
  int d = Connect(addr);
  ASSERT_GE(d, 0);
  ASSERT_TRUE(SendAll(d, PostHead(5) + "three"));
  ASSERT_TRUE(handler.WaitFor(3));
  handler.AnswerAll();
  EXPECT_NE(ReadUntil(d, "three"), "");
  EXPECT_EQ(metrics().connections.load(), 3u);
  ::close(b);
  ::close(d);
}

// A chunked body's chunk-size line (its extension) or trailer section that
// never ends is not read into memory without bound: Beast limits neither,
// the read buffer does (128 KiB), and the connection is closed.
TEST_F(HttpServerLimits, AnEndlessChunkLineOrTrailerClosesTheConnection) {
  Start(ServerOptions{});
  for (const std::string& lead : {std::string("1;"), std::string("0\r\n")}) {
    SCOPED_TRACE(lead == "1;" ? "chunk extension" : "trailer");
    const int fd = Connect(addr);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + lead));
    const std::string more = lead == "1;" ? std::string(64 * 1024, 'a') : [] {
      std::string t;
      while (t.size() < 64 * 1024) t += "x: y\r\n";
      return t;
    }();
    size_t sent = 0;
    for (int i = 0; i < 64 && SendAll(fd, more); ++i) sent += more.size();  // 4 MiB, or until closed
    EXPECT_TRUE(ReadToEnd(fd).ended) << "the server kept the connection after " << sent << " bytes";
    EXPECT_EQ(handler.count(), 0u);
    ::close(fd);
  }
}

// Trailer fields of a chunked body are dropped: not added to the request's
// headers (which the handler checked on the head), and one of 64 KiB or
// more, past Beast's field limit, no longer throws out of the read (which
// ended the process). The connection goes on.
TEST_F(HttpServerLimits, TrailerFieldsOfAChunkedBodyAreDropped) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nX-Head: h\r\n\r\n"
                          "2\r\nhi\r\n0\r\nX-Small: s\r\nX-Big: " +
                              std::string(70 * 1024, 'a') + "\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  EXPECT_EQ(handler.body(0), "hi");
  std::vector<std::string> names;
  for (const auto& [name, value] : handler.headers(0)) names.push_back(name);
  EXPECT_NE(std::find(names.begin(), names.end(), "x-head"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "x-small"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "x-big"), names.end());
  handler.Answer(0);
  EXPECT_TRUE(ReadUntil(fd, "hi").starts_with("HTTP/1.1 200"));
  ASSERT_TRUE(SendAll(fd, PostHead(3) + "two"));
  ASSERT_TRUE(handler.WaitFor(2));
  handler.Answer(1);
  EXPECT_NE(ReadUntil(fd, "two"), "");
  ::close(fd);
}

// A request the parser refuses gets 400 (431 for an oversized header)
// before the close, not a bare reset; a body coded other than chunked is
// refused, not left in the buffer to be read as the next request.
TEST_F(HttpServerLimits, MalformedRequestsGetAnAnswerBeforeTheClose) {
  Start(ServerOptions{});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nGET /y HTTP/1.1\r\nHost: t\r\n\r\n",
       "HTTP/1.1 400"},  // RFC 9112 §6.3: the last coding is not chunked
      {"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
       "HTTP/1.1 501"},  // §6.1: a transfer coding not understood
      {"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n", "HTTP/1.1 400"},
      // RFC 9112 §3.2: exactly one Host.
      {"GET /x HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
      {"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "HTTP/1.1 400"},
      {"GET /x HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(70 * 1024, 'a') + "\r\n\r\n", "HTTP/1.1 431"},
  };
  for (const auto& [bytes, status] : cases) {
    SCOPED_TRACE(status);
    const int fd = Connect(addr);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, bytes));
    const std::string got = ReadUntil(fd, "\r\n\r\n");
    EXPECT_TRUE(got.starts_with(status)) << got;
    EXPECT_TRUE(ReadToEnd(fd).ended);
    ::close(fd);
  }
  EXPECT_EQ(handler.count(), 0u);
}

// HTTP/1.0 has no chunked coding: a stream to an HTTP/1.0 client is sent as
// is and ends with the connection (and no 100 Continue is sent).
TEST_F(HttpServerLimits, AStreamToAnHttp10ClientIsNotChunked) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"));
  ASSERT_TRUE(handler.WaitFor(1));
  auto ex = handler.exchange(0);
  ex->BeginStream(200, "text/event-stream", {});
  ex->Write("event: ping\n\n", nullptr);
  ex->End();
  const std::string got = ReadUntilClosed(fd);
  EXPECT_TRUE(got.starts_with("HTTP/1.1 200")) << got;
  EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
  EXPECT_EQ(got.find("chunked"), std::string::npos) << got;
  EXPECT_TRUE(got.ends_with("\r\n\r\nevent: ping\n\n")) << got;
  ::close(fd);
}

// An HTTP/1.0 client keeps its connection only when the answer says
// `Connection: keep-alive` (RFC 9112 §9.3); one that did not ask is closed.
TEST_F(HttpServerLimits, AnHttp10KeepAliveIsAnsweredInKind) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.Answer(0);
  const std::string head = ReadUntil(fd, "\r\n\r\n");
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200")) << head;
  EXPECT_NE(head.find("Connection: keep-alive\r\n"), std::string::npos) << head;
  ASSERT_TRUE(SendAll(fd, "GET /b HTTP/1.0\r\n\r\n"));  // the same connection, not kept after
  ASSERT_TRUE(handler.WaitFor(2));
  handler.Answer(1);
  const std::string rest = ReadUntilClosed(fd);
  EXPECT_NE(rest.find("Connection: close\r\n"), std::string::npos) << rest;
  EXPECT_EQ(rest.find("keep-alive"), std::string::npos) << rest;
  ::close(fd);
}

// A client that asked for `Connection: close` is told so in a stream's head
// too (as in a Respond's), and the connection ends with the stream.
TEST_F(HttpServerLimits, AStreamSaysConnectionCloseWhenTheClientAskedForIt) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  auto ex = handler.exchange(0);
  ex->BeginStream(200, "text/event-stream", {});
  ex->Write("event: ping\n\n", nullptr);
  ex->End();
  const std::string head = ReadUntil(fd, "\r\n\r\n");
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200")) << head;
  EXPECT_NE(head.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos) << head;
  EXPECT_TRUE(ReadToEnd(fd).ended);
  ::close(fd);
}

// The 500 that answers a HEAD dropped without a response has no body
// (RFC 9110 §9.3.2), like every answer to a HEAD.
TEST_F(HttpServerLimits, AHeadDroppedWithoutAResponseGetsA500WithoutABody) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.Clear();  // the exchange goes unanswered
  const std::string got = ReadUntilClosed(fd);
  EXPECT_TRUE(got.starts_with("HTTP/1.1 500")) << got;
  EXPECT_TRUE(got.ends_with("Connection: close\r\n\r\n")) << got;
  ::close(fd);
}

// Once a drain begins, HTTP/1.1 answers say `Connection: close` (the client
// moves to another server) and the connection ends after them.
TEST_F(HttpServerLimits, ADrainsAnswersSayConnectionClose) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.Answer(0);
  const std::string before = ReadUntil(fd, "\r\n\r\n");
  EXPECT_TRUE(before.starts_with("HTTP/1.1 200")) << before;
  EXPECT_EQ(before.find("Connection: close"), std::string::npos) << before;
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(2));
  server->BeginDrain();
  handler.Answer(1);
  const std::string after = ReadUntil(fd, "\r\n\r\n");
  EXPECT_TRUE(after.starts_with("HTTP/1.1 200")) << after;
  EXPECT_NE(after.find("Connection: close\r\n"), std::string::npos) << after;
  EXPECT_TRUE(ReadToEnd(fd).ended);
  ::close(fd);
}

// A stream whose head promised keep-alive before a drain began keeps the
// connection after its end, as a Respond does: the client's next request,
// perhaps on its way already, is answered (the API says 503
// server_draining) instead of meeting a close.
TEST_F(HttpServerLimits, AStreamBegunBeforeADrainKeepsItsConnectionForTheNextAnswer) {
  Start(ServerOptions{});
  const int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  auto ex = handler.exchange(0);
  ex->BeginStream(200, "text/event-stream", {});
  ex->Write("event: ping\n\n", nullptr);
  const std::string head = ReadUntil(fd, "event: ping\n\n");
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200")) << head;
  EXPECT_EQ(head.find("Connection: close"), std::string::npos) << head;
  server->BeginDrain();
  ex->End();
  EXPECT_NE(ReadUntil(fd, "0\r\n\r\n"), "");
  ASSERT_TRUE(SendAll(fd, "GET /y HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(2)) << "the connection closed after the stream";
  handler.Answer(1);
  const std::string after = ReadUntilClosed(fd);
  EXPECT_TRUE(after.starts_with("HTTP/1.1 200")) << after;
  EXPECT_NE(after.find("Connection: close\r\n"), std::string::npos) << after;
  ::close(fd);
}

// Response bytes a client has not read count in unwritten_bytes (and come
// off ResponseRoom) until written, or until the connection that holds them
// closes.
TEST_F(HttpServerLimits, UnwrittenResponseBytesCountUntilWrittenOrDropped) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_unwritten_bytes = 64u << 20}));
  const size_t size = 16u << 20;  // more than the socket buffers hold
  for (bool read_it : {true, false}) {
    SCOPED_TRACE(read_it ? "read" : "dropped");
    handler.Clear();
    const int fd = Connect(addr);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
    ASSERT_TRUE(handler.WaitFor(1));
    auto ex = handler.exchange(0);
    EXPECT_EQ(ex->ResponseRoom(), ConnectionUnwrittenBudget(64u << 20));  // 4 MiB: the connection's share
    ex->Respond(Response{200, "text/plain", std::string(size, 'z'), {}});
    // The socket buffers take a few MiB at most; the rest waits for the client.
    ASSERT_TRUE(WaitUntil([&] { return metrics().unwritten_bytes.load() > static_cast<int64_t>(size / 2); }));
    EXPECT_EQ(ex->ResponseRoom(), 0u);  // its share is used up
    if (read_it) {  // the whole response, the connection kept open
      size_t zs = 0;
      std::vector<char> buf(65536);
      while (zs < size) {
        const ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
        ASSERT_GT(r, 0);
        zs += static_cast<size_t>(std::count(buf.begin(), buf.begin() + r, 'z'));
      }
      EXPECT_TRUE(WaitUntil([&] { return metrics().unwritten_bytes.load() == 0; }));
    }
    ::close(fd);
    EXPECT_TRUE(WaitUntil([&] { return metrics().unwritten_bytes.load() == 0; }))
        << metrics().unwritten_bytes.load() << " bytes still counted";
    EXPECT_EQ(ex->ResponseRoom(), ConnectionUnwrittenBudget(64u << 20));
  }
}

// Stop lets a response already answered reach its client whole.
TEST_F(HttpServerLimits, StopFinishesAResponseAlreadyAnswered) {
  ASSERT_NO_FATAL_FAILURE(Start({.stop_grace = 60s}));  // 16 MiB read by a sanitized reader on a loaded machine
  int fd = Connect(addr);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  const size_t size = 16u << 20;  // more than the socket buffers hold
  handler.exchange(0)->Respond(Response{200, "text/plain", std::string(size, 'z'), {}});
  ReadZs got;
  std::thread reader([&] { got = ReadToEnd(fd); });
  server->Stop();
  reader.join();
  EXPECT_EQ(got.zs, size);
  ::close(fd);
}

// Stop with a streamed chunk being written: the chunk is written, then the
// connection closes (it stayed open, idle, for good).
TEST_F(HttpServerLimits, StopClosesAStreamOnceItsChunkIsWritten) {
  ASSERT_NO_FATAL_FAILURE(Start({.stop_grace = 60s}));  // 16 MiB read by a sanitized reader on a loaded machine
  int fd = Connect(addr);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  auto ex = handler.exchange(0);
  ex->BeginStream(200, "text/plain", {});
  const size_t size = 16u << 20;
  ex->Write(std::string(size, 'z'), nullptr);
  std::this_thread::sleep_for(200ms);  // the write is under way, the socket buffers full
  ReadZs got;
  std::thread reader([&] { got = ReadToEnd(fd); });
  server->Stop();
  reader.join();
  EXPECT_EQ(got.zs, size);
  EXPECT_TRUE(got.ended) << "the connection stayed open after Stop";
  ::close(fd);
}

// A drain's CloseStalled judges progress: a large response to a client that
// reads slowly but steadily is not cut.
TEST_F(HttpServerLimits, CloseStalledSparesASlowResponseThatMoves) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int fd = Connect(addr);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  const size_t size = 48u << 20;
  handler.exchange(0)->Respond(Response{200, "text/plain", std::string(size, 'z'), {}});
  std::atomic<bool> done{false};
  size_t body = 0;
  std::thread reader([&] {
    std::vector<char> buf(512 << 10);
    while (body < size) {
      std::this_thread::sleep_for(50ms);  // about 10 MB/s: the whole response takes seconds
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) break;
      ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
      if (r <= 0) break;
      body += static_cast<size_t>(std::count(buf.begin(), buf.begin() + r, 'z'));
    }
    done = true;
  });
  while (!done) {
    server->CloseStalled(2500ms);
    std::this_thread::sleep_for(200ms);
  }
  reader.join();
  EXPECT_EQ(body, size);
  ::close(fd);
}

// A chunk written before any stream began is refused: its bytes would come
// before the response's head.
TEST_F(HttpServerLimits, AWriteBeforeBeginStreamIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int fd = Connect(addr);
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  auto refused = std::make_shared<std::atomic<int>>(0);
  handler.exchange(0)->Write("x", [refused](bool ok) { *refused += ok ? 0 : 1; });
  handler.exchange(0)->Respond(Response{503, "text/plain", "draining", {}});
  std::string got = ReadUntil(fd, "draining");
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_TRUE(WaitUntil([&] { return refused->load() == 1; }));
  ::close(fd);
}

// A drain closes a connection whose client stopped reading a streamed
// response (it would hold the drain until the stall timeout); an idle
// connection stays open.
TEST_F(HttpServerLimits, CloseStalledClosesOnlyConnectionsWhoseResponseStopped) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int idle = Connect(addr);
  int stuck = Connect(addr);
  ASSERT_TRUE(SendAll(stuck, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(handler.WaitFor(1));
  auto ex = handler.exchange(0);
  ex->BeginStream(200, "text/plain", {});
  // 64 MiB, far more than the loopback socket buffers hold: the client reads
  // nothing, so a write stops making progress.
  auto written = std::make_shared<std::atomic<int>>(0);
  auto failed = std::make_shared<std::atomic<int>>(0);
  const std::string chunk(1 << 20, 'x');
  constexpr int kChunks = 64;
  for (int i = 0; i < kChunks; ++i) ex->Write(chunk, [written, failed](bool ok) { (ok ? *written : *failed)++; });
  std::this_thread::sleep_for(1500ms);
  ASSERT_LT(written->load(), kChunks);
  EXPECT_EQ(failed->load(), 0);
  server->CloseStalled(24h);  // stuck, but not for that long: nothing happens
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(failed->load(), 0);
  server->CloseStalled(500ms);
  ASSERT_TRUE(WaitUntil([&] { return written->load() + failed->load() == kChunks; }));
  EXPECT_GT(failed->load(), 0);
  ex->End();
  // The stuck client sees its connection end (after what the buffers held).
  EXPECT_TRUE(ReadToEnd(stuck).ended);
  // The idle connection is still served.
  ASSERT_TRUE(SendAll(idle, PostHead(4) + "idle"));
  ASSERT_TRUE(handler.WaitFor(2));
  handler.Answer(1);
  EXPECT_NE(ReadUntil(idle, "idle"), "");
  ::close(idle);
  ::close(stuck);
}

// A streamed response's writes keep the order of the calls, whichever thread
// makes them: one made on the connection's I/O thread does not overtake one
// another thread made before it.
TEST(HttpServerStreams, WritesFromTheIoThreadKeepTheirTurn) {
  class Handler final : public http::Handler {
   public:
    void Handle(Request, std::shared_ptr<Exchange> ex) override {
      ex->BeginStream(200, "text/plain", {});
      std::thread([ex] { ex->Write("a", nullptr); }).join();  // queued behind this call
      ex->Write("b", nullptr);
      ex->End();
    }
  } handler;
  ServerOptions o;
  o.port = 0;
  o.io_threads = 1;
  o.worker_threads = 1;
  auto server = HttpServer::Start(o, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_TRUE(SendAll(fd, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  std::string got = ReadUntil(fd, "0\r\n\r\n");
  EXPECT_NE(got.find("\r\n1\r\na\r\n1\r\nb\r\n0\r\n\r\n"), std::string::npos) << got;
  ::close(fd);
  (*server)->Stop();
}

}  // namespace
}  // namespace weir::http
