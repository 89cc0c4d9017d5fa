// A small HTTP/1.1 and HTTP/2 server: Boost.Beast for HTTP/1.1, nghttp2 for
// HTTP/2 (cleartext, prior knowledge: a connection that opens with the
// HTTP/2 preface). Both stay inside server.cc; the rest of weir sees plain
// Request/Response values and an Exchange to answer on.
//
// Ownership and threads: the process's server front-end owns one HttpServer.
// Network I/O runs on `io_threads`. Requests are handed to the Handler on an
// I/O thread; a handler that may block (metastore, object store reads) moves
// the work to one of `worker_threads` with Exchange::Post. Requests on one
// HTTP/1.1 connection are served one at a time, in order; an HTTP/2
// connection serves up to kMaxHttp2Streams requests at once.
//
// Guarantees: a request body over max_request_bytes gets 413 and the
// connection is closed without reading the rest; a malformed request gets 400
// and the connection is closed; every request gets exactly one response (an
// Exchange dropped without one answers 500). Request bodies being read or
// handled and not yet answered hold at most max_in_flight_bytes across all
// connections (a chunked body counts as max_request_bytes): a request whose
// body does not fit waits, in arrival order, before its body is read (and
// before 100 Continue); a request alone is always admitted. At most
// max_connections are open; more are closed on accept. HTTP/2 request bodies
// take from the same budget as they arrive; a body that does not fit gets 429
// (Retry-After) instead of waiting. A body streamed to a BodySink takes from
// it too, from arrival until the sink gives the bytes back; bytes that do
// not fit end the sink's response (BodySink::OnRefused). Response bytes
// queued for clients and not yet written count against
// max_unwritten_bytes, all connections together: a handler building a
// large response (a read) sizes it to Exchange::ResponseRoom.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/ordered_queue.h"
#include "base/status.h"

namespace weir::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // upper case, as sent
  std::string path;    // as sent (still percent-encoded), without the query
  HeaderList query;    // percent-decoded name/value pairs, in order
  HeaderList headers;  // names lower-cased
  std::string body;

  // First value, or nullptr.
  const std::string* Header(std::string_view lower_name) const;
  const std::string* Query(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HeaderList headers;
};

// One request's way back to its client. Made by the HttpServer for each
// request and shared (shared_ptr) by the handler and its callbacks;
// thread-safe, any thread may call it. One response goes out: the first
// answer wins, and an Exchange dropped unanswered answers 500.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // A whole response; call once (or use the streaming calls instead).
  virtual void Respond(Response r) = 0;
  // A chunked streaming response: BeginStream once, Write any number of
  // times, then End. `written(ok)` runs on a worker thread once the chunk is
  // on the wire (ok) or the connection has failed (not ok).
  virtual void BeginStream(int status, std::string content_type, HeaderList headers) = 0;
  virtual void Write(std::string chunk, std::function<void(bool ok)> written) = 0;
  virtual void End() = 0;
  // Runs `fn` on a worker thread after `delay` (whether or not the client is still there).
  virtual void After(Duration delay, std::function<void()> fn) = 0;
  // Runs `fn` on a worker thread soon.
  virtual void Post(std::function<void()> fn) = 0;
  // Runs `fn` on a worker thread once every `fn` this connection's requests
  // posted with PostInOrder before it has returned, one at a time. HTTP/2
  // runs a connection's requests side by side on its I/O thread: work moved
  // off it this way is not overtaken by the connection's later requests that
  // wait while InOrderBusy. Elsewhere (HTTP/1.1) the same as Post.
  virtual void PostInOrder(std::function<void()> fn) { Post(std::move(fn)); }
  // Whether something this connection posted with PostInOrder has not returned.
  virtual bool InOrderBusy() const { return false; }
  // From PostInOrder work on a worker: the work goes on later
  // (SuspendedWork::Resume) without holding the worker meanwhile, and the
  // connection's later PostInOrder work waits until then, as if the work
  // were still running (InOrderBusy stays true). Elsewhere (HTTP/1.1, which
  // has no later request meanwhile) Resume just posts.
  virtual std::shared_ptr<SuspendedWork> SuspendInOrder() = 0;
  // The connection is gone: further writes are dropped.
  virtual bool closed() const = 0;
  // Bytes of responses the server may still queue before
  // ServerOptions::max_unwritten_bytes over all connections, or this
  // connection's share of it (ConnectionUnwrittenBudget), whichever is
  // less (what clients have not read yet): a handler building a large
  // response makes it fit, or waits. A hint, read without locks: handlers
  // building at once may together pass the budget by what each builds.
  virtual size_t ResponseRoom() const { return SIZE_MAX; }
  // Takes `n` more bytes of ServerOptions::max_in_flight_bytes for memory
  // the request holds besides its body (its decoded records, which may take
  // many times the body's bytes), if they fit now (true); never waits, and
  // a request holding nothing else always fits (`streamed`: bytes of its
  // body a BodySink holds, which the server counts apart). Given back by
  // GiveBackBudget, or with the body's once the response is complete.
  virtual bool TakeBudget(size_t n, size_t streamed = 0) {
    (void)n;
    (void)streamed;
    return true;
  }
  virtual void GiveBackBudget(size_t n) { (void)n; }
  // For a body streamed to a BodySink (HTTP/2): `n` more of its bytes are
  // dealt with, so the client may send `n` more (flow control). The sink
  // must give back every byte it was handed, once. A no-op elsewhere.
  virtual void ConsumeBody(size_t n) { (void)n; }
  // True where the connection reads its next request only once this one is
  // answered (HTTP/1.1): work moved to a worker cannot be overtaken by a later
  // request of the connection. HTTP/2 streams run side by side: false.
  virtual bool sequential() const { return true; }
};

