// The only translation unit that includes Boost.Beast / Asio (and nghttp2).
#include "http/server.h"

#include <nghttp2/nghttp2.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cstring>
#include <strings.h>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/byte_budget.h"
#include "base/log.h"
#include "base/ordered_queue.h"
#include "base/tcp.h"
#include "base/thread.h"

namespace weir::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
// Concrete executor types (not any_io_executor): no type erasure per operation.
using Strand = net::strand<net::io_context::executor_type>;
using Socket = net::basic_stream_socket<tcp, Strand>;
using Stream = beast::basic_stream<tcp, Strand>;

const std::string* Request::Header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return &v;
  }
  return nullptr;
}

const std::string* Request::Query(std::string_view name) const {
  for (const auto& [k, v] : query) {
    if (k == name) return &v;
  }
  return nullptr;
}

Result<std::string> PercentDecode(std::string_view s, bool plus) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%') {
      auto hex = [](char h) -> int {
        if (h >= '0' && h <= '9') return h - '0';
        if (h >= 'a' && h <= 'f') return h - 'a' + 10;
        if (h >= 'A' && h <= 'F') return h - 'A' + 10;
        return -1;
      };
      if (i + 2 >= s.size()) return InvalidArgument("bad percent escape in URL");
      int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) return InvalidArgument("bad percent escape in URL");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

namespace {

// Spare capacity after a request body, so a JSON parser that reads ahead
// (simdjson needs 64 bytes) can parse it in place.
constexpr size_t kBodyPadding = 64;
// Each connection's read buffer: a request up to this size arrives in one recv.
constexpr size_t kReadBufferBytes = 8192;
// What an HTTP/1.1 connection's read buffer may grow to: a head (64 KiB at
// most) or a chunk-size line or trailer section of a chunked body. An idle
// connection's buffer shrinks back to what it holds once it is past 64 KiB.
constexpr size_t kMaxReadBufferBytes = 128 * 1024;
constexpr size_t kKeptBufferBytes = 64 * 1024;
// An HTTP/1.1 request head's limit (431 past it).
constexpr size_t kMaxHeadBytes = 64 * 1024;

// Beast's request parser, but the trailer fields of a chunked body are
// dropped (RFC 9110 lets a recipient discard them): Beast would add them to
// the head's fields after the handler's checks of the head, and a field of
// 64 KiB or more (past Beast's field limit) throws out of the read. The read
// buffer's bound is the trailer section's. Owned by its connection.
class RequestParser final : public bhttp::request_parser<bhttp::string_body> {
 private:
  void on_field_impl(bhttp::field name, beast::string_view name_string, beast::string_view value,
                     beast::error_code& ec) override {
    if (is_header_done()) return;  // a trailer field
    // Beast's fields take a name or value of at most 65,533 bytes (a head
    // within kMaxHeadBytes cannot hold a longer one; checked all the same).
    if (name_string.size() > 65533 || value.size() > 65533) {
      ec = bhttp::error::header_limit;
      return;
    }
    get().insert(name, name_string, value);
  }
};
// HTTP/1.1 request bodies of this size or more are refused on their head when the
// handler's RefuseHead says so (below it, after the body, keeping the connection).
constexpr size_t kRefuseHeadMinBody = 64 * 1024;

// Response bytes a connection holds for its client, counted in
// HttpServerMetrics::unwritten_bytes and in the connection's own count for
// as long as it holds them: whatever path drops them (written, a reset
// stream, a closed connection) gives them back. Owned by what holds the
// bytes (a connection's output queue); moved, never copied. Used on the
// connection's strand, dropped on any thread (the counts are atomic).
class Charge {
 public:
  Charge() = default;
  Charge(std::atomic<int64_t>* total, std::atomic<int64_t>* conn, size_t n)
      : total_(total), conn_(conn), n_(static_cast<int64_t>(n)) {
    *total_ += n_;
    *conn_ += n_;
  }
  Charge(Charge&& o) noexcept
      : total_(std::exchange(o.total_, nullptr)), conn_(std::exchange(o.conn_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Charge& operator=(Charge&& o) noexcept {
    if (this != &o) {
      Reset();
      total_ = std::exchange(o.total_, nullptr);
      conn_ = std::exchange(o.conn_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() { Reset(); }

 private:
  void Reset() {
    if (total_) {
      *total_ -= n_;
      *conn_ -= n_;
    }
    total_ = conn_ = nullptr;
    n_ = 0;
  }
  std::atomic<int64_t>* total_ = nullptr;
  std::atomic<int64_t>* conn_ = nullptr;
  int64_t n_ = 0;
};

// What an HTTP/2 client sends first (RFC 9113 §3.4).
constexpr std::string_view kHttp2Preface("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
// While this much of an HTTP/2 connection's response data waits for the
// client, request bytes of a stream with response data of its own waiting
// are not acknowledged (no WINDOW_UPDATE for the stream), so a client that
// does not read stops being able to send on it. Streams whose responses
// move keep their windows, whatever other streams hold (a read session the
// client pauses does not stall an upload beside it), and the connection's
// window is always given back. (An append session also stops taking input
// once its acks back up: AnswersBacklogged.) The socket is always read: the
// client's own WINDOW_UPDATEs must get through.
constexpr size_t kHttp2MaxQueuedBytes = 4u << 20;
// Each HTTP/2 stream's receive window: a BodySink's unreturned bytes at most;
// the connection's window is larger. nghttp2 sends a WINDOW_UPDATE once half
// the window was given back, so up to half less one byte may be returned and
// not yet offered again while a sink holds part of a frame: the other half
// must fit a whole frame of the largest size, or neither side moves.
constexpr uint32_t kHttp2StreamWindow = 2 * kMaxBodySinkUnitBytes + (64u << 10);
constexpr int32_t kHttp2ConnectionWindow = 16 << 20;

std::string StatusLine(int status) {
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(reason.data(), reason.size()));
}

std::string ErrorBody(std::string_view code, std::string_view message) {
  return fmt::format(R"({{"code":"{}","message":"{}"}})", code, message);
}

// Splits a request target into path and percent-decoded query pairs; false
// on a bad escape. The absolute form ("http://host/path?query", which a
// server must accept: RFC 9112 §3.2.2) is read as its path and query.
bool ParseTarget(std::string_view target, Request* req) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() > scheme.size() && ::strncasecmp(target.data(), scheme.data(), scheme.size()) == 0) {
      const std::string_view after = target.substr(scheme.size());
      const size_t end = after.find_first_of("/?");
      const std::string_view rest = end == std::string_view::npos ? std::string_view() : after.substr(end);
      // "http://host" and "http://host?q" name the path "/".
      return ParseTarget(!rest.empty() && rest.front() == '/' ? std::string(rest) : "/" + std::string(rest), req);
    }
  }
  auto q = target.find('?');
  req->path = std::string(target.substr(0, q));
  if (q == std::string_view::npos) return true;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    auto part = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (part.empty()) continue;
    auto eq = part.find('=');
    auto k = PercentDecode(part.substr(0, eq), true);
    auto v = PercentDecode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1), true);
    if (!k.ok() || !v.ok()) return false;
    req->query.emplace_back(std::move(*k), std::move(*v));
  }
  return true;
}

// A connection the server can close at shutdown. Owned (shared_ptr) by its
// async operations and exchanges; the server keeps only a weak_ptr (conns).
// Close, CloseIfStalled and Drain may be called from any thread (they post
// to the strand). `unwritten` outlives the connection's Charges.
class ConnBase {
 public:
  virtual ~ConnBase() = default;
  virtual void Close() = 0;
  // After the worker pool was joined: forgets work queued for it that will
  // never run (it may hold the connection itself).
  virtual void DropQueuedWork() {}
  // Ends a response whose data has not moved for `stalled_for` (a client
  // that stopped reading): HTTP/1.1 closes the connection, HTTP/2 resets the
  // stream. Any thread.
  virtual void CloseIfStalled(Duration stalled_for) = 0;
  // A drain began: an HTTP/2 connection sends GOAWAY and closes once no
  // stream is open (at once if none is). HTTP/1.1 needs nothing: its
  // answers say `Connection: close` from now on. Any thread.
  virtual void Drain() {}
  // This connection's share of unwritten_bytes (its Charges; a base member,
  // so it outlives them).
  std::atomic<int64_t> unwritten{0};
};

class Conn;

// A request begun and not yet handed to the handler: its body is still
// arriving, or waits for the budget. It counts in HttpServer::receiving(),
// so a drain can wait for it to arrive and be answered (503
// server_draining) instead of closing it unanswered. Owned by the
// connection reading it (I/O thread); gone once the request is dispatched
// (after its exchange counts it) or dropped.
class Receiving {
 public:
  explicit Receiving(std::atomic<int64_t>* count) : count_(count) { ++*count_; }
  Receiving(Receiving&& other) noexcept : count_(std::exchange(other.count_, nullptr)) {}
  ~Receiving() {
    if (count_) --*count_;
  }
  Receiving(const Receiving&) = delete;
  Receiving& operator=(const Receiving&) = delete;
  Receiving& operator=(Receiving&&) = delete;

 private:
  std::atomic<int64_t>* count_;
};

}  // namespace

// HttpServer's state, owned by it. Start runs it: the io_context on `threads`, handler work on `workers`;
// connections, exchanges and Stop reach it from any thread (atomics, conns_mu, the budget's lock). Members are
// declared so that exchanges destroyed with the io_context or the pool still find what they release into.
class HttpServer::Impl {
 public:
  Impl(const ServerOptions& o, Handler* h)
      : options(o),
        handler(h),
        acceptor(net::make_strand(ioc)),
        workers(static_cast<size_t>(std::max(1, o.worker_threads))) {}

