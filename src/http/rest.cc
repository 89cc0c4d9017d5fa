#include "http/rest.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "base/base64.h"
#include "base/log.h"
#include "base/secret.h"
#include "http/s2_proto.h"
#include "wal/compression.h"

namespace weir::http {

// An S2S session holds a frame's bytes until the frame is whole (HTTP/2 flow control).
static_assert(kS2sMaxFrameBytes + 3 <= kMaxBodySinkUnitBytes);

using Json = nlohmann::json;

namespace {
// Thrown inside this file only, for malformed requests: becomes a 400 (or
// `status`). `code` is S2's name for what was malformed: bad_json (the body),
// bad_query, bad_header, bad_path or bad_proto.
struct BadRequest {
  std::string message;
  std::string_view code = "bad_json";
  int status = 400;
};

// A request's JSON body (not the append body, which simdjson parses with its
// own depth limit). Values nested deeper than kMaxJsonDepth are refused:
// nlohmann's parser is iterative, but copies and dumps recurse, and a body
// of a million brackets would overflow a thread's stack. Discarded if bad.
constexpr int kMaxJsonDepth = 64;
// Config bodies (basins, streams) are a few hundred bytes; a tree costs up to
// about 20 times its text, so a larger body is refused before it is parsed.
constexpr size_t kMaxConfigJsonBytes = 64 << 10;
Json ParseRequestJson(std::string_view body) {
  if (body.size() > kMaxConfigJsonBytes) {
    throw BadRequest{fmt::format("a JSON config body holds at most {} bytes, got {}", kMaxConfigJsonBytes, body.size()),
                     "request_too_large", 413};
  }
  bool too_deep = false;
  std::vector<std::set<std::string, std::less<>>> keys;  // each open object's keys so far
  std::optional<std::string> repeated;
  Json j = Json::parse(
      body,
      [&](int depth, Json::parse_event_t event, Json& parsed) {
        if (too_deep || repeated) return true;  // refused whatever follows
        // `depth` counts from 0 (the top-level value's start).
        if (depth >= kMaxJsonDepth &&
            (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start)) {
          too_deep = true;
          return false;  // not kept
        }
        if (event == Json::parse_event_t::object_start) {
          keys.emplace_back();
        } else if (event == Json::parse_event_t::object_end && !keys.empty()) {
          keys.pop_back();
        } else if (event == Json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
                   !keys.back().insert(parsed.get_ref<const std::string&>()).second) {
          repeated = parsed.get<std::string>();
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return Json(Json::value_t::discarded);
  // As S2 (serde): a field given twice is refused, not one of them taken.
  if (repeated) throw BadRequest{fmt::format("\"{}\" appears twice in one JSON object", *repeated)};
  return j;
}

// j[name] without a copy (copies recurse), or null if j has no such field.
const Json& FieldOrNull(const Json& j, const char* name) {
  static const Json kNull;
  auto it = j.find(name);
  return it == j.end() ? kNull : *it;
}

// S2's HTTP status and error code for an engine or metastore status
// (docs/http-api.md); `not_found` names what a kNotFound is about.
std::pair<int, std::string_view> ErrorCodeFor(const Status& st, std::string_view not_found = "not_found") {
  switch (st.code()) {
    case Code::kInvalidArgument: return {422, "invalid"};
    case Code::kNotFound: return {404, not_found};
    case Code::kAlreadyExists: return {409, "resource_already_exists"};
    case Code::kPreconditionFailed: return {409, "conflict"};
    case Code::kResourceExhausted: return {429, "rate_limited"};
    case Code::kQuotaExhausted: return {403, "quota_exhausted"};
    case Code::kNotSupported: return {501, "not_implemented"};
    case Code::kTimeout:
    case Code::kUnavailable:
    case Code::kCancelled:
    case Code::kFenced:
    case Code::kIOError: return {503, "unavailable"};
    default: return {500, "other"};
  }
}
}  // namespace

// What every handler needs to answer: the exchange, the basin, the metrics. Made by Serve (or OpenBodyStream) for
// one request; cheap to copy into its callbacks, each copy sharing the Exchange. Used on the I/O thread, a worker or
// an engine callback. Send counts the response in RestMetrics by status class, then answers.
struct RestApi::Ctx {
  std::shared_ptr<Exchange> ex;
  RestMetrics* metrics = nullptr;
  log::Engine* engine = nullptr;  // to tell a missing basin from a missing stream
  std::string basin;
  TimePoint started;
  bool on_worker = false;  // the request is served on a worker thread (free to block)
  bool head = false;       // a HEAD: it creates nothing (no stream on read)
  // The s2-stream-config header: the config of a stream this request creates
  // (on append or read), over the basin's default.
  metastore::StreamConfigLayer create_config{};

  void Send(Response r) const {
    if (r.status < 300) {
      metrics->responses_2xx++;
    } else if (r.status < 500) {
      metrics->responses_4xx++;
    } else {
      metrics->responses_5xx++;
    }
    ex->Respond(std::move(r));
  }
  static Response JsonResponse(int status, const Json& body, HeaderList headers = {}) {
    return Response{status, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace),
                    std::move(headers)};
  }
  static Response ErrorResponse(int status, std::string_view code, std::string_view message, HeaderList headers = {}) {
    return JsonResponse(status, Json{{"code", code}, {"message", message}}, std::move(headers));
  }
  void Reply(int status, const Json& body, HeaderList headers = {}) const {
    Send(JsonResponse(status, body, std::move(headers)));
  }
  void NoContent(int status) const { Send(Response{status, "application/json", "", {}}); }
  void Error(int status, std::string_view code, std::string_view message, HeaderList headers = {}) const {
    Send(ErrorResponse(status, code, message, std::move(headers)));
  }
  // Maps an engine or metastore status to the HTTP status and error code of
  // docs/http-api.md; `not_found` names what a kNotFound is about.
  Response FailResponse(const Status& st, std::string_view not_found = "not_found") const {
    if (st.code() == Code::kNotFound && not_found == "stream_not_found" && engine &&
        engine->GetBasin(basin).status().code() == Code::kNotFound) {
      return ErrorResponse(404, "basin_not_found", fmt::format("basin \"{}\" does not exist", basin));
    }
    auto [status, code] = ErrorCodeFor(st, not_found);
    HeaderList headers;
    if (status == 429) metrics->backpressure++;
    if (status == 429 || status == 503) headers.push_back({"Retry-After", "1"});
    return ErrorResponse(status, code, st.message(), std::move(headers));
  }
  void Fail(const Status& st, std::string_view not_found = "not_found") const { Send(FailResponse(st, not_found)); }
  // The answer to an append that failed (a 412 carries the stream's state).
  Response AppendFailure(const log::AppendOutcome& o) const {
    if (o.seq_num_mismatch) return JsonResponse(412, Json{{"seq_num_mismatch", *o.seq_num_mismatch}});
    if (o.fencing_token_mismatch) return JsonResponse(412, Json{{"fencing_token_mismatch", *o.fencing_token_mismatch}});
    if (o.status.code() == Code::kOutOfRange) return ErrorResponse(409, "out_of_order_sequence", o.status.message());
    if (o.producer_fenced) return ErrorResponse(409, "invalid_producer_epoch", o.status.message());
    if (o.deletion_pending) return ErrorResponse(409, "stream_deletion_pending", o.status.message());
    return FailResponse(o.status, "stream_not_found");
  }
  // Counts an acknowledged append.
  void Acked(const log::AppendAck& a, size_t records, size_t bytes) const {
    metrics->appends++;
    metrics->append_records += records;
    metrics->append_bytes += bytes;
    if (a.duplicated) metrics->append_duplicates++;
    metrics->append_latency_ns.Record(static_cast<uint64_t>(std::chrono::nanoseconds(Now() - started).count()));
  }
};

namespace {

std::string Rfc3339(int64_t ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms % 1000);
}

// An empty segment ("//", a trailing "/") names nothing: 404, as on S2.
std::vector<std::string> SplitPath(std::string_view path) {
  std::vector<std::string> parts;
  if (path == "/") return parts;
  if (!path.starts_with('/')) throw BadRequest{fmt::format("no route for {}", path), "not_found", 404};
  std::string_view rest = path.substr(1);
  while (true) {
    auto slash = rest.find('/');
    std::string_view raw = rest.substr(0, slash);
    if (raw.empty()) throw BadRequest{fmt::format("no route for {}", path), "not_found", 404};
    auto seg = PercentDecode(raw, false);
    if (!seg.ok()) throw BadRequest{seg.status().message(), "bad_path"};
    parts.push_back(std::move(*seg));
    if (slash == std::string_view::npos) return parts;
    rest = rest.substr(slash + 1);
  }
}

// `code`: where the value came from (bad_query or bad_header), for the error.
uint64_t ParseU64(std::string_view s, std::string_view what, std::string_view code) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) {
    throw BadRequest{fmt::format("{} must be at most {}, got \"{}\"", what, UINT64_MAX, s), code};
  }
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) {
    throw BadRequest{fmt::format("{} must be a non-negative integer, got \"{}\"", what, s), code};
  }
  return v;
}

bool ParseBool(std::string_view s, std::string_view what) {
  if (s == "true") return true;  // as S2: no 1/0, no other spellings
  if (s == "false") return false;
  throw BadRequest{fmt::format("{} must be true or false, got \"{}\"", what, s), "bad_query"};
}

std::optional<uint64_t> QueryU64(const Request& req, std::string_view name) {
  const std::string* v = req.Query(name);
  if (!v) return std::nullopt;
  return ParseU64(*v, name, "bad_query");
}

Json Position(uint64_t seq, int64_t ts) {
  return Json{{"seq_num", seq}, {"timestamp", static_cast<uint64_t>(std::max<int64_t>(ts, 0))}};
}

Json BasinInfoJson(const metastore::BasinInfo& b) {
  return Json{{"name", b.name}, {"created_at", Rfc3339(b.created_at_ms)}, {"deleted_at", nullptr}, {"scope", nullptr}};
}

Json StreamInfoJson(const metastore::StreamInfo& s) {
  return Json{{"name", s.name}, {"created_at", Rfc3339(s.created_at_ms)}, {"deleted_at", nullptr}, {"cipher", nullptr}};
}

Json StreamConfigJson(const metastore::StreamConfig& c) {
  Json retention = c.retention_age_s == 0 ? Json{{"infinite", Json::object()}} : Json{{"age", c.retention_age_s}};
  return Json{{"storage_class", metastore::StorageClassName(c.storage_class)},
              {"retention_policy", retention},
              {"timestamping",
               Json{{"mode", metastore::TimestampingModeName(c.timestamping)}, {"uncapped", c.uncapped_timestamps}}},
              {"delete_on_empty", c.delete_on_empty_min_age_s == 0
                                      ? Json(nullptr)
                                      : Json{{"min_age_secs", c.delete_on_empty_min_age_s}}}};
}

// Applies a StreamConfig or StreamReconfiguration to a partial config (S2's
// OptionalStreamConfig): absent fields stay as they are, explicit nulls unset
// the field, which then falls back to the basin's default, then weir's (as on
// S2). Bad values are kInvalidArgument (422); wrong JSON types throw (400).
// The one difference between a config (kCreate) and a reconfiguration:
// `delete_on_empty: {}` is an explicit "never" in a config (S2's
// min_age_secs defaults to 0 there) and "no change" in a reconfiguration.
enum class ConfigMode { kCreate, kReconfigure };
Status ApplyStreamLayer(const Json& j, metastore::StreamConfigLayer* l, ConfigMode mode) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) throw BadRequest{"stream config must be an object"};
  auto null = [&](const char* field) { return j.contains(field) && j[field].is_null(); };
  if (null("storage_class")) l->storage_class.reset();
  if (null("retention_policy")) l->retention_age_s.reset();
  if (null("delete_on_empty")) l->delete_on_empty_min_age_s.reset();
  if (null("timestamping")) {
    l->timestamping.reset();
    l->uncapped_timestamps.reset();
  }
  // As on S2, a value the JSON schema does not allow (an unknown enum name, a
  // negative or fractional retention age) is a 400; a valid value the server
  // refuses is a 422.
  if (auto it = j.find("storage_class"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) throw BadRequest{"storage_class must be a string"};
    auto parsed = metastore::ParseStorageClass(it->get<std::string>());
    if (!parsed.ok()) throw BadRequest{parsed.status().message()};
    l->storage_class = *parsed;
  }
  if (auto it = j.find("retention_policy"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw BadRequest{"retention_policy must be an object"};
    if (it->contains("age") && it->contains("infinite")) {
      throw BadRequest{"retention_policy takes \"age\" or \"infinite\", not both"};
    }
    if (it->contains("infinite") && !(*it)["infinite"].is_object()) {
      throw BadRequest{"retention_policy.infinite must be an object ({})"};
    }
    if (it->contains("age")) {
      const Json& a = (*it)["age"];
      if (!a.is_number_unsigned() || a.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        throw BadRequest{"retention_policy.age must be a whole number of seconds"};
      }
      int64_t age = a.get<int64_t>();
      if (age == 0) return InvalidArgument("retention_policy.age must be greater than 0 seconds");
      l->retention_age_s = age;
    } else if (it->contains("infinite")) {
      l->retention_age_s = 0;
    } else {
      return InvalidArgument("retention_policy needs \"age\" or \"infinite\"");
    }
  }
  if (auto it = j.find("timestamping"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw BadRequest{"timestamping must be an object"};
    if (auto m = it->find("mode"); m != it->end()) {
      if (m->is_null()) {
        l->timestamping.reset();
      } else {
        if (!m->is_string()) throw BadRequest{"timestamping.mode must be a string"};
        auto parsed = metastore::ParseTimestampingMode(m->get<std::string>());
        if (!parsed.ok()) throw BadRequest{parsed.status().message()};
        l->timestamping = *parsed;
      }
    }
    if (auto u = it->find("uncapped"); u != it->end()) {
      if (u->is_null()) {
        l->uncapped_timestamps.reset();
      } else {
        if (!u->is_boolean()) throw BadRequest{"timestamping.uncapped must be true or false"};
        l->uncapped_timestamps = u->get<bool>();
      }
    }
  }
  if (auto it = j.find("delete_on_empty"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw BadRequest{"delete_on_empty must be an object"};
    if (mode == ConfigMode::kCreate && !it->contains("min_age_secs")) l->delete_on_empty_min_age_s = 0;
    if (auto age = it->find("min_age_secs"); age != it->end()) {
      if (age->is_null()) {
        if (mode == ConfigMode::kCreate) throw BadRequest{"delete_on_empty.min_age_secs must be an integer"};
        l->delete_on_empty_min_age_s.reset();
      } else {
        if (!age->is_number_integer() || (!age->is_number_unsigned() && age->get<int64_t>() < 0)) {
          throw BadRequest{"delete_on_empty.min_age_secs must be a whole number of seconds"};
        }
        if (age->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
          return InvalidArgument("delete_on_empty.min_age_secs must be at most {}", INT64_MAX);
        }
        l->delete_on_empty_min_age_s = age->get<int64_t>();  // 0 turns it off
      }
    }
  }
  return Status::Ok();
}

// The config a stream gets from `j` applied over `layer` (empty on a create,
// the stream's config on a reconfigure), then its basin's defaults.
Result<metastore::StreamConfig> ResolveStreamConfig(log::Engine* engine, const std::string& basin, const Json& j,
                                                    ConfigMode mode, metastore::StreamConfigLayer layer = {}) {
  WEIR_RETURN_IF_ERROR(ApplyStreamLayer(j, &layer, mode));
  WEIR_ASSIGN_OR_RETURN(metastore::BasinInfo b, engine->GetBasin(basin));
  return layer.Over(b.config.default_stream_config).Resolve();
}

// A basin create's `scope`: null or one of S2's scopes (weir has one
// location, so it is not kept; BasinInfo's scope reads back null).
void CheckBasinScope(const Json& j) {
  auto it = j.find("scope");
  if (it == j.end() || it->is_null()) return;
  static constexpr std::string_view kScopes[] = {"aws:us-east-1", "aws:us-west-2", "aws:eu-north-1"};
  if (!it->is_string() ||
      std::find(std::begin(kScopes), std::end(kScopes), it->get<std::string>()) == std::end(kScopes)) {
    throw BadRequest{"scope must be null, \"aws:us-east-1\", \"aws:us-west-2\" or \"aws:eu-north-1\""};
  }
}

// Applies a BasinConfig (create, PUT: onto a default config) or a
// BasinReconfiguration (PATCH: onto the current one). default_stream_config
// is reconfigured field by field; null clears it.
Status ApplyBasinConfig(const Json& j, metastore::BasinConfig* b, ConfigMode mode) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) throw BadRequest{"basin config must be an object"};
  if (auto it = j.find("stream_cipher"); it != j.end() && !it->is_null()) {
    return NotSupported("stream encryption is not supported");
  }
  if (auto it = j.find("default_stream_config"); it != j.end()) {
    if (it->is_null()) b->default_stream_config = {};
    WEIR_RETURN_IF_ERROR(ApplyStreamLayer(*it, &b->default_stream_config, mode));
  }
  for (auto [field, flag] : {std::pair{"create_stream_on_append", &b->create_stream_on_append},
                             std::pair{"create_stream_on_read", &b->create_stream_on_read}}) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;  // null: the default, or (PATCH) no change
    if (!it->is_boolean()) throw BadRequest{fmt::format("{} must be true or false", field)};
    *flag = it->get<bool>();
  }
  return Status::Ok();
}

