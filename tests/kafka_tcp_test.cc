// The Kafka listener's transport (src/kafka/tcp_server.h): the request byte
// budget across connections and the connection limit, over real sockets.
#include "kafka/tcp_server.h"

#include <deque>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "socket_util.h"

namespace weir::kafka {
namespace {

using weir::testing::ClosedByPeer;
using weir::testing::Connect;
using weir::testing::SendAll;
using weir::testing::ServerSideKeepsAlive;
using weir::testing::WaitUntil;

using namespace std::chrono_literals;

// Holds every request unanswered until told to answer; echoes the frame.
class HoldingHandler : public FrameHandler {
 public:
  void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
    std::string frame(bytes.view());
    std::lock_guard lk(mu_);
    held_.emplace_back(std::move(frame), std::move(reply));
    cv_.notify_all();
  }
  // Waits until `n` requests have arrived (false on timeout).
  bool WaitFor(size_t n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return held_.size() >= n; });
  }
  size_t count() {
    std::lock_guard lk(mu_);
    return held_.size();
  }
  // Answers request i with its own frame.
  void Answer(size_t i) {
    std::lock_guard lk(mu_);
    held_[i].second->Respond(held_[i].first);
  }
  void AnswerAll() {
    std::lock_guard lk(mu_);
    for (auto& [frame, reply] : held_) reply->Respond(frame);
  }
  // Drops every Reply (and with them the connections), while the server the
  // connections belong to still exists.
  void Clear() {
    std::lock_guard lk(mu_);
    held_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, std::shared_ptr<Reply>>> held_;
};

// A TcpServer on a free port with a HoldingHandler; torn down in an order
// that lets the held replies (and their connections) go before the server.
class KafkaTcpServer : public ::testing::Test {
 protected:
  void Start(TcpServerOptions o) {
    o.port = 0;
    auto s = TcpServer::Start(o, &handler);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(*s);
    addr = server->address();
  }
  void TearDown() override {
    if (server) server->Stop();
    handler.Clear();
    server.reset();
  }

  HoldingHandler handler;
  std::unique_ptr<TcpServer> server;
  std::string addr;
};

bool SendFrame(int fd, const std::string& body) {
  std::string wire(4, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  wire[0] = static_cast<char>(n >> 24);
  wire[1] = static_cast<char>(n >> 16);
  wire[2] = static_cast<char>(n >> 8);
  wire[3] = static_cast<char>(n);
  wire += body;
  return SendAll(fd, wire);
}

// Reads one response frame's body; "" on EOF, error or timeout.
std::string ReadFrame(int fd, int timeout_ms = 10000) {
  std::string out;
  size_t want = 4;
  bool header = true;
  while (out.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return "";
    char buf[4096];
    ssize_t r = ::recv(fd, buf, std::min(sizeof buf, want - out.size()), 0);
    if (r <= 0) return "";
    out.append(buf, static_cast<size_t>(r));
    if (header && out.size() == 4) {
      want = 4 + ((static_cast<uint32_t>(static_cast<uint8_t>(out[0])) << 24) |
                  (static_cast<uint32_t>(static_cast<uint8_t>(out[1])) << 16) |
                  (static_cast<uint32_t>(static_cast<uint8_t>(out[2])) << 8) |
                  static_cast<uint32_t>(static_cast<uint8_t>(out[3])));
      header = false;
    }
  }
  return out.substr(4);
}

// A client gone without a FIN or RST (its host lost) is found by TCP
// keep-alive; a quiet connection would otherwise be held for good.
TEST_F(KafkaTcpServer, AcceptedConnectionsKeepAlive) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int fd = Connect(addr);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ServerSideKeepsAlive(fd));
  ::close(fd);
}

