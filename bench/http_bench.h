// `weir bench http`: a closed-loop load generator against a running
// `weir serve`. N clients, each one keep-alive connection with one append in
// flight, all driven by one thread: a plain epoll loop that sends a prebuilt
// request with one sendmsg and parses the response in place, so the
// generator leaves the server its CPU. Plain http:// only. Prints one JSON line.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace weir::bench {

struct HttpBenchOptions {
  std::string server = "http://127.0.0.1:8080";
  std::string basin;        // "" = the server's default basin
  std::string auth_token;   // "" = none
  int clients = 64;
  size_t record_bytes = 1024;
  int batch = 1;            // records per request
  double duration_s = 10;
  double warmup_s = 1;
  int streams = 0;          // 0 = one per client; clients are spread round-robin
  std::string stream_prefix = "bench-";
};

// One parsed HTTP/1.1 response head and where its message ends.
struct Response {
  int status = 0;
  size_t body_start = 0;
  size_t end = 0;            // one past the last byte of the message (when complete)
  bool close = false;        // the server will close the connection after it
  bool until_close = false;  // no length given: the body runs until the server closes
};

enum class Parsed { kIncomplete, kDone, kBad };

// Parses the response at the start of `in`: a Content-Length or chunked
// body, or (neither given) a body that runs until the connection closes.
Parsed ParseResponse(std::string_view in, Response* r);

// Creates the streams if missing, runs the load, prints the JSON result line
// to stdout (and a progress line once a second on a TTY stderr). Fails if the
// server cannot be reached or no append succeeded.
Status RunHttpBench(const HttpBenchOptions& options);

}  // namespace weir::bench