Json StreamConfigLayerJson(const metastore::StreamConfigLayer& l) {
  if (l.Empty()) return nullptr;
  Json retention = nullptr, timestamping = nullptr, delete_on_empty = nullptr;
  if (l.retention_age_s) {
    retention = *l.retention_age_s == 0 ? Json{{"infinite", Json::object()}} : Json{{"age", *l.retention_age_s}};
  }
  if (l.timestamping || l.uncapped_timestamps) {
    timestamping = Json{{"mode", l.timestamping ? Json(metastore::TimestampingModeName(*l.timestamping)) : Json()},
                        {"uncapped", l.uncapped_timestamps ? Json(*l.uncapped_timestamps) : Json()}};
  }
  if (l.delete_on_empty_min_age_s) delete_on_empty = Json{{"min_age_secs", *l.delete_on_empty_min_age_s}};
  return Json{{"storage_class", l.storage_class ? Json(metastore::StorageClassName(*l.storage_class)) : Json()},
              {"retention_policy", retention},
              {"timestamping", timestamping},
              {"delete_on_empty", delete_on_empty}};
}

Json BasinConfigJson(const metastore::BasinConfig& b) {
  return Json{{"create_stream_on_append", b.create_stream_on_append},
              {"create_stream_on_read", b.create_stream_on_read},
              {"default_stream_config", StreamConfigLayerJson(b.default_stream_config)},
              {"stream_cipher", nullptr}};
}

enum class Format { kRaw, kBase64 };

Format ParseFormat(const Request& req) {
  const std::string* h = req.Header("s2-format");
  if (!h) return Format::kRaw;
  const std::string& f = *h;  // HTTP/1.1 parsing drops spaces around a value; HTTP/2 forbids them
  // As S2, with its older names ("json", "json-binsafe") for the same two.
  if (f == "raw" || f == "json") return Format::kRaw;
  if (f == "base64" || f == "json-binsafe") return Format::kBase64;
  throw BadRequest{fmt::format("s2-format must be raw or base64, got \"{}\"", *h), "bad_header"};
}

std::string DecodeField(simdjson::dom::element j, Format f, std::string_view what) {
  std::string_view s;
  if (j.get_string().get(s)) throw BadRequest{fmt::format("{} must be a string", what)};
  if (f == Format::kRaw) return std::string(s);
  auto d = Base64Decode(s);
  if (!d.ok()) throw BadRequest{fmt::format("{}: {}", what, d.status().message())};
  return std::move(*d);
}

std::string EncodeField(std::string_view s, Format f) { return f == Format::kRaw ? std::string(s) : Base64Encode(s); }

// The append body is the hot path: parsed with simdjson, not nlohmann.
// Past `limits` (records, metered bytes) it stops at once with 422, before
// a body of many tiny records or headers becomes far more memory than it is.
// A thread's parser keeps its buffers (about 14 times the largest body it
// parsed) for the next body up to this size; one past it gives them back.
constexpr size_t kKeptParserCapacity = 2 << 20;
// What simdjson's DOM parser allocates for a body of `n` bytes, besides the
// body: a tape of 8 bytes and a structural index of 4 bytes per byte, a
// string buffer of 5/3 of it, and a padded copy when the body has no spare
// room for the padding. Taken from the in-flight budget while it parses a
// body larger than the parser keeps (a smaller one's buffers are the
// thread's, bounded per thread: no budget call on the hot path).
constexpr size_t JsonParseBytes(size_t n) { return n <= kKeptParserCapacity ? 0 : 15 * n + (64 << 10); }

AppendInput ParseJsonAppend(const std::string& body, Format f, const AppendLimits& limits) {
  thread_local simdjson::dom::parser parser;
  struct Shrink {  // however the parse ends (a refusal throws)
    ~Shrink() {
      if (parser.capacity() > kKeptParserCapacity) parser = simdjson::dom::parser{};
    }
  } shrink;
  simdjson::dom::element doc;
  // Parses in place when the body has simdjson's padding as spare capacity (the server leaves it).
  if (parser.parse(body).get(doc)) throw BadRequest{"the body is not valid JSON"};
  simdjson::dom::object obj;
  simdjson::dom::array records;
  if (doc.get_object().get(obj) || obj["records"].get_array().get(records)) {
    throw BadRequest{"AppendInput needs a \"records\" array"};
  }
  // As S2 (serde): a field given twice is refused, not one of them taken.
  auto twice = [](std::string_view key) {
    return BadRequest{fmt::format("\"{}\" appears twice in one JSON object", key)};
  };
  {
    unsigned seen = 0;
    for (auto field : obj) {
      const unsigned bit = field.key == "records"         ? 1
                           : field.key == "match_seq_num" ? 2
                           : field.key == "fencing_token" ? 4
                                                          : 0;
      if (seen & bit) throw twice(field.key);
      seen |= bit;
    }
  }
  if (records.size() > limits.max_records) {
    throw BadRequest{fmt::format("an append holds at most {} records, got {}", limits.max_records, records.size()),
                     "invalid", 422};
  }
  AppendInput in;
  in.records.reserve(records.size());
  size_t metered = 0;
  auto meter = [&](size_t n) {
    metered += n;
    if (metered > limits.max_metered_bytes) {
      throw BadRequest{fmt::format("an append holds at most {} metered bytes", limits.max_metered_bytes), "invalid",
                       422};
    }
  };
  for (simdjson::dom::element r : records) {
    simdjson::dom::object ro;
    if (r.get_object().get(ro)) throw BadRequest{"each record must be an object"};
    log::AppendRecord rec;
    constexpr unsigned kTimestamp = 1, kBody = 2, kHeaders = 4;
    unsigned seen = 0;
    for (auto field : ro) {
      const unsigned which = field.key == "timestamp" ? kTimestamp
                             : field.key == "body"    ? kBody
                             : field.key == "headers" ? kHeaders
                                                      : 0u;
      if (seen & which) throw twice(field.key);
      seen |= which;
      if (which == 0 || field.value.is_null()) continue;  // other fields are ignored
      if (which == kTimestamp) {
        uint64_t ts = 0;
        if (field.value.get_uint64().get(ts)) throw BadRequest{"timestamp must be a non-negative integer"};
        rec.timestamp_ms = static_cast<int64_t>(std::min<uint64_t>(ts, INT64_MAX));  // see docs/http-api.md
      } else if (which == kBody) {
        rec.body = DecodeField(field.value, f, "body");
        meter(rec.body.size());
      } else {
        simdjson::dom::array headers;
        if (field.value.get_array().get(headers)) throw BadRequest{"headers must be an array of [name, value] pairs"};
        for (simdjson::dom::element h : headers) {
          simdjson::dom::array pair;
          if (h.get_array().get(pair) || pair.size() != 2) throw BadRequest{"each header must be a [name, value] pair"};
          rec.headers.push_back(
              wal::RecordHeader{DecodeField(pair.at(0).value_unsafe(), f, "header name"),
                                DecodeField(pair.at(1).value_unsafe(), f, "header value")});
          meter(log::MeteredBytes(rec.headers.back()));
        }
      }
    }
    meter(log::kMeteredRecordBytes);
    in.records.push_back(std::move(rec));
  }
  if (auto m = obj["match_seq_num"]; !m.error() && !m.is_null()) {
    uint64_t v = 0;
    if (m.get_uint64().get(v)) throw BadRequest{"match_seq_num must be a non-negative integer"};
    in.options.match_seq_num = v;
  }
  if (auto t = obj["fencing_token"]; !t.error() && !t.is_null()) {
    std::string_view v;
    if (t.get_string().get(v)) throw BadRequest{"fencing_token must be a string"};
    in.options.fencing_token = std::string(v);
  }
  return in;
}

// What an append's decoded records hold in memory: wal's fixed costs per
// record and header, and their bytes. It may be many times the request's
// bytes: an empty header is two bytes of protobuf or seven of JSON.
size_t DecodedBytes(const std::vector<log::AppendRecord>& records) {
  size_t n = 0;
  for (const auto& r : records) {
    n += wal::kDecodedRecordCost + r.body.size() + (r.key ? r.key->size() : 0);
    for (const auto& h : r.headers) n += wal::kRecordHeaderCost + h.key.size() + (h.value ? h.value->size() : 0);
  }
  return n;
}

Json RecordJson(const log::ReadRecord& r, Format f) {
  Json headers = Json::array();
  for (const auto& h : r.record.headers) {
    headers.push_back(Json::array({EncodeField(h.key, f), EncodeField(h.value.value_or(""), f)}));
  }
  return Json{{"seq_num", r.offset},
              {"timestamp", static_cast<uint64_t>(std::max<int64_t>(r.record.timestamp, 0))},
              {"headers", std::move(headers)},
              {"body", EncodeField(r.record.value.value_or(""), f)}};
}

// S2's s2-request-token (at most 36 bytes), or "".
std::string RequestToken(const Request& req) {
  const std::string* t = req.Header("s2-request-token");
  if (!t) return "";
  if (t->size() > 36) throw BadRequest{"s2-request-token must be at most 36 bytes", "bad_header"};
  return *t;
}

// Whether a create that found the name taken is a retry of the create that
// took it: both carry the same non-empty request token.
// What a create's idempotency is keyed on, as on S2: the request token and the
// config as requested (before the basin's defaults apply), so a retry matches
// even after the resource was reconfigured. Stored as the create token; "" if
// the request has no token.
std::string CreationKey(const std::string& token, const Json& requested_config) {
  return token.empty() ? std::string() : token + "\n" + requested_config.dump();
}

// Whether the basin (stream empty) or stream was created with this key.
bool SameCreation(log::Engine* engine, const std::string& key, const std::string& basin, const std::string& stream) {
  if (key.empty()) return false;
  auto stored = engine->CreateToken(basin, stream);
  return stored.ok() && *stored == key;
}

constexpr auto kTombstoneLife = std::chrono::seconds(60);
// A read needs this much response room (Exchange::ResponseRoom) to go on; with
// less it looks again after kRoomPoll, then twice as long each time up to
// kRoomPollMax, for up to kRoomWaitLimit.
constexpr size_t kMinReadRoom = 128 << 10;
constexpr auto kRoomPoll = std::chrono::milliseconds(20);
constexpr auto kRoomPollMax = std::chrono::milliseconds(100);
constexpr auto kRoomWaitLimit = std::chrono::seconds(5);
constexpr size_t kMaxTombstones = 10000;
// /health answers 503 wal_stalled once a WAL slot has waited this long to
// be durable, with nothing acknowledged for as long (Writer::StalledFor).
constexpr auto kHealthWalStall = std::chrono::seconds(30);

// S2's s2-provision-result header: what a create or ensure did.
HeaderList Provisioned(std::string_view outcome) { return {{"s2-provision-result", std::string(outcome)}}; }