TEST_F(KafkaTcpServer, RequestsOverTheByteBudgetWaitUnreadUntilEarlierOnesAreAnswered) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .max_in_flight_bytes = 1000, .small_frame_bytes = 0}));

  int a = Connect(addr), b = Connect(addr), c = Connect(addr);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_GE(c, 0);
  ASSERT_TRUE(SendFrame(a, std::string(600, 'a')));
  ASSERT_TRUE(handler.WaitFor(1));
  ASSERT_TRUE(SendFrame(b, std::string(600, 'b')));  // 600 + 600 > 1000: waits
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().budget_waits.load() == 1; }));
  ASSERT_TRUE(SendFrame(c, std::string(300, 'c')));  // would fit, but b came first
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().budget_waits.load() == 2; }));
  EXPECT_EQ(handler.count(), 1u);
  EXPECT_EQ(server->metrics().in_flight_bytes.load(), 600);

  handler.Answer(0);  // frees 600: b (600) is read, then c (300) fits too
  EXPECT_EQ(ReadFrame(a), std::string(600, 'a'));
  ASSERT_TRUE(handler.WaitFor(3));
  EXPECT_EQ(server->metrics().in_flight_bytes.load(), 900);
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(b), std::string(600, 'b'));
  EXPECT_EQ(ReadFrame(c), std::string(300, 'c'));
  EXPECT_EQ(server->metrics().in_flight_bytes.load(), 0);

  // A frame larger than the whole budget is read when it is alone.
  ASSERT_TRUE(SendFrame(a, std::string(5000, 'x')));
  ASSERT_TRUE(handler.WaitFor(4));
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(a), std::string(5000, 'x'));
  for (int fd : {a, b, c}) ::close(fd);
}

TEST_F(KafkaTcpServer, AWaitingConnectionThatClosesGivesItsTurnAway) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .max_in_flight_bytes = 1000, .small_frame_bytes = 0}));
  int a = Connect(addr), b = Connect(addr), c = Connect(addr);
  ASSERT_TRUE(SendFrame(a, std::string(900, 'a')));
  ASSERT_TRUE(handler.WaitFor(1));
  // b announces a 900-byte frame, waits for budget, and leaves before sending it.
  const char header[4] = {0, 0, 0x03, static_cast<char>(0x84)};
  ASSERT_EQ(::send(b, header, 4, MSG_NOSIGNAL), 4);
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().budget_waits.load() == 1; }));
  ASSERT_TRUE(SendFrame(c, std::string(900, 'c')));
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().budget_waits.load() == 2; }));
  ::close(b);
  handler.Answer(0);
  EXPECT_EQ(ReadFrame(a), std::string(900, 'a'));
  ASSERT_TRUE(handler.WaitFor(2));  // b's turn came, its read failed, and c was read
  handler.Answer(1);
  EXPECT_EQ(ReadFrame(c), std::string(900, 'c'));
  EXPECT_EQ(handler.count(), 2u);
  EXPECT_EQ(server->metrics().in_flight_bytes.load(), 0);
  ::close(a);
  ::close(c);
}

// Draining: a connection with a request in flight gets its answer, then
// closes; one accepted after the drain began is closed at once.
TEST_F(KafkaTcpServer, DrainingAnswersThenClosesAndTakesNoNewConnection) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int a = Connect(addr);
  ASSERT_TRUE(SendFrame(a, "one"));
  ASSERT_TRUE(handler.WaitFor(1));
  server->CloseConnectionsWhenAnswered();
  int late = Connect(addr);  // the listener is still open (StopAccepting not called)
  ASSERT_GE(late, 0);
  EXPECT_TRUE(ClosedByPeer(late));
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(a), "one");
  EXPECT_TRUE(ClosedByPeer(a));
  EXPECT_TRUE(WaitUntil([&] { return server->metrics().open_connections.load() == 0; }));
  ::close(a);
  ::close(late);
}

// Stop after the drain began lets an answer already given be written whole.
TEST_F(KafkaTcpServer, StopAfterTheDrainLetsAnswersBeWritten) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int fd = Connect(addr);
  const std::string big(16u << 20, 'k');  // more than the socket buffers hold
  ASSERT_TRUE(SendFrame(fd, big));
  ASSERT_TRUE(handler.WaitFor(1));
  server->CloseConnectionsWhenAnswered();
  handler.AnswerAll();
  std::string got;
  std::thread reader([&] { got = ReadFrame(fd); });
  server->Stop();
  reader.join();
  EXPECT_EQ(got.size(), big.size());
  ::close(fd);
}

TEST_F(KafkaTcpServer, ConnectionsOverTheLimitAreClosed) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 2}));
  int a = Connect(addr), b = Connect(addr);
  ASSERT_TRUE(SendFrame(a, "one"));
  ASSERT_TRUE(SendFrame(b, "two"));
  ASSERT_TRUE(handler.WaitFor(2));  // both accepted and registered
  int c = Connect(addr);
  ASSERT_GE(c, 0);  // the kernel accepts; the server closes it at once
  EXPECT_TRUE(ClosedByPeer(c));
  EXPECT_EQ(server->metrics().rejected_connections.load(), 1u);
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(a), "one");
  EXPECT_EQ(ReadFrame(b), "two");
  ::close(c);
  // A slot frees up when a connection closes.
  ::close(a);
  int d = -1;
  for (int i = 0; i < 100 && d < 0; ++i) {
    std::this_thread::sleep_for(50ms);
    if (server->metrics().open_connections.load() < 2) d = Connect(addr);
  }
  ASSERT_GE(d, 0);
  ASSERT_TRUE(SendFrame(d, "three"));
  ASSERT_TRUE(handler.WaitFor(3));
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(d), "three");
  ::close(b);
  ::close(d);
}


