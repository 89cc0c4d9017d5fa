// weir's client for the S2 v1 REST API (docs/http-api.md): one blocking call
// per endpoint, each returning Status or Result. Bodies travel as JSON with
// `s2-format: base64`, so any bytes round-trip.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "client/http.h"
#include "client/types.h"

namespace weir::client {

struct ClientOptions {
  std::string server = "http://127.0.0.1:8080";
  std::string basin;       // sent as `s2-basin`; "" = the server's default basin
  std::string auth_token;  // sent as `Authorization: Bearer`; "" = none
  // Per request (not per read session). Above the server's default 60 s
  // `--http-stall-timeout-s`: an append whose body the server holds unread
  // for want of memory is answered 429 (nothing appended, so retried) before
  // the client would give up on it as possibly appended.
  int timeout_ms = 90000;
};

// Owned by one caller, used from one thread at a time (it holds one
// keep-alive connection). Errors are one-line messages a person can act on
// (codec.h ApiError); transport failures are Unavailable or Timeout.
class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options);

  const ClientOptions& options() const { return options_; }

  // `config_json`: an S2 BasinConfig object as JSON text, or empty for the defaults.
  Result<BasinInfo> CreateBasin(std::string_view name, std::string_view config_json = {});
  Result<std::vector<BasinInfo>> ListBasins(std::string_view prefix = "");  // every page
  Status DeleteBasin(std::string_view name);

  // `config_json`: an S2 StreamConfig object as JSON text, or empty for the defaults.
  Result<StreamInfo> CreateStream(std::string_view name, std::string_view config_json = {});
  Result<std::vector<StreamInfo>> ListStreams(std::string_view prefix = "");  // every page
  // One page (S2's pagination): up to 1000 names after `start_after`;
  // `*has_more` says whether more follow.
  Result<std::vector<StreamInfo>> ListStreamsPage(std::string_view prefix, std::string_view start_after,
                                                  bool* has_more);
  Result<std::vector<BasinInfo>> ListBasinsPage(std::string_view prefix, std::string_view start_after,
                                                bool* has_more);
  Result<StreamConfig> GetStreamConfig(std::string_view name);
  // The stream of that name, or nullopt if there is none: its created_at
  // tells it from a stream of the same name made after it was deleted.
  Result<std::optional<StreamInfo>> FindStream(std::string_view name);
  Status DeleteStream(std::string_view name);

  // On failure, `*nothing_appended` (if given) says whether the append
  // certainly changed nothing, so that sending it again cannot duplicate it:
  // no connection was made (kNoConnection), or the server's answer says so
  // (kRefused: ErrorHasNoSideEffects).
  enum class NothingAppended { kUnknown, kNoConnection, kRefused };
  Result<AppendAck> Append(std::string_view stream, const std::vector<AppendRecord>& records,
                           const AppendOptions& options = {}, NothingAppended* nothing_appended = nullptr);
  // One read request (at most 1000 records / 1 MiB, per the server). A start
  // at the tail reads no records (the server's 416 for it becomes an empty
  // batch with the tail); a start past the tail is kOutOfRange.
  Result<ReadBatch> Read(std::string_view stream, const ReadOptions& options);
  Result<StreamPosition> CheckTail(std::string_view stream);
  // On failure, `*nothing_done` (if given) says as for Append whether the
  // server certainly allocated nothing (a retry wastes no id either way).
  Result<ProducerId> AllocateProducer(NothingAppended* nothing_done = nullptr);

  // A read session (SSE). Calls `on_batch` for each batch until it returns
  // false, the server sends `done` (OK), an `error` event (Unavailable with its
  // message), or the connection ends (Unavailable). `*last_event_id` is kept
  // current; pass it back to resume where the session stopped.
  // `on_event_seen` (optional) runs once the server has accepted the session
  // (a 2xx answer begins) and for every event, pings included.
  Status ReadSession(std::string_view stream, const ReadOptions& options, std::string* last_event_id,
                     const std::function<bool(const ReadBatch&)>& on_batch,
                     const std::function<void()>& on_event_seen = nullptr);

  // Whether the last call (a read session's opening answer too) failed with
  // an answer that says the server did nothing (ErrorHasNoSideEffects: 429,
  // a 503 while it starts or drains): a caller may wait such refusals out.
  bool last_refused() const { return last_refused_; }

 private:
  Client(ClientOptions options, std::unique_ptr<HttpConnection> http);
  HttpRequest Request(std::string method, std::string target) const;
  // Sends `req`; a 2xx response comes back, anything else as ApiError about `subject`.
  Result<HttpResponse> Call(const HttpRequest& req, std::string_view stream, std::string_view basin = {});
  // As Call (in the client's basin), and on failure sets `*nothing` (if
  // given) to whether the request certainly changed nothing.
  Result<HttpResponse> CallNoting(const HttpRequest& req, std::string_view stream, NothingAppended* nothing);
  Result<std::vector<NamedInfo>> List(std::string_view path, std::string_view key, std::string_view prefix);
  Result<std::vector<NamedInfo>> ListPage(std::string_view path, std::string_view key, std::string_view prefix,
                                          std::string_view start_after, bool* has_more);
  // http_->Do, noting in last_refused_ whether the answer was such a refusal.
  Result<HttpResponse> Do(const HttpRequest& req);

  ClientOptions options_;
  std::unique_ptr<HttpConnection> http_;
  bool last_refused_ = false;
};

// "/v1/streams/NAME/records?seq_num=5&count=10" for `options` (no session).
std::string ReadTarget(std::string_view stream, const ReadOptions& options);

}  // namespace weir::client
