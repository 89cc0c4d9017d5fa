// s3://: requests, retries, metrics and the conditional-PUT probe (see
// s3_store.h). Signing is in sigv4.cc, XML in s3_protocol.cc, HTTP in
// http_client.cc.
#include "objstore/s3_store.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <random>
#include <thread>
#include <unordered_set>

#include "base/clock.h"
#include "base/log.h"
#include "base/secret.h"
#include "base/utf8.h"
#include "objstore/http_client.h"
#include "objstore/internal.h"
#include "objstore/s3_protocol.h"
#include "objstore/sigv4.h"

namespace weir::objstore {

namespace {

using internal::CatchAll;

constexpr size_t kMaxS3KeyBytes = 1024;
constexpr size_t kDeleteBatch = 1000;  // S3's DeleteObjects limit
// What is kept of a response body: XML answers (a LIST page of 1,000 keys of
// at most 1,024 bytes is a few MB) and whole objects (weir writes none this
// large: slots and merged segments are a few MiB).
constexpr uint64_t kMaxXmlBodyBytes = 16u << 20;
// Requests of one List call (pages of keys, or S3's empty truncated pages).
constexpr size_t kMaxListRoundTrips = 10000;
constexpr uint64_t kMaxObjectBodyBytes = uint64_t{1} << 30;
constexpr std::string_view kScheme = "s3://";

// libcurl reports no 1xx as final, but a status of 0 or 1xx is no success.
bool Is2xx(long status) { return status >= 200 && status < 300; }

S3Metrics::Outcome OutcomeOf(long status) {
  if (Is2xx(status)) return S3Metrics::k2xx;
  switch (status) {
    case 404: return S3Metrics::k404;
    case 409: return S3Metrics::k409;
    case 412: return S3Metrics::k412;
    case 416: return S3Metrics::k416;
    case 503: return S3Metrics::k503;
    default: return status >= 500 ? S3Metrics::k5xxOther : S3Metrics::k4xxOther;
  }
}

bool ParseBool(std::string_view v, bool* out) {
  if (v == "true" || v == "1") {
    *out = true;
  } else if (v == "false" || v == "0") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

uint64_t RandomU64() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(NowNanos()));
  return rng();
}

}  // namespace

// ---- metrics ------------------------------------------------------------------

std::string_view S3Metrics::OpName(int op) {
  static constexpr std::string_view kNames[] = {"put", "get", "head", "list", "delete", "delete_many", "other"};
  return op >= 0 && op < kOpCount ? kNames[op] : "?";
}

std::string_view S3Metrics::OutcomeName(int outcome) {
  static constexpr std::string_view kNames[] = {"2xx", "404", "409", "412", "416",
                                                "4xx", "503", "5xx", "transport"};
  return outcome >= 0 && outcome < kOutcomeCount ? kNames[outcome] : "?";
}

uint64_t S3Metrics::Requests(int op) const {
  uint64_t n = 0;
  for (const auto& c : requests[static_cast<size_t>(op)]) n += c.load(std::memory_order_relaxed);
  return n;
}

// ---- URI ------------------------------------------------------------------------