// The largest unit (an S2S frame with its length prefix) a BodySink may
// hold back whole before it gives its bytes back: the HTTP/2 stream window
// is sized so that one always fits.
inline constexpr size_t kMaxBodySinkUnitBytes = (2u << 20) + 3;

// The body of a streamed request, delivered as it arrives (HTTP/2 only). Made by Handler::OpenBodyStream; the
// connection keeps it (shared_ptr) for the stream's life. Calls come from one I/O thread at a time, in order, and
// must not block for long (the connection's other streams wait); OnEnd comes last, once. The client can send at most
// one stream window (about 4 MiB) that the sink has not given back with Exchange::ConsumeBody.
class BodySink {
 public:
  virtual ~BodySink() = default;
  virtual void OnData(std::string_view bytes) = 0;
  // The body ended: `complete` if the client finished it; otherwise the
  // stream was reset or the connection closed (the response cannot arrive).
  virtual void OnEnd(bool complete) = 0;
  // The server takes no more of the body: bytes that arrived do not fit
  // ServerOptions::max_in_flight_bytes (a sink's bytes count from arrival
  // until it gives them back). `answer` is a 429 for the sink to end its
  // response with, after what it answers already. No OnData follows (the
  // server drops the rest); OnEnd still does.
  virtual void OnRefused(Response answer) = 0;
  // Whether bytes it took wait for more to make a whole unit (an S2S frame):
  // such a wait is bounded by the stall timeout, as a body's is.
  virtual bool HoldsPartialInput() { return false; }
};

// What HttpServer serves requests with. Owned by the server front-end, not
// by HttpServer, and must outlive it. Every method runs on an I/O thread and
// must not block (Post blocking work). Each request handed to it must be
// answered on its Exchange (one dropped unanswered gets 500).
class Handler {
 public:
  virtual ~Handler() = default;
  // Called on an I/O thread; must not block (Post blocking work). Must
  // eventually answer on `ex`.
  virtual void Handle(Request req, std::shared_ptr<Exchange> ex) = 0;
  // On an I/O thread once a request's headers have arrived, before its body
  // is read (`head.body` empty): a response to answer at once, the body left
  // unread (its memory never reserved), or nullopt to go on. For checks that
  // need no body, such as authentication. An HTTP/1.1 connection is closed
  // after such an answer.
  virtual std::optional<Response> RefuseHead(const Request& head) const {
    (void)head;
    return std::nullopt;
  }
  // Whether RefuseHead may refuse anything: if not, HTTP/1.1 heads are not
  // copied into a Request to ask it.
  virtual bool RefusesHeads() const { return false; }
  // HTTP/2 only, on an I/O thread once a request's headers have arrived
  // (`head.body` empty): whether its body should stream to a BodySink
  // rather than be read whole and passed to Handle.
  virtual bool WantsBodyStream(const Request& head) const {
    (void)head;
    return false;
  }
  // For a request WantsBodyStream chose: returns the sink for its body, or
  // nullptr after answering on `ex` (the body is then dropped).
  virtual std::shared_ptr<BodySink> OpenBodyStream(Request head, std::shared_ptr<Exchange> ex) {
    (void)head;
    (void)ex;
    return nullptr;
  }
};