// "p<ms>": PostInOrder work that sleeps ms; "r": RunInOrder work. Each logs
// when it starts and ends (and for "r" whether it ran on a worker), then
// answers with its frame.
class OrderingHandler : public FrameHandler {
 public:
  void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
    std::string frame(bytes.view());
    if (frame[0] == 'p') {
      int ms = std::stoi(frame.substr(1));
      reply->PostInOrder([this, frame, reply, ms] {
        Log("start " + frame);
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        Log("end " + frame);
        reply->Respond(frame);
      });
    } else {
      reply->RunInOrder([this, frame, reply](bool on_worker) {
        Log(frame + (on_worker ? " on a worker" : " inline"));
        reply->Respond(frame);
      });
    }
  }
  std::vector<std::string> log() {
    std::lock_guard lk(mu_);
    return log_;
  }

 private:
  void Log(std::string line) {
    std::lock_guard lk(mu_);
    log_.push_back(std::move(line));
  }
  std::mutex mu_;
  std::vector<std::string> log_;
};

TEST(KafkaTcpOrdering, OrderedWorkRunsInRequestOrderOneAtATime) {
  OrderingHandler handler;
  auto server = TcpServer::Start({.port = 0, .worker_threads = 4}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  // Pipelined: a slow piece of work first; the quick ones behind it wait.
  ASSERT_TRUE(SendFrame(fd, "p1000") && SendFrame(fd, "p0") && SendFrame(fd, "r1"));
  EXPECT_EQ(ReadFrame(fd), "p1000");
  EXPECT_EQ(ReadFrame(fd), "p0");
  EXPECT_EQ(ReadFrame(fd), "r1");
  EXPECT_EQ(handler.log(),
            (std::vector<std::string>{"start p1000", "end p1000", "start p0", "end p0", "r1 on a worker"}));
  // With nothing pending, RunInOrder work runs at once on the I/O thread. (The
  // worker that answered r1 counts its work done just after answering, so the
  // next request may still find it pending: try a few times.)
  bool inline_seen = false;
  for (int i = 2; i < 200 && !inline_seen; ++i) {
    std::string frame = "r" + std::to_string(i);
    ASSERT_TRUE(SendFrame(fd, frame));
    ASSERT_EQ(ReadFrame(fd), frame);
    inline_seen = handler.log().back() == frame + " inline";
    if (!inline_seen) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(inline_seen) << "RunInOrder never ran inline with nothing pending";
  ::close(fd);
  (*server)->Stop();
}

// Reads (Post, PostOneAtATime: Fetch) run on threads of their own: one
// that waits long (a cold read from the object store) never holds up the
// ordered work of any connection (produces, commits, heartbeats).
TEST(KafkaTcpOrdering, ASlowReadDoesNotHoldUpOrderedWork) {
  struct Handler : FrameHandler {
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
      std::string frame(bytes.view());
      if (frame == "read") {
        reply->PostOneAtATime([this, reply] {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] { return release; });
          reply->Respond("read");
        });
      } else if (frame == "admit") {  // a Produce waiting for room looks again on a timer
        reply->PostInOrder([reply] {
          std::shared_ptr<SuspendedWork> waiting = reply->SuspendInOrder();
          reply->WorkAfter(1ms, [reply, waiting] {
            reply->Respond("admit");
            waiting->Resume(nullptr);
          });
        });
      } else {
        reply->PostInOrder([frame, reply] { reply->Respond(frame); });
      }
    }
    void Release() {
      {
        std::lock_guard lk(mu);
        release = true;
      }
      cv.notify_all();
    }
  } handler;
  auto server = TcpServer::Start({.port = 0, .worker_threads = 1, .read_threads = 1}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  // However the test ends, the read is let go before the server stops.
  std::shared_ptr<void> release(nullptr, [&](void*) { handler.Release(); });
  int reader = Connect((*server)->address()), writer = Connect((*server)->address());
  ASSERT_TRUE(SendFrame(reader, "read"));
  std::this_thread::sleep_for(100ms);  // the read holds its thread
  ASSERT_TRUE(SendFrame(writer, "produce"));
  const std::string got = ReadFrame(writer, 20000);
  // WorkAfter's timers run their work on the ordered-work threads too.
  ASSERT_TRUE(SendFrame(writer, "admit"));
  const std::string admitted = ReadFrame(writer, 20000);
  handler.Release();
  EXPECT_EQ(got, "produce") << "ordered work waited for a read";
  EXPECT_EQ(admitted, "admit") << "a timer's work waited for a read";
  EXPECT_EQ(ReadFrame(reader), "read");
  ::close(reader);
  ::close(writer);
  (*server)->Stop();
}

