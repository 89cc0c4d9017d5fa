// Plain values of the S2 v1 API as the client sees them (docs/http-api.md).
// Bytes are bytes here: the wire encoding (base64) is the codec's business.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace weir::client {

using RecordHeaders = std::vector<std::pair<std::string, std::string>>;

// An entry of a basin or stream list.
struct NamedInfo {
  std::string name;
  std::string created_at;  // RFC 3339
};
using BasinInfo = NamedInfo;
using StreamInfo = NamedInfo;

// GET /v1/streams/{s}; `json` is the server's object as received.
struct StreamConfig {
  std::string storage_class;
  std::optional<int64_t> retention_age_s;  // nullopt: infinite
  std::string timestamping_mode;
  bool timestamping_uncapped = false;
  int64_t delete_on_empty_min_age_s = 0;  // 0: never
  std::string json;
};

struct StreamPosition {
  uint64_t seq_num = 0;
  uint64_t timestamp = 0;
};

struct AppendRecord {
  std::string body;
  RecordHeaders headers;
  std::optional<uint64_t> timestamp;
};

// weir's idempotent producer: `seq` is the sequence of the append's first record.
struct ProducerId {
  uint64_t id = 0;
  uint64_t epoch = 0;
};

struct AppendOptions {
  std::optional<uint64_t> match_seq_num;
  std::optional<std::string> fencing_token;
  std::optional<ProducerId> producer;
  uint64_t producer_seq = 0;  // with `producer`
};

struct AppendAck {
  StreamPosition start;  // first record's position
  StreamPosition end;    // one past the last record
  StreamPosition tail;
  bool duplicated = false;
};

struct SequencedRecord {
  uint64_t seq_num = 0;
  uint64_t timestamp = 0;
  RecordHeaders headers;
  std::string body;

  // A command record (fence, trim): exactly one header, with an empty name.
  bool IsCommand() const { return headers.size() == 1 && headers[0].first.empty(); }
};

struct ReadBatch {
  std::vector<SequencedRecord> records;
  std::optional<StreamPosition> tail;
};

// Where a read starts; at most one of S2's three start parameters.
struct ReadStart {
  enum class Kind { kFirst, kSeqNum, kTimestamp, kTailOffset };  // kFirst: seq_num 0
  Kind kind = Kind::kFirst;
  uint64_t value = 0;
};

struct ReadOptions {
  ReadStart start;
  std::optional<uint64_t> count;
  std::optional<uint64_t> bytes;
  std::optional<uint64_t> until;  // exclusive timestamp
  bool clamp = false;
  std::optional<int> wait_s;  // long poll (one read) or idle bound (session)
};

}  // namespace weir::client
