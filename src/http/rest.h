// The S2 v1 REST API over the stream engine (docs/http-api.md), plus weir's
// extensions: idempotent producers, /health, /metrics and bearer-token auth.
//
// Ownership and threads: the server front-end owns one RestApi and hands it
// to the HttpServer as its Handler. Appends are served on the HTTP I/O thread
// while admitting them cannot wait (Engine::AdmissionMayWait); under
// backpressure they move to a worker, in order per connection. The response
// is sent from the engine's completion callback. Every other request moves to an HTTP worker thread, where it may
// block briefly on the metastore or the object store. Long polls and read sessions wait on tail watches and
// timers, not threads.
//
// Guarantees: an append is answered 2xx only once the engine acknowledged it (durable); every request gets one
// response, errors as S2 answers them ({code, message}); authorized requests other than /health and
// /metrics get 503 server_starting before SetReady and 503 server_draining after SetDraining.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/histogram.h"
#include "http/s2_proto.h"
#include "http/server.h"
#include "log/engine.h"

namespace weir::http {

struct RestOptions {
  std::string default_basin = "weir-default";
  // Basins that cannot be deleted besides the default (Kafka's: its topics
  // and group offsets live there, and the broker makes it only at start).
  std::vector<std::string> kept_basins;
  std::optional<std::string> auth_token;  // set: every request but /health needs it
  Duration ping_interval = std::chrono::seconds(5);  // read sessions: idle keep-alive
  size_t max_append_records = 1000;
  size_t max_append_bytes = 1 << 20;
  size_t max_request_bytes = 8u << 20;  // a body decoded from Content-Encoding, at most
};

// Counters for /metrics; read from any thread.
struct RestMetrics {
  std::atomic<uint64_t> requests{0}, responses_2xx{0}, responses_4xx{0}, responses_5xx{0};
  std::atomic<uint64_t> appends{0}, append_records{0}, append_bytes{0}, append_duplicates{0};
  std::atomic<uint64_t> backpressure{0};  // 429s
  std::atomic<uint64_t> reads{0}, read_records{0}, read_bytes{0};
  std::atomic<int64_t> read_sessions{0};    // SSE and S2S
  std::atomic<int64_t> long_polls{0};       // unary reads that have waited at the tail, until answered
  // Reads (or session steps) that waited for response room (--http-max-unwritten-mib).
  std::atomic<uint64_t> read_room_waits{0};
  std::atomic<int64_t> append_sessions{0};  // S2S
  Histogram append_latency_ns;  // request parsed to ack sent
};

class RestApi : public Handler {
 public:
  RestApi(log::Engine* engine, RestOptions options);
  ~RestApi() override;

  void Handle(Request req, std::shared_ptr<Exchange> ex) override;
  // S2S append sessions (POST .../records, content-type s2s/proto) stream
  // their input over HTTP/2; over HTTP/1.1 it is read whole.
  // 401 for a request without the bearer token, before its body is read.
  std::optional<Response> RefuseHead(const Request& head) const override;
  bool RefusesHeads() const override { return options_.auth_token.has_value(); }
  bool WantsBodyStream(const Request& head) const override;
  std::shared_ptr<BodySink> OpenBodyStream(Request head, std::shared_ptr<Exchange> ex) override;

  // Attaches the engine (once recovered); call before SetReady. Requests
  // read it only once they see ready_ (ReadyEngine), so this write is
  // published by SetReady.
  void SetEngine(log::Engine* engine) { engine_ = engine; }
  // /health answers 200 only between SetReady and SetDraining; the API
  // answers 503 before SetReady.
  void SetReady() { ready_ = true; }
  // Long polls answer now; read sessions end; append sessions end after
  // acking the input they hold; new requests get 503.
  void SetDraining();
  bool draining() const { return draining_; }
  // Renders the process-wide part of /metrics (WAL, metastore, engine); call before SetReady.
  void SetMetricsRenderer(std::function<std::string()> render) { render_metrics_ = std::move(render); }

  RestMetrics& metrics() { return metrics_; }

  struct Ctx;
  class ReadSession;
  class AppendSession;