  Status Listen() {
    beast::error_code ec;
    auto addr = net::ip::make_address(options.host, ec);
    if (ec) return InvalidArgument("bad listen address \"{}\": {}", options.host, ec.message());
    tcp::endpoint ep(addr, options.port);
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable("cannot listen on {}:{}: {}", options.host, options.port, ec.message());
    bound = acceptor.local_endpoint(ec);
    return Status::Ok();
  }

  void Accept();
  void Run() {
    for (int i = 0; i < std::max(1, options.io_threads); ++i) {
      threads.emplace_back([this] {
        SetThreadName("http-io");
        ioc.run();
      });
    }
  }

  ServerOptions options;
  Handler* handler;
  // Declared before ioc and workers: exchanges destroyed with their pending
  // handlers still count and release into these.
  HttpServerMetrics metrics;
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> receiving{0};  // requests whose body is still arriving (Receiving)
  // Set once Stop joined `workers`: suspended work dropped later (with the
  // io_context's pending timers) posts nothing.
  std::atomic<bool> workers_joined{false};
  // Request bodies (options.max_in_flight_bytes). A waiting connection has
  // no I/O pending, so the queue keeps it alive.
  ByteBudget<std::shared_ptr<Conn>> budget{options.max_in_flight_bytes, &metrics.in_flight_bytes,
                                           &metrics.budget_waits};

  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> guard{ioc.get_executor()};
  // On a strand: accept completions, retries and StopAccepting's close do not run at once.
  tcp::acceptor acceptor;
  net::steady_timer accept_retry{acceptor.get_executor()};  // after an accept error (out of file descriptors)
  tcp::endpoint bound;
  net::thread_pool workers;
  std::vector<std::thread> threads;
  std::mutex conns_mu;
  std::vector<std::weak_ptr<ConnBase>> conns;

  void Register(const std::shared_ptr<ConnBase>& conn) {
    {
      std::lock_guard lk(conns_mu);
      std::erase_if(conns, [](const std::weak_ptr<ConnBase>& w) { return w.expired(); });
      conns.push_back(conn);
    }
    // One registered after BeginDrain's walk (an HTTP/2 preface that came
    // later) is told to go too; `draining` is set before the walk takes
    // conns_mu, so none is missed (a second Drain does nothing).
    if (draining.load()) conn->Drain();
  }
  std::atomic<bool> stopped{false};
  std::atomic<bool> draining{false};  // BeginDrain: connections are told to go
  // Whether a connection may stay open after its current response.
  bool KeepsConnections() const { return !stopped.load() && !draining.load(); }
};

namespace {

// Frees a string's buffer. (Assigning an empty string keeps the buffer:
// libstdc++ copies into it.)
void FreeString(std::string& s) { std::string().swap(s); }

// GET and HEAD bodies mean nothing to any handler: dropped at dispatch, and
// their budget given back, so a read session or long poll holds none of it.
template <typename Budget>
void DropUnusedBody(Request& req, size_t& reserved, Budget& budget) {
  if (req.method != "GET" && req.method != "HEAD") return;
  FreeString(req.body);
  if (reserved > 0) budget.Release(std::exchange(reserved, 0));
}

// One TCP connection: HTTP/1.1, unless it opens with the HTTP/2 preface (then
// handed to an H2Conn). Lives while an async operation or an Exchange holds it;
// all its state is touched on its strand only (Close posts there). Serves its
// requests one at a time, in order.
class Conn : public ConnBase, public std::enable_shared_from_this<Conn> {
 public:
  Conn(Socket socket, HttpServer::Impl* srv)
      : stream_(std::move(socket)), srv_(srv), budget_timer_(stream_.get_executor()) {}

