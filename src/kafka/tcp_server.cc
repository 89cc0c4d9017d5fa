#include "kafka/tcp_server.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "base/byte_budget.h"
#include "base/log.h"
#include "base/ordered_queue.h"
#include "base/tcp.h"
#include "base/thread.h"

namespace weir::kafka {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

class Connection;

// TcpServer's state, owned by it. The io_context runs on io_threads; ordered work on `workers`, reads on
// `readers`; connections and replies reach it from any thread (atomics, the budgets' locks, mu). Members are
// declared so that replies destroyed with a pool or the io_context still find what they release into.
class TcpServer::Impl {
 public:
  Impl(const TcpServerOptions& o, FrameHandler* h)
      : options(o),
        handler(h),
        small_budget(SmallShare(o), &metrics.in_flight_bytes, &metrics.budget_waits),
        budget(std::max<size_t>(o.max_in_flight_bytes - SmallShare(o), 1), &metrics.in_flight_bytes,
               &metrics.budget_waits) {}

  static size_t SmallShare(const TcpServerOptions& o) {
    return o.small_frame_bytes == 0 ? 0 : std::max<size_t>(o.max_in_flight_bytes / 8, 1);
  }

  const TcpServerOptions options;
  FrameHandler* const handler;
  // Declared before ioc and workers: replies destroyed with their pending
  // handlers still count and release into these.
  TcpServerMetrics metrics;
  // Request frames (options.max_in_flight_bytes). The connections set keeps
  // waiting connections alive.
  // Small frames (options.small_frame_bytes) have a share of their own, so
  // they never wait behind big ones; which budget is a function of the size.
  ByteBudget<std::weak_ptr<Connection>> small_budget;
  ByteBudget<std::weak_ptr<Connection>> budget;
  ByteBudget<std::weak_ptr<Connection>>& BudgetFor(size_t n) {
    return n <= options.small_frame_bytes ? small_budget : budget;
  }
  void Release(size_t n) { BudgetFor(n).Release(n); }

  // Set once Stop joined the pools (before ioc: still there while the
  // io_context drops its pending timers): suspended work dropped then posts
  // nothing.
  std::atomic<bool> pools_joined{false};
  // Declared after ioc, so destroyed first: work posted to the pool after
  // Stop joined it (it never runs) holds connections, whose sockets and
  // strands belong to the io_context, which must still be there.
  net::io_context ioc;
  std::unique_ptr<net::thread_pool> workers;
  // Reply::Post, After and PostOneAtATime work (Fetch: reads that may go to
  // the object store), apart from the ordered work on `workers`.
  std::unique_ptr<net::thread_pool> readers;
  net::executor_work_guard<net::io_context::executor_type> guard{ioc.get_executor()};
  // On a strand: accept completions, retries and StopAccepting's close do not run at once.
  tcp::acceptor acceptor{net::make_strand(ioc)};
  net::steady_timer accept_retry{acceptor.get_executor()};  // after an accept error (out of file descriptors)
  std::vector<std::thread> io_threads;
  std::string bound;
  std::mutex mu;  // guards conns, stopped and draining
  std::set<std::shared_ptr<Connection>> conns;
  bool stopped = false;
  bool draining = false;  // CloseConnectionsWhenAnswered ran: a connection accepted since is closed

  void Accept();
  void Forget(const std::shared_ptr<Connection>& c) {
    std::lock_guard lk(mu);
    conns.erase(c);
  }
};

// One client connection. Owned by the server's conns set (until Forget), its async operations and its Replies.
// Its socket and I/O state are touched on its strand only (other threads post there, or touch atomics and the
// ordered queue); responses are written in request order, whatever order they are answered in.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(TcpServer::Impl* srv, tcp::socket socket)
      : srv_(srv),
        socket_(std::move(socket)),
        idle_(socket_.get_executor()),
        body_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {
    ErrorCode ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? "unknown" : ep.address().to_string() + ":" + std::to_string(ep.port());
    socket_.set_option(tcp::no_delay(true), ec);
    EnableTcpKeepAlive(socket_.native_handle());
  }

