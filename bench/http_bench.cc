#include "bench/http_bench.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/histogram.h"
#include "base/tcp.h"
#include "client/client.h"

namespace weir::bench {

namespace {

// What one phase (warm-up, a progress second, the measured window) saw.
struct Tally {
  uint64_t appends = 0;
  uint64_t errors = 0;
  std::map<std::string, uint64_t> errors_by_status;  // "429", "503", "transport"
  Histogram latency_ns;

  void Reset() {
    appends = errors = 0;
    errors_by_status.clear();
    latency_ns.Reset();
  }
};

double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// The AppendInput body: `batch` records of `record_bytes` ASCII characters,
// sent with `s2-format: raw` (the cheapest body for the server to decode).
std::string AppendBody(size_t record_bytes, int batch) {
  std::string record = "{\"body\":\"";
  for (size_t i = 0; i < record_bytes; ++i) record.push_back(static_cast<char>('a' + i % 26));
  record += "\"}";
  std::string body = "{\"records\":[";
  for (int i = 0; i < batch; ++i) {
    if (i > 0) body.push_back(',');
    body += record;
  }
  body += "]}";
  return body;
}

Status CreateStreams(const HttpBenchOptions& o, int streams) {
  client::ClientOptions co;
  co.server = o.server;
  co.basin = o.basin;
  co.auth_token = o.auth_token;
  WEIR_ASSIGN_OR_RETURN(auto c, client::Client::Connect(co));
  for (int i = 0; i < streams; ++i) {
    auto r = c->CreateStream(o.stream_prefix + std::to_string(i));
    if (!r.ok() && r.status().code() != Code::kAlreadyExists) return r.status();
  }
  return Status::Ok();
}

// Where the load goes: `http://HOST[:PORT][/PREFIX]`, resolved once.
struct Target {
  std::string host_header;  // HOST[:PORT] as written in the URL
  std::string path_prefix;  // "" or "/PREFIX" without a trailing slash
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
};

Result<Target> ResolveTarget(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return InvalidArgument("weir bench http needs an http:// server URL (it speaks plain HTTP/1.1), got '{}'", url);
  }
  std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  Target t;
  t.host_header = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) t.path_prefix = std::string(rest.substr(slash));
  while (!t.path_prefix.empty() && t.path_prefix.back() == '/') t.path_prefix.pop_back();
  std::string host = t.host_header, port = "80";
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string::npos) return InvalidArgument("bad server URL '{}'", url);
    if (close + 1 < host.size() && host[close + 1] == ':') port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    port = host.substr(colon + 1);
    host.resize(colon);
  }
  if (host.empty() || port.empty()) return InvalidArgument("bad server URL '{}'", url);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Unavailable("cannot resolve {}: {}", t.host_header, gai_strerror(rc));
  }
  // IPv4 first, as `weir serve` resolves its own listen address.
  const addrinfo* pick = PreferIPv4(found);
  std::memcpy(&t.addr, pick->ai_addr, pick->ai_addrlen);
  t.addr_len = pick->ai_addrlen;
  freeaddrinfo(found);
  return t;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::string_view Trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

}  // namespace