  void Start() {
    // Beast reads at most the buffer's spare capacity (512 bytes at first):
    // with room for a small request whole, one recv takes head and body.
    buf_.reserve(kReadBufferBytes);
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Sniff(); });
  }
  // The server stops: what is being written or queued is written first, then
  // OnWritten closes (Stop bounds the wait).
  void Close() override {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->writing_ || !self->out_.empty()) {
        self->close_requested_ = true;
        return;
      }
      self->Shutdown();
    });
  }
  void CloseIfStalled(Duration stalled_for) override {
    net::post(stream_.get_executor(), [self = shared_from_this(), stalled_for] {
      if (!self->closed_ && self->writing_ && Now() - self->moved_at_ > stalled_for) self->Shutdown();
    });
  }
  bool closed() const { return closed_.load(); }
  auto executor() { return stream_.get_executor(); }

  // From the budget, on any thread: `n` bytes are now reserved for the body
  // this connection waits to read.
  void Admitted(size_t n) {
    net::post(stream_.get_executor(), [self = shared_from_this(), n] {
      self->reserved_ = n;
      self->waiting_budget_ = false;
      self->budget_timer_.cancel();
      if (self->closed_) return self->ReleaseReserved();
      self->ReadBody();
    });
  }

  // Strand only: queue bytes for the socket; `then` runs after they are written.
  void Send(std::string bytes, std::function<void(bool)> then, bool response_done, bool keep_alive) {
    if (closed_) {
      if (then) then(false);
      return;
    }
    const size_t n = bytes.size();
    out_.push_back(Out{std::move(bytes), std::move(then), response_done, keep_alive,
                       Charge(&srv_->metrics.unwritten_bytes, &unwritten, n)});
    if (!writing_) WriteNext();
  }

 private:
  struct Out {
    std::string bytes;
    std::function<void(bool)> then;
    bool response_done;
    bool keep_alive;
    Charge charge;  // bytes' share of unwritten_bytes, until written or dropped
  };

  // Reads the first bytes: the HTTP/2 preface hands the connection to
  // nghttp2; anything else is HTTP/1.1, parsed from what was read.
  void Sniff() {
    stream_.expires_after(srv_->options.idle_timeout);
    stream_.async_read_some(buf_.prepare(kReadBufferBytes), [self = shared_from_this()](beast::error_code ec,
                                                                                       size_t n) {
      if (ec) return self->Fail(ec);
      self->buf_.commit(n);
      std::string_view have(static_cast<const char*>(self->buf_.data().data()), self->buf_.size());
      size_t k = std::min(have.size(), kHttp2Preface.size());
      if (have.substr(0, k) != kHttp2Preface.substr(0, k)) return self->ReadHeader();
      if (have.size() < kHttp2Preface.size()) return self->Sniff();
      self->StartHttp2(std::string(have));
    });
  }

  void StartHttp2(std::string already_read);

  void ReadHeader() {
    if (closed_) return;
    head_ = false;
    // A large head or trailer section left its buffer grown: not kept idle.
    if (buf_.capacity() > kKeptBufferBytes && buf_.size() <= kReadBufferBytes) {
      buf_.shrink_to_fit();
      buf_.reserve(kReadBufferBytes);  // a head still comes in one read
    }
    parser_.emplace();
    parser_->header_limit(kMaxHeadBytes);
    parser_->body_limit(srv_->options.max_request_bytes);
    stream_.expires_after(srv_->options.idle_timeout);
    bhttp::async_read_header(stream_, buf_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) {  // the Content-Length is over the limit
      return Reject(413, "request_too_large",
                    fmt::format("request body is over the limit of {} bytes", srv_->options.max_request_bytes));
    }
    if (ec) return RejectMalformed(ec) ? void() : Fail(ec);
    head_ = parser_->get().method() == bhttp::verb::head;
    // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host.
    if (parser_->get().version() >= 11 && parser_->get().count(bhttp::field::host) != 1) {
      return Reject(400, "bad_request", "an HTTP/1.1 request needs exactly one Host header");
    }
    // RFC 9112 §6.3: a body coded other than chunked (last) has no length
    // this server can know: refused (400), or its bytes would be read as the
    // next request. §6.1: codings before chunked are not understood (501).
    if (parser_->get().find(bhttp::field::transfer_encoding) != parser_->get().end()) {
      if (!parser_->chunked()) {
        return Reject(400, "bad_request", "a Transfer-Encoding whose last coding is not chunked is not supported");
      }
      auto [first, last] = parser_->get().equal_range(bhttp::field::transfer_encoding);
      for (auto it = first; it != last; ++it) {
        for (const auto& coding : bhttp::token_list(it->value())) {
          if (!beast::iequals(coding, "chunked")) {
            return Reject(501, "not_implemented",
                          fmt::format("the transfer coding \"{}\" is not supported (only chunked is)",
                                      std::string_view(coding.data(), coding.size())));
          }
        }
      }
    }
    auto len = parser_->content_length();
    if (len && *len > srv_->options.max_request_bytes) {
      return Reject(413, "request_too_large",
                    fmt::format("request body of {} bytes is over the limit of {} bytes", *len,
                                srv_->options.max_request_bytes));
    }
    // The body's memory comes from the shared budget; a chunked body may
    // grow to the limit, so it counts as that.
    const size_t want = parser_->chunked() ? srv_->options.max_request_bytes : len.value_or(0);
    // Checks that need no body (authentication) come before a large one is
    // read or reserved; that answer closes the connection. A small body is
    // read first, so the answer keeps the connection (4,096 connections
    // holding 64 KiB each are within the default budget).
    if (want >= kRefuseHeadMinBody && srv_->handler->RefusesHeads()) {
      if (auto refused = RefuseHead()) {
        return RejectWith(std::move(*refused));
      }
    }
    if (want == 0) return ReadBody();
    receiving_.emplace(&srv_->receiving);
    if (srv_->budget.ReserveOrWait(shared_from_this(), want)) {
      reserved_ = want;
      ReadBody();
      return;
    }
    // Otherwise Admitted() resumes here once the budget has room, unless the
    // stall timeout passes first: a request body not whole that long after
    // its head is given up, as one that stops arriving is.
    waiting_budget_ = true;
    budget_timer_.expires_after(srv_->options.stall_timeout);
    budget_timer_.async_wait([self = shared_from_this()](beast::error_code waited) {
      if (waited || !self->waiting_budget_) return;
      // Admitted meanwhile: its post is on its way.
      if (!self->srv_->budget.Cancel(self.get())) return;
      self->waiting_budget_ = false;
      self->receiving_.reset();
      if (self->closed_) return;
      self->srv_->metrics.budget_timeouts++;
      self->Reject(429, "rate_limited",
                   fmt::format("the server's memory for request bodies (--http-max-in-flight-mib) stayed full for "
                               "{} s while this request waited for room; try again later",
                               std::chrono::duration_cast<std::chrono::seconds>(self->srv_->options.stall_timeout)
                                   .count()));
    });
  }

  // Reads the body whose header parser_ holds; its budget is reserved.
  void ReadBody() {
    auto& req = parser_->get();
    if (req.version() >= 11 && beast::iequals(req[bhttp::field::expect], "100-continue")) {
      Send("HTTP/1.1 100 Continue\r\n\r\n", nullptr, false, true);
    }
    stream_.expires_after(srv_->options.stall_timeout);
    if (!parser_->chunked()) {
      // A sized body (the common case) is read straight into its string:
      // one copy, no per-chunk parsing.
      size_t n = parser_->content_length().value_or(0);
      body_.reserve(n + kBodyPadding);
      body_.resize(n);
      size_t have = std::min(buf_.size(), n);
      net::buffer_copy(net::buffer(body_.data(), have), buf_.data());
      buf_.consume(have);
      if (have == n) return OnBody({}, true);
      net::async_read(stream_, net::buffer(body_.data() + have, n - have),
                      [self = shared_from_this()](beast::error_code e, size_t) { self->OnBody(e, true); });
      return;
    }
    bhttp::async_read(stream_, buf_, *parser_,
                      [self = shared_from_this()](beast::error_code e, size_t) { self->OnBody(e, false); });
  }

  void ReleaseReserved() {
    if (reserved_ > 0) srv_->budget.Release(std::exchange(reserved_, 0));
  }

  // `sized`: the body is in body_; otherwise the parser holds it.
  void OnBody(beast::error_code ec, bool sized) {
    // Counted until this returns: the answer (or the dispatch) counts next.
    std::optional<Receiving> receiving = std::exchange(receiving_, std::nullopt);
    if (ec) ReleaseReserved();  // not dispatched: the body is dropped
    if (ec == bhttp::error::body_limit) {
      return Reject(413, "request_too_large",
                    fmt::format("request body is over the limit of {} bytes", srv_->options.max_request_bytes));
    }
    if (ec) return RejectMalformed(ec) ? void() : Fail(ec);
    stream_.expires_never();
    auto msg = parser_->release();
    parser_.reset();
    if (sized) msg.body() = std::move(body_);
    FreeString(body_);
    keep_alive_ = msg.keep_alive();
    http10_ = msg.version() < 11;
    Request req;
    if (!HeadToRequest(msg, &req)) {
      ReleaseReserved();
      return Reject(400, "bad_request", "bad percent escape in the query string");
    }
    req.body = std::move(msg.body());
    // A chunked body counted as the limit until its size was known.
    if (reserved_ > req.body.size()) {
      srv_->budget.Release(reserved_ - req.body.size());
      reserved_ = req.body.size();
    }
    Dispatch(std::move(req));
  }

  void Dispatch(Request req);

  // Answers an unreadable request and closes the connection after, reading
  // (and dropping) what the client still sends for a while first, so the
  // close does not reset the connection before the client reads the answer.
  // A request the parser refused gets an answer before the close, as HTTP
  // asks: 431 for a header over the limit, 400 for anything else malformed.
  // False for an error that is no fault of the request (the peer went away).
  bool RejectMalformed(beast::error_code ec) {
    if (ec.category() != bhttp::make_error_code(bhttp::error::bad_method).category()) return false;
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == bhttp::error::need_more ||
        ec == bhttp::error::need_buffer) {
      return false;
    }
    if (ec == bhttp::error::header_limit) {
      Reject(431, "request_header_fields_too_large", "the request header is over the limit of 64 KiB");
    } else {
      Reject(400, "bad_request", fmt::format("malformed HTTP request: {}", ec.message()));
    }
    return true;
  }

  void Reject(int status, std::string_view code, std::string_view message) {
    HeaderList headers;
    if (status == 429 || status == 503) headers.emplace_back("Retry-After", "1");  // as every other such answer
    RejectWith(Response{status, "application/json", ErrorBody(code, message), std::move(headers)});
  }
  // The answer to a HEAD goes without its body (RFC 9110 §9.3.2).
  void RejectWith(Response r) {
    linger_close_ = true;
    std::string bytes = StatusLine(r.status) +
                        fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", r.content_type, r.body.size());
    for (const auto& [k, v] : r.headers) bytes += fmt::format("{}: {}\r\n", k, v);
    bytes += "Connection: close\r\n\r\n";
    if (!head_) bytes += r.body;
    Send(std::move(bytes), nullptr, true, false);
  }

  // The handler's RefuseHead on the head parser_ holds; a target that cannot
  // be parsed is refused here too (it would be with the body, but then an
  // unauthenticated client could have its large body read first).
  std::optional<Response> RefuseHead() {
    Request head;
    if (!HeadToRequest(parser_->get(), &head)) {
      return Response{400, "application/json", ErrorBody("bad_request", "bad percent escape in the query string"), {}};
    }
    return srv_->handler->RefuseHead(head);
  }

  // A Beast request's method, target (ParseTarget) and headers (names in
  // lower case, as HTTP/2's) into `req`; false on a bad target.
  template <typename Message>
  static bool HeadToRequest(const Message& msg, Request* req) {
    req->method = std::string(msg.method_string());
    if (!ParseTarget(std::string_view(msg.target().data(), msg.target().size()), req)) return false;
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req->headers.emplace_back(std::move(name), std::string(f.value()));
    }
    return true;
  }

  void WriteNext() {
    if (out_.empty() || closed_) return;
    writing_ = true;
    moved_at_ = Now();
    WriteSome();
  }

  // Writes the rest of the front piece, a write_some at a time: the stall
  // timeout (and a drain's CloseIfStalled) judge progress, not how long a
  // large response takes.
  void WriteSome() {
    stream_.expires_after(srv_->options.stall_timeout);
    const std::string& bytes = out_.front().bytes;
    stream_.async_write_some(net::buffer(bytes.data() + front_sent_, bytes.size() - front_sent_),
                             [self = shared_from_this()](beast::error_code ec, size_t n) {
                               if (!ec && !self->closed_) {
                                 self->front_sent_ += n;
                                 self->moved_at_ = Now();
                                 if (self->front_sent_ < self->out_.front().bytes.size()) return self->WriteSome();
                               }
                               self->front_sent_ = 0;
                               self->OnWritten(ec);
                             });
  }

  void OnWritten(beast::error_code ec) {
    writing_ = false;
    Out done = std::move(out_.front());
    out_.pop_front();
    if (closed_) return;  // Shutdown ran during the write and answered the rest
    done.charge = Charge();  // written (or not to be): room before `then` looks for it
    if (ec) {
      if (done.then) done.then(false);
      return Fail(ec);
    }
    if (done.then) done.then(true);
    if (done.response_done) {
      if (linger_close_) return LingerClose();
      // As the response said: one that promised keep-alive before a drain
      // began keeps the connection, and its next request is answered 503
      // server_draining (a close now could meet that request on its way).
      if (!done.keep_alive || srv_->stopped.load()) return Shutdown();
      ReadHeader();
    }
    if (close_requested_ && out_.empty()) return Shutdown();  // a stream's chunk, a 100 Continue
    WriteNext();
  }

  void LingerClose() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    discard_ = std::make_unique<std::array<char, 16384>>();
    Discard();
  }
  void Discard() {
    stream_.async_read_some(net::buffer(*discard_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->discarded_ += n;
      if (ec || self->discarded_ > (64u << 20)) return self->Shutdown();
      self->Discard();
    });
  }

  void Fail(beast::error_code ec) {
    if (ec != bhttp::error::end_of_stream && ec != net::error::eof && ec != net::error::operation_aborted &&
        ec != beast::error::timeout && ec != net::error::connection_reset) {
      Log().debug("http connection: {}", ec.message());
    }
    Shutdown();
  }

  void Shutdown() {
    if (closed_.exchange(true)) return;
    srv_->metrics.open_connections--;
    // Out of the budget's queue, and no timer holding this connection.
    budget_timer_.cancel();
    if (std::exchange(waiting_budget_, false)) srv_->budget.Cancel(this);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    for (auto& o : out_) {
      if (o.then) std::exchange(o.then, nullptr)(false);
    }
    // A write in progress still points into the front: OnWritten drops it.
    out_.erase(writing_ ? out_.begin() + 1 : out_.begin(), out_.end());
  }

  Stream stream_;
  HttpServer::Impl* srv_;
  // Bounded: a chunked body's chunk-size lines and trailers pass through it,
  // and Beast limits neither (over the bound: buffer_overflow, the
  // connection closed).
  beast::flat_buffer buf_{kMaxReadBufferBytes};
  std::optional<RequestParser> parser_;
  std::string body_;  // a sized request body being read
  net::steady_timer budget_timer_;  // a request waiting for the budget gives up at the stall timeout
  bool waiting_budget_ = false;     // queued in the budget; Admitted() has not come
  size_t reserved_ = 0;  // budget held for the request being read, until Dispatch hands it on
  std::optional<Receiving> receiving_;  // a body is being read (or waits for the budget)
  std::deque<Out> out_;
  bool writing_ = false;
  size_t front_sent_ = 0;  // bytes of out_.front() written
  TimePoint moved_at_;     // the write in progress began, or last wrote some
  bool close_requested_ = false;  // Close found a write in progress
  bool keep_alive_ = true;
  bool http10_ = false;  // the request being answered is HTTP/1.0: no chunked coding
  bool linger_close_ = false;
  bool head_ = false;  // the request being read is a HEAD: a refusal carries no body
  std::unique_ptr<std::array<char, 16384>> discard_;  // only while closing after a Reject
  size_t discarded_ = 0;
  std::atomic<bool> closed_{false};

  friend class ExchangeImpl;
};

