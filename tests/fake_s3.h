// FakeS3: a tiny in-process HTTP server speaking just enough S3 (PUT with
// If-None-Match, GET with Range, HEAD, DELETE) to test the S3 client's
// retries, ambiguity handling, connection reuse and concurrency limits with
// scripted faults. It does not check signatures. Owned by one test; its
// threads serve connections until destruction.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace weir::testing {

class FakeS3 {
 public:
  enum class Fault {
    kDropBeforeApply,  // close the connection without applying or answering
    kDropAfterApply,   // apply, then close without answering (an ambiguous PUT)
    k403Denied,        // answer 403 AccessDenied without applying
    k503SlowDown,      // answer 503 SlowDown, not applied
    k500AfterApply,    // apply, then answer 500 InternalError
    k409Conflict,      // answer 409 ConditionalRequestConflict, not applied
    kStall,            // wait 10 s (or until the server stops), then answer normally
    kNone,             // answer normally (places the next fault one request later)
  };

  explicit FakeS3(bool honour_if_none_match = true) : honour_(honour_if_none_match) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ::listen(listen_fd_, 64);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeS3() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    stop_cv_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard lk(mu_);
      for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : workers_) t.join();
    ::close(listen_fd_);
  }

  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }

  // Faults for the next requests, in order (one each).
  void Inject(Fault f) {
    std::lock_guard lk(mu_);
    faults_.push_back(f);
  }
  // Answers for the next requests, in order (one each), taking precedence
  // over faults: the status and body as given, nothing applied.
  void Script(int status, std::string body, std::string extra_headers = "") {
    std::lock_guard lk(mu_);
    scripted_.push_back(Scripted{status, std::move(body), std::move(extra_headers)});
  }
  // Every request waits this long before it is answered (0: none).
  void SetDelay(std::chrono::milliseconds d) { delay_ms_ = static_cast<int>(d.count()); }
  int connections() const { return connections_.load(); }
  int requests() const { return requests_.load(); }
  int max_concurrent() const { return max_concurrent_.load(); }
  size_t objects() {
    std::lock_guard lk(mu_);
    return objects_.size();
  }

 private:
  struct Req {
    std::string method, path;
    std::map<std::string, std::string> headers;
    std::string body;
  };

  void AcceptLoop() {
    while (!stopping_) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (stopping_) return;
        continue;
      }
      connections_.fetch_add(1);
      std::lock_guard lk(mu_);
      open_fds_.push_back(fd);
      workers_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  // Reads one request; false when the peer closed.
  static bool ReadRequest(int fd, std::string& buf, Req& req) {
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      char tmp[65536];
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<size_t>(n));
    }
    const std::string head = buf.substr(0, end);
    buf.erase(0, end + 4);
    size_t line_end = head.find("\r\n");
    const std::string first = head.substr(0, line_end);
    req.method = first.substr(0, first.find(' '));
    req.path = first.substr(first.find(' ') + 1, first.rfind(' ') - first.find(' ') - 1);
    req.path = req.path.substr(0, req.path.find('?'));
    while (line_end != std::string::npos) {
      const size_t next = head.find("\r\n", line_end + 2);
      const std::string line = head.substr(line_end + 2, next == std::string::npos ? std::string::npos : next - line_end - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        req.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
      }
      line_end = next;
    }
    const size_t length = req.headers.count("content-length") ? std::stoul(req.headers["content-length"]) : 0;
    while (buf.size() < length) {
      char tmp[65536];
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<size_t>(n));
    }
    req.body = buf.substr(0, length);
    buf.erase(0, length);
    return true;
  }

  static void Send(int fd, int status, const std::string& reason, const std::string& body,
                   const std::string& extra = "", size_t content_length = std::string::npos) {
    const std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Length: {}\r\n{}\r\n{}", status, reason,
                                        content_length == std::string::npos ? body.size() : content_length, extra, body);
    ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
  }

  static std::string ErrorBody(const std::string& code) {
    return "<?xml version=\"1.0\"?><Error><Code>" + code + "</Code><Message>fake</Message></Error>";
  }

  void Serve(int fd) {
    std::string buf;
    for (Req req; !stopping_ && ReadRequest(fd, buf, req); req = Req()) {
      requests_.fetch_add(1);
      const int now = concurrent_.fetch_add(1) + 1;
      for (int m = max_concurrent_.load(); now > m && !max_concurrent_.compare_exchange_weak(m, now);) {
      }
      std::optional<Fault> fault;
      std::optional<Scripted> scripted;
      {
        std::lock_guard lk(mu_);
        if (!scripted_.empty()) {
          scripted = std::move(scripted_.front());
          scripted_.pop_front();
        } else if (!faults_.empty()) {
          fault = faults_.front();
          faults_.pop_front();
        }
      }
      bool keep = true;
      if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_.load()));
      if (fault == Fault::kStall) {
        std::unique_lock lk(mu_);
        stop_cv_.wait_for(lk, std::chrono::seconds(10), [&] { return stopping_.load(); });
      }
      if (scripted) {
        Send(fd, scripted->status, "X", scripted->body, scripted->extra);
      } else if (fault == Fault::kDropBeforeApply) {
        keep = false;
      } else if (fault == Fault::k503SlowDown) {
        Send(fd, 503, "Slow Down", ErrorBody("SlowDown"));
      } else if (fault == Fault::k403Denied) {
        Send(fd, 403, "Forbidden", ErrorBody("AccessDenied"));
      } else if (fault == Fault::k409Conflict) {
        Send(fd, 409, "Conflict", ErrorBody("ConditionalRequestConflict"));
      } else {
        const auto [status, body, extra, length] = Apply(req);
        if (fault == Fault::kDropAfterApply) {
          keep = false;
        } else if (fault == Fault::k500AfterApply) {
          Send(fd, 500, "Internal Server Error", ErrorBody("InternalError"));
        } else {
          Send(fd, status, "X", body, extra, length);
        }
      }
      concurrent_.fetch_sub(1);
      if (!keep) break;
    }
    ::shutdown(fd, SHUT_RDWR);
    std::lock_guard lk(mu_);
    open_fds_.erase(std::find(open_fds_.begin(), open_fds_.end(), fd));
    ::close(fd);
  }

  struct Scripted {
    int status;
    std::string body, extra;  // extra: header lines, each ending in \r\n
  };

  struct Answer {
    int status;
    std::string body, extra;
    size_t length = std::string::npos;
  };

  Answer Apply(Req& req) {
    std::lock_guard lk(mu_);
    auto it = objects_.find(req.path);
    if (req.method == "PUT") {
      if (honour_ && req.headers.count("if-none-match") && it != objects_.end()) {
        return {412, ErrorBody("PreconditionFailed"), ""};
      }
      objects_[req.path] = req.body;
      return {200, "", ""};
    }
    if (req.method == "DELETE") {
      objects_.erase(req.path);
      return {204, "", ""};
    }
    if (it == objects_.end()) return {404, req.method == "HEAD" ? "" : ErrorBody("NoSuchKey"), ""};
    const std::string& data = it->second;
    if (req.method == "HEAD") return {200, "", "", data.size()};
    if (req.headers.count("range")) {
      const std::string r = req.headers["range"].substr(6);  // "bytes="
      const uint64_t first = std::stoull(r.substr(0, r.find('-')));
      const std::string last_s = r.substr(r.find('-') + 1);
      uint64_t last = last_s.empty() ? data.size() - 1 : std::stoull(last_s);
      if (first >= data.size()) return {416, ErrorBody("InvalidRange"), ""};
      last = std::min<uint64_t>(last, data.size() - 1);
      return {206, data.substr(first, last - first + 1),
              fmt::format("Content-Range: bytes {}-{}/{}\r\n", first, last, data.size())};
    }
    return {200, data, ""};
  }

  const bool honour_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable stop_cv_;  // wakes stalled requests at destruction
  std::vector<std::thread> workers_;
  std::vector<int> open_fds_;
  std::deque<Fault> faults_;
  std::deque<Scripted> scripted_;
  std::map<std::string, std::string> objects_;
  std::atomic<int> delay_ms_{0};
  std::atomic<int> connections_{0}, requests_{0}, concurrent_{0}, max_concurrent_{0};
};

}  // namespace weir::testing
