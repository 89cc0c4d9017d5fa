// The only translation unit that includes Boost.Beast / Asio.
#include "http/server.h"

#include <array>
#include <cctype>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/byte_budget.h"
#include "base/log.h"
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

std::string StatusLine(int status) {
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(reason.data(), reason.size()));
}

class Conn;

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const ServerOptions& o, Handler* h)
      : options(o), handler(h), acceptor(ioc), workers(static_cast<size_t>(std::max(1, o.worker_threads))) {}

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
  // Request bodies (options.max_in_flight_bytes). A waiting connection has
  // no I/O pending, so the queue keeps it alive.
  ByteBudget<std::shared_ptr<Conn>> budget{options.max_in_flight_bytes, &metrics.in_flight_bytes,
                                           &metrics.budget_waits};

  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> guard{ioc.get_executor()};
  tcp::acceptor acceptor;
  tcp::endpoint bound;
  net::thread_pool workers;
  std::vector<std::thread> threads;
  std::mutex conns_mu;
  std::vector<std::weak_ptr<Conn>> conns;
  std::atomic<bool> stopped{false};
};

namespace {

// One TCP connection. Lives while an async operation or an Exchange holds it;
// all its state is touched on its strand only.
class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(Socket socket, HttpServer::Impl* srv) : stream_(std::move(socket)), srv_(srv) {}