 private:
  // `head`: a HEAD, served as a GET (whose body the exchange drops) that creates nothing.
  void Serve(Request req, std::shared_ptr<Exchange> ex, bool on_worker, bool head = false);
  // The engine once SetReady has published it, else null (still recovering).
  log::Engine* ReadyEngine() const { return ready_.load(std::memory_order_acquire) ? engine_ : nullptr; }
  // Bearer-token auth; false once answered (401).
  bool Authorized(const Request& req, const Ctx& c) const;
  AppendLimits append_limits() const { return {options_.max_append_records, options_.max_append_bytes}; }
  // Readiness, draining and the s2-basin header (into c.basin); false once answered.
  bool Admit(const Request& req, Ctx& c) const;
  void Route(Request& req, const Ctx& c);
  void Basins(Request& req, const Ctx& c, const std::string* name);
  void Streams(Request& req, const Ctx& c, const std::string* name);
  void Append(Request& req, const Ctx& c, const std::string& stream);
  // An append checked whole: to its stream, created first if the basin
  // creates streams on append (then on a worker).
  void AppendToStream(const Ctx& c, const std::string& stream, AppendInput in, bool proto_out, size_t records,
                      size_t bytes);
  // Hands a parsed append to the engine; answers when it is durable (or failed).
  // On a worker, an append that must wait for admission waits without
  // holding the worker (Engine::WhenAdmissible).
  void SubmitAppend(const Ctx& c, const std::string& stream, AppendInput in, bool proto_out, size_t records,
                    size_t bytes);
  static void RefuseProducerHeadersOnASession(const Request& req);  // throws BadRequest
  // What answers an append: its ack (JSON or protobuf) or its failure.
  static log::AppendCallback AppendAnswer(const Ctx& c, bool proto_out, size_t records, size_t bytes);
  // Appends without waiting for admission (room held by in.options.ticket,
  // or taken now, or a refusal).
  void AppendNow(const Ctx& c, const std::string& stream, AppendInput in, bool proto_out, size_t records,
                 size_t bytes);
  void Read(Request& req, const Ctx& c, const std::string& stream);
  void Tail(const Ctx& c, const std::string& stream);
  // Creates a missing stream when its basin has create_stream_on_read; a
  // missing basin or stream is left for the read itself to report.
  Status CreateOnRead(const Ctx& c, const std::string& stream);
  void Producers(const Ctx& c);
  void Metrics(const Ctx& c);

  // Deletes answered in the last minute, so a retried DELETE whose first
  // answer was lost gets 202 again (S2 answers 202 while a deletion is
  // pending). Keyed by "b\n" + basin or "s\n" + basin + "\n" + stream;
  // at most kMaxTombstones entries.
  void RememberDeleted(const std::string& key);
  bool RecentlyDeleted(const std::string& key);
  std::mutex tombstones_mu_;
  // Held across a basin's config read-modify-write (PUT, PATCH) and a
  // stream's PUT on this node; a stream's PATCH is applied under the
  // engine's own config lock (Engine::ReconfigureStream with a change).
  std::mutex config_mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> tombstones_;
  // Open S2S append sessions, to end at a drain.
  std::mutex sessions_mu_;
  std::vector<std::weak_ptr<AppendSession>> append_sessions_;
  void TrackSession(const std::shared_ptr<AppendSession>& s);
  // Reads that may wait at the tail (sessions, long polls), to wake at a
  // drain instead of at their next tick. Compacted as it doubles.
  std::vector<std::weak_ptr<ReadSession>> read_sessions_;  // sessions_mu_
  size_t compact_reads_at_ = 64;                            // sessions_mu_
  void TrackRead(const std::shared_ptr<ReadSession>& s);
  void WakeReadsForDrain();

  log::Engine* engine_;
  RestOptions options_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::function<std::string()> render_metrics_;
  RestMetrics metrics_;
};

// Prometheus text helpers shared with the server's metrics renderer.
void PromCounter(std::string* out, std::string_view name, std::string_view help, double value);
void PromGauge(std::string* out, std::string_view name, std::string_view help, double value);
// A histogram of nanoseconds exported in seconds, with cumulative buckets
// near 0.5 ms, 1 ms, 2.5 ms ... 10 s (each `le` is the upper edge of the fine
// bucket holding the round value, up to 3 % above it, so its count is exact).
void PromHistogramSeconds(std::string* out, std::string_view name, std::string_view help, const Histogram& h);

}  // namespace weir::http
