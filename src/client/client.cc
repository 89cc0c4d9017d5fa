#include "client/client.h"

#include <map>
#include <string_view>

#include <nlohmann/json.hpp>

#include "client/codec.h"

namespace weir::client {

namespace {

bool Is2xx(long status) { return status >= 200 && status < 300; }

std::string StreamPath(std::string_view stream) { return "/v1/streams/" + UrlEncode(stream); }

}  // namespace

std::string ReadTarget(std::string_view stream, const ReadOptions& o) {
  std::string q;
  auto add = [&q](std::string_view k, auto v) { fmt::format_to(std::back_inserter(q), "{}{}={}", q.empty() ? '?' : '&', k, v); };
  switch (o.start.kind) {
    case ReadStart::Kind::kFirst: add("seq_num", 0); break;  // the server's default is the tail
    case ReadStart::Kind::kSeqNum: add("seq_num", o.start.value); break;
    case ReadStart::Kind::kTimestamp: add("timestamp", o.start.value); break;
    case ReadStart::Kind::kTailOffset: add("tail_offset", o.start.value); break;
  }
  if (o.count) add("count", *o.count);
  if (o.bytes) add("bytes", *o.bytes);
  if (o.until) add("until", *o.until);
  if (o.clamp) add("clamp", "true");
  if (o.wait_s) add("wait", *o.wait_s);
  return StreamPath(stream) + "/records" + q;
}

Client::Client(ClientOptions options, std::unique_ptr<HttpConnection> http)
    : options_(std::move(options)), http_(std::move(http)) {}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  WEIR_ASSIGN_OR_RETURN(auto http, HttpConnection::Open(options.server));
  options.server = http->base_url();
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(http)));
}

HttpRequest Client::Request(std::string method, std::string target) const {
  HttpRequest req;
  req.method = std::move(method);
  req.target = std::move(target);
  req.timeout_ms = options_.timeout_ms;
  req.headers.emplace_back("s2-format", "base64");
  // Basins are the account's, not a basin's: no s2-basin there.
  if (!options_.basin.empty() && !req.target.starts_with("/v1/basins")) {
    req.headers.emplace_back("s2-basin", options_.basin);
  }
  if (!options_.auth_token.empty()) req.headers.emplace_back("Authorization", "Bearer " + options_.auth_token);
  return req;
}

Result<HttpResponse> Client::Do(const HttpRequest& req) {
  last_refused_ = false;
  auto resp = http_->Do(req);
  if (resp.ok() && !Is2xx(resp->status)) last_refused_ = ErrorHasNoSideEffects(resp->status, resp->body);
  return resp;
}

Result<HttpResponse> Client::CallNoting(const HttpRequest& req, std::string_view stream, NothingAppended* nothing) {
  if (nothing) *nothing = NothingAppended::kUnknown;
  auto resp = Do(req);
  if (!resp.ok()) {
    if (nothing && http_->failed_before_connect()) *nothing = NothingAppended::kNoConnection;
    return resp.status();
  }
  if (!Is2xx(resp->status)) {
    if (nothing && last_refused_) *nothing = NothingAppended::kRefused;
    return ApiError(resp->status, resp->body, ErrorSubject{options_.basin, stream});
  }
  return resp;
}

Result<HttpResponse> Client::Call(const HttpRequest& req, std::string_view stream, std::string_view basin) {
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Do(req));
  if (!Is2xx(resp.status)) {
    return ApiError(resp.status, resp.body, ErrorSubject{basin.empty() ? options_.basin : basin, stream});
  }
  return resp;
}

Result<std::vector<NamedInfo>> Client::ListPage(std::string_view path, std::string_view key, std::string_view prefix,
                                                std::string_view start_after, bool* has_more) {
  std::string target = fmt::format("{}?limit=1000", path);
  if (!prefix.empty()) target += "&prefix=" + UrlEncode(prefix);
  if (!start_after.empty()) target += "&start_after=" + UrlEncode(start_after);
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Call(Request("GET", target), {}));
  *has_more = false;
  WEIR_ASSIGN_OR_RETURN(auto page, DecodeNamedList(resp.body, key, has_more));
  if (page.empty()) *has_more = false;  // nothing to go on from
  return page;
}

Result<std::vector<NamedInfo>> Client::List(std::string_view path, std::string_view key, std::string_view prefix) {
  std::vector<NamedInfo> all;
  std::string start_after;
  for (bool more = true; more;) {
    WEIR_ASSIGN_OR_RETURN(auto page, ListPage(path, key, prefix, start_after, &more));
    if (!page.empty()) start_after = page.back().name;
    for (auto& e : page) all.push_back(std::move(e));
  }
  return all;
}