// Without the spaces and tabs HTTP allows around a list item or value.
std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether `s` is `lower` (all lower case) in any case: media types, codings
// and auth schemes are case-insensitive.
bool EqualsLowercase(std::string_view s, std::string_view lower) {
  return s.size() == lower.size() && std::equal(s.begin(), s.end(), lower.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

// A media type without its parameters and surrounding spaces.
std::string_view BareMediaType(std::string_view media_type) {
  return TrimOws(media_type.substr(0, media_type.find(';')));
}

// application/protobuf, or the older spelling application/x-protobuf.
bool IsProtoType(std::string_view media_type) {
  media_type = BareMediaType(media_type);
  return EqualsLowercase(media_type, "application/protobuf") || EqualsLowercase(media_type, "application/x-protobuf");
}

// A request body sent with Content-Encoding gzip or zstd (S2's server
// decodes these; its Rust SDK and CLI compress bodies) is decoded in place,
// to at most `limit` bytes (over it: 413). identity passes; another coding is
// 415. S2S input is framed, each frame compressed on its own: not here. The
// in-flight budget held the body's bytes as sent: what decoding adds is
// taken from it too (if it has no room: 429).
// The Content-Encoding of a request body that has one (not identity); none
// without a body (a GET, say), whatever the header says.
std::optional<std::string_view> BodyCoding(const Request& req) {
  const std::string* enc = req.Header("content-encoding");
  if (!enc || req.body.empty()) return std::nullopt;
  const std::string_view coding = TrimOws(*enc);
  if (coding.empty() || EqualsLowercase(coding, "identity")) return std::nullopt;
  return coding;
}

void DecodeContentEncoding(Request& req, size_t limit, Exchange& ex) {
  const std::optional<std::string_view> encoded = BodyCoding(req);
  if (!encoded) return;
  const std::string_view coding = *encoded;
  int codec = -1;
  if (EqualsLowercase(coding, "gzip") || EqualsLowercase(coding, "x-gzip")) codec = wal::kCodecGzip;
  if (EqualsLowercase(coding, "zstd")) codec = wal::kCodecZstd;
  if (codec < 0) {
    throw BadRequest{fmt::format("Content-Encoding \"{}\" is not supported: use gzip, zstd or identity", coding),
                     "unsupported_encoding", 415};
  }
  auto decoded = wal::DecompressRecords(codec, req.body, limit);
  if (!decoded.ok()) {
    if (decoded.status().code() == Code::kResourceExhausted) throw BadRequest{decoded.status().message(), "unavailable", 503};
    if (wal::DecompressedPastLimit(decoded.status())) {
      throw BadRequest{fmt::format("the request body decodes to more than {} bytes", limit), "request_too_large", 413};
    }
    throw BadRequest{fmt::format("the body is not valid {}: {}", coding, decoded.status().message()), "bad_body"};
  }
  if (decoded->size() > req.body.size() && !ex.TakeBudget(decoded->size() - req.body.size())) {
    throw BadRequest{fmt::format("the body decodes to {} bytes, more than the server's memory for requests "
                                 "(--http-max-in-flight-mib) has left now; retry",
                                 decoded->size()),
                     "rate_limited", 429};
  }
  req.body = std::move(*decoded);
}

// As S2: the first media type the client accepts decides.
std::string_view FirstAccepted(const Request& req) {
  const std::string* a = req.Header("accept");
  return a ? BareMediaType(std::string_view(*a).substr(0, a->find(','))) : std::string_view();
}
bool WantsProto(const Request& req) { return IsProtoType(FirstAccepted(req)); }

// Parameters of a read, as sent.
struct ReadParams {
  log::ReadStart start;
  bool clamp = false;
  std::optional<uint64_t> count, bytes, until;
  // The bytes limit the client asked for (bytes may be capped below it).
  std::optional<uint64_t> bytes_asked;
  std::optional<uint64_t> wait_s;
  Format format = Format::kRaw;
  bool proto = false;
};

ReadParams ParseReadParams(const Request& req) {
  ReadParams p;
  p.start = {log::ReadStart::kTailOffset, 0};  // S2: no start means the tail
  int starts = 0;
  if (auto v = QueryU64(req, "seq_num")) p.start = {log::ReadStart::kOffset, *v}, ++starts;
  if (auto v = QueryU64(req, "timestamp")) p.start = {log::ReadStart::kTimestamp, *v}, ++starts;
  if (auto v = QueryU64(req, "tail_offset")) p.start = {log::ReadStart::kTailOffset, *v}, ++starts;
  if (starts > 1) throw BadRequest{"give at most one of seq_num, timestamp and tail_offset", "bad_query"};
  if (const std::string* c = req.Query("clamp")) p.clamp = ParseBool(*c, "clamp");
  p.count = QueryU64(req, "count");
  p.bytes = QueryU64(req, "bytes");
  p.bytes_asked = p.bytes;
  p.until = QueryU64(req, "until");
  p.wait_s = QueryU64(req, "wait");
  if (p.wait_s && *p.wait_s > UINT32_MAX) throw BadRequest{"wait must fit in 32 bits", "bad_query"};
  p.format = ParseFormat(req);
  p.proto = WantsProto(req);
  return p;
}

// Drops records at or past `until`, by the time they are shown with (a
// record stored before 1970 at 0); true if any were dropped (the read is done).
bool CutAtUntil(std::vector<log::ReadRecord>* records, const std::optional<uint64_t>& until) {
  if (!until) return false;
  for (size_t i = 0; i < records->size(); ++i) {
    if (*until <= static_cast<uint64_t>(INT64_MAX) &&
        std::max<int64_t>((*records)[i].record.timestamp, 0) >= static_cast<int64_t>(*until)) {
      records->resize(i);
      return true;
    }
  }
  return false;
}

// One page of a list endpoint (`prefix`, `start_after`, `limit` ≤ 1000) and
// whether more items follow it.
template <typename Info, typename ListFn>
Result<std::pair<std::vector<Info>, bool>> ListPage(const Request& req, ListFn list) {
  std::string prefix = req.Query("prefix") ? *req.Query("prefix") : "";
  std::string after = req.Query("start_after") ? *req.Query("start_after") : "";
  uint64_t limit = QueryU64(req, "limit").value_or(1000);
  if (limit == 0 || limit > 1000) limit = 1000;  // as S2 does
  if (!after.empty() && after < prefix) {
    return InvalidArgument("start_after \"{}\" sorts before prefix \"{}\": the page would start outside the prefix",
                           after, prefix);
  }
  WEIR_ASSIGN_OR_RETURN(auto items, list(prefix, after, limit));
  bool more = false;
  if (items.size() == limit) {
    WEIR_ASSIGN_OR_RETURN(auto next, list(prefix, items.back().name, 1));
    more = !next.empty();
  }
  return std::make_pair(std::move(items), more);
}

// Deletes a basin's tables (with their bucket streams), then its streams. A
// pass that deletes nothing it listed (each one kNotFound: gone meanwhile,
// or a row the engine cannot delete) ends it, rather than listing for ever.
Status DeleteBasinStreams(log::Engine* engine, const std::string& basin) {
  for (;;) {
    WEIR_ASSIGN_OR_RETURN(auto tables, engine->ListTables(basin, "", "", 1000));
    if (tables.empty()) break;
    bool progress = false;
    for (const auto& t : tables) {
      Status st = engine->DeleteTable(basin, t.name);
      if (!st.ok() && st.code() != Code::kNotFound) return st;
      progress = progress || st.ok();
    }
    if (!progress) return Unavailable("basin {}: table {} could not be deleted; retry", basin, tables[0].name);
  }
  for (;;) {
    WEIR_ASSIGN_OR_RETURN(auto streams, engine->ListStreams(basin, "", "", 1000));
    if (streams.empty()) return Status::Ok();
    bool progress = false;
    for (const auto& s : streams) {
      Status st = engine->DeleteStream(basin, s.name);
      if (!st.ok() && st.code() != Code::kNotFound) return st;
      progress = progress || st.ok();
    }
    if (!progress) return Unavailable("basin {}: stream {} could not be deleted; retry", basin, streams[0].name);
  }
}

}  // namespace

RestApi::RestApi(log::Engine* engine, RestOptions options) : engine_(engine), options_(std::move(options)) {}
RestApi::~RestApi() = default;

void RestApi::Handle(Request req, std::shared_ptr<Exchange> ex) {
  // HEAD is GET without the body (RFC 9110 §9.3.2); the exchange drops it.
  // It is safe (§9.2.1): it creates no stream a GET would create on read.
  const bool head = req.method == "HEAD";
  if (head) req.method = "GET";
  // Appends to known streams run here, on the I/O thread: they wait for
  // durability through a callback. Everything else, an append while the
  // engine is under backpressure (admission may block), and an append that
  // may first create its stream (RestApi::Append), moves to a worker.
  // /health is answered here too (it reads two flags): a load balancer's
  // check never waits behind reads that hold every worker.
  if (req.path == "/health") return Serve(std::move(req), std::move(ex), false, head);
  bool append = req.method == "POST" && req.path.size() > 8 && req.path.ends_with("/records");
  // Under backpressure admission may block: a worker waits, not the I/O
  // thread. HTTP/2 appends of one connection keep their order: one moved to
  // a worker queues behind those moved before it (PostInOrder), and the
  // connection's later appends follow it there until that queue is empty.
  // Before recovery has finished there is no engine: Serve answers 503.
  if (append) {
    log::Engine* engine = ReadyEngine();
    bool may_wait = !engine || engine->AdmissionMayWait(req.body.size());
    // A compressed body may expand a thousandfold: it is decoded (and
    // parsed) on a worker, not on the I/O thread its connection shares.
    may_wait = may_wait || BodyCoding(req).has_value();
    if (!ex->sequential() && (may_wait || ex->InOrderBusy())) {
      auto* e = ex.get();
      return e->PostInOrder([this, r = std::make_shared<Request>(std::move(req)), ex = std::move(ex)]() mutable {
        Serve(std::move(*r), std::move(ex), true);
      });
    }
    if (may_wait) append = false;
  }
  if (!append) {
    auto* e = ex.get();
    return e->Post([this, r = std::make_shared<Request>(std::move(req)), ex = std::move(ex), head]() mutable {
      Serve(std::move(*r), std::move(ex), true, head);
    });
  }
  Serve(std::move(req), std::move(ex), false);
}

void RestApi::Serve(Request req, std::shared_ptr<Exchange> ex, bool on_worker, bool head) {
  metrics_.requests++;
  Ctx c{std::move(ex), &metrics_, ReadyEngine(), options_.default_basin, Now(), on_worker};
  c.head = head;
  try {
    if (req.path == "/health") {
      if (req.method != "GET") return c.Error(405, "method_not_allowed", "use GET", {{"Allow", "GET"}});
      if (c.engine != nullptr && !draining_) {  // ready (c.engine is set once it is)
        // Appends here are fenced: a load balancer should send them elsewhere.
        if (c.engine->superseded()) return c.Reply(503, Json{{"status", "superseded"}});
        // A WAL slot not durable for long (a store down, hanging or
        // refusing writes; a halt not resolved): appends here wait. A
        // writer that takes no append again (a halt it gave up on) needs a
        // restart.
        if (c.engine->wal().takes_no_appends()) return c.Reply(503, Json{{"status", "wal_closed"}});
        const Duration stalled = c.engine->wal().StalledFor(Now());
        if (stalled >= kHealthWalStall) {
          return c.Reply(503, Json{{"status", "wal_stalled"},
                                   {"stalled_s", std::chrono::duration_cast<std::chrono::seconds>(stalled).count()}});
        }
        return c.Reply(200, Json{{"status", "ok"}});
      }
      return c.Reply(503, Json{{"status", draining_ ? "draining" : "starting"}});
    }
    if (!Authorized(req, c)) return;
    if (req.path == "/metrics") {
      if (req.method != "GET") return c.Error(405, "method_not_allowed", "use GET", {{"Allow", "GET"}});
      return Metrics(c);
    }
    if (Admit(req, c)) Route(req, c);
  } catch (const BadRequest& e) {
    if (e.status == 429) {  // no room: back off, as a 429 from the engine says
      metrics_.backpressure++;
      return c.Error(e.status, e.code, e.message, {{"Retry-After", "1"}});
    }
    if (e.status == 503) return c.Error(e.status, e.code, e.message, {{"Retry-After", "1"}});
    c.Error(e.status, e.code, e.message);
  } catch (const Json::exception& e) {
    c.Error(400, "bad_json", fmt::format("bad JSON field: {}", e.what()));
  } catch (const std::exception& e) {
    // Nothing is known to throw here; on a worker thread, an exception that
    // escaped would end the process.
    Log().error("http: {} {} threw: {}", req.method, req.path, e.what());
    c.Error(500, "other", "internal error (logged by the server)");
  }
}

namespace {
// The 401 for a request without the bearer token `token` (if set), else nullopt.
std::optional<Response> Unauthorized(const std::optional<std::string>& token, const Request& req) {
  if (!token) return std::nullopt;
  const std::string* auth = req.Header("authorization");
  if (auto bearer = auth ? AuthCredentials(*auth, "bearer") : std::nullopt;
      bearer && ConstantTimeEqual(*bearer, *token)) {
    return std::nullopt;
  }
  return RestApi::Ctx::ErrorResponse(401, "authn",
                                     auth ? "the bearer token is not valid" : "a bearer token is required",
                                     {{"WWW-Authenticate", "Bearer"}});
}
}  // namespace

bool RestApi::Authorized(const Request& req, const Ctx& c) const {
  auto refused = Unauthorized(options_.auth_token, req);
  if (!refused) return true;
  c.Send(std::move(*refused));
  return false;
}

std::optional<Response> RestApi::RefuseHead(const Request& head) const {
  if (head.path == "/health") return std::nullopt;  // open to all, as in Serve
  return Unauthorized(options_.auth_token, head);
}

bool RestApi::Admit(const Request& req, Ctx& c) const {
  if (!c.engine) {
    c.Error(503, "server_starting", "the server is still recovering", {{"Retry-After", "1"}});
    return false;
  }
  // S2's SDK reconnects at once (without spending a retry) on this code.
  if (draining_) {
    c.Error(503, "server_draining", "the server is shutting down", {{"Retry-After", "1"}});
    return false;
  }
  if (const std::string* b = req.Header("s2-basin")) {
    if (Status st = log::ValidateBasinName(*b); !st.ok()) throw BadRequest{"s2-basin: " + st.message(), "bad_header"};
    c.basin = *b;
  }
  if (const std::string* cfg = req.Header("s2-stream-config")) {
    // JSON StreamConfig, as S2's SDK sends it with appends and reads; checked
    // here, before anything is created.
    Json j;
    try {
      j = ParseRequestJson(*cfg);
    } catch (const BadRequest& bad) {
      throw BadRequest{"s2-stream-config: " + bad.message, "bad_header"};
    }
    if (j.is_discarded() || !j.is_object()) throw BadRequest{"s2-stream-config must be a JSON object", "bad_header"};
    Status st;
    try {
      st = ApplyStreamLayer(j, &c.create_config, ConfigMode::kCreate);
    } catch (const BadRequest& bad) {
      throw BadRequest{"s2-stream-config: " + bad.message, "bad_header"};
    } catch (const Json::exception& e) {
      throw BadRequest{fmt::format("s2-stream-config: {}", e.what()), "bad_header"};
    }
    if (!st.ok()) throw BadRequest{"s2-stream-config: " + st.message(), "bad_header"};
  }
  return true;
}

namespace {
bool IsS2s(const Request& req) {
  const std::string* ctype = req.Header("content-type");
  return ctype && EqualsLowercase(BareMediaType(*ctype), "s2s/proto");
}

// The frame compression an S2S client accepts (S2's rule: zstd if listed,
// else gzip, else none): 0 none, 1 zstd, 2 gzip.
int S2sCompression(const Request& req) {
  const std::string* ae = req.Header("accept-encoding");
  if (!ae) return 0;
  bool gzip = false;
  std::string_view rest = *ae;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    // A coding with q=0 (RFC 9110: "not acceptable") is refused, not chosen.
    const size_t semi = item.find(';');
    if (semi != std::string_view::npos) {
      std::string_view params = item.substr(semi + 1);
      bool refused = false;
      while (!params.empty()) {
        const size_t next = params.find(';');
        std::string_view p = TrimOws(params.substr(0, next));
        params = next == std::string_view::npos ? std::string_view() : params.substr(next + 1);
        if (p.size() >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
          std::string_view v = p.substr(2);
          refused = !v.empty() && v.find_first_not_of("0.") == std::string_view::npos;
        }
      }
      if (refused) continue;
    }
    item = TrimOws(item.substr(0, semi));
    auto is = [&](std::string_view name) { return EqualsLowercase(item, name); };
    if (is("zstd")) return 1;
    if (is("gzip")) gzip = true;
  }
  return gzip ? 2 : 0;
}

// A frame holding `message`, compressed as the client accepts when it is
// 1 KiB or more (as S2 does); uncompressed if compression fails.
std::string S2sFrameOf(const std::string& message, int compression) {
  if (compression != 0 && message.size() >= 1024) {
    auto c = wal::CompressRecords(compression == 1 ? wal::kCodecZstd : wal::kCodecGzip, message);
    if (c.ok() && c->size() < kS2sMaxFrameBytes) return EncodeS2sFrame(*c, compression);
  }
  return EncodeS2sFrame(message);
}

std::string ProtoAck(const log::AppendAck& a) {
  return EncodeProtoAppendAck({a.start_offset, static_cast<uint64_t>(a.first_timestamp_ms)},
                              {a.end_offset, static_cast<uint64_t>(a.last_timestamp_ms)},
                              {a.tail, static_cast<uint64_t>(std::max<int64_t>(a.tail_timestamp_ms, 0))});
}
}  // namespace

bool RestApi::WantsBodyStream(const Request& head) const {
  return head.method == "POST" && head.path.ends_with("/records") && IsS2s(head);
}

// An S2S append session: AppendInput frames in, an AppendAck frame out for
// each, in order; the first failure (of an append, or of a frame) ends the
// session with a terminal frame, after the acks of the inputs before it, and
// no input after the failure is known is submitted. Frames arrive through
// BodySink calls (an I/O thread, in order) and are submitted in order by one
// thread at a time, a worker while admission may wait (Pump); acks come
// from the engine's callbacks. A frame's bytes are given back to the client's flow-control
// window (Exchange::ConsumeBody) once its ack is sent, so the client's
// unacknowledged input is bounded by the stream's window. Owned by the
// request's body stream and by the callbacks of its appends in flight.
class RestApi::AppendSession : public BodySink, public std::enable_shared_from_this<RestApi::AppendSession> {
 public:
  AppendSession(RestApi* api, Ctx c, std::string stream) : api_(api), c_(std::move(c)), stream_(std::move(stream)) {}
  ~AppendSession() override {
    if (counted_) api_->metrics_.append_sessions--;
  }

  // The whole input, read before the session opens (HTTP/1.1).
  void Preload(std::string body) {
    std::lock_guard lk(in_mu_);
    buf_ = std::move(body);
    whole_ = 0;
    ScanWhole();
    input_ended_ = true;
  }

  // Answers 200 and takes frames once the stream exists: a basin that creates
  // streams on append creates it first, on a worker (a metastore write).
  void Open() {
    if (auto id = api_->engine_->StreamIdOf(c_.basin, stream_)) {
      stream_id_ = *id;
      return Ready(true);
    }
    auto self = shared_from_this();
    c_.ex->Post([self] {
      auto created = self->api_->engine_->CreateIfConfigured(
          self->c_.basin, self->stream_, log::Engine::AutoCreate::kOnAppend,
          [&self](const metastore::StreamConfig& config) { return self->CheckFirstInput(config); },
          self->c_.create_config);
      if (!created.ok() && created.status().code() != Code::kNotFound) return self->Refuse(created.status());
      auto id = self->api_->engine_->StreamIdOf(self->c_.basin, self->stream_);
      if (!id) return self->Refuse(NotFound("stream \"{}\" does not exist", self->stream_));
      self->stream_id_ = *id;
      self->Ready(false);
    });
  }

  void OnData(std::string_view bytes) override {
    std::unique_lock lk(in_mu_);
    if (failed_ || poisoned_) return c_.ex->ConsumeBody(bytes.size());  // dropped
    buf_.append(bytes);
    ScanWhole();
    if (ready_) Pump(lk, true);
  }