// A client that announces a frame and sends it slowly cannot hold its budget
// for long: the body must be whole within the stall timeout.
TEST_F(KafkaTcpServer, ABodyNotWholeWithinTheStallTimeoutClosesTheConnection) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .stall_timeout = 300ms}));
  int a = Connect(addr);
  ASSERT_GE(a, 0);
  const char header[4] = {0, 0, 0x03, static_cast<char>(0x84)};  // 900 bytes
  ASSERT_EQ(::send(a, header, 4, MSG_NOSIGNAL), 4);
  ASSERT_EQ(::send(a, "only a part", 11, MSG_NOSIGNAL), 11);
  EXPECT_TRUE(ClosedByPeer(a, 10000));
  EXPECT_EQ(server->metrics().stalled.load(), 1u);
  EXPECT_TRUE(WaitUntil([&] { return server->metrics().in_flight_bytes.load() == 0; }));
  EXPECT_EQ(handler.count(), 0u);
  // A body sent whole, however long after its size, is read.
  int b = Connect(addr);
  ASSERT_TRUE(SendFrame(b, "prompt"));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(b), "prompt");
  ::close(a);
  ::close(b);
}

// A connection is not idle while a request arrives: a body that takes
// longer than the idle timeout (but not the stall timeout) is read whole.
TEST_F(KafkaTcpServer, ARequestArrivingSlowlyIsNotClosedAsIdle) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 10000, .stall_timeout = 60s, .idle_timeout = 1500ms}));
  int a = Connect(addr);
  ASSERT_GE(a, 0);
  const std::string body(900, 'x');
  const char header[4] = {0, 0, 0x03, static_cast<char>(0x84)};  // 900 bytes
  ASSERT_EQ(::send(a, header, 4, MSG_NOSIGNAL), 4);
  ASSERT_EQ(::send(a, body.data(), 10, MSG_NOSIGNAL), 10);
  std::this_thread::sleep_for(4000ms);  // more than two idle timeouts
  ASSERT_TRUE(SendAll(a, body.substr(10)));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.AnswerAll();
  EXPECT_EQ(ReadFrame(a), body);
  ::close(a);
}

// A connection whose answered responses are not written (its client does
// not read) reads no further request past max_unwritten_bytes.
TEST_F(KafkaTcpServer, ReadingPausesWhileTooManyResponseBytesAreUnwritten) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_unwritten_bytes = 1 << 20}));
  int a = Connect(addr);
  const std::string big(8 << 20, 'x');  // echoed: more than the socket buffers hold
  ASSERT_TRUE(SendFrame(a, big));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.Answer(0);
  ASSERT_TRUE(SendFrame(a, "next"));
  std::this_thread::sleep_for(300ms);  // room for a wrong read to show
  EXPECT_EQ(handler.count(), 1u);
  EXPECT_EQ(ReadFrame(a, 30000).size(), big.size());
  ASSERT_TRUE(handler.WaitFor(2));  // read once the response was written
  handler.Answer(1);
  EXPECT_EQ(ReadFrame(a), "next");
  ::close(a);
}

// The count of unwritten response bytes (all connections) comes back to 0
// when a client leaves with a response half written, and when a response
// comes after its client left.
TEST_F(KafkaTcpServer, UnwrittenBytesAreGivenBackWhenClientsLeave) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  int a = Connect(addr);
  const std::string big(8 << 20, 'x');  // echoed: more than the socket buffers hold
  ASSERT_TRUE(SendFrame(a, big));
  ASSERT_TRUE(handler.WaitFor(1));
  handler.Answer(0);
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().unwritten_bytes.load() == int64_t{8} << 20; }));
  ::close(a);  // mid-write
  EXPECT_TRUE(WaitUntil([&] { return server->metrics().unwritten_bytes.load() == 0; }));

  int b = Connect(addr);
  ASSERT_TRUE(SendFrame(b, std::string(100000, 'y')));
  ASSERT_TRUE(handler.WaitFor(2));
  ::close(b);
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().open_connections.load() == 0; }));
  handler.Answer(1);  // into the void
  EXPECT_TRUE(WaitUntil([&] { return server->metrics().unwritten_bytes.load() == 0; }));
  EXPECT_EQ(server->metrics().unwritten_bytes.load(), 0);
}

