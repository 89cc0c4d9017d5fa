// A blocking HTTP/1.1 client over a pool of libcurl easy handles, for the S3
// backend. Private to src/objstore (no curl types here).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace weir::objstore::http {

struct ClientOptions {
  int max_connections = 64;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{120000};
  long low_speed_bytes = 1024;
  std::chrono::seconds low_speed_time{20};
};

struct Request {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string_view body;      // must outlive Perform
  // When not empty, the body is the concatenation of these (sent by a read
  // callback, no copy; they must outlive Perform) and `body` is ignored.
  std::span<const std::string_view> body_parts;
  size_t expected_bytes = 0;  // response body size hint (reserve)
  // Limits on what is kept of a response body. A 2xx body (206 excepted)
  // longer than max_body_bytes fails the request with kCorruption, unless
  // truncate_body: then a 200 keeps its first max_body_bytes and the
  // connection is dropped. A 206 body longer than max_partial_body_bytes
  // fails. Of an error body (status >= 300) the first kMaxErrorBodyBytes are
  // kept and the rest is read and dropped.
  uint64_t max_body_bytes = uint64_t{1} << 30;
  uint64_t max_partial_body_bytes = uint64_t{1} << 30;
  bool truncate_body = false;
};

inline constexpr size_t kMaxErrorBodyBytes = 64u << 10;

struct Response {
  long status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  bool new_connection = false;                               // this request opened a connection
  // libcurl sent the request more than once (it silently resends on a fresh
  // connection when a reused one dies): an earlier copy may have been applied.
  bool resent = false;
  bool truncated = false;  // the body was cut at Request::max_body_bytes (truncate_body)
  std::string_view Header(std::string_view lowercase_name) const;
};

// Why a request got no HTTP response. `may_have_been_sent` is false when the
// request certainly never reached the server (resolve/connect failures), and
// for errors nothing retries (a bad URL, a TLS certificate refused), whatever
// was sent.
struct TransportError {
  Status status;  // kTimeout or kUnavailable (retryable); kInvalidArgument for a bad URL
  bool may_have_been_sent = true;
};

// Client: owned by one S3Store; Perform may be called from any thread. At most
// max_connections requests run at once (others wait in Perform); each running
// request holds one pooled easy handle, whose connection stays open for the
// next request (most recently used handle first, so warm connections win).
class Client {
 public:
  explicit Client(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Returns the response (any HTTP status) or, with no response, the error.
  // On a transport error, *error is filled and the result is its status.
  Result<Response> Perform(const Request& request, TransportError* error);

 private:
  struct Handle;
  std::unique_ptr<Handle> Acquire();
  void Release(std::unique_ptr<Handle> handle);

  const ClientOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Handle>> idle_;  // LIFO
  int busy_ = 0;
};

}  // namespace weir::objstore::http
