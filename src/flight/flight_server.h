// The Arrow Flight listener (docs/flight.md): gRPC's FlightService for log
// tables. DoPut (Append to a bucket, AppendTable routed by the node) turns
// rows into records of the bucket's stream through the same append path as
// the REST API and Kafka: one RecordBatch v2 per bucket per Arrow batch,
// acknowledged once durable. GetFlightInfo, PollFlightInfo, ListFlights,
// GetSchema and DoGet (up to a tail, or following it) read them back as
// Arrow; DoAction allocates writers and creates and deletes tables;
// ListActions lists the actions; Handshake hands out the bearer header.
//
// Owned by `weir serve`; Start and Stop are called from its thread. gRPC's
// threads and the server's own (Boost.Asio pools: workers decoding batches,
// readers for reads and actions) call into the engine, which must outlive
// the server. This header keeps gRPC out of its includers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace weir::log {
class Engine;
}

namespace weir::flight {

struct FlightOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (port() tells which)
  // A FlightData message (an Arrow batch and its header) is at most this.
  size_t max_message_bytes = 16u << 20;
  // DoPut calls open at once; more are refused with RESOURCE_EXHAUSTED.
  // Each holds at most one message (max_message_bytes) undecoded, or, while
  // its batch waits for room in the WAL pool, that batch encoded instead (up
  // to max_batch_bytes per bucket it reaches: more than its message when a
  // compressed body fans out to many buckets).
  size_t max_put_calls = 64;
  // DoGet calls open at once (each holds up to one message of about 1 MiB
  // that its client has not taken); more are refused with RESOURCE_EXHAUSTED.
  size_t max_get_calls = 256;
  // GetFlightInfo, GetSchema, PollFlightInfo, ListFlights, ListActions and
  // DoAction calls open at once, from their start until their answer is
  // taken (each holds its request, and a ListFlights answer may list 100,000
  // endpoints); more are refused with RESOURCE_EXHAUSTED. Handshake calls
  // (which callers without the token open too) are counted apart, up to the
  // same number.
  size_t max_info_calls = 256;
  // gRPC's own memory (requests still arriving, before any check of ours;
  // calls' arenas; connection buffers) is kept near this, or near
  // (2 * max_put_calls + 8) messages if that is more (2,176 MiB at the
  // defaults): past it gRPC cancels calls of its choosing (RESOURCE_EXHAUSTED).
  size_t max_grpc_memory_bytes = 512u << 20;
  // A bucket's part of a batch, as a Kafka batch, at most (the engine's
  // max_batch_bytes).
  size_t max_batch_bytes = 1048588;
  // Threads that decode batches and hand them to the engine (a batch waiting
  // for room in the WAL pool holds none). Two more serve reads and actions.
  size_t workers = 4;
  std::string auth_token;  // non-empty: every call needs "authorization: Bearer <token>"
  std::string default_basin = "weir-kafka";  // for descriptors that name no basin
};

struct FlightMetrics {
  std::atomic<uint64_t> put_calls{0}, put_calls_refused{0}, open_put_calls{0}, open_get_calls{0};
  std::atomic<uint64_t> get_calls_refused{0};
  std::atomic<uint64_t> open_info_calls{0}, info_calls_refused{0};
  std::atomic<uint64_t> open_handshake_calls{0}, handshake_calls_refused{0};
  std::atomic<uint64_t> batches{0}, rows{0}, bytes{0}, duplicated_batches{0}, errors{0};
};

class FlightServer {
 public:
  static Result<std::unique_ptr<FlightServer>> Start(const FlightOptions& options, log::Engine* engine);
  ~FlightServer();
  FlightServer(const FlightServer&) = delete;
  FlightServer& operator=(const FlightServer&) = delete;

  uint16_t port() const;
  const FlightMetrics& metrics() const;
  // Stops taking calls; DoGet calls following a tail end (UNAVAILABLE) at
  // once, or after their write in progress; calls open get up to
  // `grace_ms` to finish (their appends complete either way), then are
  // cancelled. Returns at once: a cancelled DoPut still ends only once its
  // appends are answered (by the engine's close, when the store fails).
  void BeginStop(int grace_ms);
  // BeginStop, then waits until every call has ended and joins the
  // server's threads. Idempotent.
  void Stop(int grace_ms = 5000);

  struct Impl;

 private:
  explicit FlightServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weir::flight
