// The Kafka listener's transport: a TCP server for size-prefixed request
// frames (Kafka's framing: a 4-byte big-endian length, then the request).
// Boost.Asio stays inside tcp_server.cc; the broker sees whole frames and a
// Reply to answer on.
//
// Ownership and threads: the server front-end owns one TcpServer. Network I/O
// runs on `io_threads`; frames are handed to the FrameHandler on an I/O
// thread, and blocking work moves to `worker_threads` (in request order) or
// `read_threads` (Reply::Post, PostOneAtATime).
//
// Guarantees: requests on one connection may be handled concurrently
// (pipelining), but their responses are written in request order, as Kafka
// clients require, and work queued with Reply::PostInOrder/RunInOrder runs in
// request order, one at a time; a request that gets no response (acks=0) keeps its place
// until answered with NoResponse. A frame over max_request_bytes, or a Reply
// that asks to Close, closes the connection after the responses before it are
// written. At most max_in_flight requests per connection are outstanding;
// reading pauses until one is answered. Request frames read and not yet
// answered (or given back with Reply::ReleaseFrame) hold at most
// max_in_flight_bytes across all connections: a
// connection whose next frame does not fit waits (in arrival order) before
// reading its body, so memory stays bounded however many clients send; a
// frame alone is always admitted. Frames up to small_frame_bytes (heartbeats,
// commits, fetch requests) have a share of that budget of their own, so big
// frames waiting for room never hold them up. A frame's body must arrive
// within stall_timeout of being admitted, and a response write that makes no
// progress for stall_timeout closes the connection: a client that sends or
// reads slowly cannot hold the budget or its responses for long. A
// connection holding more than max_unwritten_bytes of answered, unwritten
// responses reads no further request until they are written, and one
// holding more than max_unwritten_ordered_bytes handles no further ordered
// request (PostInOrder, RunInOrder) until then. At most
// max_connections are open; more are closed on accept. A Reply dropped
// unanswered closes the connection (the client would otherwise wait
// forever).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "base/clock.h"
#include "base/ordered_queue.h"
#include "base/status.h"

