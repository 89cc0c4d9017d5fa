// A blocking HTTP/1.1 connection to one server (libcurl underneath; no curl
// types in this header). Keeps its connection alive between requests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace weir::client {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method = "GET";
  std::string target;  // path and query, e.g. "/v1/streams?limit=10"; already URL-encoded
  Headers headers;
  std::string body;
  int timeout_ms = 0;      // whole request; 0 = no limit
  int idle_timeout_s = 0;  // give up when no byte arrives for this long; 0 = never
  int connect_timeout_ms = 5000;
  // Sent on a new connection, never a kept-alive one: libcurl silently sends
  // a request again when a reused connection dies before any answer, which a
  // request that is not idempotent (an append without a producer) must not
  // risk.
  bool fresh_connection = false;
};

struct HttpResponse {
  long status = 0;
  Headers headers;  // names lowercased
  std::string body;

  // The first header named `name` (lowercase), or "" if absent.
  std::string_view Header(std::string_view name) const;
};

// Initializes libcurl's global state once per process; any thread may call it.
void InitCurl();

// Percent-encodes everything but RFC 3986 unreserved characters, so a stream
// name can be one path segment or one query value.
std::string UrlEncode(std::string_view s);

// One keep-alive connection to `base_url` (e.g. "http://127.0.0.1:8080").
// Owned by one caller and used from one thread at a time. Transport failures
// come back as Unavailable (refused, reset) or Timeout, naming base_url; HTTP
// error statuses are not errors here: the response carries them.
class HttpConnection {
 public:
  static Result<std::unique_ptr<HttpConnection>> Open(std::string base_url);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  const std::string& base_url() const { return base_url_; }

  Result<HttpResponse> Do(const HttpRequest& request);
  // Whether the last Do or Stream failed before a connection was made (no
  // byte of the request reached a server). A timeout counts only when the
  // request could not have gone on a kept-alive connection (a fresh one was
  // asked for, or this connection never connected).
  bool failed_before_connect() const { return failed_before_connect_; }

  // Like Do, but a 2xx body goes to `on_data` as it arrives instead of into
  // the response; `on_data` returns false to stop reading, which ends the
  // request with OK. A non-2xx body is collected into the response as usual.
  // `on_2xx` (if set) is called once the headers of a 2xx answer are in,
  // before any of its body.
  Result<HttpResponse> Stream(const HttpRequest& request, const std::function<bool(std::string_view)>& on_data,
                              const std::function<void()>& on_2xx = nullptr);

 private:
  struct Impl;
  explicit HttpConnection(std::string base_url, std::unique_ptr<Impl> impl);
  std::string base_url_;
  std::unique_ptr<Impl> impl_;
  bool failed_before_connect_ = false;
  bool ever_connected_ = false;  // a connection was made: one may be kept alive
};

}  // namespace weir::client