// Small frames (heartbeats, commits, fetch requests) have a share of the
// budget of their own: big frames waiting for room never hold them up.
TEST_F(KafkaTcpServer, SmallFramesDoNotWaitBehindBigOnes) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_request_bytes = 1 << 20, .max_in_flight_bytes = 800 << 10}));
  int a = Connect(addr), b = Connect(addr), c = Connect(addr);
  ASSERT_TRUE(SendFrame(a, std::string(600 << 10, 'a')));  // the big share (700 KiB) is mostly taken
  ASSERT_TRUE(handler.WaitFor(1));
  ASSERT_TRUE(SendFrame(b, std::string(600 << 10, 'b')));  // waits for it
  ASSERT_TRUE(WaitUntil([&] { return server->metrics().budget_waits.load() == 1; }));
  ASSERT_TRUE(SendFrame(c, "heartbeat"));  // read at once, from its own share
  ASSERT_TRUE(handler.WaitFor(2));
  handler.Answer(1);
  EXPECT_EQ(ReadFrame(c), "heartbeat");
  EXPECT_EQ(handler.count(), 2u);  // b still waits
  handler.Answer(0);
  EXPECT_EQ(ReadFrame(a, 30000).size(), size_t{600} << 10);
  ASSERT_TRUE(handler.WaitFor(3));
  handler.Answer(2);
  EXPECT_EQ(ReadFrame(b, 30000).size(), size_t{600} << 10);
  for (int fd : {a, b, c}) ::close(fd);
}

// Every request goes through PostOneAtATime and answers with `size` bytes.
class BigAnswerHandler : public FrameHandler {
 public:
  explicit BigAnswerHandler(size_t size) : size_(size) {}
  void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
    std::string frame(bytes.view());
    reply->PostOneAtATime([this, frame = std::move(frame), reply] {
      room_ = reply->ResponseRoom(/*small=*/true);
      large_room_ = reply->ResponseRoom(/*small=*/false);
      started_++;
      std::string answer = frame;
      answer.resize(size_, '.');
      reply->Respond(std::move(answer));
    });
  }
  int started() const { return started_.load(); }
  size_t room() const { return room_.load(); }  // ResponseRoom when the last one started
  size_t large_room() const { return large_room_.load(); }

 private:
  size_t size_;
  std::atomic<int> started_{0};
  std::atomic<size_t> room_{0};
  std::atomic<size_t> large_room_{0};
};