Result<std::vector<StreamInfo>> Client::ListStreamsPage(std::string_view prefix, std::string_view start_after,
                                                        bool* has_more) {
  return ListPage("/v1/streams", "streams", prefix, start_after, has_more);
}

Result<std::vector<BasinInfo>> Client::ListBasinsPage(std::string_view prefix, std::string_view start_after,
                                                      bool* has_more) {
  return ListPage("/v1/basins", "basins", prefix, start_after, has_more);
}

Result<BasinInfo> Client::CreateBasin(std::string_view name, std::string_view config_json) {
  HttpRequest req = Request("POST", "/v1/basins");
  req.headers.emplace_back("Content-Type", "application/json");
  WEIR_ASSIGN_OR_RETURN(req.body, EncodeCreate("basin", name, config_json));
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Call(req, {}, name));
  return DecodeNamedInfo(resp.body);
}

Result<std::vector<BasinInfo>> Client::ListBasins(std::string_view prefix) {
  return List("/v1/basins", "basins", prefix);
}

Status Client::DeleteBasin(std::string_view name) {
  return Call(Request("DELETE", "/v1/basins/" + UrlEncode(name)), {}, name).status();
}

Result<StreamInfo> Client::CreateStream(std::string_view name, std::string_view config_json) {
  HttpRequest req = Request("POST", "/v1/streams");
  req.headers.emplace_back("Content-Type", "application/json");
  WEIR_ASSIGN_OR_RETURN(req.body, EncodeCreate("stream", name, config_json));
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Call(req, name));
  return DecodeNamedInfo(resp.body);
}

Result<std::vector<StreamInfo>> Client::ListStreams(std::string_view prefix) {
  return List("/v1/streams", "streams", prefix);
}

Result<std::optional<StreamInfo>> Client::FindStream(std::string_view name) {
  // Names list in order, so the first with the name as prefix is the name itself, if any.
  const std::string target = "/v1/streams?limit=1&prefix=" + UrlEncode(name);
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Call(Request("GET", target), {}));
  bool has_more = false;
  WEIR_ASSIGN_OR_RETURN(auto page, DecodeNamedList(resp.body, "streams", &has_more));
  if (page.empty() || page.front().name != name) return std::optional<StreamInfo>();
  return std::optional<StreamInfo>(std::move(page.front()));
}

Result<StreamConfig> Client::GetStreamConfig(std::string_view name) {
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Call(Request("GET", StreamPath(name)), name));
  return DecodeStreamConfig(resp.body);
}

Status Client::DeleteStream(std::string_view name) {
  return Call(Request("DELETE", StreamPath(name)), name).status();
}

Result<AppendAck> Client::Append(std::string_view stream, const std::vector<AppendRecord>& records,
                                 const AppendOptions& options, NothingAppended* nothing_appended) {
  HttpRequest req = Request("POST", StreamPath(stream) + "/records");
  req.headers.emplace_back("Content-Type", "application/json");
  if (options.producer) {
    req.headers.emplace_back("weir-producer-id", std::to_string(options.producer->id));
    req.headers.emplace_back("weir-producer-epoch", std::to_string(options.producer->epoch));
    req.headers.emplace_back("weir-producer-seq", std::to_string(options.producer_seq));
  }
  req.fresh_connection = !options.producer;  // a silent resend would append twice
  req.body = EncodeAppendInput(records, options);
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, CallNoting(req, stream, nothing_appended));
  return DecodeAppendAck(resp.body);
}

Result<ReadBatch> Client::Read(std::string_view stream, const ReadOptions& options) {
  HttpRequest req = Request("GET", ReadTarget(stream, options));
  if (options.wait_s) req.timeout_ms += *options.wait_s * 1000;
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Do(req));
  if (resp.status == 416) {
    // The server answers 416 both for a start past the tail and for one at
    // the tail with nothing to wait for; the second is an empty read. A time
    // after every record's is the tail too (nothing is there yet).
    auto tail = DecodeTail(resp.body);
    if (tail.ok()) {
      const ReadStart& st = options.start;
      bool at_tail = options.clamp || st.kind == ReadStart::Kind::kTailOffset ||
                     st.kind == ReadStart::Kind::kFirst ||  // an empty or fully trimmed stream
                     (st.kind == ReadStart::Kind::kSeqNum && st.value <= tail->seq_num) ||
                     st.kind == ReadStart::Kind::kTimestamp;
      if (at_tail) return ReadBatch{{}, *tail};
    }
  }
  if (!Is2xx(resp.status)) return ApiError(resp.status, resp.body, ErrorSubject{options_.basin, stream});
  return DecodeReadBatch(resp.body);
}

