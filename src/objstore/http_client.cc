// The pooled libcurl client behind s3:// (see http_client.h).
#include "objstore/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace weir::objstore::http {

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct SlistFree {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The request body from Request::body_parts: read in order, rewindable (curl
// resends a body when a reused connection turns out dead).
struct PartsReader {
  std::span<const std::string_view> parts;
  size_t part = 0;    // current part
  size_t offset = 0;  // within it
};

size_t ReadParts(char* buf, size_t size, size_t n, void* user) {
  auto* r = static_cast<PartsReader*>(user);
  const size_t room = size * n;
  size_t filled = 0;
  while (filled < room && r->part < r->parts.size()) {
    std::string_view p = r->parts[r->part].substr(r->offset);
    const size_t take = std::min(p.size(), room - filled);
    std::memcpy(buf + filled, p.data(), take);
    filled += take;
    r->offset += take;
    if (r->offset == r->parts[r->part].size()) {
      ++r->part;
      r->offset = 0;
    }
  }
  return filled;
}

int SeekParts(void* user, curl_off_t offset, int origin) {
  auto* r = static_cast<PartsReader*>(user);
  if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
  auto left = static_cast<uint64_t>(offset);
  r->part = 0;
  r->offset = 0;
  while (r->part < r->parts.size() && left >= r->parts[r->part].size()) left -= r->parts[r->part++].size();
  if (r->part == r->parts.size() && left > 0) return CURL_SEEKFUNC_FAIL;
  r->offset = static_cast<size_t>(left);
  return CURL_SEEKFUNC_OK;
}

// What libcurl's callbacks fill for one request. No exception may cross
// libcurl's C frames: an allocation that fails is recorded, and the callback
// returns a short count, which ends the transfer (CURLE_WRITE_ERROR).
struct Receiving {
  Response* response;
  const Request* request;
  bool head = false;    // a HEAD: no body follows its Content-Length
  long status = 0;      // of the status line being read (a 100 Continue comes first)
  bool out_of_memory = false;
  bool over_limit = false;  // a 2xx body passed its limit: the request fails
  bool truncated = false;   // a 200 body reached max_body_bytes with truncate_body
};

// The most of a body with this status that is kept.
uint64_t BodyLimit(const Receiving& rx) {
  if (rx.status < 200 || rx.status >= 300) return kMaxErrorBodyBytes;
  return rx.status == 206 ? rx.request->max_partial_body_bytes : rx.request->max_body_bytes;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) noexcept {
  auto* rx = static_cast<Receiving*>(user);
  std::string& body = rx->response->body;
  const size_t len = size * n;
  const uint64_t limit = BodyLimit(*rx);
  const uint64_t room = limit > body.size() ? limit - body.size() : 0;
  const bool error_body = rx->status < 200 || rx->status >= 300;
  try {
    body.append(data, static_cast<size_t>(std::min<uint64_t>(len, room)));
  } catch (...) {
    rx->out_of_memory = true;
    return 0;
  }
  if (len <= room || error_body) return len;  // the rest of an error body is read and dropped
  if (rx->status == 200 && rx->request->truncate_body) {
    rx->truncated = true;
  } else {
    rx->over_limit = true;
  }
  return 0;  // ends the transfer
}

// Collects "Name: value" lines; a new status line (after a 100 Continue)
// starts over. Reserves the body from Content-Length, for a successful
// answer that has one (not a HEAD's, not an error's).
size_t OnHeader(char* data, size_t size, size_t n, void* user) noexcept {
  auto* rx = static_cast<Receiving*>(user);
  Response* r = rx->response;
  std::string_view line(data, size * n);
  try {
    if (line.starts_with("HTTP/")) {
      r->headers.clear();
      rx->status = 0;
      const size_t space = line.find(' ');
      if (space != std::string_view::npos) {
        std::string_view code = line.substr(space + 1, 3);
        std::from_chars(code.data(), code.data() + code.size(), rx->status);
      }
      return size * n;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return size * n;
    std::string name(Trim(line.substr(0, colon)));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string_view value = Trim(line.substr(colon + 1));
    if (name == "content-length" && !rx->head && rx->status >= 200 && rx->status < 300) {
      uint64_t len = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), len);
      if (ec == std::errc()) r->body.reserve(static_cast<size_t>(std::min(len, BodyLimit(*rx))));
    }
    r->headers.emplace_back(std::move(name), std::string(value));
  } catch (...) {
    rx->out_of_memory = true;
    return 0;
  }
  return size * n;
}

// Called before each time the request is sent; a second call in one perform
// is a hidden resend.
int OnPrereq(void* user, char* /*conn_primary_ip*/, char* /*conn_local_ip*/, int /*primary*/, int /*local*/) {
  ++*static_cast<int*>(user);
  return CURL_PREREQFUNC_OK;
}

TransportError MapCurlError(CURLcode code, const char* detail, bool sent, std::string_view method,
                            std::string_view url) {
  const std::string what = fmt::format("{} {}: {} ({})", method, url, curl_easy_strerror(code), detail);
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:  // this connect; an earlier copy may have gone out on a reused connection
      return {Unavailable("{}", what), sent};
    case CURLE_OPERATION_TIMEDOUT:
      return {Timeout("{}", what), sent};
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return {InvalidArgument("{}", what), false};
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      return {IOError("{} (TLS certificate)", what), false};
    case CURLE_OUT_OF_MEMORY:
      return {ResourceExhausted("{}", what), sent};
    default:  // send/receive errors, resets, empty replies, partial bodies
      return {Unavailable("{}", what), sent};
  }
}

}  // namespace

