#include "bench/http_bench.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/histogram.h"
#include "client/client.h"

namespace weir::bench {

namespace {

// One simulated client: an easy handle (its own keep-alive connection) with
// at most one append in flight. Touched only by the driver thread.
struct BenchClient {
  CURL* easy = nullptr;
  std::string url;
  TimePoint sent;
  std::string error_body;  // the start of a non-2xx body, for the report
};

size_t KeepErrorStart(char* data, size_t size, size_t n, void* user) {
  auto* c = static_cast<BenchClient*>(user);
  if (c->error_body.size() < 200) c->error_body.append(data, std::min<size_t>(size * n, 200));
  return size * n;
}

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

// The event loop under curl's multi_socket API: curl says which sockets to
// watch (an epoll set) and when to call back on a timer. Touched only by the
// driver thread.
struct Loop {
  CURLM* multi = nullptr;
  int epoll_fd = -1;
  long timer_ms = -1;  // curl's next timeout; -1 = none
  TimePoint timer_set;
};

// `registered` is curl's per-socket pointer: non-null once the socket is in the epoll set.
int OnSocket(CURL*, curl_socket_t fd, int what, void* user, void* registered) {
  auto* loop = static_cast<Loop*>(user);
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(loop->epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    return 0;
  }
  epoll_event ev{};
  ev.data.fd = fd;
  ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
  if (registered != nullptr) {
    epoll_ctl(loop->epoll_fd, EPOLL_CTL_MOD, fd, &ev);
  } else if (epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0 ||
             epoll_ctl(loop->epoll_fd, EPOLL_CTL_MOD, fd, &ev) == 0) {
    curl_multi_assign(loop->multi, fd, loop);
  }
  return 0;
}

int OnTimer(CURLM*, long timeout_ms, void* user) {
  auto* loop = static_cast<Loop*>(user);
  loop->timer_ms = timeout_ms;
  loop->timer_set = Now();
  return 0;
}

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

}  // namespace

Status RunHttpBench(const HttpBenchOptions& o) {
  if (o.clients < 1 || o.clients > 4096) return InvalidArgument("--clients must be 1..4096");
  if (o.batch < 1 || o.batch > 1000) return InvalidArgument("--batch must be 1..1000");
  if (o.record_bytes < 1 || o.record_bytes * static_cast<size_t>(o.batch) > (1u << 20)) {
    return InvalidArgument("--record-bytes × --batch must be 1..1048576");
  }
  if (o.duration_s <= 0) return InvalidArgument("--duration must be positive");
  const int streams = o.streams > 0 ? o.streams : o.clients;
  WEIR_RETURN_IF_ERROR(CreateStreams(o, streams));

  client::InitCurl();
  const std::string body = AppendBody(o.record_bytes, o.batch);
  std::string base = o.server;
  while (!base.empty() && base.back() == '/') base.pop_back();
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "s2-format: raw");
  headers = curl_slist_append(headers, "Expect:");
  if (!o.basin.empty()) headers = curl_slist_append(headers, ("s2-basin: " + o.basin).c_str());
  if (!o.auth_token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + o.auth_token).c_str());

  Loop loop;
  loop.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (loop.epoll_fd < 0) return IOError("epoll_create1 failed");
  CURLM* multi = curl_multi_init();
  loop.multi = multi;
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, static_cast<long>(o.clients + 8));
  curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, OnSocket);
  curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, &loop);
  curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, OnTimer);
  curl_multi_setopt(multi, CURLMOPT_TIMERDATA, &loop);
  std::vector<BenchClient> clients(static_cast<size_t>(o.clients));
  for (size_t i = 0; i < clients.size(); ++i) {
    BenchClient& c = clients[i];
    c.url = base + "/v1/streams/" + client::UrlEncode(o.stream_prefix + std::to_string(i % static_cast<size_t>(streams))) +
            "/records";
    c.easy = curl_easy_init();
    curl_easy_setopt(c.easy, CURLOPT_URL, c.url.c_str());
    curl_easy_setopt(c.easy, CURLOPT_POST, 1L);
    curl_easy_setopt(c.easy, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c.easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(c.easy, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c.easy, CURLOPT_WRITEFUNCTION, KeepErrorStart);
    curl_easy_setopt(c.easy, CURLOPT_WRITEDATA, &c);
    curl_easy_setopt(c.easy, CURLOPT_PRIVATE, &c);
    curl_easy_setopt(c.easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c.easy, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c.easy, CURLOPT_TIMEOUT_MS, 60000L);
  }
  auto send = [&](BenchClient& c) {
    c.error_body.clear();
    c.sent = Now();
    curl_multi_add_handle(multi, c.easy);
  };
  for (auto& c : clients) send(c);

  const bool tty = isatty(STDERR_FILENO) != 0;
  const TimePoint start = Now();
  const TimePoint measure_from = start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.warmup_s));
  const TimePoint end = measure_from + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.duration_s));
  bool measuring = false;
  TimePoint measured_at = measure_from;
  Tally window, second;
  std::string first_error;
  TimePoint next_tick = start + std::chrono::seconds(1);
  std::deque<std::pair<TimePoint, BenchClient*>> backoff;  // clients pausing after a transport error

  std::vector<epoll_event> events(static_cast<size_t>(o.clients) + 16);
  int running = 0;
  while (Now() < end) {
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      BenchClient* c = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&c));
      long status = 0;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
      CURLcode rc = msg->data.result;
      curl_multi_remove_handle(multi, c->easy);
      const TimePoint done = Now();
      if (!measuring && done >= measure_from) {
        measuring = true;
        measured_at = done;
        window.Reset();
      }
      if (rc == CURLE_OK && status >= 200 && status < 300) {
        uint64_t ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(done - c->sent).count());
        window.appends++;
        window.latency_ns.Record(ns);
        second.appends++;
        second.latency_ns.Record(ns);
        send(*c);
        continue;
      }
      std::string key = rc == CURLE_OK ? std::to_string(status) : "transport";
      for (Tally* t : {&window, &second}) {
        t->errors++;
        t->errors_by_status[key]++;
      }
      if (first_error.empty()) {
        first_error = rc == CURLE_OK ? key + " " + c->error_body : curl_easy_strerror(rc);
      }
      if (rc == CURLE_OK) {
        send(*c);
      } else {
        backoff.emplace_back(done + std::chrono::milliseconds(50), c);  // do not spin on a dead server
      }
    }
    const TimePoint now = Now();
    while (!backoff.empty() && backoff.front().first <= now) {
      send(*backoff.front().second);
      backoff.pop_front();
    }
    if (now >= next_tick) {
      if (tty) {
        double secs = std::chrono::duration<double>(now - start).count();
        std::fprintf(stderr, "\r[%5.0fs%s] %9.0f appends/s %8.1f MB/s  p50 %7.2f ms  p99 %7.2f ms  errors %llu\x1b[K",
                     secs, now < measure_from ? " warmup" : "", static_cast<double>(second.appends),
                     static_cast<double>(second.appends) * static_cast<double>(o.batch) *
                         static_cast<double>(o.record_bytes) / 1e6,
                     Ms(second.latency_ns.Quantile(0.5)), Ms(second.latency_ns.Quantile(0.99)),
                     static_cast<unsigned long long>(second.errors));
        std::fflush(stderr);
      }
      second.Reset();
      next_tick += std::chrono::seconds(1);
    }
    auto wake = std::min(end, next_tick);
    if (!backoff.empty()) wake = std::min(wake, backoff.front().first);
    if (loop.timer_ms >= 0) wake = std::min(wake, loop.timer_set + std::chrono::milliseconds(loop.timer_ms));
    // Rounded up: waking before a timer is due would spin until it is.
    int timeout_ms = static_cast<int>(std::max<int64_t>(
        0, std::chrono::ceil<std::chrono::milliseconds>(wake - Now()).count()));
    int n = epoll_wait(loop.epoll_fd, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[static_cast<size_t>(i)];
      int mask = (ev.events & EPOLLIN ? CURL_CSELECT_IN : 0) | (ev.events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                 (ev.events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(multi, ev.data.fd, mask, &running);
    }
    if (loop.timer_ms >= 0 && Now() >= loop.timer_set + std::chrono::milliseconds(loop.timer_ms)) {
      loop.timer_ms = -1;
      curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
  }
  const double elapsed = std::chrono::duration<double>(Now() - measured_at).count();
  if (tty) std::fprintf(stderr, "\n");

  for (auto& c : clients) {
    curl_multi_remove_handle(multi, c.easy);  // a no-op for handles not added
    curl_easy_cleanup(c.easy);
  }
  curl_multi_cleanup(multi);
  curl_slist_free_all(headers);
  close(loop.epoll_fd);

  if (!measuring) return Internal("no request finished in the measured window");
  const double appends = static_cast<double>(window.appends);
  const double records = appends * o.batch;
  nlohmann::ordered_json j;
  j["appends_per_s"] = appends / elapsed;
  j["records_per_s"] = records / elapsed;
  j["mb_per_s"] = records * static_cast<double>(o.record_bytes) / 1e6 / elapsed;
  j["p50_ms"] = Ms(window.latency_ns.Quantile(0.50));
  j["p99_ms"] = Ms(window.latency_ns.Quantile(0.99));
  j["p999_ms"] = Ms(window.latency_ns.Quantile(0.999));
  j["max_ms"] = Ms(window.latency_ns.max());
  j["mean_ms"] = window.appends > 0 ? Ms(window.latency_ns.sum()) / appends : 0.0;
  j["errors"] = window.errors;
  j["errors_by_status"] = window.errors_by_status;
  if (!first_error.empty()) j["first_error"] = first_error;
  j["clients"] = o.clients;
  j["streams"] = streams;
  j["record_bytes"] = o.record_bytes;
  j["batch"] = o.batch;
  j["duration_s"] = elapsed;
  j["server"] = base;
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  if (window.appends == 0) {
    return Unavailable("no append succeeded ({} errors; first: {})", window.errors, first_error);
  }
  return Status::Ok();
}

}  // namespace weir::bench
