#include "client/codec.h"

#include <nlohmann/json.hpp>

#include "base/base64.h"

namespace weir::client {

using json = nlohmann::json;

namespace {

// Parses `text` as JSON and runs `fn` on it; any parse or type error becomes
// an Internal status naming `what` (the server sent something unexpected).
template <typename T, typename Fn>
Result<T> WithJson(std::string_view text, std::string_view what, Fn&& fn) {
  try {
    json j = json::parse(text);
    return fn(j);
  } catch (const std::exception& e) {
    return Internal("unexpected {} from the server: {}", what, e.what());
  }
}

StreamPosition Position(const json& j) {
  return StreamPosition{j.at("seq_num").get<uint64_t>(), j.value("timestamp", uint64_t{0})};
}

// Decodes a base64 field or throws (caught by WithJson).
std::string Bytes(const json& j) {
  auto r = Base64Decode(j.get_ref<const std::string&>());
  if (!r.ok()) throw std::runtime_error(r.status().message());
  return std::move(r).value();
}

std::string Quoted(std::string_view s) { return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

Result<std::string> EncodeCreate(std::string_view key, std::string_view name, std::string_view config_json) {
  json body{{std::string(key), std::string(name)}};
  if (!config_json.empty()) {
    json config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) return InvalidArgument("{} config must be a JSON object", key);
    body["config"] = std::move(config);
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string EncodeAppendInput(const std::vector<AppendRecord>& records, const AppendOptions& options) {
  json recs = json::array();
  for (const auto& r : records) {
    json rec = {{"body", Base64Encode(r.body)}};
    if (!r.headers.empty()) {
      json hs = json::array();
      for (const auto& [name, value] : r.headers) hs.push_back({Base64Encode(name), Base64Encode(value)});
      rec["headers"] = std::move(hs);
    }
    if (r.timestamp) rec["timestamp"] = *r.timestamp;
    recs.push_back(std::move(rec));
  }
  json in = {{"records", std::move(recs)}};
  if (options.match_seq_num) in["match_seq_num"] = *options.match_seq_num;
  if (options.fencing_token) in["fencing_token"] = *options.fencing_token;
  return in.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<AppendAck> DecodeAppendAck(std::string_view text) {
  return WithJson<AppendAck>(text, "append ack", [](const json& j) {
    AppendAck ack;
    ack.start = Position(j.at("start"));
    ack.end = Position(j.at("end"));
    ack.tail = Position(j.at("tail"));
    ack.duplicated = j.value("duplicated", false);
    return ack;
  });
}

Result<ReadBatch> DecodeReadBatch(std::string_view text) {
  return WithJson<ReadBatch>(text, "read batch", [](const json& j) {
    ReadBatch batch;
    for (const auto& r : j.at("records")) {
      SequencedRecord rec;
      rec.seq_num = r.at("seq_num").get<uint64_t>();
      rec.timestamp = r.value("timestamp", uint64_t{0});
      if (r.contains("body") && !r["body"].is_null()) rec.body = Bytes(r["body"]);
      if (r.contains("headers") && !r["headers"].is_null()) {
        for (const auto& h : r["headers"]) rec.headers.emplace_back(Bytes(h.at(0)), Bytes(h.at(1)));
      }
      batch.records.push_back(std::move(rec));
    }
    if (j.contains("tail") && !j["tail"].is_null()) batch.tail = Position(j["tail"]);
    return batch;
  });
}

Result<StreamPosition> DecodeTail(std::string_view text) {
  return WithJson<StreamPosition>(text, "tail", [](const json& j) { return Position(j.at("tail")); });
}

Result<StreamConfig> DecodeStreamConfig(std::string_view text) {
  return WithJson<StreamConfig>(text, "stream config", [&](const json& j) {
    StreamConfig c;
    c.json = j.dump();
    c.storage_class = j.value("storage_class", "standard");
    c.retention_age_s = 7 * 24 * 3600;
    if (j.contains("retention_policy") && j["retention_policy"].is_object()) {
      const json& rp = j["retention_policy"];
      if (rp.contains("age")) {
        c.retention_age_s = rp["age"].get<int64_t>();
      } else if (rp.contains("infinite")) {
        c.retention_age_s.reset();
      }
    }
    c.timestamping_mode = "client-prefer";
    if (j.contains("timestamping") && j["timestamping"].is_object()) {
      const json& ts = j["timestamping"];
      if (ts.contains("mode") && ts["mode"].is_string()) c.timestamping_mode = ts["mode"].get<std::string>();
      if (ts.contains("uncapped") && ts["uncapped"].is_boolean()) c.timestamping_uncapped = ts["uncapped"].get<bool>();
    }
    if (j.contains("delete_on_empty") && j["delete_on_empty"].is_object()) {
      c.delete_on_empty_min_age_s = j["delete_on_empty"].value("min_age_secs", int64_t{0});
    }
    return c;
  });
}

Result<ProducerId> DecodeProducer(std::string_view text) {
  return WithJson<ProducerId>(text, "producer", [](const json& j) {
    return ProducerId{j.at("id").get<uint64_t>(), j.value("epoch", uint64_t{0})};
  });
}

Result<NamedInfo> DecodeNamedInfo(std::string_view text) {
  return WithJson<NamedInfo>(text, "info", [](const json& j) {
    return NamedInfo{j.at("name").get<std::string>(), j.value("created_at", "")};
  });
}

Result<std::vector<NamedInfo>> DecodeNamedList(std::string_view text, std::string_view key, bool* has_more) {
  return WithJson<std::vector<NamedInfo>>(text, "list", [&](const json& j) {
    std::vector<NamedInfo> out;
    for (const auto& e : j.at(std::string(key))) {
      out.push_back(NamedInfo{e.at("name").get<std::string>(), e.value("created_at", "")});
    }
    *has_more = j.value("has_more", false);
    return out;
  });
}

bool ErrorHasNoSideEffects(long http_status, std::string_view body) {
  if (http_status != 429 && http_status != 502 && http_status != 503) return false;
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("code") || !j["code"].is_string()) return false;
  const std::string& code = j["code"].get_ref<const std::string&>();
  switch (http_status) {
    case 429: return code == "rate_limited";
    case 502: return code == "hot_server";
    default: return code == "reconnect_advised" || code == "server_draining" || code == "server_starting";
  }
}

Status ApiError(long http_status, std::string_view body, const ErrorSubject& subject) {
  std::string code;
  std::string message;
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  std::string basin = subject.basin.empty() ? "weir-default" : std::string(subject.basin);
  std::string stream = Quoted(subject.stream);
  std::string in_basin = subject.basin.empty() ? "" : " in basin " + Quoted(subject.basin);
  try {
    if (j.is_object()) {
      if (j.contains("code") && j["code"].is_string()) code = j["code"].get<std::string>();
      if (j.contains("message") && j["message"].is_string()) message = j["message"].get<std::string>();
      if (j.contains("seq_num_mismatch")) {
        code = "seq_num_mismatch";
        message = fmt::format("seq_num mismatch: stream {} has its tail at {}", stream, j["seq_num_mismatch"].dump());
      } else if (j.contains("fencing_token_mismatch")) {
        code = "fencing_token_mismatch";
        message = fmt::format("fencing token mismatch: stream {} has token {}", stream,
                              j["fencing_token_mismatch"].dump(-1, ' ', false, json::error_handler_t::replace));
      } else if (http_status == 416 && j.contains("tail") && j["tail"].is_object()) {
        code = "range_not_satisfiable";  // S2's 416 body is the tail alone
        message = fmt::format("the read starts past the tail of stream {} (next seq_num {})", stream,
                              j["tail"].value("seq_num", uint64_t{0}));
      }
    }
  } catch (const std::exception&) {
    // A malformed error body: fall back to the status line below.
  }
  if (code == "stream_not_found") message = fmt::format("stream {} not found{}", stream, in_basin);
  if (code == "basin_not_found") message = fmt::format("basin {} not found", Quoted(basin));
  if (code == "resource_already_exists") {
    message = subject.stream.empty() ? fmt::format("basin {} already exists", Quoted(basin))
                                     : fmt::format("stream {} already exists{}", stream, in_basin);
  }
  if (http_status == 401) {
    message = (message.empty() ? "unauthorized" : message) + "; pass --auth-token or set WEIR_AUTH_TOKEN";
  }
  // Not a weir (or S2) answer at all: another server on that port, or a
  // proxy's page. Its HTML would say little.
  const bool foreign = message.empty() && !body.empty() && !j.is_object();
  if (message.empty()) {
    std::string snippet(body.substr(0, 200));
    for (char& c : snippet) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    message = snippet.empty() ? fmt::format("the server answered HTTP {}", http_status)
                              : fmt::format("the server answered HTTP {}: {}", http_status, snippet);
  }
  std::string text = foreign ? fmt::format("the server answered HTTP {} with a body that is not JSON: is it a weir "
                                           "server? (and no proxy in between)",
                                           http_status)
                     : code.empty() ? fmt::format("{} ({})", message, http_status)
                                    : fmt::format("{} ({} {})", message, http_status, code);
  Code c = Code::kInternal;
  switch (http_status) {
    case 400: case 401: case 413: case 422: c = Code::kInvalidArgument; break;
    case 403: c = code == "quota_exhausted" ? Code::kQuotaExhausted : Code::kInvalidArgument; break;
    case 404: c = Code::kNotFound; break;
    case 409:
      c = code == "out_of_order_sequence"     ? Code::kPreconditionFailed
          : code == "invalid_producer_epoch"  ? Code::kFenced
          : code == "stream_deletion_pending" ? Code::kNotFound  // going: not retried
                                              : Code::kAlreadyExists;
      break;
    case 412: c = Code::kPreconditionFailed; break;
    case 416: c = Code::kOutOfRange; break;
    case 429: c = Code::kResourceExhausted; break;
    case 502: case 503: case 504: c = Code::kUnavailable; break;
    default: c = http_status >= 400 && http_status < 500 ? Code::kInvalidArgument : Code::kInternal;
  }
  return Status(c, std::move(text));
}

bool SseParser::Feed(std::string_view chunk, const std::function<bool(const SseEvent&)>& on_event) {
  size_t i = 0;
  if (skip_lf_ && !chunk.empty() && chunk[0] == '\n') i = 1;
  skip_lf_ = false;
  while (i < chunk.size()) {
    size_t end = chunk.find_first_of("\r\n", i);
    if (end == std::string_view::npos) {
      pending_.append(chunk.substr(i));
      return true;
    }
    pending_.append(chunk.substr(i, end - i));
    std::string line = std::move(pending_);
    pending_.clear();
    i = end + 1;
    if (chunk[end] == '\r') {
      if (i < chunk.size() && chunk[i] == '\n') {
        ++i;
      } else if (i == chunk.size()) {
        skip_lf_ = true;
      }
    }
    if (!Line(line, on_event)) return false;
  }
  return true;
}

bool SseParser::Line(std::string_view line, const std::function<bool(const SseEvent&)>& on_event) {
  if (line.empty()) {  // dispatch
    bool go_on = true;
    if (has_data_) go_on = on_event(event_);
    event_ = SseEvent{};
    has_data_ = false;
    return go_on;
  }
  if (line[0] == ':') return true;  // a comment
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (field == "event") {
    event_.event = value;
  } else if (field == "data") {
    if (has_data_) event_.data.push_back('\n');
    event_.data.append(value);
    has_data_ = true;
  } else if (field == "id") {
    event_.id = value;
  }
  return true;
}

}  // namespace weir::client