  // Moves whole_ past the whole frames buf_ holds (in_mu_ held): a frame is
  // a 3-byte big-endian length, then that many bytes.
  void ScanWhole() {
    while (buf_.size() - whole_ >= 3) {
      const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + whole_);
      const size_t len = (size_t{p[0]} << 16) | (size_t{p[1]} << 8) | p[2];
      if (buf_.size() - whole_ - 3 < len) break;
      whole_ += 3 + len;
    }
  }

  bool HoldsPartialInput() override {
    std::lock_guard lk(in_mu_);
    return whole_ < buf_.size();
  }

  void OnEnd(bool complete) override {
    std::lock_guard lk(in_mu_);
    if (!complete) {  // the client is gone: nothing more to answer
      failed_ = true;
      Discard();  // what it sent and nothing took (a partial frame) goes now
    }
    input_ended_ = true;
    // Else the pump ends the input once it is done (or resumed).
    if (ready_ && !pumping_ && (!acks_stalled_ || failed_)) EndOfInput();
  }

  // The server holds too many request bytes to take more of this input:
  // the session ends with `answer` (429) after the acks of what it took.
  void OnRefused(Response answer) override {
    std::lock_guard lk(in_mu_);
    if (failed_ || poisoned_) return;
    if (!ready_) {
      failed_ = true;  // Ready answers it
      refusal_ = std::move(answer);
      Discard();
      return;
    }
    Fail(std::move(answer));
  }

  // The server drains: no more input; the session ends with 503
  // server_draining (S2's SDKs reconnect on it) after the acks of what it
  // took.
  void Drain() {
    std::lock_guard lk(in_mu_);
    if (failed_ || poisoned_) return;
    // The client ended its input and all of it was taken: nothing to refuse,
    // the session ends after its acks.
    if (input_ended_ && buf_.empty()) return;
    if (!ready_) {
      failed_ = true;  // Ready answers 503
      return;
    }
    Fail(Ctx::ErrorResponse(503, "server_draining", "the server is shutting down", {{"Retry-After", "1"}}));
  }

 private:
  struct Input {
    AppendInput in;
    size_t frame_bytes;
  };
  struct RawFrame {  // a whole frame taken from the input, not yet decoded
    std::string payload;
    int compression = 0;
    size_t frame_bytes = 0;
  };

  void Ready(bool on_io_thread) {
    std::unique_lock lk(in_mu_);
    if (failed_) {  // refused, drained (or the client left) while the stream was being created
      if (refusal_) return c_.Send(std::move(*refusal_));
      c_.Send(Ctx::ErrorResponse(503, "server_draining", "the server is shutting down", {{"Retry-After", "1"}}));
      return;
    }
    api_->metrics_.append_sessions++;
    counted_ = true;
    c_.ex->BeginStream(200, "s2s/proto", {});
    ready_ = true;
    Pump(lk, on_io_thread);
  }

  void Refuse(const Status& st) {
    {
      std::lock_guard lk(in_mu_);
      failed_ = true;  // input arriving meanwhile is dropped
    }
    // A first input a new stream would refuse gets that stream's answer (a 412 body).
    if (first_refused_) return c_.Send(c_.AppendFailure(*first_refused_));
    c_.Fail(st, "stream_not_found");  // may ask the metastore: not under in_mu_, which the I/O thread takes
  }

  // in_mu_ held (by lk): submits the whole frames in buf_, in order, from one
  // thread at a time (pumping_: a thread that finds another pumping leaves
  // its input to it). Admission may wait, and a compressed frame may expand
  // a thousandfold: on an I/O thread the pump moves to a worker before
  // either. On a worker it takes one round (see Take: at most about twice
  // kS2sMaxFrameBytes decoded, then submitted) per turn, and posts itself again for more, so a
  // busy session takes turns with the pool's other work. in_mu_ is released
  // while submitting, so input keeps arriving meanwhile; the pump ends the
  // input if it ended meanwhile.
  void Pump(std::unique_lock<std::mutex>& lk, bool on_io_thread) {
    if (pumping_) return;
    pumping_ = true;
    for (bool first = true;; first = false) {
      const bool live = !failed_ && !poisoned_;
      // Set before the count is read, as AckWritten counts before it reads
      // the flag: one of them sees the other.
      acks_stalled_ = live && HasFrame();
      if (acks_stalled_ && AnswersBacklogged()) {
        // The client does not read its acks: take no more of its input until
        // it does (AckWritten pumps again). What it sends meanwhile waits in
        // buf_, within its flow-control window (given back with each ack).
        pumping_ = false;
        return;
      }
      acks_stalled_ = false;
      const bool to_worker =
          on_io_thread && live && (FrontCompressed() || api_->engine_->AdmissionMayWait(buf_.size()));
      if ((to_worker || (!on_io_thread && !first)) && live && HasFrame()) {
        c_.ex->Post([self = shared_from_this()] {
          std::unique_lock wlk(self->in_mu_);
          self->pumping_ = false;
          self->Pump(wlk, false);
        });
        return;  // pumping_ stays set until the worker has the pump
      }
      std::vector<RawFrame> raw;
      std::optional<Response> bad;
      Take(&raw, &bad, on_io_thread);
      if (raw.empty() && !bad) break;
      const size_t buffered = buf_.size();  // input not yet taken: counted with the body's
      lk.unlock();
      // Decoded outside in_mu_: a compressed frame may take milliseconds,
      // while the I/O thread's OnData waits for the lock.
      std::vector<Input> inputs;
      std::optional<Response> undecodable;
      Decode(raw, &inputs, &undecodable);
      size_t bytes = 0;  // decoded (a compressed frame's records take more room than it)
      for (const auto& i : inputs) bytes += log::Engine::AdmissionBytes(i.in.records);
      // The frames' bytes hold their place in the in-flight budget; the
      // decoded records may take more room: that too, until they are
      // submitted (encoded into the WAL pool), or the session ends with 429.
      size_t extra = 0;
      {
        size_t decoded = 0, framed = 0;
        for (const auto& i : inputs) {
          decoded += DecodedBytes(i.in.records);
          framed += i.frame_bytes;
        }
        extra = decoded > framed ? decoded - framed : 0;
        // The session's own frames and input do not make it less alone: over
        // HTTP/2 the server counts them apart from its exchange (over
        // HTTP/1.1 the exchange holds the whole body).
        if (!c_.ex->TakeBudget(extra, c_.ex->sequential() ? 0 : framed + buffered)) {
          extra = 0;
          for (const auto& i : inputs) c_.ex->ConsumeBody(i.frame_bytes);
          inputs.clear();
          // The first failure: the inputs let go come before a frame that
          // did not decode.
          undecodable = Ctx::ErrorResponse(
              429, "rate_limited",
              fmt::format("the session's next inputs take {} bytes decoded, more than the server's memory for "
                          "requests (--http-max-in-flight-mib) has left now; retry",
                          decoded),
              {{"Retry-After", "1"}});
        }
      }
      // On a worker, room is taken for all the inputs at once (held by the
      // ticket), or waited for without holding the worker: the pump
      // (pumping_ still set) goes on once the inputs are in. A look then an
      // append would leave a worker waiting should others take the room in
      // between. Nothing here waits for admission (may_wait false).
      std::shared_ptr<log::AdmissionTicket> ticket;
      if (!on_io_thread && !inputs.empty()) {
        ticket = api_->engine_->TryAdmission(bytes, inputs.size());
        if (!ticket || !ticket->has_room()) {
          auto held = std::make_shared<Held>(Held{std::move(inputs), std::move(undecodable), std::move(bad),
                                                  Now() + api_->engine_->admission_timeout(), extra});
          WaitForAdmission(std::move(held), 0);
          lk.lock();
          return;
        }
      }
      for (auto& i : inputs) {
        i.in.options.may_wait = false;
        i.in.options.ticket = ticket;
        Submit(std::move(i.in), i.frame_bytes);
      }
      c_.ex->GiveBackBudget(extra);
      lk.lock();
      FailAfterInputs(std::move(undecodable), std::move(bad));
    }
    pumping_ = false;
    if (input_ended_) EndOfInput();
  }

  // in_mu_ held: after the inputs before the bad frame (a frame that does
  // not decode comes before one whose framing is bad: Take stopped there).
  void FailAfterInputs(std::optional<Response> undecodable, std::optional<Response> bad) {
    if (undecodable) {
      Fail(std::move(*undecodable));
    } else if (bad) {
      Fail(std::move(*bad));
    }
  }

  // Inputs of one round of the pump waiting for admission, and the answers
  // that come after them.
  struct Held {
    std::vector<Input> inputs;
    std::optional<Response> undecodable, bad;
    TimePoint admit_by;  // one admission timeout for all its groups
    size_t extra = 0;    // in-flight budget the decoded inputs hold besides their frames
  };

  // From the pump on a worker, in_mu_ not held, pumping_ set: submits the
  // inputs from `from` on as admission has room for them: as many at a time
  // as fit the WAL pool at once (one too large for it alone is refused),
  // each group once its room is held for it; what is left at once after
  // the admission timeout (one for the whole round: admitted or refused),
  // the client leaving, or the session ending (not submitted). Then pumps
  // on.
  void WaitForAdmission(std::shared_ptr<Held> held, size_t from) {
    auto& inputs = held->inputs;
    auto* engine = api_->engine_;
    auto self = shared_from_this();
    bool ended;
    {
      std::lock_guard lk(out_mu_);
      ended = last_numbered_ || poisoned_;
    }
    // The session's end is numbered (Fail: a bad frame, the client gone, a
    // drain) or an input was refused: Submit drops each input left, which
    // gives its bytes back; no wait for room that would not be used.
    for (; ended && from < inputs.size(); ++from) Submit(std::move(inputs[from].in), inputs[from].frame_bytes);
    if (from == inputs.size()) {
      c_.ex->GiveBackBudget(std::exchange(held->extra, 0));
      std::unique_lock lk(in_mu_);
      FailAfterInputs(std::move(held->undecodable), std::move(held->bad));
      pumping_ = false;
      return Pump(lk, false);
    }
    const auto [to, bytes] = engine->NextAdmissionGroup(
        from, inputs.size(), [&](size_t i) { return log::Engine::AdmissionBytes(inputs[i].in.records); });
    using Wait = log::Engine::AdmissionWait;
    engine->WhenAdmissible(
        bytes, to - from, held->admit_by,
        [ex = c_.ex](Duration delay, std::function<void()> fn) { ex->After(delay, std::move(fn)); },
        // The client left, or the session's end is numbered (a drain, an
        // answer refused): the inputs would be dropped anyway.
        [self] {
          if (self->c_.ex->closed()) return true;
          std::lock_guard lk(self->out_mu_);
          return self->last_numbered_ || self->poisoned_;
        },
        [self, held, from, to](Wait how, std::shared_ptr<log::AdmissionTicket> ticket) {
          self->c_.ex->Post([self, held, from, to, how, ticket = std::move(ticket)]() mutable {
            if (how == Wait::kAbandoned) {
              // Nothing more is submitted (each input below gives its bytes
              // back). The client left: Fail numbers the session's end (a
              // no-op when it is numbered already).
              std::lock_guard lk(self->in_mu_);
              self->Fail(Ctx::ErrorResponse(503, "unavailable", "the client went away"));
            }
            // Room held for this group; else the rest, now.
            const size_t end = how == Wait::kRoom ? to : held->inputs.size();
            for (size_t i = from; i < end; ++i) {
              auto& in = held->inputs[i];
              in.in.options.may_wait = false;
              in.in.options.ticket = how == Wait::kRoom ? ticket : nullptr;
              self->Submit(std::move(in.in), in.frame_bytes);
            }
            ticket.reset();  // room an input did not take (dropped) goes back before the next look
            self->WaitForAdmission(held, end);
          });
        });
  }

  // in_mu_ held: the client finished its input.
  void EndOfInput() {
    if (!failed_ && !poisoned_ && !buf_.empty()) {
      return Fail(Ctx::ErrorResponse(400, "bad_frame", "the input ended inside an S2S frame"));
    }
    std::lock_guard lk(out_mu_);
    input_done_ = true;
    MaybeEnd();
  }

  // in_mu_ held: whether buf_ starts with a whole frame (or one that is bad).
  bool HasFrame() const {
    S2sFrame frame;
    auto n = DecodeS2sFrame(buf_, &frame);
    return !n.ok() || *n > 0;
  }
  // in_mu_ held: whether buf_ starts with a whole compressed frame.
  bool FrontCompressed() const {
    S2sFrame frame;
    auto n = DecodeS2sFrame(buf_, &frame);
    return n.ok() && *n > 0 && frame.compression != 0;
  }

  // in_mu_ held: takes whole frames off the front of buf_ into `raw`: about
  // kS2sMaxFrameBytes of payload at most, and at most one compressed frame
  // (it decodes to at most that), so a round's decoded input stays bounded
  // however well it compresses; on an I/O thread none compressed. A frame
  // whose framing is bad ends the input (failed_); its answer goes to `bad`,
  // to be sent after the inputs before it.
  void Take(std::vector<RawFrame>* raw, std::optional<Response>* bad, bool on_io_thread) {
    size_t pos = 0, taken = 0;
    auto refuse = [&](Response r) {
      failed_ = true;
      *bad = std::move(r);
    };
    // At most about 2 MiB, and 256 frames (each an append), per round: frames
    // of no payload count too.
    while (!failed_ && !poisoned_ && taken < kS2sMaxFrameBytes && raw->size() < 256) {
      S2sFrame frame;
      auto n = DecodeS2sFrame(std::string_view(buf_).substr(pos), &frame);
      if (!n.ok()) {
        refuse(Ctx::ErrorResponse(400, "bad_frame", n.status().message()));
        break;
      }
      if (*n == 0) break;
      if (frame.terminal) {
        refuse(Ctx::ErrorResponse(400, "bad_frame", "a client may not send a terminal frame"));
        break;
      }
      if (frame.compression != 0 && on_io_thread) break;  // decompressed on a worker
      raw->push_back({std::string(frame.payload), frame.compression, *n});
      pos += *n;
      taken = frame.compression != 0 ? kS2sMaxFrameBytes : taken + *n;
    }
    buf_.erase(0, pos);
    whole_ = whole_ > pos ? whole_ - pos : 0;
    ScanWhole();
    if (failed_ || poisoned_) Discard();
  }

  // in_mu_ not held: decodes `raw`, in order, into `inputs`. The first frame
  // that does not decode ends them: its answer goes to `undecodable`, and its
  // bytes and those of the frames after it go back to the client's window.
  void Decode(const std::vector<RawFrame>& raw, std::vector<Input>* inputs, std::optional<Response>* undecodable) {
    size_t i = 0;
    for (; i < raw.size(); ++i) {
      Response why;
      auto in = DecodeInput(raw[i], &why);
      if (!in) {
        *undecodable = std::move(why);
        break;
      }
      inputs->push_back({std::move(*in), raw[i].frame_bytes});
    }
    for (; i < raw.size(); ++i) c_.ex->ConsumeBody(raw[i].frame_bytes);
  }

  // One frame's AppendInput; none, with the answer that ends the session in
  // `why`, if it does not decode.
  std::optional<AppendInput> DecodeInput(const RawFrame& f, Response* why) const {
    std::string decompressed;
    std::string_view message = f.payload;
    if (f.compression != 0) {
      auto d = wal::DecompressRecords(f.compression == 1 ? wal::kCodecZstd : wal::kCodecGzip, f.payload,
                                      kS2sMaxFrameBytes);
      if (!d.ok()) {
        *why = Ctx::ErrorResponse(400, "bad_frame", d.status().message());
        return std::nullopt;
      }
      decompressed = std::move(*d);
      message = decompressed;
    }
    auto in = DecodeProtoAppendInput(message, api_->append_limits());
    if (!in.ok()) {
      const bool over = in.status().code() == Code::kOutOfRange;
      *why = Ctx::ErrorResponse(over ? 422 : 400, over ? "invalid" : "bad_proto", in.status().message());
      return std::nullopt;
    }
    if (in->options.fencing_token && in->options.fencing_token->size() > 36) {
      *why = Ctx::ErrorResponse(422, "invalid", "fencing_token must be at most 36 bytes");
      return std::nullopt;
    }
    return std::move(*in);
  }

  // For a basin that would create the stream: an input already whole (read
  // before the session opened, HTTP/1.1) whose first frame the append would
  // refuse creates nothing, as a plain append. A streamed input's frames
  // arrive only once the session is open (the stream created, as on S2).
  Status CheckFirstInput(const metastore::StreamConfig& config) {
    RawFrame first;
    {
      std::lock_guard lk(in_mu_);
      if (!input_ended_) return Status::Ok();
      S2sFrame frame;
      auto n = DecodeS2sFrame(buf_, &frame);
      if (!n.ok()) return InvalidArgument("bad S2S frame: {}", n.status().message());
      if (*n == 0) {
        return buf_.empty() ? Status::Ok() : InvalidArgument("the input ended inside an S2S frame");
      }
      if (frame.terminal) return InvalidArgument("a client may not send a terminal frame");
      first = {std::string(frame.payload), frame.compression, *n};
    }
    Response why;
    auto in = DecodeInput(first, &why);
    if (!in) return InvalidArgument("the first input does not decode: {}", why.body);
    WEIR_RETURN_IF_ERROR(api_->engine_->CheckAppendRecords(in->records));
    first_refused_ = log::Engine::RefusedByANewStream(in->options, in->records.size());
    if (first_refused_) return first_refused_->status;
    return log::CheckClientTimestamps(config, in->records);
  }

  // in_mu_ held: input that will never be submitted.
  void Discard() {
    c_.ex->ConsumeBody(buf_.size());
    std::string().swap(buf_);  // its memory too: the session may live on for its acks
    whole_ = 0;
  }

  // From the pump, in_mu_ not held. `frame_bytes`: the frame's size, given
  // back with its answer. Submits nothing once the session's end is numbered
  // or an answer failed.
  void Submit(AppendInput in, size_t frame_bytes) {
    auto index = Number(frame_bytes, false);
    if (!index) return c_.ex->ConsumeBody(frame_bytes);
    size_t records = in.records.size(), bytes = 0;
    for (const auto& r : in.records) bytes += log::MeteredBytes(r);
    auto self = shared_from_this();
    auto done = [self, index = *index, records, bytes, started = Now()](log::AppendOutcome o) {
      Ctx c = self->c_;
      c.started = started;
      if (!o.status.ok() && o.status.code() == Code::kNotFound) {
        // Nothing after it is submitted from now (a stream made again
        // meanwhile under the name would take later inputs).
        {
          std::lock_guard lk(self->out_mu_);
          self->poisoned_ = true;
        }
        // Telling a missing basin asks the metastore: not here (this may be
        // a WAL thread, whose acks wait behind it).
        return c.ex->Post([self, c, index, o] { self->Deliver(index, c.AppendFailure(o)); });
      }
      if (!o.status.ok()) return self->Deliver(index, c.AppendFailure(o));
      c.Acked(o.ack, records, bytes);
      self->Deliver(index, Response{200, "", EncodeS2sFrame(ProtoAck(o.ack)), {}});
    };
    in.options.stream_id = stream_id_;  // never a stream made again under the name since
    const bool refused =
        api_->engine_->AppendAsync(c_.basin, stream_, std::move(in.records), in.options, std::move(done));
    // Its 412 may come once earlier inputs are durable: nothing after it is
    // submitted meanwhile.
    if (refused) {
      std::lock_guard lk(out_mu_);
      poisoned_ = true;
    }
  }

  // in_mu_ held: the session ends with `r` after the inputs already numbered.
  void Fail(Response r) {
    failed_ = true;
    Discard();
    if (auto index = Number(0, true)) Deliver(*index, std::move(r));
  }

  // The next answer's number (its frame's bytes go back to the client with
  // it), or none once the session's last answer is numbered (`last`: this is
  // it) or an answer failed.
  std::optional<uint64_t> Number(size_t frame_bytes, bool last) {
    std::lock_guard lk(out_mu_);
    if (last_numbered_ || (!last && poisoned_)) return std::nullopt;
    last_numbered_ = last;
    credit_.emplace(submitted_, frame_bytes);
    return submitted_++;
  }

  // Input `index` is answered: a 200 carries its ack frame, anything else
  // ends the session. Sends what is now in order.
  void Deliver(uint64_t index, Response r) {
    std::lock_guard lk(out_mu_);
    if (r.status != 200) poisoned_ = true;  // nothing numbered after this is submitted
    answers_.emplace(index, std::move(r));
    for (auto it = answers_.find(sent_); it != answers_.end(); it = answers_.find(sent_)) {
      Response& a = it->second;
      if (!ended_) {
        if (a.status == 200) {
          // Acks reach the wire in order: one in kAckWrittenEvery reports
          // how far they got, not each (a worker task per ack otherwise).
          std::function<void(bool)> written;
          if (sent_ % kAckWrittenEvery == kAckWrittenEvery - 1) {
            written = [self = shared_from_this(), upto = sent_ + 1](bool) { self->AckWritten(upto); };
          }
          c_.ex->Write(std::move(a.body), std::move(written));
        } else {
          c_.ex->Write(EncodeS2sTerminal(a.status, a.body), nullptr);
          ended_ = true;
          c_.ex->End();
        }
      }
      if (auto cr = credit_.find(sent_); cr != credit_.end()) {
        if (cr->second > 0) c_.ex->ConsumeBody(cr->second);
        credit_.erase(cr);
      }
      answers_.erase(it);
      sent_++;
    }
    MaybeEnd();
  }

  // Whether so many answers are numbered and not yet on the wire (the
  // client reads none, or slowly) that no more input is taken; `slack`
  // lowers the bar (AckWritten resumes at half).
  bool AnswersBacklogged(uint64_t slack = 0) {
    std::lock_guard lk(out_mu_);
    return submitted_ - written_.load() + slack >= kMaxUnwrittenAnswers;
  }

  // The acks of inputs below `upto` are on the wire (or the connection
  // failed), on a worker. Only a pump that stopped for the backlog needs it:
  // that pump goes on once half of the backlog is written.
  void AckWritten(uint64_t upto) {
    for (uint64_t w = written_.load(); w < upto && !written_.compare_exchange_weak(w, upto);) {
    }
    if (!acks_stalled_.load()) return;
    std::unique_lock lk(in_mu_);
    if (!acks_stalled_ || pumping_ || AnswersBacklogged(kMaxUnwrittenAnswers / 2)) return;
    Pump(lk, false);
  }

  // out_mu_ held.
  void MaybeEnd() {
    if (!ended_ && input_done_ && sent_ == submitted_) {
      ended_ = true;
      c_.ex->End();
    }
  }

  RestApi* api_;
  Ctx c_;
  std::string stream_;
  uint64_t stream_id_ = 0;  // the stream opened (set before Ready): inputs go to it alone
  std::mutex in_mu_;  // before out_mu_ when both are held
  std::string buf_;   // input not yet parsed (a partial frame)
  size_t whole_ = 0;  // buf_[0, whole_) holds whole frames (in_mu_)
  bool ready_ = false, failed_ = false, input_ended_ = false, counted_ = false;  // in_mu_
  bool pumping_ = false;  // a thread is submitting buf_'s frames (in_mu_)
  std::optional<Response> refusal_;  // OnRefused before Ready: Ready's answer (in_mu_)
  // What a new stream answers the first input, when it would refuse it (set
  // and read by Open's worker, in CheckFirstInput and Refuse).
  std::optional<log::AppendOutcome> first_refused_;
  std::atomic<bool> acks_stalled_{false};  // the pump waits for the client to read acks (set under in_mu_)
  // Inputs numbered and not yet acked on the wire at which the pump stops:
  // with S2's 2 MiB frames and a 4 MiB stream window, what a session holds
  // for a client that does not read is bounded (acks of ~50 bytes each).
  static constexpr uint64_t kMaxUnwrittenAnswers = 1024;
  static constexpr uint64_t kAckWrittenEvery = 64;  // at most an eighth of the resume margin
  std::mutex out_mu_;
  uint64_t submitted_ = 0, sent_ = 0;       // inputs numbered, answers sent (out_mu_)
  std::atomic<uint64_t> written_{0};         // inputs whose acks are on the wire (or given up), in steps
  std::map<uint64_t, Response> answers_;    // answered out of order (out_mu_)
  std::map<uint64_t, size_t> credit_;       // frame bytes to give back with each answer (out_mu_)
  bool input_done_ = false, ended_ = false;  // out_mu_
  bool last_numbered_ = false;               // the session's terminal answer is numbered (out_mu_)
  std::atomic<bool> poisoned_{false};        // an answer failed: submit nothing more (set under out_mu_)
};