  void Start() {
    // Beast reads at most the buffer's spare capacity (512 bytes at first):
    // with room for a small request whole, one recv takes head and body.
    buf_.reserve(kReadBufferBytes);
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }
  void Close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Shutdown(); });
  }
  bool closed() const { return closed_.load(); }
  auto executor() { return stream_.get_executor(); }

  // From the budget, on any thread: `n` bytes are now reserved for the body
  // this connection waits to read.
  void Admitted(size_t n) {
    net::post(stream_.get_executor(), [self = shared_from_this(), n] {
      self->reserved_ = n;
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
    out_.push_back(Out{std::move(bytes), std::move(then), response_done, keep_alive});
    if (!writing_) WriteNext();
  }

 private:
  struct Out {
    std::string bytes;
    std::function<void(bool)> then;
    bool response_done;
    bool keep_alive;
  };

  void ReadHeader() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(64 * 1024);
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
    if (ec) return Fail(ec);
    auto len = parser_->content_length();
    if (len && *len > srv_->options.max_request_bytes) {
      return Reject(413, "request_too_large",
                    fmt::format("request body of {} bytes is over the limit of {} bytes", *len,
                                srv_->options.max_request_bytes));
    }
    // The body's memory comes from the shared budget; a chunked body may
    // grow to the limit, so it counts as that.
    const size_t want = parser_->chunked() ? srv_->options.max_request_bytes : len.value_or(0);
    if (want == 0) return ReadBody();
    if (srv_->budget.ReserveOrWait(shared_from_this(), want)) {
      reserved_ = want;
      ReadBody();
    }
    // Otherwise Admitted() resumes here once the budget has room.
  }

  // Reads the body whose header parser_ holds; its budget is reserved.
  void ReadBody() {
    auto& req = parser_->get();
    if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
      Send("HTTP/1.1 100 Continue\r\n\r\n", nullptr, false, true);
    }
    stream_.expires_after(std::chrono::seconds(60));
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
    if (ec) ReleaseReserved();  // not dispatched: the body is dropped
    if (ec == bhttp::error::body_limit) {
      return Reject(413, "request_too_large",
                    fmt::format("request body is over the limit of {} bytes", srv_->options.max_request_bytes));
    }
    if (ec) return Fail(ec);
    stream_.expires_never();
    auto msg = parser_->release();
    parser_.reset();
    if (sized) msg.body() = std::move(body_);
    body_ = std::string();
    keep_alive_ = msg.keep_alive();
    Request req;
    req.method = std::string(msg.method_string());
    std::string_view target(msg.target().data(), msg.target().size());
    auto q = target.find('?');
    req.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) {
      std::string_view rest = target.substr(q + 1);
      while (!rest.empty()) {
        auto amp = rest.find('&');
        auto part = rest.substr(0, amp);
        rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
        if (part.empty()) continue;
        auto eq = part.find('=');
        auto k = PercentDecode(part.substr(0, eq), true);
        auto v = PercentDecode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1), true);
        if (!k.ok() || !v.ok()) {
          ReleaseReserved();
          return Reject(400, "bad_request", "bad percent escape in the query string");
        }
        req.query.emplace_back(std::move(*k), std::move(*v));
      }
    }
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    req.body = std::move(msg.body());
    Dispatch(std::move(req));
  }

  void Dispatch(Request req);

  // Answers an unreadable request and closes the connection after, reading
  // (and dropping) what the client still sends for a while first, so the
  // close does not reset the connection before the client reads the answer.
  void Reject(int status, std::string_view code, std::string_view message) {
    linger_close_ = true;
    std::string body = fmt::format(R"({{"code":"{}","message":"{}"}})", code, message);
    std::string bytes = StatusLine(status) +
                        fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                    body.size()) +
                        body;
    Send(std::move(bytes), nullptr, true, false);
  }

  void WriteNext() {
    if (out_.empty() || closed_) return;
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(60));
    net::async_write(stream_, net::buffer(out_.front().bytes),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(beast::error_code ec) {
    writing_ = false;
    Out done = std::move(out_.front());
    out_.pop_front();
    if (closed_) return;  // Shutdown ran during the write and answered the rest
    if (ec) {
      if (done.then) done.then(false);
      return Fail(ec);
    }
    if (done.then) done.then(true);
    if (done.response_done) {
      if (linger_close_) return LingerClose();
      if (!done.keep_alive || srv_->stopped) return Shutdown();
      ReadHeader();
    }
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
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string body_;  // a sized request body being read
  size_t reserved_ = 0;  // budget held for the request being read, until Dispatch hands it on
  std::deque<Out> out_;
  bool writing_ = false;
  bool keep_alive_ = true;
  bool linger_close_ = false;
  std::unique_ptr<std::array<char, 16384>> discard_;  // only while closing after a Reject
  size_t discarded_ = 0;
  std::atomic<bool> closed_{false};

  friend class ExchangeImpl;
};

// The Exchange of one request. Calls from any thread hop onto the
// connection's strand; completion callbacks hop onto the worker pool.
class ExchangeImpl : public Exchange {
 public:
  // `reserved`: the request body's bytes of the budget, released once the
  // response is complete.
  ExchangeImpl(std::shared_ptr<Conn> conn, HttpServer::Impl* srv, bool keep_alive, size_t reserved)
      : conn_(std::move(conn)), srv_(srv), keep_alive_(keep_alive), reserved_(reserved) {
    srv_->in_flight++;
  }
  ~ExchangeImpl() override {
    if (!answered_.exchange(true)) {
      Log().error("http: a request was dropped without a response");
      Emit(StatusLine(500) + "Content-Type: application/json\r\nContent-Length: 55\r\nConnection: close\r\n\r\n" +
               R"({"code":"internal","message":"no response was produced"})",
           nullptr, true, false);
    }
    Finish();
  }

  void Respond(Response r) override {
    if (answered_.exchange(true)) return;
    bool keep = keep_alive_ && !srv_->stopped;
    std::string head = StatusLine(r.status);
    head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", r.content_type, r.body.size());
    for (const auto& [k, v] : r.headers) head += fmt::format("{}: {}\r\n", k, v);
    if (!keep) head += "Connection: close\r\n";
    head += "\r\n";
    head += r.body;
    Finish();
    Emit(std::move(head), nullptr, true, keep);
  }

  void BeginStream(int status, std::string content_type, HeaderList headers) override {
    if (answered_.exchange(true)) return;
    std::string head = StatusLine(status);
    head += fmt::format("Content-Type: {}\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n", content_type);
    for (const auto& [k, v] : headers) head += fmt::format("{}: {}\r\n", k, v);
    head += "\r\n";
    streaming_ = true;
    Emit(std::move(head), nullptr, false, true);
  }

  void Write(std::string chunk, std::function<void(bool)> written) override {
    if (chunk.empty()) {  // an empty chunk would end the body
      if (written) Post([written] { written(true); });
      return;
    }
    std::string bytes = fmt::format("{:x}\r\n", chunk.size());
    bytes += chunk;
    bytes += "\r\n";
    auto* pool = &srv_->workers;
    std::function<void(bool)> then;
    if (written) then = [pool, written](bool ok) { net::post(*pool, [written, ok] { written(ok); }); };
    Emit(std::move(bytes), std::move(then), false, true);
  }

  void End() override {
    if (!streaming_ || finished_) return;
    Finish();
    bool keep = keep_alive_ && !srv_->stopped;
    Emit("0\r\n\r\n", nullptr, true, keep);
  }

  void After(Duration delay, std::function<void()> fn) override {
    auto timer = std::make_shared<net::steady_timer>(srv_->ioc, delay);
    auto* pool = &srv_->workers;
    timer->async_wait([timer, pool, fn = std::move(fn)](beast::error_code) { net::post(*pool, fn); });
  }

  void Post(std::function<void()> fn) override { net::post(srv_->workers, std::move(fn)); }

  bool closed() const override { return conn_->closed(); }

 private:
  void Finish() {
    if (finished_.exchange(true)) return;
    srv_->in_flight--;
    if (reserved_ > 0) srv_->budget.Release(reserved_);
  }
  void Emit(std::string bytes, std::function<void(bool)> then, bool done, bool keep) {
    net::dispatch(conn_->executor(), [c = conn_, b = std::move(bytes), t = std::move(then), done, keep]() mutable {
      c->Send(std::move(b), std::move(t), done, keep);
    });
  }

  std::shared_ptr<Conn> conn_;
  HttpServer::Impl* srv_;
  bool keep_alive_;
  const size_t reserved_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> streaming_{false};
};

void Conn::Dispatch(Request req) {
  auto ex = std::make_shared<ExchangeImpl>(shared_from_this(), srv_, keep_alive_, std::exchange(reserved_, 0));
  srv_->handler->Handle(std::move(req), std::move(ex));
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc.get_executor()), [this](beast::error_code ec, Socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      Log().warn("http accept: {}", ec.message());
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
      metrics.connections++;
      metrics.open_connections++;
      auto conn = std::make_shared<Conn>(std::move(socket), this);
      {
        std::lock_guard lk(conns_mu);
        std::erase_if(conns, [](const std::weak_ptr<Conn>& w) { return w.expired(); });
        conns.push_back(conn);
      }
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
  return fmt::format("{}:{}", impl_->bound.address().to_string(), impl_->bound.port());
}

int64_t HttpServer::in_flight() const { return impl_->in_flight.load(); }
const HttpServerMetrics& HttpServer::metrics() const { return impl_->metrics; }

void HttpServer::StopAccepting() {
  net::post(impl_->ioc, [i = impl_.get()] {
    beast::error_code ec;
    i->acceptor.close(ec);
  });
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
  impl_->guard.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace weir::http
