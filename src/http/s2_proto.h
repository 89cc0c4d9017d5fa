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

// kInvalidArgument on malformed input (truncated fields, bad wire types).
Result<AppendInput> DecodeProtoAppendInput(std::string_view data);
std::string EncodeProtoAppendAck(const StreamPosition& start, const StreamPosition& end, const StreamPosition& tail);
std::string EncodeProtoReadBatch(const std::vector<log::ReadRecord>& records, const std::optional<StreamPosition>& tail);

}  // namespace weir::http