// What both protocols' exchanges share: the in-flight count, the request
// body's budget, timers and the worker pool. Held (shared_ptr) by the handler
// and its callbacks; any thread. Counts in in_flight and holds the budget from
// creation until Finish (the response complete), which gives both back once.
class ExchangeBase : public Exchange {
 public:
  ExchangeBase(HttpServer::Impl* srv, size_t reserved, const std::atomic<int64_t>* conn_unwritten)
      : srv_(srv), reserved_(reserved), conn_unwritten_(conn_unwritten) {
    srv_->in_flight++;
  }

  void After(Duration delay, std::function<void()> fn) override {
    auto timer = std::make_shared<net::steady_timer>(srv_->ioc, delay);
    auto* pool = &srv_->workers;
    timer->async_wait([timer, pool, fn = std::move(fn)](beast::error_code) { net::post(*pool, fn); });
  }

  void Post(std::function<void()> fn) override { net::post(srv_->workers, std::move(fn)); }
  // The server's room, and the connection's: a client that reads slowly
  // holds up its own reads before everyone's.
  size_t ResponseRoom() const override {
    auto left = [](int64_t used, size_t budget) {
      const auto u = static_cast<size_t>(std::max<int64_t>(used, 0));
      return u >= budget ? 0 : budget - u;
    };
    const size_t budget = srv_->options.max_unwritten_bytes;
    return std::min(left(srv_->metrics.unwritten_bytes.load(), budget),
                    left(conn_unwritten_->load(), ConnectionUnwrittenBudget(budget)));
  }
  // Bytes that are in memory already: taken ahead of requests waiting for
  // the budget (which hold nothing yet), as a streamed body's are.
  bool TakeBudget(size_t n, size_t streamed) override {
    if (n == 0) return true;
    std::lock_guard lk(extra_mu_);
    if (finished_ || !srv_->budget.TryReserve(n, reserved_ + extra_ + streamed, /*ahead_of_waiters=*/true)) {
      return false;
    }
    extra_ += n;
    return true;
  }
  void GiveBackBudget(size_t n) override {
    {
      std::lock_guard lk(extra_mu_);
      n = std::min(n, extra_);
      extra_ -= n;
    }
    if (n > 0) srv_->budget.Release(n);  // outside the lock: it may admit waiters
  }
  // HTTP/1.1: no later request of the connection comes meanwhile.
  std::shared_ptr<SuspendedWork> SuspendInOrder() override {
    return std::make_shared<SuspendedWork>([srv = srv_](std::function<void()> fn) {
      if (fn && !srv->workers_joined.load()) net::post(srv->workers, std::move(fn));
    });
  }

 protected:
  void Finish() {
    size_t extra = 0;
    {
      std::lock_guard lk(extra_mu_);
      if (finished_.exchange(true)) return;
      extra = std::exchange(extra_, 0);
    }
    srv_->in_flight--;
    if (reserved_ + extra > 0) srv_->budget.Release(reserved_ + extra);
  }
  // `written`, run on the worker pool.
  std::function<void(bool)> OnWorker(std::function<void(bool)> written) {
    if (!written) return nullptr;
    auto* pool = &srv_->workers;
    return [pool, written = std::move(written)](bool ok) { net::post(*pool, [written, ok] { written(ok); }); };
  }

  HttpServer::Impl* srv_;
  const size_t reserved_;
  std::mutex extra_mu_;  // extra_, and finished_ against it
  size_t extra_ = 0;     // TakeBudget's bytes, not given back yet
  const std::atomic<int64_t>* conn_unwritten_;  // its connection's (which the exchange keeps)
  std::atomic<bool> answered_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> streaming_{false};
  bool stream_keeps_ = false;  // set by BeginStream, before streaming_; read by End after it
  std::atomic<bool> head_ended_{false};  // a HEAD's stream, answered with its head alone
};

// The Exchange of one HTTP/1.1 request, made by its Conn and kept alive by the
// handler (it keeps the Conn). Calls from any thread hop onto the connection's
// strand; completion callbacks hop onto the worker pool. The first answer
// wins; dropped unanswered, it answers 500 and closes the connection.
class ExchangeImpl : public ExchangeBase {
 public:
  ExchangeImpl(std::shared_ptr<Conn> conn, HttpServer::Impl* srv, bool keep_alive, size_t reserved, bool head_only,
               bool http10)
      : ExchangeBase(srv, reserved, &conn->unwritten),
        conn_(std::move(conn)),
        keep_alive_(keep_alive),
        head_only_(head_only),
        http10_(http10) {}
  ~ExchangeImpl() override {
    if (!answered_.exchange(true)) {
      Log().error("http: a request was dropped without a response");
      std::string body = ErrorBody("other", "no response was produced");
      Emit(StatusLine(500) +
               fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                           body.size()) +
               (head_only_ ? std::string() : body),
           nullptr, true, false);
    }
    Finish();
  }

  void Respond(Response r) override {
    if (answered_.exchange(true)) return;
    bool keep = keep_alive_ && srv_->KeepsConnections();
    std::string head = StatusLine(r.status);
    head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", r.content_type, r.body.size());
    for (const auto& [k, v] : r.headers) head += fmt::format("{}: {}\r\n", k, v);
    // HTTP/1.0 closes unless both sides say keep-alive (RFC 9112 §9.3).
    if (!keep) head += "Connection: close\r\n";
    else if (http10_) head += "Connection: keep-alive\r\n";
    head += "\r\n";
    if (!head_only_) head += r.body;
    // Queued before the request stops counting as in flight: a drain that
    // sees none left stops the server only behind it.
    Emit(std::move(head), nullptr, true, keep);
    Finish();
  }

  void BeginStream(int status, std::string content_type, HeaderList headers) override {
    if (answered_.exchange(true)) return;
    std::string head = StatusLine(status);
    // HTTP/1.0 has no chunked coding (RFC 9112 §6.1): the body ends with the connection.
    head += fmt::format("Content-Type: {}\r\n{}Cache-Control: no-cache\r\n", content_type,
                        http10_ ? "Connection: close\r\n" : "Transfer-Encoding: chunked\r\n");
    // The connection ends with the stream (the client asked, or a drain
    // began): said now, as a Respond says it (RFC 9112 §9.6).
    // End keeps to what the head said: a drain that begins meanwhile answers
    // the next request 503 server_draining, as after a Respond.
    stream_keeps_ = keep_alive_ && srv_->KeepsConnections() && !http10_;
    if (!http10_ && !stream_keeps_) head += "Connection: close\r\n";
    for (const auto& [k, v] : headers) head += fmt::format("{}: {}\r\n", k, v);
    head += "\r\n";
    streaming_ = true;
    if (head_only_) {  // the response ends with its head: later writes are dropped, closed() is true
      head_ended_ = true;
      Emit(std::move(head), nullptr, true, stream_keeps_);
      Finish();
      return;
    }
    Emit(std::move(head), nullptr, false, true);
  }

  void Write(std::string chunk, std::function<void(bool)> written) override {
    if (!streaming_) {  // no stream begun: its bytes would precede a response's head
      if (written) Post([written] { written(false); });
      return;
    }
    if (chunk.empty()) {  // an empty chunk would end the body
      if (written) Post([written] { written(true); });
      return;
    }
    if (http10_) return Emit(std::move(chunk), OnWorker(std::move(written)), false, true);
    std::string bytes = fmt::format("{:x}\r\n", chunk.size());
    bytes += chunk;
    bytes += "\r\n";
    Emit(std::move(bytes), OnWorker(std::move(written)), false, true);
  }

  void End() override {
    if (!streaming_ || finished_) return;
    Emit(http10_ ? "" : "0\r\n\r\n", nullptr, true, stream_keeps_);
    Finish();
  }

  // Also once a HEAD's streamed response ended with its head: a session
  // sees that nobody reads it (its writes are dropped) and ends.
  bool closed() const override { return conn_->closed() || head_ended_.load(); }

 private:
  // On the strand, in the order the calls reach it: once the response's
  // last bytes are queued, a late chunk (a ping racing the end of a read
  // session) is dropped, so it never lands in the next response. Posted even
  // from the strand itself: run there at once, a call would overtake the
  // calls other threads queued before it.
  void Emit(std::string bytes, std::function<void(bool)> then, bool done, bool keep) {
    net::post(conn_->executor(), [c = conn_, ended = ended_, b = std::move(bytes), t = std::move(then), done,
                                      keep]() mutable {
      if (*ended) {
        if (t) t(false);
        return;
      }
      if (done) *ended = true;
      c->Send(std::move(b), std::move(t), done, keep);
    });
  }

  std::shared_ptr<Conn> conn_;
  bool keep_alive_;
  const bool head_only_;  // a HEAD request: headers only (RFC 9110 §9.3.2)
  const bool http10_;     // an HTTP/1.0 request: a stream is sent as is and ends with the connection
  std::shared_ptr<bool> ended_ = std::make_shared<bool>(false);  // on the strand only
};

// ---- HTTP/2 -------------------------------------------------------------------

// One HTTP/2 connection (cleartext, prior knowledge), on nghttp2. Lives while
// an async operation or an exchange holds it; all its state, and every
// nghttp2 call, is on its strand. Handlers and sinks are called from inside
// nghttp2's receive callbacks; exchanges post to the strand, so nothing
// re-enters nghttp2 from a callback.
class H2Conn : public ConnBase, public std::enable_shared_from_this<H2Conn> {
 public:
  H2Conn(Socket socket, HttpServer::Impl* srv)
      : sock_(std::move(socket)), srv_(srv), timer_(sock_.get_executor()), linger_timer_(sock_.get_executor()) {}
  ~H2Conn() override {
    if (session_) nghttp2_session_del(session_);
  }