Parsed ParseResponse(std::string_view in, Response* r) {
  constexpr size_t kMaxHead = 64 * 1024;
  const size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return in.size() > kMaxHead ? Parsed::kBad : Parsed::kIncomplete;
  std::string_view head = in.substr(0, head_end);
  size_t eol = head.find("\r\n");
  std::string_view status_line = head.substr(0, eol);
  if (status_line.substr(0, 5) != "HTTP/" || status_line.size() < 12 || status_line[8] != ' ') return Parsed::kBad;
  auto [p, ec] = std::from_chars(status_line.data() + 9, status_line.data() + 12, r->status);
  if (ec != std::errc() || p != status_line.data() + 12) return Parsed::kBad;
  r->close = status_line.substr(0, 8) == "HTTP/1.0";
  std::optional<size_t> length;
  bool chunked = false;
  while (eol != std::string_view::npos) {
    const size_t next = head.find("\r\n", eol + 2);
    std::string_view line = head.substr(eol + 2, next == std::string_view::npos ? std::string_view::npos : next - eol - 2);
    eol = next;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return Parsed::kBad;
    std::string_view name = line.substr(0, colon), value = Trim(line.substr(colon + 1));
    if (EqualsNoCase(name, "content-length")) {
      size_t n = 0;
      auto [q, e] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (e != std::errc() || q != value.data() + value.size()) return Parsed::kBad;
      length = n;
    } else if (EqualsNoCase(name, "transfer-encoding")) {
      chunked = EqualsNoCase(value, "chunked");
    } else if (EqualsNoCase(name, "connection")) {
      if (EqualsNoCase(value, "close")) r->close = true;
      if (EqualsNoCase(value, "keep-alive")) r->close = false;
    }
  }
  r->body_start = head_end + 4;
  if (r->status == 204 || r->status == 304) {
    r->end = r->body_start;
    return Parsed::kDone;
  }
  if (chunked) {
    size_t pos = r->body_start;
    while (true) {
      const size_t line_end = in.find("\r\n", pos);
      if (line_end == std::string_view::npos) return Parsed::kIncomplete;
      size_t size = 0;
      auto [q, e] = std::from_chars(in.data() + pos, in.data() + line_end, size, 16);
      if (e != std::errc() || q == in.data() + pos) return Parsed::kBad;
      if (size == 0) {  // the last chunk, then trailers up to an empty line
        const size_t trailers_end = in.find("\r\n\r\n", line_end);
        if (in.substr(line_end + 2, 2) == "\r\n") {
          r->end = line_end + 4;
          return Parsed::kDone;
        }
        if (trailers_end == std::string_view::npos) return Parsed::kIncomplete;
        r->end = trailers_end + 4;
        return Parsed::kDone;
      }
      if (size > in.size() - line_end - 2) return Parsed::kIncomplete;  // (no wrap past SIZE_MAX)
      pos = line_end + 2 + size;
      if (in.size() < pos + 2) return Parsed::kIncomplete;
      if (in.substr(pos, 2) != "\r\n") return Parsed::kBad;
      pos += 2;
    }
  }
  if (length) {
    if (*length > SIZE_MAX - r->body_start) return Parsed::kBad;
    r->end = r->body_start + *length;
    return in.size() >= r->end ? Parsed::kDone : Parsed::kIncomplete;
  }
  r->until_close = true;
  r->close = true;
  return Parsed::kIncomplete;
}