  // On the connection's strand (posted there, so a close posted after it
  // cannot run first).
  void Start() {
    net::post(socket_.get_executor(), [self = shared_from_this()] {
      self->srv_->metrics.connections++;
      self->srv_->metrics.open_connections++;
      self->ArmIdle();
      self->ReadHeader();
    });
  }

  // From any thread: closes the socket on the strand.
  void Shutdown() {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->CloseNow(); });
  }

  // TcpServer::CloseConnectionsWhenAnswered.
  void CloseWhenAnswered() {
    net::post(socket_.get_executor(), [self = shared_from_this()] {
      if (!self->closed_ && !self->stop_reading_) self->CloseAfterPending();
    });
  }

  void Answer(uint64_t seq, std::string response, bool respond, bool close) {
    if (respond) {
      in_transit_ += response.size();
      srv_->metrics.unwritten_bytes += static_cast<int64_t>(response.size());
    }
    net::post(socket_.get_executor(), [self = shared_from_this(), seq, response = std::move(response), respond,
                                       close]() mutable {
      self->OnAnswer(seq, std::move(response), respond, close);
    });
  }

  // Ordered work (Reply::PostInOrder / RunInOrder), drained on the workers.
  // Work that comes up after the close is skipped: Kafka reads a request
  // only after answering the last, so nothing a client pipelined before it
  // left takes effect after (its retry on a new connection would append
  // twice), except requests that get no response (acks=0), which Kafka
  // reads and runs up to the first that answers.
  void PostInOrder(std::function<void()> fn, bool answers = true) {
    auto item = [this, fn = std::move(fn), answers] {
      if (closed_.load() && (answers || skip_ordered_.load())) {
        skip_ordered_.store(true);  // this one, and everything after it
        return;
      }
      fn();
    };
    if (ordered_.Push(std::move(item))) DrainOrdered();
  }
  // A turn of the ordered work on the pool; posted again while more waits,
  // parked while the client has not read its responses (OrderedMustWait).
  void DrainOrdered() {
    net::post(*srv_->workers, [self = shared_from_this()] {
      switch (self->ordered_.RunSomeUnless([&] { return self->OrderedMustWait(); })) {
        case OrderedQueue::Turn::kMore: return self->DrainOrdered();
        case OrderedQueue::Turn::kPaused: return self->ParkOrdered();
        case OrderedQueue::Turn::kDone: return;
      }
    });
  }
  void RunInOrder(std::function<void(bool)> fn, bool answers = true) {
    if (!ordered_.Busy() && !OrderedMustWait()) return fn(false);
    PostInOrder([fn = std::move(fn)] { fn(true); }, answers);
  }
  // Kafka's broker handles a connection's next request once the last
  // response is sent. Here requests pipeline, but ordered work (every
  // request but Fetch, which goes one at a time, and ApiVersions and
  // FindCoordinator, answered at once) waits, and no further request is
  // read, while the connection holds
  // more than max_unwritten_ordered_bytes of responses it can write now (or
  // is writing): a client that stops reading holds that plus one response,
  // not one per pipelined request. Responses queued behind an unanswered
  // request do not count (that request may be the ordered work itself).
  // Any thread.
  // Also while ordered work is suspended, closed or not: nothing queued
  // behind it overtakes it (an acks=0 Produce would run once closed).
  bool OrderedMustWait() const {
    if (suspended_.load() > 0) return true;
    return !closed_.load() && in_transit_.load() + writable_.load() > srv_->options.max_unwritten_ordered_bytes;
  }

  // Reply::SuspendInOrder, from ordered work on a worker.
  std::shared_ptr<SuspendedWork> SuspendOrdered() {
    suspended_++;
    return std::make_shared<SuspendedWork>(
        [self = shared_from_this()](std::function<void()> fn) { self->ResumeSuspended(std::move(fn)); });
  }
  // SuspendedWork::Resume: `fn` (if any) on a worker, then the ordered work
  // goes on. Any thread, once per SuspendOrdered.
  void ResumeSuspended(std::function<void()> fn) {
    if (srv_->pools_joined.load()) return;  // stopped: nothing runs any more
    net::post(*srv_->workers, [self = shared_from_this(), fn = std::move(fn)] {
      if (fn) fn();
      self->suspended_--;
      self->ResumeOrdered();
    });
  }
  void ParkOrdered() {
    ordered_parked_.store(true);
    ResumeOrdered();  // the write may have caught up meanwhile
  }
  // After a write or a close; any thread. Also resumes reading held back by
  // OrderedMustWait.
  void ResumeOrdered() {
    if (OrderedMustWait()) return;
    if (ordered_parked_.exchange(false)) {
      // Parked after CloseNow looked (the drain paused just before the
      // close): dropped as CloseNow would have. Parked, no drain runs.
      if (closed_.load()) return ordered_.Drop();
      DrainOrdered();
    }
    if (read_held_.exchange(false)) {
      net::post(socket_.get_executor(), [self = shared_from_this()] {
        self->ResumeHeld();
        self->ReadHeader();
      });
    }
  }

  // After the I/O threads stopped: forgets the requests waiting for a turn.
  void DropWaiting() {
    one_at_a_time_waiting_.clear();
    ordered_.Drop();
  }

  // Reply::PostOneAtATime for request `seq`; any thread.
  void PostOneAtATime(uint64_t seq, std::function<void()> fn) {
    net::post(socket_.get_executor(), [self = shared_from_this(), seq, fn = std::move(fn)]() mutable {
      if (self->closed_) return;
      if (self->one_at_a_time_) {
        self->one_at_a_time_waiting_.emplace_back(seq, std::move(fn));
        return;
      }
      self->one_at_a_time_ = seq;
      net::post(*self->srv_->readers, std::move(fn));
    });
  }

  TcpServer::Impl* srv() const { return srv_; }
  const std::string& peer() const { return peer_; }
  bool closed() const { return closed_.load(); }

 private:
  struct Slot {
    bool done = false;
    bool respond = false;
    bool close = false;
    char prefix[4] = {};
    std::string bytes;
  };

  void ArmIdle() {
    idle_.expires_after(srv_->options.idle_timeout);
    idle_.async_wait([self = shared_from_this()](ErrorCode ec) {
      if (ec || self->closed_) return;
      if (self->slots_.empty() && !self->writing_ && !self->in_frame_) {
        self->CloseNow();
      } else {
        self->ArmIdle();
      }
    });
  }

  void ReadHeader() {
    if (closed_ || reading_ || stop_reading_) return;
    if (slots_.size() >= srv_->options.max_in_flight) return;  // resumed by OnAnswer
    if (unwritten_bytes_ > srv_->options.max_unwritten_bytes) return;  // resumed by the write
    if (OrderedMustWait()) {  // resumed by ResumeOrdered
      read_held_.store(true);
      if (OrderedMustWait() || !read_held_.exchange(false)) return;
    }
    reading_ = true;
    net::async_read(socket_, net::buffer(size_buf_, 4), [self = shared_from_this()](ErrorCode ec, size_t) {
      self->reading_ = false;
      if (ec) return self->CloseNow();
      // A close was queued while this read was in flight: read no further.
      if (self->stop_reading_ || self->closed_) return;
      uint32_t n = (static_cast<uint32_t>(static_cast<uint8_t>(self->size_buf_[0])) << 24) |
                   (static_cast<uint32_t>(static_cast<uint8_t>(self->size_buf_[1])) << 16) |
                   (static_cast<uint32_t>(static_cast<uint8_t>(self->size_buf_[2])) << 8) |
                   static_cast<uint32_t>(static_cast<uint8_t>(self->size_buf_[3]));
      if (n > self->srv_->options.max_request_bytes || static_cast<int32_t>(n) < 0) {
        self->srv_->metrics.oversized++;
        Log().warn("kafka: {} sent a {}-byte request (limit {}); closing", self->peer_, n,
                   self->srv_->options.max_request_bytes);
        return self->CloseAfterPending();
      }
      // Reading stays marked busy while the frame waits for budget, or for
      // this connection's unwritten responses to be written; the connection
      // is not idle while a request arrives.
      self->reading_ = true;
      self->in_frame_ = true;
      self->held_frame_ = n;  // admitted once the write brings them under
      self->ResumeHeld();
    });
  }

  void Admit(uint32_t n) {
    if (srv_->BudgetFor(n).ReserveOrWait(shared_from_this(), n)) ReadBody(n);
  }

  // After a write: a frame held back by unwritten responses goes on. Strand only.
  void ResumeHeld() {
    if (!held_frame_ || unwritten_bytes_ > srv_->options.max_unwritten_bytes || closed_ || stop_reading_) return;
    if (OrderedMustWait()) {  // resumed by ResumeOrdered
      read_held_.store(true);
      if (OrderedMustWait() || !read_held_.exchange(false)) return;
    }
    const uint32_t n = *held_frame_;
    held_frame_.reset();
    Admit(n);
  }

 public:
  // From the budget, on any thread: `n` bytes are now reserved for the frame
  // this connection waits to read.
  void Admitted(size_t bytes) {
    const auto n = static_cast<uint32_t>(bytes);  // a frame's size
    net::post(socket_.get_executor(), [self = shared_from_this(), n] {
      if (self->stop_reading_ || self->closed_) {
        self->reading_ = false;
        self->in_frame_ = false;
        self->srv_->Release(n);
        return;
      }
      self->ReadBody(n);
    });
  }

 private:
  // `n` bytes of budget are reserved; they pass to the request's Reply. The
  // body must be whole within the stall timeout: a client that announces a
  // frame and sends it slowly holds budget others wait for.
  void ReadBody(uint32_t n) {
    reading_ = true;
    auto frame = std::make_shared<Frame>(n);
    const uint64_t body = ++bodies_;
    body_timer_.expires_after(srv_->options.stall_timeout);
    body_timer_.async_wait([self = shared_from_this(), body, n](ErrorCode ec) {
      if (ec || self->closed_ || self->bodies_ != body) return;
      self->srv_->metrics.stalled++;
      Log().warn("kafka: {} did not send the rest of a {}-byte request within {} ms; closing", self->peer_, n,
                 std::chrono::duration_cast<std::chrono::milliseconds>(self->srv_->options.stall_timeout).count());
      self->CloseNow();
    });
    net::async_read(socket_, net::buffer(frame->data(), n),
                    [self = shared_from_this(), frame, n](ErrorCode ec, size_t) {
                      self->reading_ = false;
                      self->in_frame_ = false;
                      ++self->bodies_;  // a timer that fired already and is queued finds it over
                      self->body_timer_.cancel();
                      if (ec) {
                        self->srv_->Release(n);
                        return self->CloseNow();
                      }
                      // Not handled once a close is queued: its client never
                      // learns the outcome, so it must have none.
                      if (self->stop_reading_ || self->closed_) return self->srv_->Release(n);
                      self->ArmIdle();
                      self->Dispatch(std::move(*frame), n);
                      self->ReadHeader();
                    });
  }

  void Dispatch(Frame frame, uint32_t reserved);

  void OnAnswer(uint64_t seq, std::string response, bool respond, bool close) {
    // After a close, CloseNow has already settled every unanswered slot.
    if (respond) in_transit_ -= response.size();
    if (closed_ || seq < first_seq_ || seq - first_seq_ >= slots_.size()) {
      if (respond) srv_->metrics.unwritten_bytes -= static_cast<int64_t>(response.size());
      return ResumeOrdered();
    }
    Slot& s = slots_[seq - first_seq_];
    s.done = true;
    s.respond = respond;
    s.close = close;
    if (close) stop_reading_ = true;
    if (respond) {
      unwritten_bytes_ += response.size();
      uint32_t n = static_cast<uint32_t>(response.size());
      s.prefix[0] = static_cast<char>(n >> 24);
      s.prefix[1] = static_cast<char>(n >> 16);
      s.prefix[2] = static_cast<char>(n >> 8);
      s.prefix[3] = static_cast<char>(n);
      s.bytes = std::move(response);
    }
    srv_->metrics.in_flight--;
    UpdateWritable();
    Flush();
  }

  // Writes the answered responses at the front, in order.
  void Flush() {
    if (writing_ || closed_) return;
    std::vector<net::const_buffer> bufs;
    size_t count = 0;
    bool close_after = false;
    for (auto& s : slots_) {
      if (!s.done) break;
      ++count;
      if (s.respond) {
        bufs.emplace_back(s.prefix, 4);
        bufs.emplace_back(s.bytes.data(), s.bytes.size());
      }
      if (s.close) {
        close_after = true;
        break;
      }
    }
    if (count == 0) return;
    if (bufs.empty()) {
      Pop(count);
      if (close_after) return CloseNow();
      ReadHeader();
      return Flush();
    }
    writing_ = true;
    write_bufs_ = std::move(bufs);
    write_next_ = 0;
    write_progress_ = std::chrono::steady_clock::now();
    ArmWriteTimer(srv_->options.stall_timeout);
    WriteSome(count, close_after);
  }

  // Writes write_bufs_ from write_next_ on, a write_some at a time, so a
  // stall is judged by progress: a slow reader keeps its connection, one
  // that stopped reading does not.
  void WriteSome(size_t count, bool close_after) {
    socket_.async_write_some(
        std::span(write_bufs_).subspan(write_next_),
        [self = shared_from_this(), count, close_after](ErrorCode ec, size_t written) {
          if (!ec && !self->closed_) {
            self->write_progress_ = std::chrono::steady_clock::now();
            auto& bufs = self->write_bufs_;
            size_t& i = self->write_next_;
            while (written > 0 && i < bufs.size()) {
              const size_t take = std::min(written, bufs[i].size());
              bufs[i] += take;
              written -= take;
              if (bufs[i].size() == 0) ++i;
            }
            while (i < bufs.size() && bufs[i].size() == 0) ++i;
            if (i < bufs.size()) return self->WriteSome(count, close_after);
          }
          self->writing_ = false;
          self->write_bufs_.clear();
          if (self->closed_) return self->DropSlots();  // closed while the write used the slots' buffers
          if (ec) return self->CloseNow();  // not Pop first: that would resume work parked for this client
          self->Pop(count);
          if (close_after) return self->CloseNow();
          self->ResumeHeld();
          self->ReadHeader();
          self->Flush();
        });
  }

  void ArmWriteTimer(Duration after) {
    if (write_timer_armed_) return;
    write_timer_armed_ = true;
    write_timer_.expires_after(after);
    write_timer_.async_wait([self = shared_from_this()](ErrorCode ec) {
      self->write_timer_armed_ = false;
      if (ec || self->closed_ || !self->writing_) return;
      const Duration stall = self->srv_->options.stall_timeout;
      const auto still = std::chrono::steady_clock::now() - self->write_progress_;
      if (still < stall) return self->ArmWriteTimer(std::chrono::duration_cast<Duration>(stall - still));
      self->srv_->metrics.stalled++;
      Log().warn("kafka: {} read none of its responses for {} ms; closing", self->peer_,
                 std::chrono::duration_cast<std::chrono::milliseconds>(stall).count());
      self->CloseNow();
    });
  }

  void Pop(size_t count) {
    for (size_t i = 0; i < count; ++i) {
      unwritten_bytes_ -= slots_.front().bytes.size();
      srv_->metrics.unwritten_bytes -= static_cast<int64_t>(slots_.front().bytes.size());
      slots_.pop_front();
    }
    first_seq_ += count;
    UpdateWritable();
    // The one-at-a-time request is answered and written: start the next.
    if (one_at_a_time_ && *one_at_a_time_ < first_seq_) {
      one_at_a_time_.reset();
      if (!one_at_a_time_waiting_.empty()) {
        auto [seq, fn] = std::move(one_at_a_time_waiting_.front());
        one_at_a_time_waiting_.pop_front();
        one_at_a_time_ = seq;
        net::post(*srv_->readers, std::move(fn));
      }
    }
  }

  // Stops reading; closes once everything before is answered and written.
  void CloseAfterPending() {
    stop_reading_ = true;
    slots_.emplace_back();
    slots_.back().done = true;
    slots_.back().close = true;
    ++next_seq_;
    Flush();
  }

  void DropSlots() {
    first_seq_ += slots_.size();
    slots_.clear();
    srv_->metrics.unwritten_bytes -= static_cast<int64_t>(unwritten_bytes_);
    unwritten_bytes_ = 0;
    UpdateWritable();
  }

  // writable_: the bytes of the answered responses at the front of slots_.
  void UpdateWritable() {
    size_t n = 0;
    for (const Slot& slot : slots_) {
      if (!slot.done) break;
      n += slot.bytes.size();
    }
    writable_ = n;
    ResumeOrdered();
  }

  void CloseNow() {
    if (closed_.exchange(true)) return;
    ErrorCode ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    idle_.cancel();
    body_timer_.cancel();
    write_timer_.cancel();
    // Ordered work parked for the client to read is dropped, not run late
    // (a Produce taking effect long after its client gave up). Parked, no
    // drain is running, so the queue is the strand's to drop. Before the
    // slots go: that would resume it.
    if (ordered_parked_.exchange(false)) ordered_.Drop();
    for (auto& s : slots_) {
      if (!s.done) srv_->metrics.in_flight--;
      s.done = true;
    }
    // A write in progress still points into the slots: its handler drops them.
    if (!writing_) DropSlots();
    one_at_a_time_waiting_.clear();  // their Replies go unanswered on a closed connection
    srv_->metrics.open_connections--;
    srv_->Forget(shared_from_this());
  }

  TcpServer::Impl* srv_;
  tcp::socket socket_;
  net::steady_timer idle_;
  net::steady_timer body_timer_;   // the frame body being read: stall_timeout
  uint64_t bodies_ = 0;            // bumped as a body begins and ends: tells a stale body_timer_ firing apart
  net::steady_timer write_timer_;  // the write in progress: stall_timeout without progress
  bool write_timer_armed_ = false;
  std::vector<net::const_buffer> write_bufs_;  // the write in progress, from write_next_ on
  size_t write_next_ = 0;
  std::chrono::steady_clock::time_point write_progress_;
  size_t unwritten_bytes_ = 0;  // answered responses not yet written (max_unwritten_bytes)
  // For OrderedMustWait, read by ordered work on the workers: response bytes
  // answered and not yet on the strand, and those at the front of slots_.
  std::atomic<size_t> in_transit_{0};
  std::atomic<size_t> writable_{0};
  std::atomic<bool> ordered_parked_{false};  // a drain stopped at OrderedMustWait
  std::atomic<int> suspended_{0};              // SuspendOrdered calls not yet resumed
  std::atomic<bool> read_held_{false};        // ReadHeader stopped at OrderedMustWait
  std::optional<uint32_t> held_frame_;  // a frame's size read while over max_unwritten_bytes
  bool in_frame_ = false;  // from a frame's size until its body is read
  OrderedQueue ordered_;  // PostInOrder work (not an asio strand on the pool: this may outlive it)
  std::atomic<bool> skip_ordered_{false};  // closed, and an answering item was skipped: skip the rest
  std::string peer_;
  char size_buf_[4] = {};
  std::deque<Slot> slots_;
  uint64_t first_seq_ = 0;  // seq of slots_.front()
  uint64_t next_seq_ = 0;
  bool reading_ = false;
  bool writing_ = false;
  bool stop_reading_ = false;  // a close is queued: read no further request
  std::atomic<bool> closed_{false};
  // PostOneAtATime: the request holding the turn (until its response is
  // written), and the ones waiting for it, in arrival order. Strand only.
  std::optional<uint64_t> one_at_a_time_;
  std::deque<std::pair<uint64_t, std::function<void()>>> one_at_a_time_waiting_;
};

