// The client's wire codec: JSON bodies with `s2-format: base64`, S2
// error bodies mapped to Status, and an incremental Server-Sent Events parser.
// Pure functions (no I/O), safe from any thread; the SseParser is one
// caller's.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "client/types.h"

namespace weir::client {

// `{"KEY": "NAME", "config": CONFIG}`, the body that creates a basin or a
// stream; no config when CONFIG is empty; kInvalidArgument if it is not a
// JSON object.
Result<std::string> EncodeCreate(std::string_view key, std::string_view name, std::string_view config_json = {});

// AppendInput JSON with base64 bodies and header names/values.
std::string EncodeAppendInput(const std::vector<AppendRecord>& records, const AppendOptions& options);

Result<AppendAck> DecodeAppendAck(std::string_view json);
// ReadBatch JSON with base64 bodies and header names/values.
Result<ReadBatch> DecodeReadBatch(std::string_view json);
Result<StreamPosition> DecodeTail(std::string_view json);  // {"tail": StreamPosition}
Result<StreamConfig> DecodeStreamConfig(std::string_view json);
Result<NamedInfo> DecodeNamedInfo(std::string_view json);  // BasinInfo or StreamInfo
Result<ProducerId> DecodeProducer(std::string_view json);
// One page of a list: `key` is "basins" or "streams"; `has_more` is set.
Result<std::vector<NamedInfo>> DecodeNamedList(std::string_view json, std::string_view key, bool* has_more);

// What an error is about, to name it in the message.
struct ErrorSubject {
  std::string_view basin;   // "" = the server's default basin
  std::string_view stream;  // "" = not about a stream
};

// A non-2xx response as a Status whose message is one line for a person,
// ending in "(STATUS CODE)", e.g. `stream "s1" not found (404 stream_not_found)`.
// The Code says what a caller can do: 429 ResourceExhausted, 503 Unavailable
// (both retryable), 404 NotFound, 409 AlreadyExists (or PreconditionFailed /
// Fenced for producer sequence and epoch errors), 412 PreconditionFailed,
// 416 OutOfRange, 400/401/413/422 InvalidArgument, other 5xx Internal.
Status ApiError(long http_status, std::string_view body, const ErrorSubject& subject);

// Whether an error answer says the request changed nothing, as S2's SDKs
// judge it (429 rate_limited, 502 hot_server, 503 reconnect_advised and
// 503 server_draining) and weir's 503 server_starting. Such an append may be
// sent again without a producer.
bool ErrorHasNoSideEffects(long http_status, std::string_view body);

// One Server-Sent Event. `id` is empty when the event carried none.
struct SseEvent {
  std::string event = "message";
  std::string data;
  std::string id;
};

// Incremental SSE parser (the WHATWG event-stream format), owned by the read
// that uses it, one thread: feed it bytes as they arrive, in chunks of any
// size; it calls back once per complete event, in order.
class SseParser {
 public:
  // Returns false as soon as `on_event` does (the rest of the chunk is dropped).
  bool Feed(std::string_view chunk, const std::function<bool(const SseEvent&)>& on_event);
  // Bytes held for an event not complete yet (its lines so far).
  size_t buffered() const { return pending_.size() + event_.data.size(); }

 private:
  bool Line(std::string_view line, const std::function<bool(const SseEvent&)>& on_event);
  std::string pending_;  // an incomplete line
  SseEvent event_;
  bool has_data_ = false;
  bool skip_lf_ = false;  // the last chunk ended in CR; a leading LF belongs to it
};

}  // namespace weir::client