Result<S3Options> ParseS3Uri(std::string_view uri) {
  const std::string shown = RedactUri(uri);
  auto bad = [&](std::string_view why) { return InvalidArgument("object store URI \"{}\": {}", shown, why); };
  if (!uri.starts_with(kScheme)) return bad("not an s3:// URI");
  std::string_view rest = uri.substr(kScheme.size());
  std::string_view params;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    params = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  S3Options o;
  const size_t slash = rest.find('/');
  o.bucket = rest.substr(0, slash);
  if (o.bucket.empty()) return bad("s3:// needs a bucket: s3://BUCKET[/PREFIX]");
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (prefix.ends_with('/')) prefix.remove_suffix(1);
    if (!prefix.empty()) {
      if (Status st = ValidateKey(prefix); !st.ok()) return bad("bad prefix: " + st.message());
      o.prefix = prefix;
    }
  }
  bool region_given = false;
  while (!params.empty()) {
    const size_t amp = params.find('&');
    const std::string_view item = params.substr(0, amp);
    params = amp == std::string_view::npos ? std::string_view() : params.substr(amp + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    auto decoded = s3::UrlDecode(eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1), false);
    if (!decoded.ok()) return bad(fmt::format("parameter {} is not properly %-encoded", name));
    const std::string& value = *decoded;
    if (name == "endpoint") {
      o.endpoint = value;
    } else if (name == "region") {
      o.region = value;
      region_given = true;
    } else if (name == "path_style") {
      bool b = false;
      if (!ParseBool(value, &b)) return bad("path_style must be true or false");
      o.path_style = b;
    } else if (name == "access_key") {
      o.access_key = value;
    } else if (name == "secret_key") {
      o.secret_key = value;
    } else if (name == "session_token") {
      o.session_token = value;
    } else if (name == "allow_unconditional_put") {
      if (!ParseBool(value, &o.allow_unconditional_put)) return bad("allow_unconditional_put must be true or false");
    } else if (name == "max_connections") {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), o.max_connections);
      if (ec != std::errc() || p != value.data() + value.size() || o.max_connections < 1 || o.max_connections > 1024) {
        return bad("max_connections must be 1..1024");
      }
    } else {
      return bad(fmt::format(
          "unknown parameter \"{}\"; known: endpoint, region, path_style, access_key, secret_key, session_token, "
          "allow_unconditional_put, max_connections",
          name));
    }
  }
  if (o.region.empty()) return bad("region must not be empty");
  if (!region_given) {
    if (std::string r = EnvOr("AWS_REGION"); !r.empty()) o.region = r;
  }
  while (o.endpoint.ends_with('/')) o.endpoint.pop_back();
  if (!o.endpoint.empty() && !o.endpoint.starts_with("http://") && !o.endpoint.starts_with("https://")) {
    return bad("endpoint must start with http:// or https://");
  }
  if (o.access_key.empty() && o.secret_key.empty()) {
    o.access_key = EnvOr("AWS_ACCESS_KEY_ID");
    o.secret_key = EnvOr("AWS_SECRET_ACCESS_KEY");
    o.session_token = EnvOr("AWS_SESSION_TOKEN");
  }
  if (o.access_key.empty() || o.secret_key.empty()) {
    return bad(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary "
        "credentials), or pass access_key= and secret_key= in the URI");
  }
  return o;
}

// ---- the store ----------------------------------------------------------------

// Configuration (immutable after OpenS3Store, but for emulate_create_only,
// which the probe sets once) plus the thread-safe client and metrics; shared
// by every calling thread without locks.
struct S3Store::Impl {
  S3Options o;
  sigv4::Credentials credentials;
  std::string origin;     // "http://127.0.0.1:7480" or "https://bucket.s3.r.amazonaws.com"
  std::string host;       // Host header: "127.0.0.1:7480"
  std::string base_path;  // "/bucket" (path style) or "" (virtual host)
  std::string key_prefix;  // "prefix/" or ""
  http::Client client;
  S3Metrics metrics;
  std::atomic<bool> emulate_create_only{false};

  Impl(const S3Options& options, const http::ClientOptions& client_options) : o(options), client(client_options) {}

  // One logical request; Send signs and sends it, retrying as needed.
  struct Call {
    S3Metrics::Op op = S3Metrics::kOther;
    std::string method;
    std::string path;  // encoded, from the bucket root: "/" or "/prefix/key"
    sigv4::Pairs query;
    std::vector<std::pair<std::string, std::string>> headers;  // signed, besides the standard ones
    std::string_view body;
    std::span<const std::string_view> body_parts;  // instead of body when not empty
    std::string payload_sha256 = std::string(sigv4::kEmptySha256);
    size_t expected_bytes = 0;
    uint64_t max_body_bytes = kMaxXmlBodyBytes;  // see http::Request
    uint64_t max_partial_body_bytes = kMaxXmlBodyBytes;
    bool truncate_body = false;
    std::string what;  // "PUT s3://bucket/key", for messages
  };

  std::string FullKey(std::string_view key) const { return key_prefix + std::string(key); }
  std::string ObjectPath(std::string_view key) const { return "/" + sigv4::UriEncode(FullKey(key), false); }
  std::string What(std::string_view method, std::string_view key) const {
    return fmt::format("{} s3://{}/{}{}", method, o.bucket, key_prefix, key);
  }

  // A request on one object.
  Call ObjectCall(S3Metrics::Op op, std::string_view method, std::string_view key) const {
    Call call;
    call.op = op;
    call.method = method;
    call.path = ObjectPath(key);
    call.what = What(method, key);
    return call;
  }

  // Checks S3's own key rules on top of ValidateKey.
  Status CheckKey(std::string_view key) const {
    WEIR_RETURN_IF_ERROR(ValidateKey(key));
    if (key_prefix.size() + key.size() > kMaxS3KeyBytes) {
      return InvalidArgument("object key {} is too long for s3://: prefix \"{}\" plus key must be at most {} bytes",
                             internal::QuoteKey(key), key_prefix, kMaxS3KeyBytes);
    }
    if (!IsValidUtf8(key)) return InvalidArgument("object key {} is not UTF-8, which S3 requires", internal::QuoteKey(key));
    return Status::Ok();
  }

