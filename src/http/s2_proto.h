// S2's protobuf messages (s2/v1/s2.proto: AppendInput, AppendAck, ReadBatch),
// encoded and decoded by hand: seven small messages do not justify a protoc
// step in the build (docs/dependencies.md). Field numbers follow S2's spec.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "log/engine.h"

namespace weir::http {

struct StreamPosition {
  uint64_t seq_num = 0;
  uint64_t timestamp = 0;
};

struct AppendInput {
  std::vector<log::AppendRecord> records;
  log::AppendOptions options;  // match_seq_num and fencing_token
};

// What one append may hold; decoders stop as soon as an input is over it.
struct AppendLimits {
  size_t max_records = 1000;
  size_t max_metered_bytes = 1u << 20;  // as log::MeteredBytes counts
};

// kInvalidArgument on malformed input (truncated fields, bad wire types);
// kOutOfRange once the input is over `limits` (decoding stops there, before
// many tiny records or headers take far more memory than their bytes).
Result<AppendInput> DecodeProtoAppendInput(std::string_view data, const AppendLimits& limits);
std::string EncodeProtoAppendAck(const StreamPosition& start, const StreamPosition& end, const StreamPosition& tail);
// A ReadBatch of the longest prefix of `records` that keeps it within
// `max_bytes` (the tail included); how many went in is put in `encoded`.
std::string EncodeProtoReadBatch(const std::vector<log::ReadRecord>& records, const std::optional<StreamPosition>& tail,
                                 size_t max_bytes = SIZE_MAX, size_t* encoded = nullptr);

// ---- S2S session framing (docs/http-api.md, "S2S sessions") ----------------
// A frame: 3 bytes big-endian length of what follows, a flag byte
// (bit 7 terminal, bits 6-5 compression: 0 none, 1 zstd, 2 gzip), then a
// protobuf message, or for a terminal frame a 2-byte HTTP status and a JSON
// error body.
inline constexpr size_t kS2sMaxFrameBytes = 2u << 20;  // flag byte + payload

struct S2sFrame {
  bool terminal = false;
  int compression = 0;  // 0 none, 1 zstd, 2 gzip
  std::string_view payload;
};

// A regular frame holding `payload`: a message, or one compressed with
// `compression` (1 zstd, 2 gzip; the caller compresses).
std::string EncodeS2sFrame(std::string_view payload, int compression = 0);
// A terminal frame: the session ends with `status` and an error body.
std::string EncodeS2sTerminal(int status, std::string_view json);
// The frame at the front of `buf`: its total size (0 when `buf` holds only
// part of it, `frame` untouched). kInvalidArgument for a length over
// kS2sMaxFrameBytes or of 0, or an unknown compression.
Result<size_t> DecodeS2sFrame(std::string_view buf, S2sFrame* frame);

}  // namespace weir::http