  // Strand only. `already_read` holds the preface and whatever followed it.
  void Start(std::string already_read);
  // Sends GOAWAY and what is queued, then closes.
  void Close() override {
    net::post(sock_.get_executor(), [self = shared_from_this()] {
      if (self->closed_) return;
      self->closing_ = true;
      self->Flush();  // writes what is queued, then GOAWAY, then closes
    });
  }
  void Drain() override {
    net::post(sock_.get_executor(), [self = shared_from_this()] {
      if (self->closed_ || self->draining_ || self->session_ == nullptr) return;
      self->draining_ = true;
      self->Flush();  // closes it now if no stream is open
    });
  }
  // A socket write stuck that long closes the connection (nothing reaches
  // the client); a stream whose queued response data has not moved that
  // long (its client's flow-control window stays shut) is reset, and the
  // connection's other streams go on.
  void CloseIfStalled(Duration stalled_for) override {
    net::post(sock_.get_executor(), [self = shared_from_this(), stalled_for] {
      if (self->closed_) return;
      auto now = Now();
      if (self->writing_ && now - self->write_started_ > stalled_for) return self->Shutdown();
      if (self->ResetStalledStreams(now, stalled_for)) self->Flush();
    });
  }
  // Resets the streams whose queued response data has not moved for
  // `stalled_for`; true if it reset any (the caller flushes).
  bool ResetStalledStreams(TimePoint now, Duration stalled_for) {
    bool reset = false;
    for (auto& [id, st] : streams_) {
      if (!st->out.empty() && now - st->moved_at > stalled_for) {
        st->dropping = true;  // once: Tick's own resets pass over it
        nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        reset = true;
      }
    }
    return reset;
  }
  bool closed() const { return closed_.load(); }
  auto executor() { return sock_.get_executor(); }
  // Any thread: Exchange::PostInOrder and InOrderBusy for this connection.
  void PostInOrder(std::function<void()> fn) {
    if (in_order_.Push(std::move(fn))) DrainInOrder();
  }
  bool InOrderBusy() const { return in_order_.Busy() || in_order_suspended_.load() > 0; }
  void DropQueuedWork() override { in_order_.Drop(); }
  // Exchange::SuspendInOrder for this connection.
  std::shared_ptr<SuspendedWork> SuspendInOrder() {
    in_order_suspended_++;
    return std::make_shared<SuspendedWork>([self = shared_from_this()](std::function<void()> fn) {
      if (self->srv_->workers_joined.load()) return;  // stopped: nothing runs any more
      net::post(self->srv_->workers, [self, fn = std::move(fn)] {
        if (fn) fn();
        self->in_order_suspended_--;
        self->ResumeInOrder();
      });
    });
  }

  // Strand only, from exchanges; a stream that is gone drops the call.
  void Respond(int32_t id, Response r);
  void BeginStream(int32_t id, int status, std::string content_type, HeaderList headers);
  void Write(int32_t id, std::string chunk, std::function<void(bool)> then);
  void End(int32_t id);

 private:
  struct Chunk {
    std::string bytes;
    std::function<void(bool)> then;
    Charge charge;  // bytes' share of unwritten_bytes, until handed to nghttp2 whole or dropped
  };
  struct H2Stream {
    int32_t id = 0;
    Request req;
    size_t header_bytes = 0;
    bool head_done = false;
    bool dropping = false;  // the body is not wanted (answered already)
    size_t reserved = 0;    // budget held by a buffered body not yet dispatched, or by a sink's bytes
    std::shared_ptr<BodySink> sink;
    bool sink_ended = false;
    bool sink_refused = false;  // over the budget: the sink takes no more
    std::optional<Receiving> receiving;  // the head is read, the body not yet whole
    bool responded = false;
    std::deque<Chunk> out;  // response data not yet handed to nghttp2
    size_t out_offset = 0;  // into out.front()
    size_t queued = 0;      // bytes of `out` not yet handed to nghttp2 (this stream's part of queued_bytes_)
    bool eof = false;       // no more response data after `out`
    bool head_only = false; // a HEAD request: headers only (RFC 9110 §9.3.2)
    bool deferred = false;  // the data source is paused: resume on more data
    TimePoint head_at = Now();  // the body must be whole within the stall timeout of this, as on HTTP/1.1
    TimePoint moved_at = Now();  // response data last sent, or queued while none was
    std::optional<TimePoint> partial_since;  // a sink holds part of a unit (an S2S frame): its latest bytes came then
    bool held = false;  // at the last tick our windows kept the client from sending
    std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  };

  H2Stream* Find(int32_t id) {
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second.get();
  }