  std::chrono::nanoseconds Backoff(int attempt) const {
    // attempt 2 waits ~retry_initial, doubling up to retry_max; jitter 50-100%.
    auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(o.retry_initial) * (int64_t{1} << std::min(attempt - 2, 20));
    d = std::min<std::chrono::nanoseconds>(d, o.retry_max);
    const double jitter = 0.5 + 0.5 * static_cast<double>(RandomU64() >> 11) * 0x1.0p-53;
    return std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(d.count()) * jitter));
  }

  // Sends `call`, retrying transport failures and retryable S3 errors with
  // backoff, up to max_attempts. Returns the last HTTP response (any status),
  // or the transport error when the last attempt got none. *maybe_applied
  // tells whether a failed earlier attempt may have been applied anyway.
  Result<http::Response> Send(const Call& call, bool* maybe_applied_out = nullptr) {
    bool ignored = false;
    bool* maybe_applied = maybe_applied_out ? maybe_applied_out : &ignored;
    *maybe_applied = false;
    const std::string query = sigv4::CanonicalQuery(call.query);
    http::Request req;
    req.method = call.method;
    req.url = origin + base_path + call.path + (query.empty() ? "" : "?" + query);
    req.body = call.body;
    req.body_parts = call.body_parts;
    req.expected_bytes = call.expected_bytes;
    req.max_body_bytes = call.max_body_bytes;
    req.max_partial_body_bytes = call.max_partial_body_bytes;
    req.truncate_body = call.truncate_body;
    sigv4::Request sreq;
    sreq.method = call.method;
    sreq.canonical_uri = base_path + call.path;
    sreq.query = call.query;
    sreq.payload_sha256 = call.payload_sha256;
    const size_t op = static_cast<size_t>(call.op);
    Status last;
    const int attempts = std::max(1, o.max_attempts);
    for (int attempt = 1; attempt <= attempts; ++attempt) {
      if (attempt > 1) {
        metrics.retries[op].fetch_add(1, std::memory_order_relaxed);
        std::this_thread::sleep_for(Backoff(attempt));
      }
      const std::string date = sigv4::AmzDate(std::chrono::system_clock::now());
      sreq.headers = call.headers;
      sreq.headers.emplace_back("host", host);
      sreq.headers.emplace_back("x-amz-date", date);
      sreq.headers.emplace_back("x-amz-content-sha256", call.payload_sha256);
      if (!credentials.session_token.empty()) sreq.headers.emplace_back("x-amz-security-token", credentials.session_token);
      const sigv4::Signed sig = sigv4::Sign(sreq, credentials, o.region, "s3", date);
      req.headers = sreq.headers;
      req.headers.emplace_back("Authorization", sig.authorization);

      http::TransportError terr;
      metrics.in_flight.fetch_add(1, std::memory_order_relaxed);
      const TimePoint t0 = Now();
      Result<http::Response> resp = client.Perform(req, &terr);
      metrics.latency_ns[op].Record(static_cast<uint64_t>(std::chrono::nanoseconds(Now() - t0).count()));
      metrics.in_flight.fetch_sub(1, std::memory_order_relaxed);
      if (!resp.ok()) {
        metrics.requests[op][S3Metrics::kTransport].fetch_add(1, std::memory_order_relaxed);
        if (terr.may_have_been_sent) *maybe_applied = true;
        last = terr.status;
        if (!last.retryable()) return last;
        Log().debug("S3 {} attempt {} failed: {}", call.what, attempt, last.ToString());
        continue;
      }
      if (resp->resent) {
        // libcurl resent the request on a fresh connection: the first copy may have landed.
        metrics.retries[op].fetch_add(1, std::memory_order_relaxed);
        *maybe_applied = true;
      }
      metrics.requests[op][OutcomeOf(resp->status)].fetch_add(1, std::memory_order_relaxed);
      size_t sent = call.body.size();
      for (std::string_view part : call.body_parts) sent += part.size();
      metrics.bytes_sent.fetch_add(sent, std::memory_order_relaxed);
      metrics.bytes_received.fetch_add(resp->body.size(), std::memory_order_relaxed);
      if (resp->new_connection) metrics.connections_opened.fetch_add(1, std::memory_order_relaxed);
      if (Is2xx(resp->status)) return resp;
      const s3::Error err = ErrorOf(*resp);
      // A 5xx may have been applied, the last attempt's too.
      if (s3::MayHaveBeenApplied(err)) *maybe_applied = true;
      if (!s3::IsRetryable(err) || attempt == attempts) return resp;
      last = s3::ToStatus(err, call.what);
      Log().debug("S3 {} attempt {} failed: {}", call.what, attempt, last.ToString());
    }
    return last.WithContext(fmt::format("after {} attempts", attempts));
  }

  static s3::Error ErrorOf(const http::Response& r) {
    return s3::ParseError(r.status, r.body, r.Header("x-amz-request-id"));
  }
  // The Status for a non-2xx response.
  static Status ErrorStatus(const http::Response& r, std::string_view what) { return s3::ToStatus(ErrorOf(r), what); }

  Status PutObject(std::string_view key, std::string_view data, bool create_only) {
    return PutObject(key, std::span(&data, 1), create_only);
  }
  // The object is the concatenation of `parts`.
  Status PutObject(std::string_view key, std::span<const std::string_view> parts, bool create_only) {
    Call call = ObjectCall(S3Metrics::kPut, "PUT", key);
    if (parts.size() == 1) {
      call.body = parts[0];
    } else {
      call.body_parts = parts;
    }
    call.payload_sha256 = sigv4::Sha256Hex(parts);
    call.headers.emplace_back("content-type", "application/octet-stream");
    if (create_only) call.headers.emplace_back("if-none-match", "*");
    bool maybe_applied = false;
    Result<http::Response> r = Send(call, &maybe_applied);
    if (r.ok() && Is2xx(r->status)) return Status::Ok();
    if (maybe_applied) {
      // Whatever the last attempt met (a 412, an expired token, a reset, the
      // retries running out), an earlier one may have landed: outcome unknown.
      if (create_only) metrics.ambiguous_creates.fetch_add(1, std::memory_order_relaxed);
      const Status last = r.ok() ? ErrorStatus(*r, call.what) : r.status();
      if (r.ok() && r->status == 412 && create_only) {
        return Timeout(
            "{} (create-only): a retry got 412 after an attempt that may have been applied; the object may be "
            "ours or another writer's (read it back to decide)",
            call.what);
      }
      return Timeout("{}: an attempt may have been applied (read it back to decide); the last one failed: {}",
                     call.what, last.ToString());
    }
    if (!r.ok()) return r.status();
    return ErrorStatus(*r, call.what);
  }

  Result<ObjectInfo> HeadObject(std::string_view key) {
    const Call call = ObjectCall(S3Metrics::kHead, "HEAD", key);
    WEIR_ASSIGN_OR_RETURN(http::Response r, Send(call));
    if (!Is2xx(r.status)) return ErrorStatus(r, call.what);
    const std::string_view len = r.Header("content-length");
    ObjectInfo info{std::string(key), 0};
    auto [p, ec] = std::from_chars(len.data(), len.data() + len.size(), info.size);
    if (ec != std::errc() || p != len.data() + len.size()) {
      return Corruption("{}: bad Content-Length \"{}\"", call.what, len);
    }
    return info;
  }

  Result<std::string> GetObject(std::string_view key, std::optional<ByteRange> range) {
    if (range && range->length == 0) {
      // HTTP cannot ask for zero bytes: check the offset against the size.
      WEIR_ASSIGN_OR_RETURN(ObjectInfo info, HeadObject(key));
      if (range->offset > 0 && range->offset >= info.size) {
        return OutOfRange("range offset {} is past the end of {} ({} bytes)", range->offset, What("GET", key), info.size);
      }
      return std::string();
    }
    Call call = ObjectCall(S3Metrics::kGet, "GET", key);
    call.max_body_bytes = kMaxObjectBodyBytes;
    uint64_t end = 0;  // of the range, saturated
    if (range) {
      const uint64_t last = range->length > UINT64_MAX - range->offset ? UINT64_MAX : range->offset + range->length - 1;
      end = last == UINT64_MAX ? UINT64_MAX : last + 1;
      call.headers.emplace_back("range", last >= (uint64_t{1} << 62) ? fmt::format("bytes={}-", range->offset)
                                                                      : fmt::format("bytes={}-{}", range->offset, last));
      call.expected_bytes = static_cast<size_t>(std::min<uint64_t>(range->length, 64u << 20));
      call.max_partial_body_bytes = std::min(range->length, kMaxObjectBodyBytes);
      // A service that ignores Range sends the object from its start: keep
      // only what the range needs.
      call.max_body_bytes = std::min(end, kMaxObjectBodyBytes);
      call.truncate_body = true;
    }
    WEIR_ASSIGN_OR_RETURN(http::Response r, Send(call));
    if (r.status == 206) {
      // The window sent must be the one asked for: a gateway that moves or
      // caps ranges would otherwise read as the object's end. (A 206
      // without Content-Range is taken as is.)
      if (std::string_view h = r.Header("content-range"); range && !h.empty()) {
        auto cr = s3::ParseContentRange(h);
        if (!cr || cr->first != range->offset || cr->last - cr->first + 1 != r.body.size()) {
          return Corruption("{}: asked for bytes from {}, got {} bytes with Content-Range \"{}\"", call.what,
                            range->offset, r.body.size(), h);
        }
        // (With the total unknown, `bytes F-L/*`, a short window is taken
        // as the object's end, as a 206 without Content-Range is.)
        if (r.body.size() < range->length && cr->total && cr->last + 1 < *cr->total) {
          return Unavailable("{}: asked for {} bytes from {}, the service sent {} (Content-Range \"{}\")", call.what,
                             range->length, range->offset, r.body.size(), h);
        }
      }
      return std::move(r.body);
    }
    if (r.status == 200) {
      if (!range) return std::move(r.body);
      // The service ignored the Range header: cut the range out ourselves.
      if (r.truncated && r.body.size() < end) {
        return Corruption("{}: the service ignored the Range header and the object is larger than the {} bytes read",
                          call.what, r.body.size());
      }
      if (range->offset > 0 && range->offset >= r.body.size()) {
        return OutOfRange("range offset {} is past the end of {} ({} bytes)", range->offset, call.what, r.body.size());
      }
      return r.body.substr(range->offset, range->length);
    }
    if (r.status == 416 && range && range->offset == 0) {
      // Only an empty object refuses a range at offset 0; ours returns "".
      WEIR_ASSIGN_OR_RETURN(ObjectInfo info, HeadObject(key));
      if (info.size == 0) return std::string();
    }
    return ErrorStatus(r, call.what);
  }

  // One ListObjectsV2 call.
  Result<s3::ListResult> ListOnce(const std::string& full_prefix, const std::string& start_after,
                                  const std::string& token, size_t max_keys) {
    Call call;
    call.op = S3Metrics::kList;
    call.method = "GET";
    call.path = "/";
    call.query = {{"list-type", "2"}, {"prefix", full_prefix}, {"max-keys", std::to_string(max_keys)},
                  {"encoding-type", "url"}};
    if (!token.empty()) {
      call.query.emplace_back("continuation-token", token);
    } else if (!start_after.empty()) {
      call.query.emplace_back("start-after", start_after);
    }
    call.what = fmt::format("LIST s3://{}/{}*", o.bucket, full_prefix);
    WEIR_ASSIGN_OR_RETURN(http::Response r, Send(call));
    if (!Is2xx(r.status)) return ErrorStatus(r, call.what);
    auto parsed = s3::ParseListObjectsV2(r.body);
    if (!parsed.ok()) return parsed.status().WithContext(call.what);
    return parsed;
  }

  Status DeleteObject(std::string_view key) {
    const Call call = ObjectCall(S3Metrics::kDelete, "DELETE", key);
    WEIR_ASSIGN_OR_RETURN(http::Response r, Send(call));
    if (Is2xx(r.status)) return Status::Ok();
    const s3::Error e = ErrorOf(r);
    if (r.status == 404 && e.code != "NoSuchBucket") return Status::Ok();  // already gone
    return s3::ToStatus(e, call.what);
  }

  // One DeleteObjects request for at most 1000 keys.
  Status DeleteBatch(std::span<const std::string> keys) {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(FullKey(k));
    const std::string body = s3::DeleteObjectsBody(full);
    Call call;
    call.op = S3Metrics::kDeleteMany;
    call.method = "POST";
    call.path = "/";
    call.query = {{"delete", ""}};
    call.body = body;
    call.payload_sha256 = sigv4::Sha256Hex(body);
    call.headers.emplace_back("content-md5", sigv4::Md5Base64(body));
    call.headers.emplace_back("content-type", "application/xml");
    call.what = fmt::format("DeleteObjects s3://{}/ ({} keys from {})", o.bucket, keys.size(), full.front());
    WEIR_ASSIGN_OR_RETURN(http::Response r, Send(call));
    if (!Is2xx(r.status)) return ErrorStatus(r, call.what);
    auto errors = s3::ParseDeleteResult(r.body);
    if (!errors.ok()) return errors.status().WithContext(call.what);
    for (const s3::DeleteError& e : *errors) {
      if (e.code == "NoSuchKey") continue;
      // A key the service was too busy for (InternalError, SlowDown) is
      // retryable: the caller deletes it again later.
      s3::Error busy;
      busy.code = e.code;
      if (s3::IsRetryable(busy)) {
        return Unavailable("{}: key \"{}\" was not deleted: {} {}", call.what, e.key, e.code, e.message);
      }
      return IOError("{}: key \"{}\" was not deleted: {} {}", call.what, e.key, e.code, e.message);
    }
    return Status::Ok();
  }

  Status BucketRequest(const std::string& method, std::string_view body) {
    Call call;
    call.op = S3Metrics::kOther;
    call.method = method;
    call.path = base_path.empty() ? "/" : "";
    call.body = body;
    call.payload_sha256 = sigv4::Sha256Hex(body);
    call.what = fmt::format("{} bucket s3://{}", method, o.bucket);
    WEIR_ASSIGN_OR_RETURN(http::Response r, Send(call));
    if (Is2xx(r.status)) return Status::Ok();
    const s3::Error e = ErrorOf(r);
    if (method == "PUT" && e.code == "BucketAlreadyOwnedByYou") return Status::Ok();
    if (method == "DELETE" && r.status == 404 && e.code == "NoSuchBucket") return Status::Ok();
    return s3::ToStatus(e, call.what);
  }
};