Result<StreamPosition> Client::CheckTail(std::string_view stream) {
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, Call(Request("GET", StreamPath(stream) + "/records/tail"), stream));
  return DecodeTail(resp.body);
}

Result<ProducerId> Client::AllocateProducer(NothingAppended* nothing_done) {
  HttpRequest req = Request("POST", "/v1/producers");
  req.headers.emplace_back("Content-Type", "application/json");
  req.body = "{}";
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, CallNoting(req, {}, nothing_done));
  return DecodeProducer(resp.body);
}

// The most a read session's incomplete event may hold (ReadSession).
constexpr size_t kMaxSseEventBytes = 64 << 20;

Status Client::ReadSession(std::string_view stream, const ReadOptions& options, std::string* last_event_id,
                           const std::function<bool(const ReadBatch&)>& on_batch,
                           const std::function<void()>& on_event_seen) {
  HttpRequest req = Request("GET", ReadTarget(stream, options));
  req.timeout_ms = 0;        // a session lasts as long as it lasts,
  req.idle_timeout_s = 30;   // but the server pings every 5 s: silence means a dead connection
  req.headers.emplace_back("Accept", "text/event-stream");
  if (!last_event_id->empty()) req.headers.emplace_back("Last-Event-ID", *last_event_id);
  SseParser parser;
  Status outcome = Unavailable("the read session from {} ended without [DONE]", http_->base_url());
  auto on_event = [&](const SseEvent& ev) {
    if (on_event_seen) on_event_seen();
    if (ev.event == "batch") {
      auto batch = DecodeReadBatch(ev.data);
      if (!batch.ok()) {
        outcome = batch.status();
        return false;
      }
      if (!ev.id.empty()) *last_event_id = ev.id;
      if (!on_batch(*batch)) {
        outcome = Status::Ok();
        return false;
      }
    } else if (ev.event == "error") {
      // S2's ErrorInfo {code, message}; plain text from older servers. Codes
      // that say the session cannot go on (its stream deleted, say) are final,
      // as the same answer to a request would be; the rest (unavailable,
      // server_draining, ...) are worth a reconnect.
      auto j = nlohmann::json::parse(ev.data, nullptr, /*allow_exceptions=*/false);
      std::string why = ev.data;
      std::string code;
      if (j.is_object() && j.contains("message") && j["message"].is_string()) why = j["message"].get<std::string>();
      if (j.is_object() && j.contains("code") && j["code"].is_string()) code = j["code"].get<std::string>();
      static const std::map<std::string_view, long> kFinal = {
          {"stream_not_found", 404}, {"basin_not_found", 404}, {"not_found", 404}, {"invalid", 422},
          {"bad_query", 400},        {"bad_header", 400},      {"conflict", 409},  {"permission_denied", 403}};
      auto final_code = kFinal.find(code);
      outcome = final_code != kFinal.end() ? ApiError(final_code->second, ev.data, ErrorSubject{options_.basin, stream})
                                           : Unavailable("read session error from the server: {}", why);
      return false;
    } else if (ev.data == "[DONE]") {  // S2 sends it as an unnamed event
      outcome = Status::Ok();
      return false;
    }
    return true;  // ping, or an event this client does not know
  };
  auto on_data = [&](std::string_view chunk) {
    if (!parser.Feed(chunk, on_event)) return false;
    // A weir event holds one read batch (at most 1000 records, 1 MiB of
    // them, a few MiB as JSON): one far larger is no weir session's, and
    // would otherwise grow without bound.
    if (parser.buffered() > kMaxSseEventBytes) {
      outcome = InvalidArgument("the read session from {} sent an event of more than {} MiB: not a weir server?",
                                http_->base_url(), kMaxSseEventBytes >> 20);
      return false;
    }
    return true;
  };
  // Connected once a 2xx answer starts (its first event may be a ping 5 s later).
  auto on_2xx = [&] {
    if (on_event_seen) on_event_seen();
  };
  last_refused_ = false;
  WEIR_ASSIGN_OR_RETURN(HttpResponse resp, http_->Stream(req, on_data, on_2xx));
  if (!Is2xx(resp.status)) {
    last_refused_ = ErrorHasNoSideEffects(resp.status, resp.body);
    return ApiError(resp.status, resp.body, ErrorSubject{options_.basin, stream});
  }
  return outcome;
}

}  // namespace weir::client
