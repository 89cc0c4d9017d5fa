// `weir serve`: one node's process. Opens the object store, the metastore and
// the engine (recovering), takes the data dir's lock, serves the HTTP API,
// and drains on SIGTERM/SIGINT.
//
// Ownership and threads: RunServe is called once, from main, and blocks until
// the server has drained; it owns every component it starts.
#pragma once

#include <string>
#include <vector>

namespace weir::server {

struct ServeOptions {
  std::string data_dir = "./weir-data";
  std::string http_addr = "127.0.0.1:8080";
  std::string object_store;  // empty: file://DATA_DIR/objects
  std::string metastore;     // empty: sqlite://DATA_DIR/meta.db
  std::string node_id = "node-1";
  // WAL stores (docs/storage-classes.md): none = the object store; one = that
  // store; two or more = the express class, a quorum of them.
  std::vector<std::string> wal_stores;
  int wal_quorum = 0;  // copies that make a slot durable; 0 = a majority
  // s3:// only: start even if the store ignores If-None-Match: * (one node only; docs/s3.md).
  bool allow_unconditional_put = false;
  // WAL tuning.
  int pipeline_window = 8;
  size_t max_slot_bytes = 8u << 20;
  double linger_ms = 1;
  double linger_put_percent = 5;  // the linger is at least this share of the PUT latency estimate
  size_t pool_budget_mib = 256;
  double admission_timeout_ms = 500;  // a full pool answers 429 after this
  // Acknowledged, unsettled batches kept in memory for reads and settle;
  // settle starts early once a quarter of it is used.
  size_t log_cache_mib = 256;
  size_t max_unsettled_mib = 4096;  // appends wait (then 429) while more awaits settle
  // A stream settles once it holds this much, or its oldest record is
  // settle_max_delay_s old (log::EngineOptions::settle_min_bytes).
  size_t settle_min_kib = 1024;
  size_t max_streams = 100'000;  // log::EngineOptions::max_streams
  size_t max_basins = 10'000;    // log::EngineOptions::max_basins
  double settle_max_delay_s = 10;
  // How often expired and trimmed segments, and empty streams with
  // delete_on_empty, are deleted.
  double retention_interval_s = 60;
  // After SIGTERM: how long requests in flight get to finish before the WAL
  // closes (acknowledging or failing what is still open) and the listeners stop.
  double drain_timeout_s = 30;
  // Then: how long the WAL's close waits for appends still open to become
  // durable before it fails them (unavailable: they may still land).
  double wal_close_timeout_s = 60;
  // HTTP.
  std::string auth_token_file;
  size_t max_request_bytes = 8u << 20;
  int http_threads = 2;
  int worker_threads = 8;
  size_t http_max_in_flight_mib = 512;  // request bodies read and not yet answered
  size_t http_max_unwritten_mib = 512;  // responses queued and not yet written (reads size to what is left)
  size_t http_max_connections = 4096;
  double http_stall_timeout_s = 60;  // a body not whole, or a response not taken, this long after it began
  // Kafka listener ("" = off) and the address given to clients in Metadata
  // and FindCoordinator ("" = the bound address).
  std::string kafka_addr = "127.0.0.1:9092";
  std::string kafka_advertised_addr;
  int kafka_auto_create_partitions = 1;  // 0 = no auto-creation
  size_t kafka_max_request_bytes = 100u << 20;
  size_t kafka_max_in_flight_mib = 512;  // request frames read and not yet answered
  size_t kafka_max_unwritten_mib = 512;  // responses answered and not yet written
  size_t kafka_max_connections = 4096;
  double kafka_stall_timeout_s = 60;  // a request body not whole, or responses not read, this long
  // Arrow Flight listener (gRPC; docs/flight.md): "" = off.
  std::string flight_addr;
  size_t flight_max_message_mib = 16;  // one FlightData message (a batch and its header)
  size_t flight_max_put_calls = 64;    // DoPut calls open at once
  size_t flight_max_get_calls = 256;   // DoGet calls open at once
  size_t flight_max_info_calls = 256;  // GetFlightInfo, ListFlights, DoAction... calls open at once
  // Object-store fault injection, for tests and benchmarks.
  std::string inject_put_latency_ms;  // "P50" or "P50,P99" (ms); "" injects none
  double inject_put_error_rate = 0;
  double inject_put_ambiguous_rate = 0;
};

// Returns the process exit code: 0 after a clean drain, non-zero (with one
// clear line logged) if the server could not start.
int RunServe(const ServeOptions& options);

}  // namespace weir::server