S3Store::S3Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

S3Store::~S3Store() = default;

Result<std::shared_ptr<S3Store>> OpenS3Store(const S3Options& options) {
  return CatchAll("OpenS3Store", [&]() -> Result<std::shared_ptr<S3Store>> {
    if (options.bucket.empty()) return InvalidArgument("s3:// needs a bucket");
    if (options.max_connections < 1) return InvalidArgument("max_connections must be at least 1");
    http::ClientOptions co;
    co.max_connections = options.max_connections;
    co.connect_timeout = options.connect_timeout;
    co.request_timeout = options.request_timeout;
    co.low_speed_bytes = options.low_speed_bytes;
    co.low_speed_time = options.low_speed_time;
    auto impl = std::make_unique<S3Store::Impl>(options, co);
    S3Options& o = impl->o;
    const bool aws = o.endpoint.empty();
    if (aws) o.endpoint = fmt::format("https://s3.{}.amazonaws.com", o.region);
    // A dotted bucket name as a host name is not covered by AWS's wildcard
    // certificate (*.s3.REGION.amazonaws.com): path style, as AWS's SDKs do.
    const bool path_style = o.path_style.value_or(!aws || o.bucket.find('.') != std::string::npos);
    o.path_style = path_style;
    const size_t scheme_end = o.endpoint.find("://") + 3;
    std::string authority = o.endpoint.substr(scheme_end);
    std::string endpoint_path;
    if (const size_t slash = authority.find('/'); slash != std::string::npos) {
      endpoint_path = authority.substr(slash);
      authority.resize(slash);
    }
    if (authority.empty()) return InvalidArgument("s3:// endpoint \"{}\" has no host", o.endpoint);
    if (path_style) {
      impl->host = authority;
      impl->origin = o.endpoint.substr(0, scheme_end) + authority;
      impl->base_path = endpoint_path + "/" + sigv4::UriEncode(o.bucket, true);
    } else {
      impl->host = o.bucket + "." + authority;
      impl->origin = o.endpoint.substr(0, scheme_end) + impl->host;
      impl->base_path = endpoint_path;
    }
    impl->key_prefix = o.prefix.empty() ? "" : o.prefix + "/";
    impl->credentials = sigv4::Credentials{o.access_key, o.secret_key, o.session_token};
    std::shared_ptr<S3Store> store(new S3Store(std::move(impl)));
    if (options.probe_conditional_put) WEIR_RETURN_IF_ERROR(store->ProbeConditionalPut());
    return store;
  });
}