namespace weir::kafka {

// One request's way back to its client. Made by the TcpServer for each
// frame and shared (shared_ptr) by the handler and its callbacks;
// thread-safe. Call exactly one of Respond, NoResponse or Close, once (later
// calls do nothing); one dropped unanswered closes the connection.
class Reply {
 public:
  virtual ~Reply() = default;
  // The whole response after the size prefix (correlation id, then the body).
  virtual void Respond(std::string response) = 0;
  virtual void NoResponse() = 0;
  // Closes the connection once the responses before this request are written.
  virtual void Close() = 0;
  // The handler holds none of the request's frame any more (it may wait
  // long for its answer, as a JoinGroup does): the frame's bytes go back to
  // max_in_flight_bytes now, not when it is answered. Once; any thread.
  virtual void ReleaseFrame() = 0;
  // Runs `fn` on a read thread soon (a pool of its own: reads that wait on
  // the object store never hold up the ordered work below).
  virtual void Post(std::function<void()> fn) = 0;
  // Kafka handles a connection's requests one after another; these keep that
  // order for requests with side effects. PostInOrder runs `fn` on a worker
  // thread once every earlier PostInOrder/RunInOrder work of the connection
  // has finished, one at a time. RunInOrder runs `fn` at once on the calling
  // (I/O) thread when no such work is pending, else queues it the same way;
  // `fn` learns which (true: on a worker, free to block).
  // Once the connection is closed, queued work is dropped, not run, as
  // Kafka's broker (which reads a request only after answering the last)
  // would never see it: except work whose request gets no response
  // (`answers` false: an acks=0 Produce), which Kafka reads and runs up to
  // the first request that answers.
  virtual void PostInOrder(std::function<void()> fn, bool answers = true) = 0;
  virtual void RunInOrder(std::function<void(bool on_worker)> fn, bool answers = true) = 0;
  // From ordered work on a worker: the work goes on later (SuspendedWork::
  // Resume) without holding the worker meanwhile, and until then the
  // connection runs no later ordered work and reads no further request, as
  // if the work were still running. For work that waits on something else
  // (a Produce waiting for the WAL to admit it): the few ordered-work
  // threads stay free for other connections.
  virtual std::shared_ptr<SuspendedWork> SuspendInOrder() = 0;
  // Runs `fn` on an ordered-work thread soon, outside the connection's
  // order: the steps of work suspended by SuspendInOrder (the read threads
  // of Post and After are Fetch's).
  virtual void PostWork(std::function<void()> fn) = 0;
  // PostWork after `delay`: the timers of waits that must not queue behind
  // reads from the object store (a Produce looking for room in the WAL pool).
  virtual void WorkAfter(Duration delay, std::function<void()> fn) = 0;
  // Runs `fn` on a read thread once the connection's earlier PostOneAtATime
  // request is answered and its response written (Kafka's broker reads no
  // further request until then). Requests whose responses may be large
  // (Fetch) go this way, so a client that stops reading holds one of them in
  // memory, not one per pipelined request. Dropped if the connection closes.
  virtual void PostOneAtATime(std::function<void()> fn) = 0;
  virtual void After(Duration delay, std::function<void()> fn) = 0;  // Post after `delay`
  // "ip:port" of the client.
  virtual const std::string& peer() const = 0;
  // The connection is gone; a response would be dropped.
  virtual bool closed() const = 0;
  // Bytes of responses the server may still hold, over all connections,
  // before max_unwritten_total_bytes: a handler building a large response
  // (Fetch) makes it fit, or waits. The last eighth of the budget is only for
  // `small` responses (at most about 1 MiB), so that while large ones fill
  // the rest, small ones still go out. A hint, read without locks: handlers
  // building at once may together pass the budget by what each builds.
  virtual size_t ResponseRoom(bool small) const {
    (void)small;
    return SIZE_MAX;
  }
};

// One request frame's bytes (without the size prefix). Allocated without
// being zero-filled, as the socket read fills it whole (a Produce frame is up
// to max_request_bytes). Move-only; owned by whoever handles the request.
class Frame {
 public:
  Frame() = default;
  explicit Frame(size_t size) : data_(std::make_unique_for_overwrite<char[]>(size)), size_(size) {}
  // A copy of `bytes` (tests, and callers that have the frame elsewhere).
  explicit Frame(std::string_view bytes) : Frame(bytes.size()) {
    if (!bytes.empty()) std::memcpy(data_.get(), bytes.data(), bytes.size());
  }
  Frame(Frame&& other) noexcept : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  Frame& operator=(Frame&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  char* data() { return data_.get(); }
  size_t size() const { return size_; }
  std::string_view view() const { return {data_.get(), size_}; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

// What TcpServer hands request frames to (the Broker). Owned by the server
// front-end and must outlive the TcpServer. Handle runs on an I/O thread and
// must not block; every frame must be answered on its Reply.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // Called on an I/O thread with one request frame; must not block. Must
  // eventually answer on `reply`.
  virtual void Handle(Frame frame, std::shared_ptr<Reply> reply) = 0;
};

struct TcpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 9092;  // 0 = the OS picks
  size_t max_request_bytes = 100u << 20;
  int io_threads = 1;
  int worker_threads = 4;  // ordered work (PostInOrder, RunInOrder)
  int read_threads = 4;    // Post, After, PostOneAtATime
  size_t max_in_flight = 64;                           // per connection
  size_t max_in_flight_bytes = 512u << 20;             // request frames, all connections
  // Frames up to this size are admitted from a share of max_in_flight_bytes
  // of their own (an eighth), the rest from the other seven eighths (0: one
  // budget for all).
  size_t small_frame_bytes = 64u << 10;
  size_t max_unwritten_bytes = 64u << 20;              // per connection: reading pauses past it
  // Responses answered and not yet written, over all connections (slow
  // readers each hold one Fetch answer of up to 64 MiB): Fetch answers are
  // cut to what is left (Reply::ResponseRoom; the last eighth for small ones).
  size_t max_unwritten_total_bytes = 512u << 20;
  // Per connection: ordered work (every request but Fetch) pauses past it,
  // so a client that reads no responses holds this plus one.
  size_t max_unwritten_ordered_bytes = 1u << 20;
  Duration stall_timeout = std::chrono::seconds(60);
  size_t max_connections = 4096;
  Duration idle_timeout = std::chrono::minutes(10);    // Kafka's connections.max.idle.ms
  // false: Start binds (address() is known) but accepts only once
  // StartAccepting is called, e.g. after the handler learned that address.
  bool accept_at_start = true;
};

struct TcpServerMetrics {
  std::atomic<uint64_t> connections{0}, requests{0}, oversized{0}, closed_by_handler{0};
  std::atomic<uint64_t> rejected_connections{0};  // over max_connections
  std::atomic<uint64_t> budget_waits{0};          // frames that waited for max_in_flight_bytes
  std::atomic<uint64_t> stalled{0};               // connections closed by stall_timeout
  std::atomic<int64_t> open_connections{0}, in_flight{0};
  std::atomic<int64_t> in_flight_bytes{0};        // request frames read and not yet answered
  std::atomic<int64_t> unwritten_bytes{0};        // responses answered and not yet written (all connections)
};

class TcpServer {
 public:
  static Result<std::unique_ptr<TcpServer>> Start(const TcpServerOptions& options, FrameHandler* handler);
  ~TcpServer();  // Stop()
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  std::string address() const;  // "host:port" actually bound
  const TcpServerMetrics& metrics() const;
  void StartAccepting();  // with accept_at_start = false; once
  void StopAccepting();
  // Draining: every connection reads no further request and closes once the
  // responses to those it read are written (clients reconnect elsewhere, or
  // after a restart); a connection accepted from now on is closed at once.
  void CloseConnectionsWhenAnswered();
  // Closes every connection and joins all threads. After
  // CloseConnectionsWhenAnswered it first gives connections up to 5 s to
  // write their answers and close.
  void Stop();

  class Impl;

 private:
  explicit TcpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weir::kafka