  static int OnBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
    auto* self = static_cast<H2Conn*>(user);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    // A request the handler still works on counts until its exchange goes,
    // not only while its stream is open: a stream reset (by the client, or by
    // us for its frames) frees nghttp2's slot, not the work queued for it.
    if (self->live_exchanges_->load() >= static_cast<int>(kMaxHttp2Streams)) {
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_REFUSED_STREAM);
      return 0;  // no H2Stream: its headers and data are ignored
    }
    auto st = std::make_unique<H2Stream>();
    st->id = frame->hd.stream_id;
    self->streams_[st->id] = std::move(st);
    self->last_activity_ = Now();
    return 0;
  }

  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                      const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    auto* self = static_cast<H2Conn*>(user);
    H2Stream* st = self->Find(frame->hd.stream_id);
    if (!st || st->head_done) return 0;  // trailers are ignored
    // As HPACK counts a field (RFC 7541 §4.1): 32 bytes more than its
    // name and value, so a flood of empty fields counts too.
    const size_t field = namelen + valuelen + 32;
    st->header_bytes += field;
    self->header_bytes_ += field;
    // 64 KiB a stream, and kMaxHttp2HeaderBytes for all of a connection's
    // open streams: HPACK lets a client repeat a long field for a byte, and
    // a head may wait for its body for the stall timeout.
    if (st->header_bytes > 64 * 1024 || self->header_bytes_ > kMaxHttp2HeaderBytes) {
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // resets the stream
    }
    std::string_view n(reinterpret_cast<const char*>(name), namelen);
    std::string v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":method") {
      st->req.method = std::move(v);
    } else if (n == ":path") {
      st->req.path = std::move(v);  // the whole target until the head is done
    } else if (n == ":authority") {
      st->req.headers.emplace_back("host", std::move(v));
    } else if (!n.starts_with(':')) {
      st->req.headers.emplace_back(std::string(n), std::move(v));  // HTTP/2 names are lower case
    }
    return 0;
  }

  static int OnFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    auto* self = static_cast<H2Conn*>(user);
    H2Stream* st = self->Find(frame->hd.stream_id);
    if (!st) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && !st->head_done) self->HeadDone(st);
    st = self->Find(frame->hd.stream_id);  // a refused head may have closed it
    if (st && (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
      self->BodyDone(st);
    }
    return 0;
  }

  static int OnData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len, void* user) {
    auto* self = static_cast<H2Conn*>(user);
    H2Stream* st = self->Find(id);
    bool to_sink = st && st->head_done && !st->dropping && st->sink && !st->sink_ended && !st->sink_refused;
    self->Consume(id, len, /*stream_level=*/!to_sink);  // a sink gives its bytes back itself
    if (!st || !st->head_done || st->dropping) return 0;
    self->last_activity_ = Now();
    std::string_view bytes(reinterpret_cast<const char*>(data), len);
    if (st->sink) {
      if (to_sink) {
        // Held by the sink until it gives them back (ConsumeBody).
        if (!self->srv_->budget.TryReserve(len, st->reserved, /*ahead_of_waiters=*/true)) {
          self->srv_->metrics.budget_refusals++;
          st->sink_refused = true;
          st->partial_since.reset();
          self->Consume(id, len, /*stream_level=*/true, /*connection_level=*/false);
          st->sink->OnRefused(Response{429, "application/json",
                                       ErrorBody("rate_limited", "the server holds too many request bodies; retry"),
                                       {{"retry-after", "1"}}});
          return 0;
        }
        st->reserved += len;
        st->sink->OnData(bytes);
        // Progress: a frame still in part counts from its latest bytes.
        if (st->sink->HoldsPartialInput()) {
          st->partial_since = Now();
        } else {
          st->partial_since.reset();
        }
      }
      return 0;
    }
    size_t limit = self->srv_->options.max_request_bytes;
    if (st->req.body.size() + len > limit) {
      return self->Refuse(st, Response{413, "application/json",
                                       ErrorBody("request_too_large",
                                                 fmt::format("request body is over the limit of {} bytes", limit)),
                                       {}});
    }
    if (!self->srv_->budget.TryReserve(len, st->reserved)) {
      self->srv_->metrics.budget_refusals++;
      return self->Refuse(st, Response{429, "application/json",
                                       ErrorBody("rate_limited", "the server holds too many request bodies; retry"),
                                       {{"retry-after", "1"}}});
    }
    st->reserved += len;
    st->req.body.append(bytes);
    return 0;
  }

  // A response ended while the client still sends its request (an early 413
  // or 429, or a session that ended): RST_STREAM(NO_ERROR) asks it to stop
  // uploading a body nobody reads (RFC 9113 section 8.1); the response stands.
  static int OnFrameSend(nghttp2_session* session, const nghttp2_frame* frame, void*) {
    if ((frame->hd.type == NGHTTP2_DATA || frame->hd.type == NGHTTP2_HEADERS) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        nghttp2_session_get_stream_remote_close(session, frame->hd.stream_id) == 0) {
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    }
    return 0;
  }

  static int OnStreamClose(nghttp2_session*, int32_t id, uint32_t, void* user) {
    auto* self = static_cast<H2Conn*>(user);
    self->unconsumed_stream_.erase(id);  // nothing more to acknowledge for it
    auto it = self->streams_.find(id);
    if (it == self->streams_.end()) return 0;
    std::unique_ptr<H2Stream> st = std::move(it->second);
    self->streams_.erase(it);
    self->header_bytes_ -= st->header_bytes;
    self->Drop(st.get());
    return 0;
  }

  static ssize_t ReadData(nghttp2_session*, int32_t id, uint8_t* buf, size_t length, uint32_t* flags,
                          nghttp2_data_source*, void* user) {
    auto* self = static_cast<H2Conn*>(user);
    H2Stream* st = self->Find(id);
    if (!st) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    size_t n = 0;
    while (n < length && !st->out.empty()) {
      Chunk& c = st->out.front();
      size_t take = std::min(length - n, c.bytes.size() - st->out_offset);
      std::memcpy(buf + n, c.bytes.data() + st->out_offset, take);
      n += take;
      st->out_offset += take;
      self->queued_bytes_ -= take;
      st->queued -= take;
      self->data_sent_ += take;
      st->moved_at = Now();
      if (st->out_offset == c.bytes.size()) {
        if (c.then) self->written_.push_back(std::move(c.then));
        st->out.pop_front();
        st->out_offset = 0;
      }
    }
    if (st->out.empty() && st->eof) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    } else if (n == 0) {
      st->deferred = true;
      return NGHTTP2_ERR_DEFERRED;
    }
    return static_cast<ssize_t>(n);
  }

  // A session (an S2S append session once opened, a read whose response
  // became a stream) may last long: its head no longer counts against the
  // connection's headers (a unary request's counts until its stream closes).
  void ReleaseHeaderBytes(H2Stream* st) {
    header_bytes_ -= st->header_bytes;
    st->header_bytes = 0;
  }

  // The request head is complete: route it.
  void HeadDone(H2Stream* st) {
    st->head_done = true;
    st->head_only = st->req.method == "HEAD";  // also for an answer given before dispatch
    st->head_at = Now();
    std::string target = std::exchange(st->req.path, std::string());
    if (st->req.method.empty() || target.empty() || !ParseTarget(target, &st->req)) {
      Refuse(st, Response{400, "application/json", ErrorBody("bad_request", "a bad :method or :path"), {}});
      return;
    }
    if (auto refused = srv_->handler->RefuseHead(st->req)) {  // before any of the body is taken
      Refuse(st, std::move(*refused));
      return;
    }
    if (!srv_->handler->WantsBodyStream(st->req)) {  // the body is read whole
      // A length over the limit is refused before its body is sent, as on HTTP/1.1
      // (nghttp2 resets a stream whose DATA does not match its content-length).
      const size_t limit = srv_->options.max_request_bytes;
      if (const std::string* cl = st->req.Header("content-length")) {
        uint64_t n = 0;
        auto [end, ec] = std::from_chars(cl->data(), cl->data() + cl->size(), n);
        const bool whole = ec == std::errc() && end == cl->data() + cl->size();
        if (ec == std::errc::result_out_of_range || (whole && n > limit)) {
          Refuse(st, Response{413, "application/json",
                              ErrorBody("request_too_large",
                                        fmt::format("request body of {} bytes is over the limit of {} bytes", *cl,
                                                    limit)),
                              {}});
          return;
        }
      }
      st->receiving.emplace(&srv_->receiving);  // BodyDone follows at once when there is none
      return;
    }
    Request head = std::move(st->req);
    st->req = Request{};
    ReleaseHeaderBytes(st);
    auto sink = srv_->handler->OpenBodyStream(std::move(head), MakeExchange(st, 0));
    st = Find(st->id);
    if (!st) return;
    if (sink) {
      st->sink = std::move(sink);
    } else {
      st->dropping = true;
    }
  }

  // The client finished its body.
  void BodyDone(H2Stream* st) {
    if (st->dropping) return;
    if (st->sink) {
      if (!std::exchange(st->sink_ended, true)) st->sink->OnEnd(true);
      return;
    }
    if (!st->head_done) return;
    st->dropping = true;  // dispatched: nothing more is read for it
    Request req = std::move(st->req);
    st->req = Request{};
    DropUnusedBody(req, st->reserved, srv_->budget);
    // Counted until the exchange counts it.
    std::optional<Receiving> receiving = std::exchange(st->receiving, std::nullopt);
    srv_->handler->Handle(std::move(req), MakeExchange(st, std::exchange(st->reserved, 0)));
  }

  std::shared_ptr<Exchange> MakeExchange(H2Stream* st, size_t reserved);

  // Flow control is by hand (no automatic WINDOW_UPDATE): request bytes are
  // acknowledged as they are taken, for their stream only while it holds
  // back no response data of its own (HoldsBack); then once that drained
  // (Flush). A BodySink's bytes are acknowledged for the connection here,
  // for their stream when the sink gives them back.
  void Consume(int32_t id, size_t len, bool stream_level, bool connection_level = true) {
    if (connection_level) nghttp2_session_consume_connection(session_, len);
    if (!stream_level) return;
    if (const H2Stream* st = Find(id); st && HoldsBack(*st)) {
      unconsumed_stream_[id] += len;  // one sum per open stream (OnStreamClose forgets a closed one's)
      return;
    }
    nghttp2_session_consume_stream(session_, id, len);  // fails harmlessly once closed
  }
  bool HoldsBack(const H2Stream& st) const {
    return st.queued > 0 && queued_bytes_ > kHttp2MaxQueuedBytes;
  }
  // Gives back what streams that hold back no more were kept from; whether any.
  bool ConsumeHeld() {
    bool any = false;
    for (auto it = unconsumed_stream_.begin(); it != unconsumed_stream_.end();) {
      if (const H2Stream* st = Find(it->first); st && HoldsBack(*st)) {
        ++it;
        continue;
      }
      nghttp2_session_consume_stream(session_, it->first, it->second);
      it = unconsumed_stream_.erase(it);
      any = true;
    }
    return any;
  }

 public:
  // Strand only: a sink gave back `n` bytes of stream `id`.
  void ConsumeBody(int32_t id, size_t n) {
    H2Stream* st = closed_ ? nullptr : Find(id);
    if (!st) return;  // Drop gave the budget back
    if (const size_t r = std::min(n, st->reserved); r > 0) {
      srv_->budget.Release(r);
      st->reserved -= r;
    }
    Consume(id, n, /*stream_level=*/true, /*connection_level=*/false);
    Flush();
  }

 private:

  // Answers now and drops the rest of the body.
  int Refuse(H2Stream* st, Response r) {
    st->dropping = true;
    st->receiving.reset();
    // The body taken so far goes with its budget: the stream may stay open
    // (its answer waiting for the client's window) long after.
    FreeString(st->req.body);
    if (st->reserved > 0) srv_->budget.Release(std::exchange(st->reserved, 0));
    SubmitWhole(st, std::move(r));
    return 0;
  }

  // A whole response: headers, then `r.body` through ReadData.
  void SubmitWhole(H2Stream* st, Response r) {
    Submit(st, r.status, r.content_type, r.headers, r.body.size());
    if (!st->head_only) {
      queued_bytes_ += r.body.size();
      st->queued += r.body.size();
      st->moved_at = Now();
      const size_t n = r.body.size();
      st->out.push_back(Chunk{std::move(r.body), nullptr, Charge(&srv_->metrics.unwritten_bytes, &unwritten, n)});
    }
    st->eof = true;
  }

  // A stream is over (closed, or the connection is): nothing more reaches it.
  void Drop(H2Stream* st) {
    st->gone->store(true);
    if (st->reserved > 0) srv_->budget.Release(std::exchange(st->reserved, 0));
    for (auto& c : st->out) {
      queued_bytes_ -= c.bytes.size();
      if (c.then) std::exchange(c.then, nullptr)(false);
    }
    queued_bytes_ += st->out_offset;  // the front's copied part was already counted off
    st->out.clear();
    st->queued = 0;
    if (st->sink && !std::exchange(st->sink_ended, true)) st->sink->OnEnd(false);
    st->sink.reset();
  }

  // Submits the response headers; the body follows through ReadData.
  void Submit(H2Stream* st, int status, const std::string& content_type, const HeaderList& headers,
              std::optional<size_t> length) {
    st->responded = true;
    std::vector<std::pair<std::string, std::string>> h;
    h.emplace_back(":status", std::to_string(status));
    h.emplace_back("content-type", content_type);
    if (length) h.emplace_back("content-length", std::to_string(*length));
    for (const auto& [k, v] : headers) {
      std::string name = k;
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      h.emplace_back(std::move(name), v);
    }
    std::vector<nghttp2_nv> nv;
    for (auto& [k, v] : h) {
      nv.push_back(nghttp2_nv{reinterpret_cast<uint8_t*>(k.data()), reinterpret_cast<uint8_t*>(v.data()), k.size(),
                              v.size(), NGHTTP2_NV_FLAG_NONE});
    }
    nghttp2_data_provider prd{};
    prd.read_callback = &H2Conn::ReadData;
    bool body = !length || *length > 0;
    if (nghttp2_submit_response(session_, st->id, nv.data(), nv.size(), body ? &prd : nullptr) != 0) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    }
  }

  void Resume(H2Stream* st) {
    if (std::exchange(st->deferred, false)) nghttp2_session_resume_data(session_, st->id);
  }

  void ReadMore() {
    if (closed_ || reading_) return;
    reading_ = true;
    sock_.async_read_some(net::buffer(rbuf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->reading_ = false;
      if (ec) return self->Shutdown();
      self->Feed(self->rbuf_.data(), n);
      self->Flush();
      self->ReadMore();
    });
  }

  void Feed(const char* data, size_t n) {
    if (closed_ || lingering_) return;
    last_activity_ = Now();
    auto r = nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(data), n);
    if (r < 0) {
      Log().debug("http2 connection: {}", nghttp2_strerror(static_cast<int>(r)));
      Shutdown();
    }
  }

  // Writes what nghttp2 has to send, one write at a time.
  void Flush() {
    if (closed_ || writing_) return;
    // Draining: once no stream is open, GOAWAY and close. (Not GOAWAY while
    // streams are open: some clients, Python's h2 among them, drop the
    // connection's open streams when it arrives.)
    if (draining_ && streams_.empty()) {
      closing_ = true;
      // Idle: GOAWAY now, with whatever frames are due, so that a request
      // arriving while they are written is past its last stream id (nghttp2
      // ignores it, the client sends it again elsewhere) instead of being
      // taken and then cut off by the close.
      if (!goaway_sent_) {
        goaway_sent_ = true;
        nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(session_),
                              NGHTTP2_NO_ERROR, nullptr, 0);
      }
    }
    ConsumeHeld();
    wbuf_.clear();
    auto take = [this] {
      while (wbuf_.size() < (256u << 10)) {
        const uint8_t* data = nullptr;
        auto n = nghttp2_session_mem_send(session_, &data);
        if (n < 0) return false;
        if (n == 0) break;
        wbuf_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      }
      return true;
    };
    if (!take()) return Shutdown();
    // What was just handed over may end a stream's hold-back: its
    // WINDOW_UPDATE goes out with this write, not a write later.
    if (ConsumeHeld() && !take()) return Shutdown();
    if (wbuf_.empty() && closing_ && !goaway_sent_) {
      // Last, so that no client sees stream data after it.
      goaway_sent_ = true;
      nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(session_),
                            NGHTTP2_NO_ERROR, nullptr, 0);
      if (!take()) return Shutdown();
    }
    if (wbuf_.empty()) {
      // A large write left it grown: an idle connection keeps no more than 64 KiB.
      if (wbuf_.capacity() > kKeptBufferBytes) std::string().swap(wbuf_);
      if (closing_ && goaway_sent_) return Linger();
      if (closing_ || (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_))) Shutdown();
      return;
    }
    writing_ = true;
    write_started_ = Now();
    std::vector<std::function<void(bool)>> done;
    done.swap(written_);
    net::async_write(sock_, net::buffer(wbuf_),
                     [self = shared_from_this(), done = std::move(done)](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       for (const auto& d : done) d(!ec);
                       if (ec) return self->Shutdown();
                       self->Flush();
                     });
  }

  // Every 5 s (or a quarter of the stall timeout): a write stuck for the
  // stall timeout closes the connection; once the client's windows have let
  // none of the connection's queued response data through for as long, the
  // streams whose data waits are reset (its other streams, a long poll say,
  // go on; while some stream's data moves, a stream the client leaves
  // unread for a while is its business); a request body not whole that long
  // after its head is reset,
  // which gives its budget back; an idle connection (no stream for the idle timeout) is sent
  // GOAWAY and closed.
  void Tick() {
    timer_.expires_after(std::min<Duration>(std::chrono::seconds(5), srv_->options.stall_timeout / 4));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_) return;
      auto now = Now();
      const Duration stall = self->srv_->options.stall_timeout;
      if (self->writing_ && now - self->write_started_ > stall) return self->Shutdown();
      if (self->queued_bytes_ == 0 || self->data_sent_ != self->tick_data_sent_) self->stalled_since_ = now;
      self->tick_data_sent_ = self->data_sent_;
      bool reset = now - self->stalled_since_ > stall && self->ResetStalledStreams(now, stall);
      for (auto& [id, st] : self->streams_) {
        // A stream holding request budget (an append session's input, kept
        // while its acks back up) whose own responses the client leaves
        // unread that long is reset, whatever the connection's other
        // streams do: else the client could keep that budget for good.
        if (!st->dropping && st->reserved > 0 && !st->out.empty() && now - st->moved_at > stall) {
          st->dropping = true;
          nghttp2_submit_rst_stream(self->session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
          reset = true;
          continue;
        }
        // A head never finished (HEADERS without END_HEADERS, then silence)
        // counts from the stream's start, as a body from its head.
        // A sink may wait for input as long as it likes, but not sit on half
        // of a frame with no more of it coming, unless our own windows hold
        // the rest back (its bytes are credited once its appends are acked).
        bool stalled = st->sink ? st->partial_since && !st->sink_ended && now - *st->partial_since > stall
                                : now - st->head_at > stall;
        // Our own hold-back (the stream's responses queued: HoldsBack)
        // may be what keeps the client from sending: not its stall. The time
        // counts from when it may send again (seen at a tick).
        const bool held = !self->ClientMaySend(id);
        const bool was_held = std::exchange(st->held, held);
        if (held || was_held) {
          if (st->sink && st->partial_since) st->partial_since = now;
          if (!st->sink) st->head_at = now;
          stalled = false;
        }
        if (!st->dropping && stalled) {
          st->dropping = true;
          nghttp2_submit_rst_stream(self->session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
          reset = true;
        }
      }
      if (reset) {
        self->Flush();
        if (self->closed_) return;
      }
      if (self->streams_.empty() && now - self->last_activity_ > self->srv_->options.idle_timeout) {
        self->closing_ = true;  // GOAWAY, then close
        self->Flush();
        if (self->closed_) return;
      }
      self->Tick();
    });
  }

  // Whether the client's windows (stream and connection) let it send more
  // DATA on stream `id`.
  bool ClientMaySend(int32_t id) {
    const int32_t stream_window = nghttp2_session_get_stream_effective_local_window_size(session_, id);
    const int32_t stream_used = nghttp2_session_get_stream_effective_recv_data_length(session_, id);
    const int32_t conn_window = nghttp2_session_get_effective_local_window_size(session_);
    const int32_t conn_used = nghttp2_session_get_effective_recv_data_length(session_);
    return stream_window - stream_used > 0 && conn_window - conn_used > 0;
  }

  // The GOAWAY is written: the write side is shut (FIN) and what the client
  // still sends (a request that crossed the GOAWAY) is read and dropped until
  // it closes, or for two seconds, so that the close is not a reset, which
  // can cut off the GOAWAY before the client reads it (RFC 9113 §6.8).
  void Linger() {
    if (std::exchange(lingering_, true)) return;
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return Shutdown();
    linger_timer_.expires_after(std::chrono::seconds(2));
    linger_timer_.async_wait([self = shared_from_this()](beast::error_code) { self->Shutdown(); });
    ReadMore();  // already reading, unless the close came from a write's end
  }

  void Shutdown() {
    if (closed_.exchange(true)) return;
    srv_->metrics.open_connections--;
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    timer_.cancel();
    linger_timer_.cancel();
    auto streams = std::move(streams_);
    streams_.clear();
    for (auto& [id, st] : streams) Drop(st.get());
    for (auto& d : std::exchange(written_, {})) d(false);
  }

  Socket sock_;
  HttpServer::Impl* srv_;
  net::steady_timer timer_;
  net::steady_timer linger_timer_;  // ends a Linger
  bool lingering_ = false;          // GOAWAY written, write side shut: input is dropped until EOF or the timer
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, std::unique_ptr<H2Stream>> streams_;
  size_t header_bytes_ = 0;  // the open streams' header_bytes
  std::array<char, 16384> rbuf_{};
  std::string wbuf_;  // the write in progress
  std::vector<std::function<void(bool)>> written_;  // chunks handed to nghttp2 since the last write began
  size_t queued_bytes_ = 0;  // response bytes in streams' `out`
  uint64_t data_sent_ = 0;       // response bytes handed to nghttp2, ever
  uint64_t tick_data_sent_ = 0;  // data_sent_ at the last Tick
  TimePoint stalled_since_ = Now();  // since when queued response data has not moved
  // Request bytes held back, by open stream, while its responses queue
  // (HoldsBack).
  std::map<int32_t, size_t> unconsumed_stream_;
  // Exchanges handed to the handler and not yet destroyed (H2Exchange).
  std::shared_ptr<std::atomic<int>> live_exchanges_ = std::make_shared<std::atomic<int>>(0);
  bool closing_ = false;                // the server closes it: write what is queued, GOAWAY, close
  bool goaway_sent_ = false;
  bool draining_ = false;     // Drain: GOAWAY and close once no stream is open
  bool reading_ = false;
  bool writing_ = false;
  TimePoint write_started_;
  TimePoint last_activity_ = Now();
  std::atomic<bool> closed_{false};
  // A turn of PostInOrder's work on the pool; posted again while more waits,
  // parked while work is suspended.
  void DrainInOrder() {
    net::post(srv_->workers, [self = shared_from_this()] {
      switch (self->in_order_.RunSomeUnless([&] { return self->in_order_suspended_.load() > 0; })) {
        case OrderedQueue::Turn::kMore: return self->DrainInOrder();
        case OrderedQueue::Turn::kPaused:
          self->in_order_parked_.store(true);
          return self->ResumeInOrder();  // the suspended work may have gone on meanwhile
        case OrderedQueue::Turn::kDone: return;
      }
    });
  }
  // After a suspended work went on; any thread.
  void ResumeInOrder() {
    if (in_order_suspended_.load() > 0) return;
    if (in_order_parked_.exchange(false)) DrainInOrder();
  }
  OrderedQueue in_order_;  // PostInOrder's work (not an asio strand on the pool: this may outlive it)
  std::atomic<int> in_order_suspended_{0};     // SuspendInOrder calls not yet resumed
  std::atomic<bool> in_order_parked_{false};   // a drain stopped while work was suspended
};