Status S3Store::Put(std::string_view key, std::string_view data, const PutOptions& options) {
  return PutParts(key, std::span(&data, 1), options);
}

Status S3Store::PutParts(std::string_view key, std::span<const std::string_view> parts, const PutOptions& options) {
  return CatchAll("s3:// Put", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(impl_->CheckKey(key));
    if (options.if_none_match && impl_->emulate_create_only.load(std::memory_order_relaxed)) {
      // allow_unconditional_put on a service without If-None-Match: racy.
      auto head = impl_->HeadObject(key);
      if (head.ok()) return PreconditionFailed("{}: the object already exists", impl_->What("PUT", key));
      if (head.status().code() != Code::kNotFound) return head.status();
      return impl_->PutObject(key, parts, false);
    }
    return impl_->PutObject(key, parts, options.if_none_match);
  });
}

Result<std::string> S3Store::Get(std::string_view key, std::optional<ByteRange> range) {
  return CatchAll("s3:// Get", [&]() -> Result<std::string> {
    WEIR_RETURN_IF_ERROR(impl_->CheckKey(key));
    return impl_->GetObject(key, range);
  });
}

Result<ObjectInfo> S3Store::Head(std::string_view key) {
  return CatchAll("s3:// Head", [&]() -> Result<ObjectInfo> {
    WEIR_RETURN_IF_ERROR(impl_->CheckKey(key));
    return impl_->HeadObject(key);
  });
}