TEST(KafkaTcpOneAtATime, AClientThatDoesNotReadHoldsOneLargeResponse) {
  // 16 MiB answers, far more than the socket buffers hold: while the client
  // reads nothing, the first answer's write cannot finish, so the requests
  // pipelined behind it are not started (their answers are not built).
  BigAnswerHandler handler(16 << 20);
  auto server = TcpServer::Start({.port = 0, .worker_threads = 4}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(SendFrame(fd, "f" + std::to_string(i)));
  ASSERT_TRUE(WaitUntil([&] { return handler.started() >= 1; }));
  std::this_thread::sleep_for(300ms);  // room for a wrong second start to show
  EXPECT_EQ(handler.started(), 1);
  for (int i = 0; i < 8; ++i) {
    std::string got = ReadFrame(fd, 30000);
    ASSERT_EQ(got.size(), size_t{16} << 20) << "response " << i;
    EXPECT_EQ(got.substr(0, 2), "f" + std::to_string(i));
  }
  EXPECT_EQ(handler.started(), 8);
  ::close(fd);
  (*server)->Stop();
}

// Responses not yet written count against one budget over all connections,
// which handlers see as ResponseRoom; written, they give it back.
TEST(KafkaTcpOneAtATime, UnwrittenResponsesShareOneBudget) {
  BigAnswerHandler handler(16 << 20);
  auto server = TcpServer::Start({.port = 0, .max_unwritten_total_bytes = 40 << 20}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int a = Connect((*server)->address());
  int b = Connect((*server)->address());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_TRUE(SendFrame(a, "a"));
  ASSERT_TRUE(WaitUntil([&] { return handler.started() == 1; }));
  EXPECT_EQ(handler.room(), size_t{40} << 20);
  EXPECT_EQ(handler.large_room(), size_t{35} << 20);  // the last eighth is for small answers
  // a reads nothing: its answer stays unwritten.
  ASSERT_TRUE(WaitUntil([&] { return (*server)->metrics().unwritten_bytes.load() == int64_t{16} << 20; }));
  ASSERT_TRUE(SendFrame(b, "b"));
  ASSERT_TRUE(WaitUntil([&] { return handler.started() == 2; }));
  EXPECT_EQ(handler.room(), size_t{24} << 20);
  EXPECT_EQ(handler.large_room(), size_t{19} << 20);
  EXPECT_EQ(ReadFrame(b, 30000).size(), size_t{16} << 20);
  EXPECT_EQ(ReadFrame(a, 30000).size(), size_t{16} << 20);
  EXPECT_TRUE(WaitUntil([&] { return (*server)->metrics().unwritten_bytes.load() == 0; }));
  ::close(a);
  ::close(b);
  (*server)->Stop();
}

// "o<ms>": PostInOrder work that sleeps ms, then answers with its frame
// padded to big_ bytes, or to a few bytes for "o<ms>s"; "b": PostOneAtATime
// work answering big_ bytes at once.
class MixedAnswerHandler : public FrameHandler {
 public:
  explicit MixedAnswerHandler(size_t big) : big_(big) {}
  void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
    std::string frame(bytes.view());
    if (frame[0] == 'b') {
      return reply->PostOneAtATime([this, frame = std::move(frame), reply] {
        std::string answer = frame;
        answer.resize(big_, '.');
        reply->Respond(std::move(answer));
      });
    }
    reply->PostInOrder([this, frame = std::move(frame), reply] {
      ordered_started_++;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(frame.substr(1))));
      std::string answer = frame;
      answer.resize(frame.back() == 's' ? frame.size() : big_, '.');
      reply->Respond(std::move(answer));
    });
  }
  int ordered_started() const { return ordered_started_.load(); }

 private:
  size_t big_;
  std::atomic<int> ordered_started_{0};
};

TEST(KafkaTcpOrdering, AClientThatDoesNotReadHoldsFewOrderedResponses) {
  // As Fetch's one at a time: ordered answers of 16 MiB, which the socket
  // buffers cannot take; a client reading nothing gets the rest built only
  // as it reads (Metadata, DescribeGroups and the like can be large).
  MixedAnswerHandler handler(16 << 20);
  auto server = TcpServer::Start({.port = 0, .worker_threads = 2}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(SendFrame(fd, "o" + std::to_string(i)));
  ASSERT_TRUE(WaitUntil([&] { return handler.ordered_started() >= 1; }));
  std::this_thread::sleep_for(300ms);  // room for wrong further starts to show
  EXPECT_LE(handler.ordered_started(), 2);
  for (int i = 0; i < 8; ++i) {
    std::string got = ReadFrame(fd, 30000);
    ASSERT_EQ(got.size(), size_t{16} << 20) << "response " << i;
    EXPECT_EQ(got.substr(0, 2), "o" + std::to_string(i));
  }
  EXPECT_EQ(handler.ordered_started(), 8);
  ::close(fd);
  (*server)->Stop();
}

TEST(KafkaTcpOrdering, WhileOrderedWorkWaitsNoFurtherRequestIsRead) {
  // Requests read then would hold their frames' budget for as long as the
  // client does not read (Kafka reads nothing more from such a connection).
  MixedAnswerHandler handler(16 << 20);
  auto server = TcpServer::Start({.port = 0, .worker_threads = 2}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendFrame(fd, "o0"));
  // The answer is built and waits for the client (requests read while it is
  // being built are read as pipelined ones).
  ASSERT_TRUE(WaitUntil([&] { return (*server)->metrics().unwritten_bytes.load() > 0; }));
  for (int i = 1; i < 6; ++i) ASSERT_TRUE(SendFrame(fd, "o" + std::to_string(i)));
  std::this_thread::sleep_for(300ms);  // room for wrong reads to show
  EXPECT_EQ((*server)->metrics().requests.load(), 1u);  // a frame whose header came in is held before its body
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ReadFrame(fd, 30000).substr(0, 2), "o" + std::to_string(i));
  EXPECT_EQ((*server)->metrics().requests.load(), 6u);
  ::close(fd);
  (*server)->Stop();
}