// The Exchange of one HTTP/2 stream, made by its H2Conn and kept alive by the
// handler (it keeps the H2Conn): calls post to the connection's strand (never
// run inline, so never inside an nghttp2 callback). The first answer wins;
// dropped unanswered, it answers 500 (a stream begun, it ends it).
class H2Exchange : public ExchangeBase {
 public:
  H2Exchange(std::shared_ptr<H2Conn> conn, int32_t id, std::shared_ptr<std::atomic<bool>> gone,
             HttpServer::Impl* srv, size_t reserved, std::shared_ptr<std::atomic<int>> live)
      : ExchangeBase(srv, reserved, &conn->unwritten),
        conn_(std::move(conn)),
        id_(id),
        gone_(std::move(gone)),
        live_(std::move(live)) {
    ++*live_;
  }
  bool sequential() const override { return false; }
  void PostInOrder(std::function<void()> fn) override { conn_->PostInOrder(std::move(fn)); }
  bool InOrderBusy() const override { return conn_->InOrderBusy(); }
  std::shared_ptr<SuspendedWork> SuspendInOrder() override { return conn_->SuspendInOrder(); }
  ~H2Exchange() override {
    if (!answered_.exchange(true)) {
      Log().error("http: a request was dropped without a response");
      On([id = id_](H2Conn* c) {
        c->Respond(id, Response{500, "application/json", ErrorBody("other", "no response was produced"), {}});
      });
    } else if (streaming_ && !finished_) {
      On([id = id_](H2Conn* c) { c->End(id); });
    }
    Finish();
    --*live_;
  }