Result<ListPage> S3Store::List(std::string_view prefix, std::string_view start_after, size_t max_keys) {
  return CatchAll("s3:// List", [&]() -> Result<ListPage> {
    if (max_keys < 1 || max_keys > 1000) return InvalidArgument("List max_keys {} is not in 1..1000", max_keys);
    ListPage page;
    // No stored key contains NUL or is longer than S3 allows.
    if (prefix.find('\0') != std::string_view::npos) return page;
    if (impl_->key_prefix.size() + prefix.size() > kMaxS3KeyBytes) return page;
    const std::string full_prefix = impl_->FullKey(prefix);
    // start_after below the prefix excludes nothing; at or above it, it does
    // (a key equal to start_after is never listed).
    const std::string full_start =
        !start_after.empty() && start_after >= prefix ? impl_->FullKey(start_after) : std::string();
    // One key more than asked tells exactly whether more follow.
    const size_t want = max_keys < 1000 ? max_keys + 1 : max_keys;
    std::vector<ObjectInfo> found;
    bool truncated = false;
    std::string token;
    std::string last_full_key;
    std::unordered_set<std::string> seen_tokens;
    do {
      WEIR_ASSIGN_OR_RETURN(s3::ListResult r, impl_->ListOnce(full_prefix, full_start, token, want - found.size()));
      for (ObjectInfo& info : r.objects) {
        // Not only under the store's prefix: under the one asked for. A
        // service that ignored prefix= would hand callers (the startup sweep)
        // keys of another kind to parse, and delete.
        if (!info.key.starts_with(full_prefix)) {
          return Corruption("LIST s3://{}/{}: the service returned key \"{}\" outside the prefix", impl_->o.bucket,
                            full_prefix, info.key);
        }
        // Keys come in ascending order after start-after; a service that
        // ignored start-after would have callers page the same keys forever.
        const std::string& floor = found.empty() ? full_start : last_full_key;
        if (info.key <= floor) {
          return Corruption("LIST s3://{}/{}: the service returned key \"{}\" out of order (after \"{}\")",
                            impl_->o.bucket, full_prefix, info.key, floor);
        }
        last_full_key = info.key;
        info.key.erase(0, impl_->key_prefix.size());
        found.push_back(std::move(info));
      }
      truncated = r.truncated;
      // A truncated page must say where the next one starts, and move on:
      // a token seen before would loop for ever.
      if (truncated && (r.next_continuation_token.empty() || !seen_tokens.insert(r.next_continuation_token).second)) {
        return Corruption("LIST s3://{}/{}: a truncated page with {} continuation token", impl_->o.bucket,
                          full_prefix, r.next_continuation_token.empty() ? "no" : "an earlier");
      }
      // S3 may answer empty truncated pages while it skips deleted keys, but
      // not without end.
      if (truncated && seen_tokens.size() >= kMaxListRoundTrips) {
        return Unavailable("LIST s3://{}/{}: no page of keys after {} requests", impl_->o.bucket, full_prefix,
                           kMaxListRoundTrips);
      }
      token = std::move(r.next_continuation_token);
    } while (truncated && found.size() < want);
    if (found.size() > max_keys) {
      found.resize(max_keys);
      truncated = true;
    }
    page.objects = std::move(found);
    if (truncated && !page.objects.empty()) page.next_start_after = page.objects.back().key;
    return page;
  });
}