namespace {

// The Reply of request `seq` of a connection, which it keeps alive; any
// thread. The first answer wins; the frame's bytes go back to the budget
// once; dropped unanswered, it closes the connection after the earlier responses.
class ReplyImpl : public Reply {
 public:
  // `reserved`: the frame's bytes of the request budget, released when the
  // request is answered.
  ReplyImpl(std::shared_ptr<Connection> conn, uint64_t seq, uint32_t reserved)
      : conn_(std::move(conn)), seq_(seq), reserved_(reserved) {}
  ~ReplyImpl() override {
    if (!answered_.exchange(true)) {
      if (!conn_->closed()) {
        Log().error("kafka: a request from {} got no response; closing the connection", conn_->peer());
      }
      ReleaseFrame();
      conn_->Answer(seq_, {}, false, true);
    }
  }
  void Respond(std::string response) override {
    if (answered_.exchange(true)) return;
    ReleaseFrame();
    conn_->Answer(seq_, std::move(response), true, false);
  }
  void NoResponse() override {
    if (answered_.exchange(true)) return;
    ReleaseFrame();
    conn_->Answer(seq_, {}, false, false);
  }
  void Close() override {
    if (answered_.exchange(true)) return;
    conn_->srv()->metrics.closed_by_handler++;
    ReleaseFrame();
    conn_->Answer(seq_, {}, false, true);
  }
  void ReleaseFrame() override {
    if (!released_.exchange(true)) conn_->srv()->Release(reserved_);
  }
  void Post(std::function<void()> fn) override { net::post(*conn_->srv()->readers, std::move(fn)); }
  void PostInOrder(std::function<void()> fn, bool answers) override { conn_->PostInOrder(std::move(fn), answers); }
  void RunInOrder(std::function<void(bool)> fn, bool answers) override { conn_->RunInOrder(std::move(fn), answers); }
  std::shared_ptr<SuspendedWork> SuspendInOrder() override { return conn_->SuspendOrdered(); }
  void PostWork(std::function<void()> fn) override {
    if (!conn_->srv()->pools_joined.load()) net::post(*conn_->srv()->workers, std::move(fn));
  }
  void PostOneAtATime(std::function<void()> fn) override { conn_->PostOneAtATime(seq_, std::move(fn)); }
  void WorkAfter(Duration delay, std::function<void()> fn) override {
    auto* srv = conn_->srv();
    auto timer = std::make_shared<net::steady_timer>(srv->ioc, delay);
    timer->async_wait([timer, srv, fn = std::move(fn)](ErrorCode) mutable {
      if (!srv->pools_joined.load()) net::post(*srv->workers, std::move(fn));
    });
  }
  void After(Duration delay, std::function<void()> fn) override {
    auto* srv = conn_->srv();
    auto timer = std::make_shared<net::steady_timer>(srv->ioc, delay);
    timer->async_wait([timer, srv, fn = std::move(fn)](ErrorCode) mutable {
      net::post(*srv->readers, std::move(fn));
    });
  }
  const std::string& peer() const override { return conn_->peer(); }
  bool closed() const override { return conn_->closed(); }
  size_t ResponseRoom(bool small) const override {
    auto* srv = conn_->srv();
    const int64_t held = std::max<int64_t>(srv->metrics.unwritten_bytes.load(), 0);
    const size_t total = srv->options.max_unwritten_total_bytes;
    const size_t limit = small ? total : total - total / 8;
    return static_cast<size_t>(held) >= limit ? 0 : limit - static_cast<size_t>(held);
  }