void RestApi::TrackSession(const std::shared_ptr<AppendSession>& s) {
  {
    std::lock_guard lk(sessions_mu_);
    std::erase_if(append_sessions_, [](const std::weak_ptr<AppendSession>& w) { return w.expired(); });
    append_sessions_.push_back(s);
  }
  // SetDraining sets draining_ before it walks the list: a session tracked
  // after the walk sees it here.
  if (draining_) s->Drain();
}

void RestApi::SetDraining() {
  draining_ = true;
  std::vector<std::shared_ptr<AppendSession>> open;
  {
    std::lock_guard lk(sessions_mu_);
    for (auto& w : append_sessions_) {
      if (auto s = w.lock()) open.push_back(std::move(s));
    }
  }
  for (auto& s : open) s->Drain();
  WakeReadsForDrain();
}

std::shared_ptr<BodySink> RestApi::OpenBodyStream(Request head, std::shared_ptr<Exchange> ex) {
  metrics_.requests++;
  Ctx c{std::move(ex), &metrics_, ReadyEngine(), options_.default_basin, Now()};
  try {
    if (!Authorized(head, c) || !Admit(head, c)) return nullptr;
    auto parts = SplitPath(head.path);
    if (parts.size() != 4 || parts[0] != "v1" || parts[1] != "streams" || parts[3] != "records") {
      c.Error(404, "not_found", fmt::format("no route for {}", head.path));
      return nullptr;
    }
    RefuseProducerHeadersOnASession(head);
    auto session = std::make_shared<AppendSession>(this, c, parts[2]);
    TrackSession(session);
    session->Open();
    return session;
  } catch (const BadRequest& e) {
    c.Error(e.status, e.code, e.message);
    return nullptr;
  } catch (const Json::exception& e) {
    c.Error(400, "bad_json", fmt::format("bad JSON field: {}", e.what()));
    return nullptr;
  } catch (const std::exception& e) {  // called from an HTTP/2 callback: nothing may escape
    c.Error(500, "other", fmt::format("opening the append session: {}", e.what()));
    return nullptr;
  }
}

void RestApi::Route(Request& req, const Ctx& c) {
  if (!IsS2s(req)) DecodeContentEncoding(req, options_.max_request_bytes, *c.ex);
  auto parts = SplitPath(req.path);
  auto method_not_allowed = [&](const char* allow) {
    c.Error(405, "method_not_allowed", fmt::format("{} is not allowed here", req.method), {{"Allow", allow}});
  };
  if (parts.empty() || parts[0] != "v1") return c.Error(404, "not_found", fmt::format("no route for {}", req.path));
  if (parts.size() >= 2 && parts[1] == "basins" && parts.size() <= 3) {
    return Basins(req, c, parts.size() == 3 ? &parts[2] : nullptr);
  }
  if (parts.size() >= 2 && parts[1] == "streams") {
    if (parts.size() <= 3) return Streams(req, c, parts.size() == 3 ? &parts[2] : nullptr);
    if (parts.size() == 4 && parts[3] == "records") {
      if (req.method == "POST") return Append(req, c, parts[2]);
      if (req.method == "GET") return Read(req, c, parts[2]);
      return method_not_allowed("GET, POST");
    }
    if (parts.size() == 5 && parts[3] == "records" && parts[4] == "tail") {
      if (req.method == "GET") return Tail(c, parts[2]);
      return method_not_allowed("GET");
    }
  }
  if (parts.size() == 2 && parts[1] == "producers") {
    if (req.method == "POST") return Producers(c);
    return method_not_allowed("POST");
  }
  c.Error(404, "not_found", fmt::format("no route for {}", req.path));
}

void RestApi::RememberDeleted(const std::string& key) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(tombstones_mu_);
  std::erase_if(tombstones_, [&](const auto& e) { return now - e.second >= kTombstoneLife; });
  if (tombstones_.size() >= kMaxTombstones) {
    tombstones_.erase(std::min_element(tombstones_.begin(), tombstones_.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; }));
  }
  tombstones_[key] = now;
}

bool RestApi::RecentlyDeleted(const std::string& key) {
  std::lock_guard lock(tombstones_mu_);
  auto it = tombstones_.find(key);
  return it != tombstones_.end() && std::chrono::steady_clock::now() - it->second < kTombstoneLife;
}

// ---- Basins -----------------------------------------------------------------

void RestApi::Basins(Request& req, const Ctx& c, const std::string* name) {
  if (!name) {
    if (req.method == "GET") {
      auto page = ListPage<metastore::BasinInfo>(req, [&](const std::string& prefix, const std::string& after,
                                                          size_t limit) {
        return engine_->ListBasins(prefix, after, limit);
      });
      if (!page.ok()) return c.Fail(page.status());
      Json list = Json::array();
      for (const auto& b : page->first) list.push_back(BasinInfoJson(b));
      return c.Reply(200, Json{{"basins", list}, {"has_more", page->second}});
    }
    if (req.method == "POST") {
      Json j = ParseRequestJson(req.body);
      if (j.is_discarded() || !j.is_object()) throw BadRequest{"the body must be a JSON object"};
      if (!j.contains("basin") || !j["basin"].is_string()) throw BadRequest{"CreateBasinRequest needs \"basin\""};
      CheckBasinScope(j);
      std::string basin = j["basin"].get<std::string>();
      metastore::BasinConfig config;
      if (Status st = ApplyBasinConfig(FieldOrNull(j, "config"), &config, ConfigMode::kCreate); !st.ok()) {
        return c.Fail(st);
      }
      const std::string key = CreationKey(RequestToken(req), BasinConfigJson(config));
      Status created = engine_->CreateBasin(basin, key, config, log::Engine::BasinCreator::kClient);
      // A retry of a create that succeeded (same token, same config) succeeds again.
      if (!created.ok() && !(created.code() == Code::kAlreadyExists && SameCreation(engine_, key, basin, ""))) {
        return c.Fail(created);
      }
      auto info = engine_->GetBasin(basin);
      if (!info.ok()) return c.Fail(info.status(), "basin_not_found");
      return c.Reply(201, BasinInfoJson(*info), Provisioned(created.ok() ? "created" : "noop"));
    }
    return c.Error(405, "method_not_allowed", fmt::format("{} is not allowed here", req.method),
                   {{"Allow", "GET, POST"}});
  }
  // As S2, whose path extractor refuses a name that breaks the rule.
  if (Status valid = log::ValidateBasinName(*name); !valid.ok()) throw BadRequest{valid.message(), "bad_path"};
  if (req.method == "GET") {
    auto info = engine_->GetBasin(*name);
    if (!info.ok()) return c.Fail(info.status(), "basin_not_found");
    return c.Reply(200, BasinConfigJson(info->config));
  }
  if (req.method == "PUT") {
    // S2's ensure: `config` is the whole BasinConfig, for a new basin or an
    // existing one (fields it leaves out take their defaults).
    Json j = req.body.empty() ? Json() : ParseRequestJson(req.body);
    if (j.is_discarded()) throw BadRequest{"the body is not valid JSON"};
    if (!j.is_null() && !j.is_object()) throw BadRequest{"the body must be a JSON object"};
    if (j.is_object()) CheckBasinScope(j);
    metastore::BasinConfig config;
    if (Status st = ApplyBasinConfig(j.is_object() ? FieldOrNull(j, "config") : Json(), &config, ConfigMode::kCreate);
        !st.ok()) {
      return c.Fail(st);
    }
    std::lock_guard lk(config_mu_);  // read, compare, write
    Status st = engine_->CreateBasin(*name, "", config, log::Engine::BasinCreator::kClient);
    if (!st.ok() && st.code() != Code::kAlreadyExists) return c.Fail(st);
    auto info = engine_->GetBasin(*name);
    if (!info.ok()) return c.Fail(info.status(), "basin_not_found");
    if (st.ok()) return c.Reply(201, BasinInfoJson(*info), Provisioned("created"));
    if (info->config == config) return c.Reply(200, BasinInfoJson(*info), Provisioned("noop"));
    if (Status re = engine_->ReconfigureBasin(*name, config); !re.ok()) return c.Fail(re, "basin_not_found");
    return c.Reply(200, BasinInfoJson(*info), Provisioned("updated"));
  }
  if (req.method == "PATCH") {
    Json j = ParseRequestJson(req.body);
    if (j.is_discarded() || !j.is_object()) throw BadRequest{"the body must be a JSON object"};
    std::lock_guard lk(config_mu_);  // read, change, write: concurrent PATCHes do not lose changes
    auto info = engine_->GetBasin(*name);
    if (!info.ok()) return c.Fail(info.status(), "basin_not_found");
    metastore::BasinConfig config = info->config;
    if (Status st = ApplyBasinConfig(j, &config, ConfigMode::kReconfigure); !st.ok()) return c.Fail(st);
    if (config != info->config) {
      if (Status st = engine_->ReconfigureBasin(*name, config); !st.ok()) return c.Fail(st, "basin_not_found");
    }
    return c.Reply(200, BasinConfigJson(config));
  }
  if (req.method == "DELETE") {
    if (*name == options_.default_basin) {
      return c.Error(422, "invalid", fmt::format("the default basin \"{}\" cannot be deleted", *name));
    }
    if (std::find(options_.kept_basins.begin(), options_.kept_basins.end(), *name) != options_.kept_basins.end()) {
      return c.Error(422, "invalid",
                     fmt::format("the basin \"{}\" holds Kafka's topics and group offsets and cannot be deleted; "
                                 "delete its topics instead",
                                 *name));
    }
    const std::string tombstone = "b\n" + *name;
    auto info = engine_->GetBasin(*name);
    if (!info.ok() && info.status().code() == Code::kNotFound && RecentlyDeleted(tombstone)) return c.NoContent(202);
    if (!info.ok()) return c.Fail(info.status(), "basin_not_found");
    if (Status st = DeleteBasinStreams(engine_, *name); !st.ok()) return c.Fail(st);
    if (Status st = engine_->DeleteBasin(*name); !st.ok()) return c.Fail(st, "basin_not_found");
    RememberDeleted(tombstone);
    return c.NoContent(202);
  }
  c.Error(405, "method_not_allowed", fmt::format("{} is not allowed here", req.method),
          {{"Allow", "GET, PUT, PATCH, DELETE"}});
}

// ---- Streams ----------------------------------------------------------------