Status S3Store::Delete(std::string_view key) {
  return CatchAll("s3:// Delete", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(impl_->CheckKey(key));
    return impl_->DeleteObject(key);
  });
}

Status S3Store::DeleteMany(std::span<const std::string> keys) {
  return CatchAll("s3:// DeleteMany", [&]() -> Status {
    Status first;
    auto note = [&](const Status& st) {
      if (!st.ok() && first.ok()) first = st;
    };
    // Batches of keys XML can carry; keys with control bytes go one by one.
    std::vector<std::string> batch;
    auto flush = [&] {
      if (!batch.empty()) note(impl_->DeleteBatch(batch));
      batch.clear();
    };
    for (const std::string& key : keys) {
      if (Status st = impl_->CheckKey(key); !st.ok()) {
        note(st);
      } else if (!s3::XmlSafe(key)) {
        note(impl_->DeleteObject(key));
      } else {
        batch.push_back(key);
        if (batch.size() == kDeleteBatch) flush();
      }
    }
    flush();
    return first;
  });
}

std::string S3Store::Describe() const {
  const S3Options& o = impl_->o;
  return fmt::format("s3://{}/{} (endpoint {}, region {}, {})", o.bucket, o.prefix, o.endpoint, o.region,
                     o.path_style.value_or(true) ? "path style" : "virtual host");
}