namespace {

// One simulated client: its own keep-alive connection with at most one append
// in flight. Owned by the Driver; touched only by the driver thread.
struct BenchClient {
  int fd = -1;
  bool connecting = false;
  bool out_armed = false;  // EPOLLOUT is in the epoll interest set
  bool in_flight = false;
  // The request line and headers for each of this client's streams (i,
  // i + clients, i + 2 * clients, ...); its requests go to them in turn.
  std::vector<std::string> heads;
  size_t next = 0;         // index into heads of the request in flight
  const std::string& head() const { return heads[next]; }
  size_t written = 0;      // bytes of head + body sent for the request in flight
  std::string in;          // response bytes received so far
  TimePoint sent;
};

// The load loop: a plain epoll loop over non-blocking sockets. A request is
// one sendmsg of the prebuilt head and the shared body; a response is parsed
// in place. Owned by RunHttpBench; one thread.
class Driver {
 public:
  Driver(const HttpBenchOptions& o, Target target, std::string body, int streams)
      : o_(o),
        target_(std::move(target)),
        body_(std::move(body)),
        streams_(streams),
        clients_(static_cast<size_t>(o.clients)) {
    for (size_t i = 0; i < clients_.size(); ++i) {
      for (size_t k = i; k < static_cast<size_t>(streams) || k == i; k += clients_.size()) {
        AddHead(clients_[i], o.stream_prefix + std::to_string(k % static_cast<size_t>(streams)));
      }
    }
  }
  ~Driver() {
    for (auto& c : clients_) CloseConn(c);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  Status Run();

 private:
  void AddHead(BenchClient& c, const std::string& stream) {
    std::string h = "POST " + target_.path_prefix + "/v1/streams/" + client::UrlEncode(stream) + "/records HTTP/1.1\r\n";
    h += "Host: " + target_.host_header + "\r\n";
    h += "Content-Type: application/json\r\ns2-format: raw\r\n";
    if (!o_.basin.empty()) h += "s2-basin: " + o_.basin + "\r\n";
    if (!o_.auth_token.empty()) h += "Authorization: Bearer " + o_.auth_token + "\r\n";
    h += "Content-Length: " + std::to_string(body_.size()) + "\r\n\r\n";
    c.heads.push_back(std::move(h));
    c.next = c.heads.size() - 1;  // Send moves on first: the first request goes to heads[0]
  }
  void Send(BenchClient& c);
  void Write(BenchClient& c);
  void Read(BenchClient& c);
  void OnEvent(BenchClient& c, uint32_t events);
  void Complete(BenchClient& c, const Response& r);
  void Fail(BenchClient& c, std::string_view why);
  void Arm(BenchClient& c, bool out);
  void CloseConn(BenchClient& c);
  void Count(std::string_view key);
  // The measured window starts: what the warm-up counted is dropped.
  void StartMeasuring(TimePoint at) {
    measuring_ = true;
    measured_at_ = at;
    window_.Reset();
    first_error_.clear();
  }

  const HttpBenchOptions& o_;
  const Target target_;
  const std::string body_;
  const int streams_;
  std::vector<BenchClient> clients_;  // never resized: epoll holds pointers into it
  int epoll_fd_ = -1;
  TimePoint measure_from_;
  bool measuring_ = false;
  TimePoint measured_at_;
  Tally window_, second_;
  std::string first_error_;
  std::deque<std::pair<TimePoint, BenchClient*>> backoff_;  // clients pausing after a transport error, 429 or 503
};

void Driver::Send(BenchClient& c) {
  c.next = (c.next + 1) % c.heads.size();
  c.in.clear();
  c.written = 0;
  c.sent = Now();
  c.in_flight = true;
  if (c.fd < 0) {
    c.fd = socket(target_.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return Fail(c, std::string("socket: ") + std::strerror(errno));
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.ptr = &c;
    c.out_armed = true;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) return Fail(c, std::string("epoll_ctl: ") + std::strerror(errno));
    if (connect(c.fd, reinterpret_cast<const sockaddr*>(&target_.addr), target_.addr_len) != 0) {
      if (errno != EINPROGRESS) return Fail(c, std::string("connect: ") + std::strerror(errno));
      c.connecting = true;
      return;  // EPOLLOUT says when the connection is up
    }
  }
  Write(c);
}

void Driver::Write(BenchClient& c) {
  const std::string& head = c.head();
  const size_t total = head.size() + body_.size();
  while (c.written < total) {
    iovec iov[2];
    int n = 0;
    if (c.written < head.size()) {
      iov[n++] = {const_cast<char*>(head.data()) + c.written, head.size() - c.written};
      iov[n++] = {const_cast<char*>(body_.data()), body_.size()};
    } else {
      const size_t off = c.written - head.size();
      iov[n++] = {const_cast<char*>(body_.data()) + off, body_.size() - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = sendmsg(c.fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Arm(c, true);
      return Fail(c, std::string("send: ") + std::strerror(errno));
    }
    c.written += static_cast<size_t>(w);
  }
  Arm(c, false);
}

void Driver::Read(BenchClient& c) {
  char buf[16384];
  bool eof = false;
  while (true) {
    const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return Fail(c, std::string("recv: ") + std::strerror(errno));
  }
  if (!c.in_flight) {  // the server closed (or spoke on) an idle connection
    CloseConn(c);
    return;
  }
  Response r;
  switch (ParseResponse(c.in, &r)) {
    case Parsed::kDone:
      if (r.end != c.in.size()) return Fail(c, "the server sent bytes past the response");
      return Complete(c, r);
    case Parsed::kBad:
      return Fail(c, "malformed HTTP response");
    case Parsed::kIncomplete:
      if (!eof) return;
      if (r.until_close) {
        r.end = c.in.size();
        return Complete(c, r);
      }
      return Fail(c, "the server closed the connection before the response ended");
  }
}

void Driver::OnEvent(BenchClient& c, uint32_t events) {
  if (c.connecting) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Fail(c, std::string("connect: ") + std::strerror(err));
    c.connecting = false;
    Write(c);
    if (c.fd < 0) return;
  } else if ((events & EPOLLOUT) && c.in_flight && c.written < c.head().size() + body_.size()) {
    Write(c);
    if (c.fd < 0) return;
  }
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) Read(c);
}

void Driver::Count(std::string_view key) {
  for (Tally* t : {&window_, &second_}) {
    t->errors++;
    t->errors_by_status[std::string(key)]++;
  }
}

void Driver::Complete(BenchClient& c, const Response& r) {
  c.in_flight = false;
  const TimePoint done = Now();
  if (!measuring_ && done >= measure_from_) StartMeasuring(done);
  if (r.close) CloseConn(c);
  if (r.status >= 200 && r.status < 300) {
    const auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(done - c.sent).count());
    for (Tally* t : {&window_, &second_}) {
      t->appends++;
      t->latency_ns.Record(ns);
    }
  } else {
    const std::string key = std::to_string(r.status);
    Count(key);
    if (first_error_.empty()) {
      first_error_ = key + " " + c.in.substr(r.body_start, std::min<size_t>(200, r.end - r.body_start));
    }
    if (r.status == 429 || r.status == 503) {
      // Backpressure or a draining server: wait as for a transport failure
      // (the server asks for a second; 50 ms keeps the load on).
      backoff_.emplace_back(Now() + std::chrono::milliseconds(50), &c);
      return;
    }
  }
  Send(c);
}

void Driver::Fail(BenchClient& c, std::string_view why) {
  CloseConn(c);
  if (!c.in_flight) return;
  c.in_flight = false;
  Count("transport");
  if (first_error_.empty()) first_error_ = std::string(why);
  backoff_.emplace_back(Now() + std::chrono::milliseconds(50), &c);  // do not spin on a dead server
}

void Driver::Arm(BenchClient& c, bool out) {
  if (c.out_armed == out) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
  ev.data.ptr = &c;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  c.out_armed = out;
}

void Driver::CloseConn(BenchClient& c) {
  if (c.fd < 0) return;
  close(c.fd);  // also leaves the epoll set
  c.fd = -1;
  c.connecting = false;
  c.out_armed = false;
}

Status Driver::Run() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return IOError("epoll_create1 failed: {}", std::strerror(errno));
  constexpr auto kRequestTimeout = std::chrono::seconds(60);
  const bool tty = isatty(STDERR_FILENO) != 0;
  const TimePoint start = Now();
  measure_from_ = start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o_.warmup_s));
  measured_at_ = measure_from_;
  const TimePoint end = measure_from_ + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o_.duration_s));
  TimePoint next_tick = start + std::chrono::seconds(1);
  for (auto& c : clients_) Send(c);

  std::vector<epoll_event> events(clients_.size() + 16);
  while (Now() < end) {
    const TimePoint now = Now();
    if (!measuring_ && now >= measure_from_) StartMeasuring(now);
    while (!backoff_.empty() && backoff_.front().first <= now) {
      BenchClient* c = backoff_.front().second;
      backoff_.pop_front();
      Send(*c);
    }
    if (now >= next_tick) {
      for (auto& c : clients_) {
        if (c.in_flight && now - c.sent > kRequestTimeout) Fail(c, "request timed out after 60 s");
      }
      if (tty) {
        const double secs = std::chrono::duration<double>(now - start).count();
        std::fprintf(stderr, "\r[%5.0fs%s] %9.0f appends/s %8.1f MB/s  p50 %7.2f ms  p99 %7.2f ms  errors %llu\x1b[K",
                     secs, now < measure_from_ ? " warmup" : "", static_cast<double>(second_.appends),
                     static_cast<double>(second_.appends) * static_cast<double>(o_.batch) *
                         static_cast<double>(o_.record_bytes) / 1e6,
                     Ms(second_.latency_ns.Quantile(0.5)), Ms(second_.latency_ns.Quantile(0.99)),
                     static_cast<unsigned long long>(second_.errors));
        std::fflush(stderr);
      }
      second_.Reset();
      next_tick += std::chrono::seconds(1);
    }
    auto wake = std::min(end, next_tick);
    if (!measuring_) wake = std::min(wake, measure_from_);
    if (!backoff_.empty()) wake = std::min(wake, backoff_.front().first);
    // Rounded up: waking before a deadline is due would spin until it is.
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(wake - Now()).count()));
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[static_cast<size_t>(i)];
      auto* c = static_cast<BenchClient*>(ev.data.ptr);
      if (c->fd >= 0) OnEvent(*c, ev.events);
    }
  }
  const double elapsed = std::chrono::duration<double>(Now() - measured_at_).count();
  if (tty) std::fprintf(stderr, "\n");
  if (!measuring_) return Internal("the run ended before its measured window began");

  const double appends = static_cast<double>(window_.appends);
  const double records = appends * o_.batch;
  nlohmann::ordered_json j;
  j["appends_per_s"] = appends / elapsed;
  j["records_per_s"] = records / elapsed;
  j["mb_per_s"] = records * static_cast<double>(o_.record_bytes) / 1e6 / elapsed;
  j["p50_ms"] = Ms(window_.latency_ns.Quantile(0.50));
  j["p99_ms"] = Ms(window_.latency_ns.Quantile(0.99));
  j["p999_ms"] = Ms(window_.latency_ns.Quantile(0.999));
  j["max_ms"] = Ms(window_.latency_ns.max());
  j["mean_ms"] = window_.appends > 0 ? Ms(window_.latency_ns.sum()) / appends : 0.0;
  j["errors"] = window_.errors;
  j["errors_by_status"] = window_.errors_by_status;
  if (!first_error_.empty()) j["first_error"] = first_error_;
  j["clients"] = o_.clients;
  j["streams"] = streams_;
  j["record_bytes"] = o_.record_bytes;
  j["batch"] = o_.batch;
  j["duration_s"] = elapsed;
  j["server"] = o_.server;
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  if (window_.appends == 0) {
    return Unavailable("no append succeeded ({} errors; first: {})", window_.errors, first_error_);
  }
  return Status::Ok();
}

}  // namespace

Status RunHttpBench(const HttpBenchOptions& o) {
  if (o.clients < 1 || o.clients > 4096) return InvalidArgument("--clients must be 1..4096");
  if (o.batch < 1 || o.batch > 1000) return InvalidArgument("--batch must be 1..1000");
  // S2 meters a record as its body plus 8 bytes; an append holds at most 1 MiB.
  if (o.record_bytes < 1 || (o.record_bytes + 8) * static_cast<size_t>(o.batch) > (1u << 20)) {
    return InvalidArgument("(--record-bytes + 8) × --batch must be at most 1048576, S2's limit on one append's metered "
                           "bytes; got ({} + 8) × {}", o.record_bytes, o.batch);
  }
  if (o.duration_s <= 0) return InvalidArgument("--duration must be positive");
  WEIR_ASSIGN_OR_RETURN(Target target, ResolveTarget(o.server));
  const int streams = o.streams > 0 ? o.streams : o.clients;
  WEIR_RETURN_IF_ERROR(CreateStreams(o, streams));
  Driver driver(o, std::move(target), AppendBody(o.record_bytes, o.batch), streams);
  return driver.Run();
}

}  // namespace weir::bench