TEST(KafkaTcpOrdering, OrderedWorkWaitingForAClientThatLeftIsDropped) {
  // Run at the close it would take effect long after the client gave up.
  MixedAnswerHandler handler(16 << 20);
  auto server = TcpServer::Start({.port = 0, .worker_threads = 2}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(SendFrame(fd, "o" + std::to_string(i)));
  ASSERT_TRUE(WaitUntil([&] { return handler.ordered_started() >= 1; }));
  std::this_thread::sleep_for(300ms);
  const int started = handler.ordered_started();
  EXPECT_LE(started, 2);
  ::close(fd);
  ASSERT_TRUE(WaitUntil([&] { return (*server)->metrics().open_connections.load() == 0; }));
  std::this_thread::sleep_for(300ms);  // room for wrong starts to show
  EXPECT_EQ(handler.ordered_started(), started);
  EXPECT_EQ((*server)->metrics().in_flight_bytes.load(), 0);
  (*server)->Stop();
}

// Ordered work whose first function waits until the test opens the gate.
// Frames starting with 'n' get no response (as acks=0 Produces); the others
// are echoed.
class GatedOrderedHandler : public FrameHandler {
 public:
  void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
    std::string frame(bytes.view());
    const bool answers = frame[0] != 'n';
    reply->PostInOrder(
        [this, frame = std::move(frame), reply, answers] {
          if (started_++ == 0) gate_.get_future().wait();
          {
            std::lock_guard lk(mu_);
            ran_.push_back(frame);
          }
          if (answers) return reply->Respond(frame);
          reply->NoResponse();
        },
        answers);
  }
  void Open() { gate_.set_value(); }
  int started() const { return started_.load(); }
  std::vector<std::string> ran() {
    std::lock_guard lk(mu_);
    return ran_;
  }

 private:
  std::promise<void> gate_;
  std::atomic<int> started_{0};
  std::mutex mu_;
  std::vector<std::string> ran_;
};