void RestApi::Streams(Request& req, const Ctx& c, const std::string* name) {
  if (!name) {
    if (req.method == "GET") {
      auto page = ListPage<metastore::StreamInfo>(req, [&](const std::string& prefix, const std::string& after,
                                                           size_t limit) {
        return engine_->ListStreams(c.basin, prefix, after, limit);
      });
      if (!page.ok()) return c.Fail(page.status(), "basin_not_found");
      Json list = Json::array();
      for (const auto& s : page->first) list.push_back(StreamInfoJson(s));
      return c.Reply(200, Json{{"streams", list}, {"has_more", page->second}});
    }
    if (req.method == "POST") {
      Json j = ParseRequestJson(req.body);
      if (j.is_discarded() || !j.is_object()) throw BadRequest{"the body must be a JSON object"};
      if (!j.contains("stream") || !j["stream"].is_string()) throw BadRequest{"CreateStreamRequest needs \"stream\""};
      metastore::StreamConfigLayer requested;
      if (Status st = ApplyStreamLayer(FieldOrNull(j, "config"), &requested, ConfigMode::kCreate); !st.ok()) {
        return c.Fail(st);
      }
      auto resolved = ResolveStreamConfig(engine_, c.basin, Json(), ConfigMode::kCreate, requested);
      if (!resolved.ok()) return c.Fail(resolved.status(), "basin_not_found");
      const std::string stream = j["stream"].get<std::string>();
      const std::string key = CreationKey(RequestToken(req), StreamConfigLayerJson(requested));
      auto info = engine_->CreateStream(c.basin, stream, *resolved, key);
      if (!info.ok() && info.status().code() == Code::kAlreadyExists && SameCreation(engine_, key, c.basin, stream)) {
        // A retry of a create that succeeded (same token, same requested
        // config) succeeds again; the same token with another config is a new request.
        auto existing = engine_->GetStream(c.basin, stream);
        if (existing.ok()) return c.Reply(201, StreamInfoJson(existing->info), Provisioned("noop"));
      }
      if (!info.ok()) return c.Fail(info.status(), "basin_not_found");
      return c.Reply(201, StreamInfoJson(*info), Provisioned("created"));
    }
    return c.Error(405, "method_not_allowed", fmt::format("{} is not allowed here", req.method),
                   {{"Allow", "GET, POST"}});
  }
  if (req.method == "GET") {
    auto s = engine_->GetStream(c.basin, *name);
    if (!s.ok()) return c.Fail(s.status(), "stream_not_found");
    return c.Reply(200, StreamConfigJson(s->info.config));
  }
  if (req.method == "PUT" || req.method == "PATCH") {
    // PATCH reconfigures a stream: fields the body leaves out stay. PUT is
    // S2's ensure: the body is the whole StreamConfig (over the basin's
    // defaults), for a new stream or an existing one, except a table's
    // bucket (a Kafka partition), whose defaults are its table's: a PUT
    // there changes only what it names, as PATCH.
    Json j = req.body.empty() ? Json() : ParseRequestJson(req.body);
    if (j.is_discarded()) throw BadRequest{"the body is not valid JSON"};
    // (PATCH needs the object; a PUT may leave it out.)
    if (!j.is_object() && (req.method == "PATCH" || !j.is_null())) {
      throw BadRequest{req.method == "PATCH" ? "the body must be a StreamReconfiguration object"
                                             : "the body must be a StreamConfig object"};
    }
    // Read, changed and written under the engine's config lock: a change
    // made meanwhile (another PATCH, Kafka AlterConfigs) is not lost.
    // (A body refused as malformed is thrown here, not inside the engine.)
    auto reconfigure = [&](bool* changed, bool ensure) {
      std::optional<BadRequest> bad;
      auto config = engine_->ReconfigureStream(
          c.basin, *name, [&](const metastore::StreamConfig& old) -> Result<metastore::StreamConfig> {
            try {
              auto updated = ensure ? ResolveStreamConfig(engine_, c.basin, j, ConfigMode::kCreate)
                                    : ResolveStreamConfig(engine_, c.basin, j, ConfigMode::kReconfigure,
                                                          metastore::StreamConfigLayer::Of(old));
              if (updated.ok() && changed != nullptr) *changed = !(*updated == old);
              return updated;
            } catch (const BadRequest& e) {
              bad = e;
              return InvalidArgument("{}", e.message);
            }
          });
      if (bad) throw *bad;
      return config;
    };
    if (req.method == "PATCH") {
      auto config = reconfigure(nullptr, /*ensure=*/false);
      if (!config.ok()) return c.Fail(config.status(), "stream_not_found");
      return c.Reply(200, StreamConfigJson(*config));
    }
    std::lock_guard lk(config_mu_);  // a PUT's look, then create or reconfigure, as one
    auto s = engine_->GetStream(c.basin, *name);
    if (!s.ok()) {
      if (s.status().code() != Code::kNotFound) return c.Fail(s.status());
      auto resolved = ResolveStreamConfig(engine_, c.basin, j, ConfigMode::kCreate);
      if (!resolved.ok()) return c.Fail(resolved.status(), "basin_not_found");
      auto info = engine_->CreateStream(c.basin, *name, *resolved);
      if (info.ok()) return c.Reply(201, StreamInfoJson(*info), Provisioned("created"));
      if (info.status().code() != Code::kAlreadyExists) return c.Fail(info.status(), "basin_not_found");
      s = engine_->GetStream(c.basin, *name);  // lost a race with another create
      if (!s.ok()) return c.Fail(s.status(), "stream_not_found");
    }
    const auto bucket = metastore::ParseBucketStreamName(*name);
    const bool of_table = bucket && engine_->GetTable(c.basin, std::string(bucket->table)).ok();
    bool changed = false;
    auto config = reconfigure(&changed, /*ensure=*/!of_table);
    if (!config.ok()) return c.Fail(config.status(), "stream_not_found");
    return c.Reply(200, StreamInfoJson(s->info), Provisioned(changed ? "updated" : "noop"));
  }
  if (req.method == "DELETE") {
    const std::string tombstone = "s\n" + c.basin + "\n" + *name;
    if (Status st = engine_->DeleteStream(c.basin, *name); !st.ok()) {
      if (st.code() == Code::kNotFound && RecentlyDeleted(tombstone)) return c.NoContent(202);
      return c.Fail(st, "stream_not_found");
    }
    RememberDeleted(tombstone);
    return c.NoContent(202);
  }
  c.Error(405, "method_not_allowed", fmt::format("{} is not allowed here", req.method),
          {{"Allow", "GET, PUT, PATCH, DELETE"}});
}

// ---- Appends ----------------------------------------------------------------

// An S2S session's inputs are many appends, and one producer sequence number
// cannot name them: the headers are refused rather than ignored (a retry of
// the session would append its inputs again).
void RestApi::RefuseProducerHeadersOnASession(const Request& req) {
  for (const char* h : {"weir-producer-id", "weir-producer-epoch", "weir-producer-seq"}) {
    if (req.Header(h)) {
      throw BadRequest{fmt::format("{} does not apply to an S2S append session (one producer sequence cannot name "
                                   "its many inputs): send idempotent appends as unary requests",
                                   h),
                       "bad_header"};
    }
  }
}

void RestApi::Append(Request& req, const Ctx& c, const std::string& stream) {
  if (IsS2s(req)) {  // an S2S session whose input was read whole (HTTP/1.1)
    RefuseProducerHeadersOnASession(req);
    auto session = std::make_shared<AppendSession>(this, c, stream);
    TrackSession(session);
    session->Preload(std::move(req.body));
    session->Open();
    return;
  }
  const std::string* ctype = req.Header("content-type");
  bool proto_in = ctype && IsProtoType(*ctype);
  AppendInput in;
  if (proto_in) {
    auto r = DecodeProtoAppendInput(req.body, append_limits());
    if (!r.ok() && r.status().code() == Code::kOutOfRange) throw BadRequest{r.status().message(), "invalid", 422};
    if (!r.ok()) throw BadRequest{r.status().message(), "bad_proto"};
    in = std::move(*r);
  } else {
    // The parse's buffers for the time it runs: a body of unknown fields or
    // spaces (gzip makes 8 MiB of them from a few KiB) takes 15 times its
    // bytes, whatever it appends.
    const size_t parse_bytes = JsonParseBytes(req.body.size());
    if (parse_bytes > 0 && !c.ex->TakeBudget(parse_bytes)) {
      return c.Fail(ResourceExhausted(
          "parsing the append's {} bytes of JSON takes about {} bytes, more than the server's memory for requests "
          "(--http-max-in-flight-mib) has left now; retry, or send protobuf",
          req.body.size(), parse_bytes));
    }
    struct GiveBack {
      Exchange* ex;
      size_t n;
      ~GiveBack() {
        if (n > 0) ex->GiveBackBudget(n);
      }
    } give_back{c.ex.get(), parse_bytes};
    in = ParseJsonAppend(req.body, ParseFormat(req), append_limits());
  }
  if (in.options.fencing_token && in.options.fencing_token->size() > 36) {
    return c.Error(422, "invalid", "fencing_token must be at most 36 bytes");
  }
  // The body holds the request's place in the in-flight budget until the
  // answer; its decoded records may take more room than it: that too.
  if (const size_t decoded = DecodedBytes(in.records);
      decoded > req.body.size() && !c.ex->TakeBudget(decoded - req.body.size())) {
    return c.Fail(ResourceExhausted(
        "the append's records take {} bytes decoded, more than the server's memory for requests "
        "(--http-max-in-flight-mib) has left now; retry",
        decoded));
  }
  const std::string* pid = req.Header("weir-producer-id");
  const std::string* pepoch = req.Header("weir-producer-epoch");
  const std::string* pseq = req.Header("weir-producer-seq");
  if (pid || pepoch || pseq) {
    if (!pid || !pepoch || !pseq) {
      throw BadRequest{"weir-producer-id, weir-producer-epoch and weir-producer-seq go together", "bad_header"};
    }
    uint64_t id = ParseU64(*pid, "weir-producer-id", "bad_header");
    uint64_t epoch = ParseU64(*pepoch, "weir-producer-epoch", "bad_header");
    uint64_t seq = ParseU64(*pseq, "weir-producer-seq", "bad_header");
    // Stored batches carry the id as Kafka's signed int64.
    if (id > INT64_MAX) throw BadRequest{"weir-producer-id must be at most 9223372036854775807", "bad_header"};
    if (epoch > INT16_MAX) throw BadRequest{"weir-producer-epoch must be at most 32767", "bad_header"};
    if (seq > INT32_MAX) throw BadRequest{"weir-producer-seq must be at most 2147483647", "bad_header"};
    in.options.producer = log::ProducerRef{id, static_cast<int16_t>(epoch), static_cast<int32_t>(seq)};
  }
  size_t records = in.records.size();
  size_t bytes = 0;
  for (const auto& r : in.records) bytes += log::MeteredBytes(r);
  bool proto_out = WantsProto(req);
  if (in.options.producer && !engine_->KnowsProducerId(in.options.producer->id)) {
    // An id this process has not seen allocated (another node's, or none):
    // the metastore says, off this I/O thread. An id never allocated could
    // later be a Kafka producer's, whose batches its window would then take
    // for duplicates.
    auto held = std::make_shared<AppendInput>(std::move(in));
    auto check_then_append = [this, c, stream, held, proto_out, records, bytes] {
      const uint64_t id = held->options.producer->id;
      auto allocated = engine_->ProducerIdAllocated(id);
      if (!allocated.ok()) return c.Fail(allocated.status());
      if (!*allocated) {
        return c.Error(400, "bad_header",
                       fmt::format("weir-producer-id {} was never allocated: POST /v1/producers gives one", id));
      }
      Ctx on_worker = c;
      on_worker.on_worker = true;
      AppendToStream(on_worker, stream, std::move(*held), proto_out, records, bytes);
    };
    if (c.on_worker) return check_then_append();
    c.ex->PostInOrder(std::move(check_then_append));
    return;
  }
  AppendToStream(c, stream, std::move(in), proto_out, records, bytes);
}

void RestApi::AppendToStream(const Ctx& c, const std::string& stream, AppendInput in, bool proto_out, size_t records,
                             size_t bytes) {
  if (!engine_->HasStream(c.basin, stream)) {
    // The basin may create it (S2's create_stream_on_append): a metastore
    // write, kept off this I/O thread. An append that is invalid anyway, or
    // that a new stream would refuse (match_seq_num, fencing token, producer
    // sequence), creates nothing: it gets the new stream's answer.
    if (Status st = engine_->CheckAppendRecords(in.records); !st.ok()) return c.Fail(st);
    auto held = std::make_shared<AppendInput>(std::move(in));
    auto create_then_submit = [this, c, stream, held, proto_out, records, bytes] {
      std::optional<log::AppendOutcome> refused;
      auto created = engine_->CreateIfConfigured(
          c.basin, stream, log::Engine::AutoCreate::kOnAppend,
          [&](const metastore::StreamConfig& config) {
            // Asked only when the basin creates it (else the append's own 404).
            refused = log::Engine::RefusedByANewStream(held->options, records);
            if (refused) return refused->status;
            return log::CheckClientTimestamps(config, held->records);
          },
          c.create_config);
      if (refused) return c.Send(c.AppendFailure(*refused));
      if (!created.ok() && created.status().code() != Code::kNotFound) return c.Fail(created.status());
      Ctx on_worker = c;  // this runs on a worker: admission may wait for room
      on_worker.on_worker = true;
      SubmitAppend(on_worker, stream, std::move(*held), proto_out, records, bytes);
    };
    // On a worker already (in the connection's order, for HTTP/2): here and
    // now, so no later request of the connection overtakes it.
    if (c.on_worker) return create_then_submit();
    c.ex->PostInOrder(std::move(create_then_submit));
    return;
  }
  SubmitAppend(c, stream, std::move(in), proto_out, records, bytes);
}

void RestApi::SubmitAppend(const Ctx& c, const std::string& stream, AppendInput in, bool proto_out, size_t records,
                           size_t bytes) {
  const size_t room = log::Engine::AdmissionBytes(in.records);
  if (!c.on_worker) {
    // On the I/O thread only when admission looked free (Handle, by the
    // body's size): room taken now. Should there be none (others filled the
    // pool meanwhile, or the records count more than their body), the
    // append moves to a worker, in the connection's order, and waits there
    // as if admission had looked full (it was answered 429 at once).
    if (auto ticket = engine_->TryAdmission(room, 1)) {
      in.options.ticket = std::move(ticket);
      return AppendNow(c, stream, std::move(in), proto_out, records, bytes);
    }
    auto held = std::make_shared<AppendInput>(std::move(in));
    c.ex->PostInOrder([this, c, stream, held, proto_out, records, bytes] {
      // A client gone meanwhile gets no append (its retry would be a second copy).
      if (c.ex->closed()) return c.Error(503, "unavailable", "the client went away");
      Ctx on_worker = c;
      on_worker.on_worker = true;
      SubmitAppend(on_worker, stream, std::move(*held), proto_out, records, bytes);
    });
    return;
  }
  // On a worker, room taken now (held by the ticket: a look then an append
  // would leave the worker waiting should others take the room in between)
  // or waited for without holding the worker (the pool serves every
  // connection's reads and appends): the connection's later in-order work
  // waits instead (HTTP/2; HTTP/1.1 sends no request meanwhile). The append
  // itself never waits (an append too large for the pool is refused).
  if (auto ticket = engine_->TryAdmission(room, 1)) {
    in.options.ticket = std::move(ticket);
    return AppendNow(c, stream, std::move(in), proto_out, records, bytes);
  }
  // A producer's retry of an append its window holds needs no room: answered
  // (or queued behind its original) now, not after the wait.
  if (in.options.producer) {
    log::AppendCallback answer = AppendAnswer(c, proto_out, records, bytes);
    if (engine_->AnswerRetriedAppend(c.basin, stream, in.records, in.options, answer)) return;
  }
  auto suspended = c.ex->SuspendInOrder();
  auto held = std::make_shared<AppendInput>(std::move(in));
  using Wait = log::Engine::AdmissionWait;
  engine_->WhenAdmissible(
      room, 1, Now() + engine_->admission_timeout(),
      [ex = c.ex](Duration delay, std::function<void()> fn) { ex->After(delay, std::move(fn)); },
      [ex = c.ex] { return ex->closed(); },
      [this, c, stream, held, proto_out, records, bytes, suspended](Wait how,
                                                                     std::shared_ptr<log::AdmissionTicket> ticket) {
        suspended->Resume([this, c, stream, held, proto_out, records, bytes, how, ticket = std::move(ticket)] {
          // A client gone meanwhile gets no append (its retry would be a second copy).
          if (how == Wait::kAbandoned) return c.Error(503, "unavailable", "the client went away");
          // Room held for it, or (expired) admitted now or refused, as a
          // wait that ran out.
          held->options.ticket = ticket;
          AppendNow(c, stream, std::move(*held), proto_out, records, bytes);
        });
      });
}

void RestApi::AppendNow(const Ctx& c, const std::string& stream, AppendInput in, bool proto_out, size_t records,
                        size_t bytes) {
  in.options.may_wait = false;  // room held by its ticket, or none now: it is refused at once
  engine_->AppendAsync(c.basin, stream, std::move(in.records), in.options, AppendAnswer(c, proto_out, records, bytes));
}