std::string_view Response::Header(std::string_view lowercase_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lowercase_name) return value;
  }
  return {};
}

// One easy handle (and the live connection it keeps) with its error buffer.
// Owned by the idle pool or by the one request using it.
struct Client::Handle {
  CURL* curl = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  Handle() : curl(curl_easy_init()) {}
  ~Handle() {
    if (curl) curl_easy_cleanup(curl);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

Client::Client(const ClientOptions& options) : options_(options) {
  GlobalInit();
  // Release runs in a destructor: its push_back must not allocate (idle_
  // never holds more than max_connections handles).
  idle_.reserve(static_cast<size_t>(std::max(1, options_.max_connections)));
}

Client::~Client() = default;

std::unique_ptr<Client::Handle> Client::Acquire() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return busy_ < options_.max_connections; });
  ++busy_;
  if (!idle_.empty()) {
    auto h = std::move(idle_.back());
    idle_.pop_back();
    return h;
  }
  lk.unlock();
  try {
    return std::make_unique<Handle>();
  } catch (...) {  // the slot taken above goes back
    lk.lock();
    --busy_;
    cv_.notify_one();
    throw;
  }
}

void Client::Release(std::unique_ptr<Handle> handle) {
  std::lock_guard lk(mu_);
  --busy_;
  if (handle && handle->curl) idle_.push_back(std::move(handle));
  cv_.notify_one();
}

Result<Response> Client::Perform(const Request& request, TransportError* error) {
  std::unique_ptr<Handle> h = Acquire();
  struct Returner {
    Client* self;
    std::unique_ptr<Handle>* h;
    ~Returner() { self->Release(std::move(*h)); }
  } returner{this, &h};
  if (!h->curl) {
    *error = {ResourceExhausted("cannot create a curl handle"), false};
    return error->status;
  }
  CURL* c = h->curl;
  curl_easy_reset(c);  // keeps the handle's live connections
  Response response;
  if (request.expected_bytes > 0) response.body.reserve(request.expected_bytes);
  std::unique_ptr<curl_slist, SlistFree> headers;
  bool headers_ok = true;
  auto add_header = [&](const std::string& line) {
    curl_slist* next = curl_slist_append(headers.get(), line.c_str());
    if (!next) {
      headers_ok = false;
      return;
    }
    (void)headers.release();
    headers.reset(next);
  };
  for (const auto& [name, value] : request.headers) add_header(name + ": " + value);
  add_header("Expect:");  // no 100-continue round trip before bodies
  if (!headers_ok) {  // never send a request without one of its headers (a condition, the signature)
    *error = {ResourceExhausted("{} {}: out of memory building the request headers", request.method, request.url),
              false};
    return error->status;
  }

  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->error);
  h->error[0] = '\0';
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout.count()));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, options_.low_speed_bytes);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.low_speed_time.count()));
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  Receiving rx{&response, &request, request.method == "HEAD"};
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &rx);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &rx);
  int sends = 0;
  PartsReader parts{request.body_parts};
  curl_easy_setopt(c, CURLOPT_PREREQFUNCTION, OnPrereq);
  curl_easy_setopt(c, CURLOPT_PREREQDATA, &sends);
  if (request.method == "GET") {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else if (request.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT" || request.method == "POST") {
    // The body is sent from the caller's buffers (no copy), with Content-Length.
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    if (request.body_parts.empty()) {
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    } else {
      size_t size = 0;
      for (std::string_view p : request.body_parts) size += p.size();
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(size));
      curl_easy_setopt(c, CURLOPT_READFUNCTION, ReadParts);
      curl_easy_setopt(c, CURLOPT_READDATA, &parts);
      curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, SeekParts);
      curl_easy_setopt(c, CURLOPT_SEEKDATA, &parts);
    }
    if (request.method == "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());

  const CURLcode rc = curl_easy_perform(c);
  long connects = 0;
  curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &connects);
  response.new_connection = connects > 0;
  response.resent = sends > 1;
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);  // the list dies with this call
  if (rx.over_limit || rx.truncated) {
    // The rest of the body was not read: the connection is not reusable.
    curl_easy_cleanup(h->curl);
    h->curl = nullptr;
  }
  if (rx.truncated) {
    response.status = rx.status;
    response.truncated = true;
    return response;
  }
  if (rx.over_limit) {
    *error = {Corruption("{} {}: the response body is larger than the {} bytes expected", request.method, request.url,
                         BodyLimit(rx)),
              true};
    return error->status;
  }
  if (rx.out_of_memory) {
    // The response was cut off mid-way: its connection is not reusable.
    curl_easy_cleanup(h->curl);
    h->curl = nullptr;
    *error = {ResourceExhausted("{} {}: out of memory receiving the response", request.method, request.url),
              sends > 0};
    return error->status;
  }
  if (rc != CURLE_OK) {
    curl_off_t pretransfer = 0;
    curl_easy_getinfo(c, CURLINFO_PRETRANSFER_TIME_T, &pretransfer);
    // OnPrereq runs once a connection is up, just before the request goes
    // out: from then on the server may have it.
    *error = MapCurlError(rc, h->error[0] ? h->error : "no detail", pretransfer > 0 || sends > 0, request.method,
                          request.url);
    if (rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR) {
      // The connection is in an unknown state: drop it rather than pool it.
      curl_easy_cleanup(h->curl);
      h->curl = nullptr;
    }
    return error->status;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

}  // namespace weir::objstore::http