  void Respond(Response r) override {
    if (answered_.exchange(true)) return;
    On([id = id_, r = std::move(r)](H2Conn* c) mutable { c->Respond(id, std::move(r)); });
    Finish();  // after: see ExchangeImpl::Respond
  }
  void BeginStream(int status, std::string content_type, HeaderList headers) override {
    if (answered_.exchange(true)) return;
    streaming_ = true;
    On([id = id_, status, ct = std::move(content_type), h = std::move(headers)](H2Conn* c) mutable {
      c->BeginStream(id, status, std::move(ct), std::move(h));
    });
  }
  void Write(std::string chunk, std::function<void(bool)> written) override {
    if (!streaming_) {  // no stream begun (as on HTTP/1.1)
      if (written) Post([written] { written(false); });
      return;
    }
    if (chunk.empty()) {  // nothing to wait for
      if (written) Post([written] { written(true); });
      return;
    }
    On([id = id_, b = std::move(chunk), t = OnWorker(std::move(written))](H2Conn* c) mutable {
      c->Write(id, std::move(b), std::move(t));
    });
  }
  void End() override {
    if (!streaming_ || finished_) return;
    On([id = id_](H2Conn* c) { c->End(id); });
    Finish();
  }
  bool closed() const override { return conn_->closed() || gone_->load(); }
  void ConsumeBody(size_t n) override {
    On([id = id_, n](H2Conn* c) { c->ConsumeBody(id, n); });
  }

 private:
  template <typename F>
  void On(F fn) {
    net::post(conn_->executor(), [c = conn_, fn = std::move(fn)]() mutable { fn(c.get()); });
  }

  std::shared_ptr<H2Conn> conn_;
  const int32_t id_;
  std::shared_ptr<std::atomic<bool>> gone_;
  std::shared_ptr<std::atomic<int>> live_;  // the connection's count of exchanges alive
};

std::shared_ptr<Exchange> H2Conn::MakeExchange(H2Stream* st, size_t reserved) {
  return std::make_shared<H2Exchange>(shared_from_this(), st->id, st->gone, srv_, reserved, live_exchanges_);
}

void H2Conn::Start(std::string already_read) {
  nghttp2_session_callbacks* cbs = nullptr;
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &H2Conn::OnBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &H2Conn::OnHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &H2Conn::OnFrameRecv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &H2Conn::OnData);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &H2Conn::OnStreamClose);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, &H2Conn::OnFrameSend);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  nghttp2_option_set_no_auto_window_update(opt, 1);
  int rv = nghttp2_session_server_new2(&session_, cbs, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    session_ = nullptr;
    Log().warn("http2: cannot start a session: {}", nghttp2_strerror(rv));
    closed_ = true;
    srv_->metrics.open_connections--;
    beast::error_code ec;
    sock_.close(ec);
    return;
  }
  nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxHttp2Streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kHttp2StreamWindow},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 64u << 10},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kHttp2ConnectionWindow);
  Feed(already_read.data(), already_read.size());
  Flush();
  ReadMore();
  Tick();
}

void H2Conn::Respond(int32_t id, Response r) {
  H2Stream* st = closed_ ? nullptr : Find(id);
  if (!st || st->responded) return;
  SubmitWhole(st, std::move(r));
  Flush();
}

void H2Conn::BeginStream(int32_t id, int status, std::string content_type, HeaderList headers) {
  H2Stream* st = closed_ ? nullptr : Find(id);
  if (!st || st->responded) return;
  headers.emplace_back("cache-control", "no-cache");
  ReleaseHeaderBytes(st);
  Submit(st, status, content_type, headers, std::nullopt);
  if (st->head_only) st->eof = true;  // no body: later writes fail, which ends the session
  Flush();
}

void H2Conn::Write(int32_t id, std::string chunk, std::function<void(bool)> then) {
  H2Stream* st = closed_ ? nullptr : Find(id);
  if (!st || !st->responded || st->eof) {
    if (then) then(false);
    return;
  }
  queued_bytes_ += chunk.size();
  st->queued += chunk.size();
  if (st->out.empty()) st->moved_at = Now();
  const size_t n = chunk.size();
  st->out.push_back(Chunk{std::move(chunk), std::move(then), Charge(&srv_->metrics.unwritten_bytes, &unwritten, n)});
  Resume(st);
  Flush();
}

void H2Conn::End(int32_t id) {
  H2Stream* st = closed_ ? nullptr : Find(id);
  if (!st || !st->responded || st->eof) return;
  st->eof = true;
  Resume(st);
  Flush();
}

void Conn::StartHttp2(std::string already_read) {
  stream_.expires_never();
  closed_ = true;  // handed over: the HTTP/2 connection counts as the open connection now
  auto h2 = std::make_shared<H2Conn>(stream_.release_socket(), srv_);
  srv_->metrics.http2_connections++;
  srv_->Register(h2);
  h2->Start(std::move(already_read));
}

void Conn::Dispatch(Request req) {
  const bool head_only = req.method == "HEAD";
  DropUnusedBody(req, reserved_, srv_->budget);
  auto ex = std::make_shared<ExchangeImpl>(shared_from_this(), srv_, keep_alive_, std::exchange(reserved_, 0),
                                           head_only, http10_);
  srv_->handler->Handle(std::move(req), std::move(ex));
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc.get_executor()), [this](beast::error_code ec, Socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      // The connection stays in the backlog (EMFILE): accepting again at
      // once would spin an I/O thread.
      Log().warn("http accept: {}; retrying in 100 ms", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code e) {
        if (!e && acceptor.is_open()) Accept();
      });
      return;
    } else if (static_cast<size_t>(metrics.open_connections.load()) >= options.max_connections) {
      // Closed before any byte is read; the client sees a reset and retries.
      if (metrics.rejected_connections++ % 1000 == 0) {
        Log().warn("http: {} connections open (--http-max-connections); refusing more", options.max_connections);
      }
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      EnableTcpKeepAlive(socket.native_handle());
      metrics.connections++;
      metrics.open_connections++;
      auto conn = std::make_shared<Conn>(std::move(socket), this);
      Register(conn);
      conn->Start();
    }
    Accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options, Handler* handler) {
  auto impl = std::make_unique<Impl>(options, handler);
  WEIR_RETURN_IF_ERROR(impl->Listen());
  impl->Accept();
  impl->Run();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { Stop(); }

std::string HttpServer::address() const {
  // "[v6]:port", as URLs and --server want it.
  const auto& a = impl_->bound.address();
  if (a.is_v6()) return fmt::format("[{}]:{}", a.to_string(), impl_->bound.port());
  return fmt::format("{}:{}", a.to_string(), impl_->bound.port());
}

int64_t HttpServer::in_flight() const { return impl_->in_flight.load(); }
int64_t HttpServer::receiving() const { return impl_->receiving.load(); }
const HttpServerMetrics& HttpServer::metrics() const { return impl_->metrics; }

void HttpServer::StopAccepting() {
  net::post(impl_->acceptor.get_executor(), [i = impl_.get()] {
    beast::error_code ec;
    i->acceptor.close(ec);
    i->accept_retry.cancel();
  });
}

void HttpServer::BeginDrain() {
  impl_->draining = true;
  std::lock_guard lk(impl_->conns_mu);
  for (auto& w : impl_->conns) {
    if (auto c = w.lock()) c->Drain();
  }
}

void HttpServer::CloseStalled(Duration stalled_for) {
  std::lock_guard lk(impl_->conns_mu);
  for (auto& w : impl_->conns) {
    if (auto c = w.lock()) c->CloseIfStalled(stalled_for);
  }
}

void HttpServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  StopAccepting();
  {
    std::lock_guard lk(impl_->conns_mu);
    for (auto& w : impl_->conns) {
      if (auto c = w.lock()) c->Close();
    }
  }
  impl_->budget.DropWaiters();  // while the io_context lives
  impl_->workers.join();
  impl_->workers_joined = true;
  impl_->guard.reset();
  // What the strands still hold (responses answered just now, the closes
  // above) runs for up to stop_grace; then everything stops.
  auto deadline = Now() + impl_->options.stop_grace;
  while (!impl_->ioc.stopped() && Now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  {
    std::lock_guard lk(impl_->conns_mu);
    for (auto& w : impl_->conns) {
      if (auto c = w.lock()) c->DropQueuedWork();
    }
  }
  // A connection that queued for the budget since (its header read had
  // finished before its close ran) would outlive the io_context in the queue.
  impl_->budget.DropWaiters();
}

}  // namespace weir::http