log::AppendCallback RestApi::AppendAnswer(const Ctx& c, bool proto_out, size_t records, size_t bytes) {
  return [c, proto_out, records, bytes](log::AppendOutcome o) {
    if (!o.status.ok() && o.status.code() == Code::kNotFound) {
      // Telling a missing basin asks the metastore: not on a WAL or I/O thread.
      return c.ex->Post([c, o] { c.Send(c.AppendFailure(o)); });
    }
    if (!o.status.ok()) return c.Send(c.AppendFailure(o));
    const auto& a = o.ack;
    c.Acked(a, records, bytes);
    if (proto_out) return c.Send(Response{200, "application/protobuf", ProtoAck(a), {}});
    // The hot path: formatted directly rather than through a JSON tree.
    auto first = std::max<int64_t>(a.first_timestamp_ms, 0), last = std::max<int64_t>(a.last_timestamp_ms, 0);
    auto tail_ts = std::max<int64_t>(a.tail_timestamp_ms, 0);
    c.Send(Response{200, "application/json",
                    fmt::format(R"({{"start":{{"seq_num":{},"timestamp":{}}},"end":{{"seq_num":{},"timestamp":{}}},)"
                                R"("tail":{{"seq_num":{},"timestamp":{}}},"duplicated":{}}})",
                                a.start_offset, first, a.end_offset, last, a.tail, tail_ts, a.duplicated),
                    {}});
  };
}

// ---- Reads ------------------------------------------------------------------

// A read that may wait: a long poll (one response), or a session (many
// batches) as SSE events or S2S frames. Steps run on worker threads; between
// steps it waits on a tail watch and a timer tick, whichever comes first.
// Owned by the callbacks that hold it.
class RestApi::ReadSession : public std::enable_shared_from_this<RestApi::ReadSession> {
 public:
  enum class Mode { kUnary, kSse, kS2s };
  ReadSession(RestApi* api, Ctx c, std::string stream, ReadParams p, Mode mode)
      : api_(api),
        c_(std::move(c)),
        stream_(std::move(stream)),
        p_(std::move(p)),
        sse_(mode != Mode::kUnary),
        s2s_(mode == Mode::kS2s) {}

  // Resume point of an SSE session: "SEQ,COUNT,BYTES", SEQ being the last
  // record delivered.
  void Resume(const std::string& last_event_id) {
    std::vector<uint64_t> v;
    std::string_view s = last_event_id;
    while (true) {
      auto comma = s.find(',');
      v.push_back(ParseU64(s.substr(0, comma), "each of Last-Event-ID's SEQ,COUNT,BYTES", "bad_header"));
      if (comma == std::string_view::npos) break;
      s.remove_prefix(comma + 1);
    }
    if (v.size() != 3) throw BadRequest{"Last-Event-ID must be SEQ,COUNT,BYTES", "bad_header"};
    // As S2: the next record, under the request's own clamp (a stream now
    // shorter than the id says, one made again, answers 416).
    p_.start = {log::ReadStart::kOffset, v[0] == UINT64_MAX ? v[0] : v[0] + 1};
    sent_records_ = v[1];
    sent_bytes_ = v[2];
  }

  // S2S batch frames of 1 KiB or more go out compressed (1 zstd, 2 gzip).
  void CompressFrames(int compression) { s2s_compression_ = compression; }

  void Start() {
    if (p_.wait_s) wait_ = std::chrono::seconds(*p_.wait_s);
    last_record_ = Now();
    if (sse_) {
      counted_ = true;
      api_->metrics_.read_sessions++;
    }
    if (sse_ || (p_.wait_s && *p_.wait_s > 0)) api_->TrackRead(shared_from_this());
    Step();
  }

  // A drain began: a wait at the tail ends now (its Step answers or ends
  // the session with server_draining), not at its next tick. Any thread.
  void WakeForDrain() {
    uint64_t watch = 0;
    {
      std::lock_guard lk(mu_);
      if (!waiting_ || watch_id_ == 0) return;  // not waiting, or not yet watching: its tick looks
      waiting_ = false;
      watch = watch_id_;
    }
    api_->engine_->UnwatchTail(c_.basin, stream_, watch);
    auto self = shared_from_this();
    c_.ex->Post([self] { self->Step(); });
  }

  ~ReadSession() {
    if (counted_) api_->metrics_.read_sessions--;
    if (polling_) api_->metrics_.long_polls--;
  }

 private:
  // One read; then answer, send an event, or wait.
  void Step() {
    // A long poll whose client is gone (an HTTP/2 stream reset, say): nothing
    // more to read for it. Answered all the same (into the void), as an
    // exchange must be.
    if (!sse_ && c_.ex->closed()) return c_.Error(503, "unavailable", "the client went away");
    if (sse_ && (c_.ex->closed() || api_->draining_)) {
      // server_draining, as for requests: a retriable code (S2's SDKs retry it with their backoff).
      // Before the session's headers, as a plain answer.
      if (!started_) {
        return c_.Error(503, "server_draining", "the server is shutting down", {{"Retry-After", "1"}});
      }
      return Finish(api_->draining_ ? Unavailable("the server is shutting down") : Status::Ok(), "server_draining");
    }
    size_t max_records = 1000, max_bytes = 1 << 20;
    bool exhausted = false;  // the count or bytes limit allows no more records
    if (p_.count) {
      exhausted |= *p_.count <= sent_records_;
      if (!exhausted) max_records = std::min<uint64_t>(max_records, *p_.count - sent_records_);
    }
    if (p_.bytes) {
      exhausted |= *p_.bytes <= sent_bytes_;
      if (!exhausted) max_bytes = std::min<uint64_t>(max_bytes, *p_.bytes - sent_bytes_);
    }
    // A session that used its limit up ends. Before the first answer (a limit
    // of 0, or a resume at the limit) the read goes on as S2's does, 416 at
    // the tail and otherwise nothing: one record is read, then dropped.
    if (exhausted && started_) return Done();
    if (exhausted) max_records = 1;
    if (!exhausted) {
      // Responses clients have not read yet share --http-max-unwritten-mib
      // (and each connection a share of it): a read takes at most half of
      // what is left (its JSON may be a third larger than the records), and
      // with little left it waits; but a long poll whose time is up, or a
      // read during a drain, answers now (with at least one record).
      const size_t room = c_.ex->ResponseRoom();
      bool answer_now = !sse_ && (api_->draining_ || (polling_ && Now() >= deadline()));
      // Nothing to send yet (a session or long poll at the tail): it waits
      // at the tail as usual, not for room.
      if (room < kMinReadRoom && !answer_now) answer_now = StartsAtTail();
      if (room < kMinReadRoom && !answer_now) return WaitForRoom();
      room_wait_since_.reset();
      room_poll_ = kRoomPoll;
      max_bytes = std::min(max_bytes, std::max<size_t>(room / 2, 1));
    }
    if (!started_ && p_.start.kind == log::ReadStart::kTimestamp) {
      // As S2: a start timestamp past the tail's is unsatisfiable too, or
      // with `clamp` a start at the tail.
      auto s = api_->engine_->GetStream(c_.basin, stream_);
      if (!s.ok()) return c_.Fail(s.status(), "stream_not_found");
      if (p_.start.value > static_cast<uint64_t>(std::max<int64_t>(s->tail_timestamp_ms, 0))) {
        if (!p_.clamp) return Unsatisfiable(s->tail, s->tail_timestamp_ms);
        p_.start = {log::ReadStart::kOffset, s->tail};
      }
      // Every record is shown at 0 or later (one stored before 1970, or as
      // Kafka's -1, at 0): from 0 is from the first record (an empty
      // stream's read from 0 stays one by time, as before: not the tail).
      if (p_.start.kind == log::ReadStart::kTimestamp && p_.start.value == 0 && s->tail > 0) {
        p_.start = {log::ReadStart::kOffset, 0};
      }
    }
    // Pinned to the stream its first read found: one deleted and created
    // again under its name is another stream (the session ends, not-found).
    auto r = api_->engine_->Read(c_.basin, stream_, p_.start, max_records, max_bytes, std::nullopt, stream_id_);
    if (!r.ok() && r.status().code() == Code::kOutOfRange && (p_.clamp || started_)) {
      auto tail = api_->engine_->CheckTail(c_.basin, stream_);
      if (tail.ok()) {
        p_.start = {log::ReadStart::kOffset, *tail};
        r = api_->engine_->Read(c_.basin, stream_, p_.start, max_records, max_bytes, std::nullopt, stream_id_);
      }
    }
    if (r.ok()) stream_id_ = r->stream_id;
    if (!r.ok()) {
      if (r.status().code() == Code::kOutOfRange && !started_) {
        auto s = api_->engine_->GetStream(c_.basin, stream_);
        if (!s.ok()) return c_.Fail(s.status(), "stream_not_found");
        return Unsatisfiable(s->tail, s->tail_timestamp_ms);
      }
      if (!started_) return c_.Fail(r.status(), "stream_not_found");
      return Finish(r.status());
    }
    // As S2: a read that starts at the tail and may not wait for more is
    // unsatisfiable (a unary read without `wait`, a bounded session without
    // it). One that starts below the tail and finds nothing (trimmed or
    // expired records, or none at or after its time) is an empty answer.
    if (!started_ && r->records.empty() && !MayFollow() && StartIsTheTail(r->tail)) {
      return Unsatisfiable(r->tail, r->tail_timestamp_ms);
    }
    // Later steps continue where this one ended: a start relative to the
    // tail or by time is resolved once.
    if (r->records.empty()) p_.start = {log::ReadStart::kOffset, r->tail};
    bool done = CutAtUntil(&r->records, p_.until);
    bool trimmed = false;  // records left out by the limits: not caught up
    if (exhausted) {
      // As S2: at the tail a read that may wait does, until a record comes
      // (then ends, empty) or the wait is over.
      trimmed = !r->records.empty();
      r->records.clear();
      done = trimmed || !MayFollow();
    }
    // As S2, the bytes limit is never exceeded (the engine returns a first
    // record whatever its size): records past it are left for the next step,
    // and a first record over what the client's limit has left ends the read.
    if (p_.bytes && !r->records.empty()) {
      size_t used = 0, keep = 0;
      for (const auto& rec : r->records) {
        const size_t b = log::ServedMeteredBytes(rec.record);
        if (used + b > max_bytes) break;
        used += b;
        ++keep;
      }
      if (keep == 0) {
        // Over the step's cap (1 MiB; a record from Kafka can be larger) but
        // within the client's limit, or with none: one record, as the engine returns it.
        if (p_.bytes_asked && log::ServedMeteredBytes(r->records.front().record) > *p_.bytes_asked - sent_bytes_) {
          done = true;
        } else {
          keep = 1;
        }
      }
      if (keep < r->records.size()) {
        r->records.resize(keep);
        trimmed = true;
      }
    }
    // An S2S frame holds at most 2 MiB, however compressed (S2's SDK refuses
    // more): records past it wait for the next step, and a record over it
    // alone (a large one written through Kafka) ends the session.
    std::string s2s_message;
    if (s2s_ && !r->records.empty()) {
      size_t fit = 0;
      s2s_message = EncodeProtoReadBatch(r->records, TailPosition(*r), kS2sMaxFrameBytes - 1, &fit);
      if (fit == 0) {
        Status st = InvalidArgument(
            "record {} is {} bytes, more than an S2S frame holds ({} bytes); read it with a unary read or an SSE "
            "session",
            r->records.front().offset, log::ServedMeteredBytes(r->records.front().record), kS2sMaxFrameBytes - 1);
        if (!started_) return c_.Fail(st);
        return Finish(st);
      }
      if (fit < r->records.size()) {
        r->records.resize(fit);
        trimmed = true;
        done = false;  // what was left out comes next
      }
    }
    size_t bytes = 0;
    for (const auto& rec : r->records) bytes += log::ServedMeteredBytes(rec.record);
    if (!r->records.empty()) {
      p_.start = {log::ReadStart::kOffset, r->records.back().offset + 1};
      sent_records_ += r->records.size();
      following_ = false;
      sent_bytes_ += bytes;
      last_record_ = Now();
      api_->metrics_.read_records += r->records.size();
      api_->metrics_.read_bytes += bytes;
    }
    bool caught_up = !trimmed && (r->records.empty() || r->records.back().offset + 1 >= r->tail);
    if (!sse_) {
      bool expired = !p_.wait_s || *p_.wait_s == 0 || Now() >= deadline();
      if (!r->records.empty() || done || expired || api_->draining_) return Answer(*r, caught_up);
      return Wait(r->tail, r->tail_timestamp_ms);
    }
    if (!started_) Begin();
    if (!r->records.empty()) {
      auto self = shared_from_this();
      std::string event;
      if (s2s_) {  // every frame carries the tail: S2's SDK ends a session that sees none for 20 s
        event = S2sFrameOf(s2s_message, s2s_compression_);
      } else {
        event = fmt::format("event: batch\nid: {},{},{}\ndata: {}\n\n", p_.start.value - 1, sent_records_, sent_bytes_,
                            BatchJson(*r, caught_up).dump(-1, ' ', false, Json::error_handler_t::replace));
      }
      c_.ex->Write(std::move(event), [self, done](bool ok) {
        if (!ok) return self->Finish(Status::Ok());
        if (done) return self->Done();
        self->Step();
      });
      return;
    }
    if (done) return Done();
    // Its wait may have run out before its first look at the tail (a loaded
    // server): it still says it caught up, then ends.
    const bool expired = wait_ && Now() - last_record_ >= *wait_;
    if (expired && *wait_ <= Duration::zero()) return Done();  // wait 0 never follows: no heartbeat
    if (!following_) {
      // As S2: a heartbeat (the tail) whenever the session turns to
      // following, which tells a client it caught up (S2's SDK pins a
      // tail_offset or timestamp start on it before it resumes).
      following_ = true;
      {
        std::lock_guard lk(mu_);  // a Tick of the wait just ended may read it
        last_ping_ = Now();
      }
      Heartbeat(r->tail, r->tail_timestamp_ms);
    }
    if (expired) return Done();
    Wait(r->tail, r->tail_timestamp_ms);
  }

  // Little response room left: steps again soon; after kRoomWaitLimit of
  // that, a retriable 503 (a session ends with it).
  void WaitForRoom() {
    if (!room_wait_since_) {
      room_wait_since_ = Now();
      api_->metrics_.read_room_waits++;
    }
    if (Now() - *room_wait_since_ >= kRoomWaitLimit) {
      const std::string message = fmt::format(
          "responses not yet read by their clients fill the room for them (this connection's share of "
          "--http-max-unwritten-mib, or all of it); retry");
      if (!started_) return c_.Error(503, "unavailable", message, {{"Retry-After", "1"}});
      return Finish(Unavailable("{}", message));
    }
    // Looks again sooner at first, then less often (up to 10 times a
    // second): many reads may wait at once.
    auto self = shared_from_this();
    c_.ex->After(room_poll_, [self] { self->Step(); });
    room_poll_ = std::min<Duration>(room_poll_ * 2, kRoomPollMax);
  }

  // S2S: a batch of no records, with the tail; SSE: a ping with the tail.
  void Heartbeat(std::optional<uint64_t> tail, int64_t tail_timestamp_ms) {
    if (s2s_) {
      if (tail) c_.ex->Write(EncodeS2sFrame(EncodeProtoReadBatch({}, ProtoPosition(*tail, tail_timestamp_ms))), nullptr);
      return;
    }
    Json ping{{"timestamp", WallMillis()}};
    if (tail) ping["tail"] = Position(*tail, tail_timestamp_ms);
    c_.ex->Write(fmt::format("event: ping\ndata: {}\n\n", ping.dump()), nullptr);
  }

  TimePoint deadline() const { return start_ + std::chrono::seconds(p_.wait_s.value_or(0)); }

  // Whether the next read starts at the stream's tail (has nothing to send):
  // an offset at or past it, a tail offset of 0, a time later than the
  // newest record's, or any start on a stream holding no record (empty, or
  // trimmed to its tail).
  bool StartsAtTail() const {
    auto s = api_->engine_->GetStream(c_.basin, stream_);
    if (!s.ok()) return false;
    if (s->log_start >= s->tail) return true;  // trimmed or expired up to the tail: nothing to read
    switch (p_.start.kind) {
      case log::ReadStart::kOffset:
        return p_.start.value >= s->tail;
      case log::ReadStart::kTailOffset:
        return p_.start.value == 0 || s->tail == 0;
      case log::ReadStart::kTimestamp:
        return p_.start.value > static_cast<uint64_t>(std::max<int64_t>(s->tail_timestamp_ms, 0));
    }
    return false;
  }