// One connection's share of ServerOptions::max_unwritten_bytes: a sixteenth,
// at least 1 MiB (and never more than the whole), so that clients that read
// slowly hold up their own reads first.
inline size_t ConnectionUnwrittenBudget(size_t total) {
  return std::min(total, std::max<size_t>(total / 16, size_t{1} << 20));
}

// Concurrent streams an HTTP/2 client may open on one connection.
inline constexpr uint32_t kMaxHttp2Streams = 100;
// Request header bytes (as HPACK counts them) of one HTTP/2 connection's open
// streams; a stream whose head would pass it is reset.
inline constexpr size_t kMaxHttp2HeaderBytes = 256u << 10;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0 = the OS picks
  size_t max_request_bytes = 8u << 20;
  int io_threads = 2;
  int worker_threads = 8;
  Duration idle_timeout = std::chrono::seconds(120);  // keep-alive connections with no request
  // A request body not whole this long after its head, or a response write
  // that makes no progress for this long: the HTTP/1.1 connection is closed;
  // on HTTP/2 the stream is reset (a body) or the connection closed (a
  // response). HTTP/2 checks every 5 s (a quarter of this if shorter).
  Duration stall_timeout = std::chrono::seconds(60);
  size_t max_in_flight_bytes = 512u << 20;  // request bodies read and not yet answered, all connections
  // Response bytes queued and not yet written, all connections (a client
  // that reads slowly holds its responses): Exchange::ResponseRoom.
  size_t max_unwritten_bytes = 512u << 20;
  size_t max_connections = 4096;
  // Stop: how long responses already answered (and the closes) get to be
  // written before the I/O threads stop.
  Duration stop_grace = std::chrono::seconds(2);
};

struct HttpServerMetrics {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> rejected_connections{0};  // over max_connections
  std::atomic<uint64_t> budget_waits{0};          // requests that waited for max_in_flight_bytes
  std::atomic<uint64_t> budget_timeouts{0};       // ... and were refused (429) at the stall timeout
  std::atomic<uint64_t> http2_connections{0};
  std::atomic<uint64_t> budget_refusals{0};       // HTTP/2 bodies refused (429) for max_in_flight_bytes
  std::atomic<int64_t> open_connections{0};
  std::atomic<int64_t> in_flight_bytes{0};        // request bodies admitted and not yet answered
  std::atomic<int64_t> unwritten_bytes{0};        // response bytes queued and not yet written
};

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> Start(const ServerOptions& options, Handler* handler);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // "host:port" actually bound ("[v6]:port" for IPv6).
  std::string address() const;
  // Requests handed to the handler and not yet answered (streams count until End).
  int64_t in_flight() const;
  // Requests begun whose body is still arriving (or waits for the budget):
  // a drain may wait for them, to answer them 503. A request counts here
  // until in_flight() counts it: read this first, then in_flight(), and a
  // request passing from one to the other is seen at least once.
  int64_t receiving() const;
  const HttpServerMetrics& metrics() const;
  // Closes the listening socket; connections already open keep being served.
  void StopAccepting();
  // A drain begins: an HTTP/2 connection is sent GOAWAY and closed once no
  // stream is open on it (idle ones at once), and HTTP/1.1 answers say
  // `Connection: close`, so clients move to another server instead of
  // retrying here.
  void BeginDrain();
  // For a drain (a read session whose client stopped reading would hold it
  // until stall_timeout): ends every response whose data has not moved for
  // `stalled_for`. HTTP/1.1 closes the connection; HTTP/2 resets the stream
  // (its connection's other streams go on), or closes the connection if the
  // client reads nothing of it at all.
  void CloseStalled(Duration stalled_for);
  // Closes every connection and joins all threads.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Percent-decoding of a URL component ("%2F" → "/", and '+' → ' ' if `plus`);
// kInvalidArgument on a bad escape.
Result<std::string> PercentDecode(std::string_view s, bool plus);

}  // namespace weir::http