 private:
  std::shared_ptr<Connection> conn_;
  uint64_t seq_;
  uint32_t reserved_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> released_{false};  // reserved_ went back to the budget
};

}  // namespace

void Connection::Dispatch(Frame frame, uint32_t reserved) {
  uint64_t seq = next_seq_++;
  slots_.emplace_back();
  srv_->metrics.requests++;
  srv_->metrics.in_flight++;
  srv_->handler->Handle(std::move(frame), std::make_shared<ReplyImpl>(shared_from_this(), seq, reserved));
}

void TcpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc.get_executor()), [this](ErrorCode ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      // The connection stays in the backlog (EMFILE): accepting again at
      // once would spin this thread, which every connection shares.
      Log().warn("kafka: accept: {}; retrying in 100 ms", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](ErrorCode e) {
        if (!e && acceptor.is_open()) Accept();
      });
      return;
    } else {
      bool full = false, draining_now = false;
      {
        std::lock_guard lk(mu);
        if (stopped) return;
        full = conns.size() >= options.max_connections;
        draining_now = draining;
      }
      if (draining_now) {
        ErrorCode ignored;  // accepted as the listener closed: the client retries elsewhere
        socket.close(ignored);
      } else if (full) {
        // Closed before any byte is read; the client sees a reset and retries.
        if (metrics.rejected_connections++ % 1000 == 0) {
          Log().warn("kafka: {} connections open (--kafka-max-connections); refusing more", options.max_connections);
        }
        ErrorCode ignored;
        socket.close(ignored);
      } else {
        auto c = std::make_shared<Connection>(this, std::move(socket));
        {
          std::lock_guard lk(mu);
          if (stopped) return;
          conns.insert(c);
          c->Start();  // under mu: a drain or stop that finds it here posts its close after this
          if (draining) c->CloseWhenAnswered();  // the drain began since the check above
        }
      }
    }
    if (acceptor.is_open()) Accept();
  });
}