const S3Metrics& S3Store::metrics() const { return impl_->metrics; }

const S3Options& S3Store::options() const { return impl_->o; }

Status S3Store::CreateBucket() {
  return CatchAll("s3:// CreateBucket", [&]() -> Status {
    std::string body;
    if (impl_->o.region != "us-east-1") {
      body = fmt::format(
          "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
          "<LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
          impl_->o.region);
    }
    return impl_->BucketRequest("PUT", body);
  });
}

Status S3Store::DeleteBucket() {
  return CatchAll("s3:// DeleteBucket", [&]() -> Status { return impl_->BucketRequest("DELETE", {}); });
}

Status S3Store::ProbeConditionalPut() {
  return CatchAll("s3:// probe", [&]() -> Status {
    // An ambiguous answer (kTimeout: the PUT may have landed, and a 412 after
    // such an attempt proves nothing) makes that probe undecided: it is done
    // again with a fresh key, a few times.
    constexpr int kAttempts = 3;
    Status undecided;
    for (int attempt = 1; attempt <= kAttempts; ++attempt) {
      undecided = ProbeOnce();
      if (undecided.code() != Code::kTimeout) return undecided;
      Log().warn("conditional-PUT probe of {}: {} (attempt {} of {})", Describe(), undecided.ToString(), attempt,
                 kAttempts);
    }
    return undecided;
  });
}

Status S3Store::ProbeOnce() {
  const std::string key = fmt::format("_weir-probe/conditional-put-{:016x}", RandomU64());
  const std::string where = Describe();
  Status first = impl_->PutObject(key, "probe 1", true);
  // A service that refuses the header outright (501, or a 400 that says
  // so) is one without conditional writes, as one that ignores it.
  const bool refused = first.code() == Code::kNotSupported ||
                       (first.code() == Code::kInvalidArgument &&
                        (first.message().find("NotImplemented") != std::string::npos ||
                         first.message().find("If-None-Match") != std::string::npos));
  // A store without conditional writes: refused, unless the operator took
  // the risk (then emulated). `how` says what the probe saw.
  auto without_conditional_writes = [&](const std::string& how) -> Status {
    if (impl_->o.allow_unconditional_put) {
      impl_->emulate_create_only.store(true);
      Log().warn(
          "UNSAFE: object store {} {}; running anyway because allow_unconditional_put is set. Create-only PUTs are "
          "emulated by HEAD then PUT, which is racy: run exactly ONE weir node on this bucket and prefix, or a "
          "zombie writer can overwrite acknowledged data.",
          where, how);
      return Status::Ok();
    }
    return NotSupported(
        "object store {} {}. weir's WAL fencing depends on create-only PUTs, so it refuses to run on this store. "
        "Use a service with conditional writes (AWS S3, Ceph radosgw, MinIO), or accept the risk for a single node "
        "with --allow-unconditional-put (allow_unconditional_put=true in the URI).",
        where, how);
  };
  if (refused) return without_conditional_writes(fmt::format("refuses If-None-Match: * on PUT ({})", first.ToString()));
  // An outcome not known (a timeout, a 5xx or dropped connection after
  // retries): the object may be there, and no sweep lists _weir-probe/.
  if (first.code() == Code::kTimeout || first.code() == Code::kUnavailable) impl_->DeleteObject(key).IgnoreError();
  if (!first.ok()) return first.WithContext("probing the object store " + where);
  const Status second = impl_->PutObject(key, "probe 2", true);
  Status cleanup = impl_->DeleteObject(key);
  if (!cleanup.ok()) Log().warn("could not delete the probe object {}: {}", key, cleanup.ToString());
  if (second.code() == Code::kPreconditionFailed) {
    Log().info("object store {} honours If-None-Match: * (conditional-PUT probe passed)", where);
    return Status::Ok();
  }
  if (!second.ok()) return second.WithContext("probing the object store " + where);
  return without_conditional_writes(
      "ignores If-None-Match: * on PUT (the start-up probe overwrote its own create-only object)");
}

}  // namespace weir::objstore
