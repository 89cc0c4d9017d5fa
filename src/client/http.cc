#include "client/http.h"

#include <curl/curl.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace weir::client {

std::string_view HttpResponse::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

void InitCurl() {
  static std::once_flag once;
  std::call_once(once, [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    std::atexit(curl_global_cleanup);
  });
}

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

namespace {

// The most of one answer the client keeps. A weir answer is far smaller (a
// read's page holds about 1 MiB of records, one larger record alone, up to
// 64 MiB decoded, base64 in JSON); past it the server is no weir server.
constexpr size_t kMaxResponseBytes = size_t{256} << 20;

// State of one request, shared with curl's callbacks.
struct Transfer {
  CURL* easy = nullptr;
  HttpResponse* response = nullptr;
  const std::function<bool(std::string_view)>* on_data = nullptr;
  const std::function<void()>* on_2xx = nullptr;
  bool stopped = false;  // on_data asked to stop
  bool too_large = false;  // the response body passed kMaxResponseBytes
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) {
    t->response->headers.clear();  // a new response (after 100 Continue)
    return size * n;
  }
  if ((line == "\r\n" || line == "\n") && t->on_2xx != nullptr) {  // the end of a header block
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300) (*t->on_2xx)();
    return size * n;
  }
  auto colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.remove_suffix(1);
  t->response->headers.emplace_back(std::move(name), std::string(value));
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view chunk(data, size * n);
  if (t->on_data != nullptr) {
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300) {
      if (!(*t->on_data)(chunk)) {
        t->stopped = true;
        return 0;  // aborts the transfer with CURLE_WRITE_ERROR
      }
      return chunk.size();
    }
  }
  if (t->response->body.size() + chunk.size() > kMaxResponseBytes) {
    t->too_large = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  t->response->body.append(chunk);
  return chunk.size();
}

// `never_connected`: a timeout came before any connection (known only where
// no kept-alive connection could be used: a reused one reports a connect
// time of 0 as well).
Status TransportError(CURL* easy, CURLcode rc, const char* detail, const std::string& base_url,
                      bool never_connected) {
  std::string what = detail[0] != '\0' ? detail : curl_easy_strerror(rc);
  long os_errno = 0;
  curl_easy_getinfo(easy, CURLINFO_OS_ERRNO, &os_errno);
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
      if (os_errno != 0) what = std::strerror(static_cast<int>(os_errno));
      return Unavailable("cannot connect to {}: {}", base_url, what);
    case CURLE_COULDNT_RESOLVE_HOST:
      return Unavailable("cannot connect to {}: {}", base_url, what);
    case CURLE_OPERATION_TIMEDOUT:
      if (never_connected) return Unavailable("cannot connect to {}: {}", base_url, what);
      return Timeout("request to {} timed out: {}", base_url, what);
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return InvalidArgument("bad server URL \"{}\": {}", base_url, what);
    default:
      return Unavailable("connection to {} failed: {}", base_url, what);
  }
}

}  // namespace

struct HttpConnection::Impl {
  CURL* easy = nullptr;
  ~Impl() {
    if (easy != nullptr) curl_easy_cleanup(easy);
  }
};

HttpConnection::HttpConnection(std::string base_url, std::unique_ptr<Impl> impl)
    : base_url_(std::move(base_url)), impl_(std::move(impl)) {}

HttpConnection::~HttpConnection() = default;

Result<std::unique_ptr<HttpConnection>> HttpConnection::Open(std::string base_url) {
  InitCurl();
  while (!base_url.empty() && base_url.back() == '/') base_url.pop_back();
  if (!base_url.starts_with("http://") && !base_url.starts_with("https://")) {
    return InvalidArgument("bad server URL \"{}\": it must start with http:// or https://", base_url);
  }
  auto impl = std::make_unique<Impl>();
  impl->easy = curl_easy_init();
  if (impl->easy == nullptr) return Internal("curl_easy_init failed");
  return std::unique_ptr<HttpConnection>(new HttpConnection(std::move(base_url), std::move(impl)));
}

Result<HttpResponse> HttpConnection::Do(const HttpRequest& request) { return Stream(request, nullptr); }

Result<HttpResponse> HttpConnection::Stream(const HttpRequest& request,
                                            const std::function<bool(std::string_view)>& on_data,
                                            const std::function<void()>& on_2xx) {
  CURL* easy = impl_->easy;
  curl_easy_reset(easy);  // keeps the live connection
  HttpResponse response;
  Transfer t{easy, &response, on_data ? &on_data : nullptr, on_2xx ? &on_2xx : nullptr, false};
  std::string url = base_url_ + request.target;
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  if (request.fresh_connection) curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 1L);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout_ms));
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout_ms));
  if (request.idle_timeout_s > 0) {  // under 1 byte/s for that long
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_TIME, static_cast<long>(request.idle_timeout_s));
  }
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &t);
  if (request.method == "GET") {
    curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    if (!request.body.empty() || request.method != "DELETE") {
      curl_easy_setopt(easy, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    }
  }
  curl_slist* list = curl_slist_append(nullptr, "Expect:");  // no 100-continue round trip
  for (const auto& [k, v] : request.headers) {
    std::string line = k + ": " + v;
    list = curl_slist_append(list, line.c_str());
  }
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list);
  CURLcode rc = curl_easy_perform(easy);
  curl_slist_free_all(list);
  failed_before_connect_ = false;
  // A connect time of 0 tells "never connected" only where no kept-alive
  // connection could have been used (a reused one reports 0 as well).
  curl_off_t connected_at = 0;  // microseconds to the connect; 0 if none
  curl_easy_getinfo(easy, CURLINFO_CONNECT_TIME_T, &connected_at);
  const bool could_reuse = ever_connected_ && !request.fresh_connection;
  if (rc == CURLE_OK || connected_at > 0) ever_connected_ = true;
  if (t.too_large) {
    return Internal("the answer from {} is larger than {} MiB: not a weir server, or a proxy's page", base_url_,
                    kMaxResponseBytes >> 20);
  }
  if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && t.stopped)) {
    failed_before_connect_ = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                             (rc == CURLE_OPERATION_TIMEDOUT && connected_at == 0 && !could_reuse);
    return TransportError(easy, rc, errbuf, base_url_, failed_before_connect_);
  }
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

}  // namespace weir::client