TcpServer::TcpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpServer::~TcpServer() { Stop(); }

Result<std::unique_ptr<TcpServer>> TcpServer::Start(const TcpServerOptions& options, FrameHandler* handler) {
  auto impl = std::make_unique<Impl>(options, handler);
  ErrorCode ec;
  auto addr = net::ip::make_address(options.host, ec);
  if (ec) return InvalidArgument("kafka address \"{}\": {}", options.host, ec.message());
  tcp::endpoint ep(addr, options.port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("kafka listener on {}:{}: {}", options.host, options.port, ec.message());
  auto local = impl->acceptor.local_endpoint();
  impl->bound = (local.address().is_v6() ? "[" + local.address().to_string() + "]" : local.address().to_string()) +
                ":" + std::to_string(local.port());
  impl->workers = std::make_unique<net::thread_pool>(static_cast<size_t>(std::max(1, options.worker_threads)));
  impl->readers = std::make_unique<net::thread_pool>(static_cast<size_t>(std::max(1, options.read_threads)));
  if (options.accept_at_start) impl->Accept();
  for (int i = 0; i < std::max(1, options.io_threads); ++i) {
    impl->io_threads.emplace_back([io = &impl->ioc] {
      SetThreadName("kafka-io");
      io->run();
    });
  }
  return std::unique_ptr<TcpServer>(new TcpServer(std::move(impl)));
}

std::string TcpServer::address() const { return impl_->bound; }
const TcpServerMetrics& TcpServer::metrics() const { return impl_->metrics; }

void TcpServer::StartAccepting() {
  net::post(impl_->acceptor.get_executor(), [impl = impl_.get()] { impl->Accept(); });
}

void TcpServer::StopAccepting() {
  net::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    ErrorCode ec;
    impl->acceptor.close(ec);
    impl->accept_retry.cancel();
  });
}

void TcpServer::CloseConnectionsWhenAnswered() {
  std::set<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard lk(impl_->mu);
    impl_->draining = true;
    conns = impl_->conns;
  }
  for (auto& c : conns) c->CloseWhenAnswered();
}

void TcpServer::Stop() {
  if (!impl_) return;
  bool draining = false;
  {
    std::lock_guard lk(impl_->mu);
    if (impl_->stopped) return;
    draining = impl_->draining;
  }
  if (draining) {
    // Draining connections close themselves once their answers are written:
    // up to 5 s for that, rather than cutting a write short.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (impl_->metrics.open_connections.load() > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::set<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard lk(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    conns = impl_->conns;
  }
  StopAccepting();
  for (auto& c : conns) c->Shutdown();
  // Workers first: their callbacks may still post answers to the I/O threads.
  impl_->workers->join();
  impl_->readers->join();
  impl_->pools_joined = true;
  impl_->guard.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->io_threads) t.join();
  // A close posted by Shutdown may not have run: drop what waits for a turn
  // (it holds its connection through its Reply).
  for (auto& c : conns) c->DropWaiting();
  std::lock_guard lk(impl_->mu);
  impl_->conns.clear();
}

}  // namespace weir::kafka