TEST(KafkaTcpOrdering, OrderedWorkQueuedWhenTheClientLeavesRunsOnlyUpToTheFirstThatAnswers) {
  // Kafka reads a connection's next request only after answering the last:
  // of what a client pipelined before it left, requests that get no
  // response (acks=0) still run, up to the first that answers; that one
  // and the rest never do (a Produce that did would be appended twice once
  // the client retried it elsewhere). The drain is running, not parked,
  // when the client leaves.
  GatedOrderedHandler handler;
  auto server = TcpServer::Start({.port = 0, .worker_threads = 2}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  for (const char* f : {"o-gate", "n1", "n2", "o3", "n4", "o5"}) ASSERT_TRUE(SendFrame(fd, f));
  ASSERT_TRUE(WaitUntil([&] { return handler.started() == 1 && (*server)->metrics().in_flight.load() == 6; }));
  ::close(fd);
  ASSERT_TRUE(WaitUntil([&] { return (*server)->metrics().open_connections.load() == 0; }));
  handler.Open();
  ASSERT_TRUE(WaitUntil([&] { return (*server)->metrics().in_flight_bytes.load() == 0; }));
  std::this_thread::sleep_for(300ms);  // room for wrong starts to show
  EXPECT_EQ(handler.ran(), (std::vector<std::string>{"o-gate", "n1", "n2"}));
  (*server)->Stop();
}

// Ordered work for frames starting with 's' suspends itself (as a Produce
// waiting for admission) until the test resumes it; other frames are logged
// and echoed.
class SuspendingHandler : public FrameHandler {
 public:
  void Handle(Frame bytes, std::shared_ptr<Reply> reply) override {
    std::string frame(bytes.view());
    reply->PostInOrder([this, frame, reply] {
      if (frame[0] == 's') {
        Log("start " + frame);
        std::lock_guard lk(mu_);
        suspended_.push_back({frame, reply, reply->SuspendInOrder()});
        return;
      }
      Log(frame);
      reply->Respond(frame);
    });
  }
  // Resumes the oldest suspended work: it logs, then answers.
  void ResumeOne() {
    Suspended s;
    {
      std::lock_guard lk(mu_);
      ASSERT_FALSE(suspended_.empty());
      s = std::move(suspended_.front());
      suspended_.pop_front();
    }
    s.work->Resume([this, frame = s.frame, reply = s.reply] {
      Log("resumed " + frame);
      reply->Respond(frame);
    });
  }
  size_t suspended() {
    std::lock_guard lk(mu_);
    return suspended_.size();
  }
  std::vector<std::string> log() {
    std::lock_guard lk(mu_);
    return log_;
  }

 private:
  struct Suspended {
    std::string frame;
    std::shared_ptr<Reply> reply;
    std::shared_ptr<SuspendedWork> work;
  };
  void Log(std::string line) {
    std::lock_guard lk(mu_);
    log_.push_back(std::move(line));
  }
  std::mutex mu_;
  std::deque<Suspended> suspended_;
  std::vector<std::string> log_;
};

TEST(KafkaTcpOrdering, SuspendedOrderedWorkHoldsNoWorkerAndKeepsItsPlace) {
  // One worker: work that waited on it would hold every connection up.
  SuspendingHandler handler;
  auto server = TcpServer::Start({.port = 0, .worker_threads = 1}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int a = Connect((*server)->address());
  int b = Connect((*server)->address());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_TRUE(SendFrame(a, "s1"));
  ASSERT_TRUE(WaitUntil([&] { return handler.suspended() == 1; }));
  ASSERT_TRUE(SendFrame(a, "o2"));
  // Another connection's ordered work runs meanwhile.
  ASSERT_TRUE(SendFrame(b, "o3"));
  EXPECT_EQ(ReadFrame(b, 30000), "o3");
  std::this_thread::sleep_for(200ms);  // room for a wrong run of o2 to show
  EXPECT_EQ(handler.log(), (std::vector<std::string>{"start s1", "o3"}));
  EXPECT_EQ((*server)->metrics().requests.load(), 2u);  // a's second frame is held unread
  handler.ResumeOne();
  EXPECT_EQ(ReadFrame(a, 30000), "s1");
  EXPECT_EQ(ReadFrame(a, 30000), "o2");
  EXPECT_EQ(handler.log(), (std::vector<std::string>{"start s1", "o3", "resumed s1", "o2"}));
  ::close(a);
  ::close(b);
  (*server)->Stop();
}

TEST(KafkaTcpOrdering, ALargeAnswerQueuedBehindOrderedWorkDoesNotHoldItUp) {
  // The one-at-a-time request after "o0s" answers 16 MiB at once, while the
  // ordered work before it still sleeps: that answer waits for "o0s", so it
  // must not hold "o0s" back.
  MixedAnswerHandler handler(16 << 20);
  auto server = TcpServer::Start({.port = 0, .worker_threads = 2}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  for (const char* f : {"o300s", "o0s", "b"}) ASSERT_TRUE(SendFrame(fd, f));
  EXPECT_EQ(ReadFrame(fd, 30000), "o300s");
  EXPECT_EQ(ReadFrame(fd, 30000), "o0s");
  EXPECT_EQ(ReadFrame(fd, 30000).size(), size_t{16} << 20);
  ::close(fd);
  (*server)->Stop();
}

TEST(KafkaTcpOneAtATime, AClientThatStopsReadingIsClosedAfterTheStallTimeout) {
  BigAnswerHandler handler(64 << 20);  // far more than the socket buffers hold after what is read
  auto server = TcpServer::Start({.port = 0, .worker_threads = 2, .stall_timeout = 4s}, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int fd = Connect((*server)->address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendFrame(fd, "f0"));
  // Reading a little now and then is progress: the connection stays.
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1);  // the answer has begun
  size_t read = 0;
  for (int i = 0; i < 10; ++i) {  // 5 s in all, longer than the stall timeout
    std::this_thread::sleep_for(500ms);
    std::vector<char> buf(1 << 20);
    ASSERT_EQ(::poll(&p, 1, 30000), 1);  // the server may be slow to refill the buffers
    ssize_t r = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    ASSERT_GT(r, 0) << "closed while the client read";
    read += static_cast<size_t>(r);
  }
  ASSERT_LT(read, size_t{16} << 20);
  EXPECT_EQ((*server)->metrics().stalled.load(), 0u);
  // Reading nothing for longer than the stall timeout closes it.
  ASSERT_TRUE(WaitUntil([&] { return (*server)->metrics().stalled.load() == 1; }));
  EXPECT_TRUE(WaitUntil([&] { return (*server)->metrics().open_connections.load() == 0; }));
  ::close(fd);
  (*server)->Stop();
}

}  // namespace
}  // namespace weir::kafka