  // Whether the read's start, as the client gave it, is `tail` (S2 resolves
  // a tail offset to an offset; a start by time is never the tail here: one
  // past the tail's time was refused before reading).
  bool StartIsTheTail(uint64_t tail) const {
    switch (p_.start.kind) {
      case log::ReadStart::kOffset:
        return p_.start.value >= tail;
      case log::ReadStart::kTailOffset:
        return p_.start.value == 0 || tail == 0;
      case log::ReadStart::kTimestamp:
        return false;
    }
    return false;
  }

  // Whether the read may wait for records past the tail (S2's may_follow).
  bool MayFollow() const {
    if (p_.wait_s && *p_.wait_s > 0) return true;
    return sse_ && !p_.count && !p_.bytes && !p_.until;
  }

  // 416 with the tail, S2's TailResponse.
  void Unsatisfiable(uint64_t tail, int64_t tail_timestamp_ms) {
    c_.Reply(416, Json{{"tail", Position(tail, tail_timestamp_ms)}});
  }

  Json BatchJson(const log::ReadResult& r, bool caught_up) const {
    Json records = Json::array();
    for (const auto& rec : r.records) records.push_back(RecordJson(rec, p_.format));
    Json batch{{"records", std::move(records)}};
    if (caught_up) batch["tail"] = Position(r.tail, r.tail_timestamp_ms);
    return batch;
  }

  // A position for S2's protobuf messages (timestamps are unsigned there).
  static StreamPosition ProtoPosition(uint64_t seq_num, int64_t timestamp_ms) {
    return StreamPosition{seq_num, static_cast<uint64_t>(std::max<int64_t>(timestamp_ms, 0))};
  }
  static StreamPosition TailPosition(const log::ReadResult& r) { return ProtoPosition(r.tail, r.tail_timestamp_ms); }

  void Answer(const log::ReadResult& r, bool caught_up) {
    api_->metrics_.reads++;
    if (polling_) {
      polling_ = false;
      api_->metrics_.long_polls--;
    }
    if (p_.proto) {
      std::optional<StreamPosition> tail;
      if (caught_up) tail = TailPosition(r);
      return c_.Send(Response{200, "application/protobuf", EncodeProtoReadBatch(r.records, tail), {}});
    }
    c_.Reply(200, BatchJson(r, caught_up));
  }

  void Begin() {
    started_ = true;
    api_->metrics_.reads++;
    c_.ex->BeginStream(200, s2s_ ? "s2s/proto" : "text/event-stream", {});
  }

  // Waits for the tail to pass `tail` (where the session is: everything
  // before it was sent), the next timer tick, or the deadline.
  void Wait(uint64_t tail, int64_t tail_timestamp_ms) {
    auto self = shared_from_this();
    if (!sse_ && !polling_) {
      polling_ = true;
      api_->metrics_.long_polls++;
    }
    uint64_t gen;
    {
      std::lock_guard lk(mu_);
      waiting_ = true;
      gen = ++wait_gen_;
      watch_id_ = 0;  // set below, once watching
      waited_tail_ = tail;
      waited_tail_timestamp_ms_ = tail_timestamp_ms;
    }
    // Only this wait's end may step: a watch of an earlier wait can fire
    // late (the engine took its callback just before an unwatch).
    auto id = api_->engine_->WatchTail(
        c_.basin, stream_, tail,
        [self, gen] {
          if (self->TakeWait(gen)) self->c_.ex->Post([self] { self->Step(); });
        },
        stream_id_);
    if (!id.ok()) {
      if (!TakeWait(gen)) return;
      if (!started_) return c_.Fail(id.status(), "stream_not_found");
      return Finish(id.status());
    }
    if (*id == 0) {  // the tail moved already
      if (!TakeWait(gen)) return;
      return c_.ex->Post([self] { self->Step(); });
    }
    bool start_ticking = false;
    {
      std::lock_guard lk(mu_);
      // Fired already (its Step may be waiting anew, under another id).
      if (!waiting_ || wait_gen_ != gen) return;
      watch_id_ = *id;
      start_ticking = !ticking_;
      ticking_ = true;
    }
    if (start_ticking) Tick();
    // A drain that walked the sessions before this wait was watching: seen
    // here (draining_ is set before the walk).
    if (api_->draining_) WakeForDrain();
  }

  // Once a second (or at the deadline, if sooner) while the session waits: a
  // ping when due, the deadline, the client, draining. One timer at a time
  // per session: a tick that finds no wait ends the chain, and a wait that
  // finds none running starts it (a session woken many times a second
  // leaves no timer behind per wake).
  void Tick() {
    auto self = shared_from_this();
    Duration delay = std::chrono::seconds(1);
    if (!sse_) delay = std::clamp<Duration>(deadline() - Now(), Duration::zero(), delay);
    c_.ex->After(delay, [self] {
      TimePoint last_record;
      const auto now = Now();
      uint64_t gen = 0;
      {
        std::lock_guard lk(self->mu_);
        if (!self->waiting_) {
          self->ticking_ = false;
          return;
        }
        // A wait not yet watching (Wait is between its locks): the next tick.
        if (self->watch_id_ != 0) {
          gen = self->wait_gen_;
          // Read while the wait lasts: once it ends, Step writes it (unlocked).
          last_record = self->last_record_;
          if (self->sse_ && now - self->last_ping_ >= self->api_->options_.ping_interval) {
            self->last_ping_ = now;
            // Where the session is, not the stream's tail now: records past
            // it may be on their way to the client, and a tail ahead of them
            // would tell it that it caught up before they arrive. Written
            // under mu_ (Write only queues): a wake ends the wait under it
            // too, so records read after that wait go out after the ping,
            // never before it with an older tail.
            self->Heartbeat(self->waited_tail_, self->waited_tail_timestamp_ms_);
          }
        }
      }
      if (gen == 0) return self->Tick();
      bool stop = self->api_->draining_ || self->c_.ex->closed() || (!self->sse_ && now >= self->deadline()) ||
                  (self->sse_ && self->wait_ && now - last_record >= *self->wait_);
      if (stop) {
        uint64_t watch;
        {
          std::lock_guard lk(self->mu_);
          if (!self->waiting_ || self->wait_gen_ != gen) {
            // That wait ended meanwhile; a new one keeps this chain.
            if (self->waiting_) return self->Tick();
            self->ticking_ = false;
            return;
          }
          self->waiting_ = false;
          self->ticking_ = false;
          watch = self->watch_id_;
        }
        self->api_->engine_->UnwatchTail(self->c_.basin, self->stream_, watch);
        return self->Step();
      }
      self->Tick();
    });
  }

  // Ends wait `gen` if it is the one going on; whether it was.
  bool TakeWait(uint64_t gen) {
    std::lock_guard lk(mu_);
    if (!waiting_ || wait_gen_ != gen) return false;
    waiting_ = false;
    return true;
  }

  // The session reached its count, bytes or until limit (or its wait bound).
  void Done() {
    if (!sse_) return;
    if (!started_) Begin();  // e.g. a session resumed at its count limit
    if (!s2s_) c_.ex->Write("data: [DONE]\n\n", nullptr);
    c_.ex->End();
  }

  // Ends the session; with an error event (S2's ErrorInfo) unless `error` is
  // OK. `code` overrides the one the status maps to.
  void Finish(const Status& error, std::string_view code = {}) {
    if (!error.ok()) {
      auto [status, mapped] = ErrorCodeFor(error, "stream_not_found");
      if (code.empty()) code = mapped;
      std::string body =
          Json{{"code", code}, {"message", error.message()}}.dump(-1, ' ', false, Json::error_handler_t::replace);
      if (s2s_) {
        c_.ex->Write(EncodeS2sTerminal(status, body), nullptr);
      } else {
        c_.ex->Write(fmt::format("event: error\ndata: {}\n\n", body), nullptr);
      }
    }
    c_.ex->End();
  }

  RestApi* api_;
  Ctx c_;
  std::string stream_;
  ReadParams p_;
  bool sse_;  // a session: SSE or S2S
  bool s2s_;
  std::optional<TimePoint> room_wait_since_;  // this step has waited for response room since
  Duration room_poll_ = kRoomPoll;            // its next look, after that
  int s2s_compression_ = 0;  // of S2S batch frames: 0 none, 1 zstd, 2 gzip
  bool started_ = false;  // session headers sent (steps run one at a time)
  std::optional<uint64_t> stream_id_;  // the stream the first read found (Engine::Read pins it)
  bool counted_ = false;  // in metrics_.read_sessions
  bool following_ = false;  // waiting at the tail since the last records sent (its heartbeat is sent)
  bool polling_ = false;  // in metrics_.long_polls (steps run one at a time)
  TimePoint start_ = Now();
  TimePoint last_record_;
  TimePoint last_ping_ = Now();  // mu_
  std::optional<Duration> wait_;
  uint64_t sent_records_ = 0, sent_bytes_ = 0;
  std::mutex mu_;
  bool waiting_ = false;
  uint64_t wait_gen_ = 0;  // which wait is going on
  bool ticking_ = false;   // a Tick timer is set
  uint64_t waited_tail_ = 0;  // where the wait began: the position pings tell
  int64_t waited_tail_timestamp_ms_ = 0;
  uint64_t watch_id_ = 0;
};

void RestApi::TrackRead(const std::shared_ptr<ReadSession>& s) {
  {
    std::lock_guard lk(sessions_mu_);
    if (read_sessions_.size() >= compact_reads_at_) {
      std::erase_if(read_sessions_, [](const std::weak_ptr<ReadSession>& w) { return w.expired(); });
      compact_reads_at_ = std::max<size_t>(64, 2 * read_sessions_.size());
    }
    read_sessions_.push_back(s);
  }
}

void RestApi::WakeReadsForDrain() {
  std::vector<std::shared_ptr<ReadSession>> open;
  {
    std::lock_guard lk(sessions_mu_);
    for (auto& w : read_sessions_) {
      if (auto s = w.lock()) open.push_back(std::move(s));
    }
  }
  for (auto& s : open) s->WakeForDrain();
}
void RestApi::Read(Request& req, const Ctx& c, const std::string& stream) {
  ReadParams p = ParseReadParams(req);
  if (p.start.kind == log::ReadStart::kTimestamp && p.until && p.start.value >= *p.until) {
    return c.Error(422, "invalid", "the start timestamp must be before until");
  }
  const std::string* ctype = req.Header("content-type");
  using Mode = ReadSession::Mode;
  Mode mode = Mode::kUnary;
  if (ctype && EqualsLowercase(BareMediaType(*ctype), "s2s/proto")) {
    mode = Mode::kS2s;
  } else if (EqualsLowercase(FirstAccepted(req), "text/event-stream")) {
    mode = Mode::kSse;
  }
  bool sse = mode != Mode::kUnary;
  if (!sse) {
    // Non-streaming reads are bounded: 1000 records, 1 MiB at most. A limit
    // of 0 is one (as S2: nothing is returned).
    p.count = std::min<uint64_t>(p.count.value_or(1000), 1000);
    p.bytes = std::min<uint64_t>(p.bytes.value_or(1 << 20), 1 << 20);
    if (p.wait_s) p.wait_s = std::min<uint64_t>(*p.wait_s, 60);  // a long poll waits 60 s at most
  } else {
    // As S2: a bounded session does not wait past the tail unless asked to.
    if (!p.wait_s && (p.count || p.bytes || p.until)) p.wait_s = 0;
  }
  auto session = std::make_shared<ReadSession>(this, c, stream, std::move(p), mode);  // TrackRead at Start
  // Bad input is refused before anything changes (the stream created on read).
  if (const std::string* id = req.Header("last-event-id"); mode == Mode::kSse && id) session->Resume(*id);
  if (mode == Mode::kS2s) session->CompressFrames(S2sCompression(req));
  if (Status st = CreateOnRead(c, stream); !st.ok()) return c.Fail(st);
  session->Start();
}

Status RestApi::CreateOnRead(const Ctx& c, const std::string& stream) {
  if (c.head) return Status::Ok();  // a missing stream is 404, as if create_stream_on_read were off
  if (engine_->GetStream(c.basin, stream).status().code() != Code::kNotFound) return Status::Ok();
  auto created = engine_->CreateIfConfigured(c.basin, stream, log::Engine::AutoCreate::kOnRead, nullptr, c.create_config);
  // A missing basin or stream is reported by the read itself.
  return created.ok() || created.status().code() == Code::kNotFound ? Status::Ok() : created.status();
}

void RestApi::Tail(const Ctx& c, const std::string& stream) {
  if (Status st = CreateOnRead(c, stream); !st.ok()) return c.Fail(st);
  auto s = engine_->GetStream(c.basin, stream);
  if (!s.ok()) return c.Fail(s.status(), "stream_not_found");
  c.Reply(200, Json{{"tail", Position(s->tail, s->tail_timestamp_ms)}});
}

void RestApi::Producers(const Ctx& c) {
  auto id = engine_->AllocateProducerId();
  if (!id.ok()) return c.Fail(id.status());
  c.Reply(201, Json{{"id", *id}, {"epoch", 0}});
}

// ---- Metrics ----------------------------------------------------------------

void PromCounter(std::string* out, std::string_view name, std::string_view help, double value) {
  *out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, value);
}

void PromGauge(std::string* out, std::string_view name, std::string_view help, double value) {
  *out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0} {2}\n", name, help, value);
}

void PromHistogramSeconds(std::string* out, std::string_view name, std::string_view help, const Histogram& h) {
  *out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  // Fixed exported buckets, in seconds; counts come from the fine-grained histogram.
  static constexpr double kBounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                       0.1,    0.25,  0.5,    1,     2.5,  5,     10};
  uint64_t total = 0;
  for (double b : kBounds) {
    // The fine bucket holding a bound ends a little above it (within 3 %):
    // its upper edge is the `le` exported, so each counts exactly the values
    // at or below it (the bound itself would miss those just under it).
    const uint64_t edge = Histogram::BucketUpperBound(Histogram::BucketOf(static_cast<uint64_t>(b * 1e9)));
    total = h.CountAtOrBelow(edge);
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, static_cast<double>(edge) / 1e9, total);
  }
  // Never below a finite bucket: a record counts in its bucket a moment
  // before it counts in the total.
  total = std::max(total, h.count());
  *out += fmt::format("{0}_bucket{{le=\"+Inf\"}} {1}\n{0}_sum {2}\n{0}_count {1}\n", name, total,
                      static_cast<double>(h.sum()) / 1e9);
}

void RestApi::Metrics(const Ctx& c) {
  std::string out;
  const auto& m = metrics_;
  PromCounter(&out, "weir_http_requests_total", "HTTP requests received", m.requests.load());
  out += "# HELP weir_http_responses_total HTTP responses by status class\n# TYPE weir_http_responses_total counter\n";
  out += fmt::format("weir_http_responses_total{{class=\"2xx\"}} {}\n", m.responses_2xx.load());
  out += fmt::format("weir_http_responses_total{{class=\"4xx\"}} {}\n", m.responses_4xx.load());
  out += fmt::format("weir_http_responses_total{{class=\"5xx\"}} {}\n", m.responses_5xx.load());
  PromCounter(&out, "weir_appends_total", "Acknowledged append requests", m.appends.load());
  PromCounter(&out, "weir_append_records_total", "Records in acknowledged appends", m.append_records.load());
  PromCounter(&out, "weir_append_bytes_total", "Metered bytes in acknowledged appends", m.append_bytes.load());
  PromCounter(&out, "weir_append_duplicates_total", "Producer retries answered with the original ack",
              m.append_duplicates.load());
  PromCounter(&out, "weir_backpressure_total", "Requests refused with 429", m.backpressure.load());
  PromCounter(&out, "weir_reads_total", "Read requests and sessions", m.reads.load());
  PromCounter(&out, "weir_read_records_total", "Records returned by reads", m.read_records.load());
  PromCounter(&out, "weir_read_bytes_total", "Metered bytes returned by reads", m.read_bytes.load());
  PromGauge(&out, "weir_read_sessions", "Open read sessions (SSE and S2S)", static_cast<double>(m.read_sessions.load()));
  PromGauge(&out, "weir_long_polls", "Unary reads waiting at the tail (long polls)",
            static_cast<double>(m.long_polls.load()));
  PromCounter(&out, "weir_http_read_room_waits_total",
              "Reads that waited for room among responses clients had not read (--http-max-unwritten-mib)",
              m.read_room_waits.load());
  PromGauge(&out, "weir_append_sessions", "Open S2S append sessions", static_cast<double>(m.append_sessions.load()));
  PromHistogramSeconds(&out, "weir_append_ack_seconds", "HTTP append latency, request to acknowledgement",
                       m.append_latency_ns);
  if (ready_ && render_metrics_) out += render_metrics_();
  c.Send(Response{200, "text/plain; version=0.0.4", std::move(out), {}});
}

}  // namespace weir::http
