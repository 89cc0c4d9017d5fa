// s3://: the ObjectStore on any S3-compatible service (AWS S3, Ceph radosgw,
// MinIO, ...), over libcurl with hand-written SigV4 signing. libcurl and
// OpenSSL stay inside src/objstore/*.cc.
//
// URI: s3://BUCKET[/PREFIX]?endpoint=URL&region=R&path_style=true|false
//      [&access_key=..&secret_key=..&session_token=..]   (tests; else AWS_* env)
//      [&allow_unconditional_put=true]                   (see below)
//      [&max_connections=N]
// Keys live under PREFIX/ in BUCKET; PREFIX plus key is at most 1024 bytes
// and must be UTF-8 (S3's rules).
//
// Opening an s3:// store probes that the service honours `If-None-Match: *`
// (create the probe key twice; the second must fail with 412). WAL fencing
// depends on it, so a service that ignores the header is refused unless
// allow_unconditional_put, which lets a single node run with create-only PUTs
// emulated by HEAD-then-PUT (racy between nodes; logged loudly).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/histogram.h"
#include "objstore/object_store.h"

namespace weir::objstore {

struct S3Options {
  std::string bucket;
  std::string prefix;    // "" or "a/b" (no leading or trailing '/')
  std::string endpoint;  // "http://127.0.0.1:7480"; "" = https://s3.REGION.amazonaws.com
  std::string region = "us-east-1";
  // Path style (ENDPOINT/BUCKET/KEY) or virtual host (BUCKET.HOST/KEY).
  // Unset: virtual host on AWS (no endpoint given), path style elsewhere.
  std::optional<bool> path_style;
  std::string access_key, secret_key, session_token;

  bool allow_unconditional_put = false;  // see the file comment
  bool probe_conditional_put = true;     // false only for tests of the client itself

  int max_connections = 64;  // concurrent requests (and pooled connections)
  // Per request, the first included: 8 waits up to about 5 s in all (a
  // burst of 503 SlowDown outlasts a shorter budget).
  int max_attempts = 8;
  std::chrono::milliseconds retry_initial{50}, retry_max{2000};
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{120000};  // whole request
  // Abort a transfer slower than low_speed_bytes per second for low_speed_time.
  long low_speed_bytes = 1024;
  std::chrono::seconds low_speed_time{20};
};

// Parses an s3:// URI. Credentials not in the URI come from AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN. Error messages never contain
// the secret key or session token.
Result<S3Options> ParseS3Uri(std::string_view uri);

// Request counters by operation and response class, latency histograms,
// retries and bytes. Owned by its S3Store; lock-free: any thread may read
// while requests run.
struct S3Metrics {
  enum Op { kPut, kGet, kHead, kList, kDelete, kDeleteMany, kOther, kOpCount };
  enum Outcome {
    k2xx,
    k404,
    k409,
    k412,
    k416,
    k4xxOther,   // 400, 403 and the rest
    k503,        // SlowDown / Service Unavailable
    k5xxOther,
    kTransport,  // no HTTP response: connect, reset, timeout
    kOutcomeCount
  };
  static std::string_view OpName(int op);            // "put", "get", ...
  static std::string_view OutcomeName(int outcome);  // "2xx", "404", ..., "transport"

  // One count per HTTP attempt (retries included).
  std::array<std::array<std::atomic<uint64_t>, kOutcomeCount>, kOpCount> requests{};
  std::array<Histogram, kOpCount> latency_ns;  // per attempt
  std::array<std::atomic<uint64_t>, kOpCount> retries{};
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0};  // bodies
  std::atomic<uint64_t> connections_opened{0};             // new TCP connections
  std::atomic<uint64_t> ambiguous_creates{0};  // create-only PUTs whose outcome was unknown
  std::atomic<uint64_t> in_flight{0};

  uint64_t Requests(int op) const;  // all outcomes
};

// S3Store: owned by its shared_ptr holders; every method may be called from any
// thread and blocks until the request (with retries) finishes. At most
// max_connections requests run at once; further callers wait for a slot.
// Idle connections are kept and reused.
//
// Failures map to Status codes: 404 kNotFound, 412 kPreconditionFailed, 416
// kOutOfRange, authentication and permission failures (403) and a missing
// bucket kIOError with the S3 code and a hint, other 4xx kInvalidArgument,
// 5xx/throttling/transport kUnavailable or kTimeout after the retries. A PUT
// that fails after an attempt that may have been applied (its answer lost, a
// 500, a resend) returns kTimeout (outcome unknown) whatever the last attempt
// met; a create-only one that then gets 412 too, never OK: the caller reads
// the object back to decide (the WAL compares its nonce).
class S3Store : public ObjectStore {
 public:
  ~S3Store() override;

  Status Put(std::string_view key, std::string_view data, const PutOptions& options = {}) override;
  // Streams the parts (hashed incrementally, sent by a read callback): a
  // segment is never joined in memory.
  Status PutParts(std::string_view key, std::span<const std::string_view> parts,
                  const PutOptions& options = {}) override;
  Result<std::string> Get(std::string_view key, std::optional<ByteRange> range = std::nullopt) override;
  Result<ObjectInfo> Head(std::string_view key) override;
  Result<ListPage> List(std::string_view prefix, std::string_view start_after = {},
                        size_t max_keys = 1000) override;
  Status Delete(std::string_view key) override;
  Status DeleteMany(std::span<const std::string> keys) override;
  std::string Describe() const override;

  const S3Metrics& metrics() const;
  const S3Options& options() const;

  // The start-up probe: PUT a fresh probe key create-only twice, expect 412 the
  // second time, delete it. Returns kNotSupported naming the reason if the
  // service ignored If-None-Match (unless allow_unconditional_put: then OK, a
  // loud warning, and create-only PUTs are emulated from then on), or the
  // error of the first PUT (credentials, bucket, endpoint). A probe with an
  // ambiguous answer (kTimeout) is done again with a fresh key, 3 times at most.
  Status ProbeConditionalPut();

  // Bucket administration for tests and benchmarks; weir itself never creates
  // or removes buckets. CreateBucket of an existing bucket of ours succeeds.
  Status CreateBucket();
  Status DeleteBucket();  // the bucket must be empty

  Status ProbeOnce();  // one probe, as ProbeConditionalPut describes
  struct Impl;

 private:
  friend Result<std::shared_ptr<S3Store>> OpenS3Store(const S3Options&);
  explicit S3Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Builds the store (connections open lazily) and, unless
// options.probe_conditional_put is false, runs ProbeConditionalPut.
Result<std::shared_ptr<S3Store>> OpenS3Store(const S3Options& options);

}  // namespace weir::objstore
