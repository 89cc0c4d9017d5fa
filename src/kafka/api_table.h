// The Kafka APIs and versions weir speaks, and whole-request decoding: one
// frame body in, the header and the typed request out. Stateless functions
// and constant data; thread-safe. docs/format/kafka-wire.md.
//
// Framing: on the socket every request and response is an int32 size and then
// that many bytes, the frame body. Everything here works on frame bodies
// (without the size); the server reads and writes the size (for a response,
// Writer::ReserveLength / PatchLength). A request body is header v1 + request;
// a response body is the correlation id (header v0) + response.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "base/status.h"
#include "kafka/messages.h"

namespace weir::kafka {

enum class ApiKey : int16_t {
  kProduce = 0,
  kFetch = 1,
  kListOffsets = 2,
  kMetadata = 3,
  kOffsetCommit = 8,
  kOffsetFetch = 9,
  kFindCoordinator = 10,
  kJoinGroup = 11,
  kHeartbeat = 12,
  kLeaveGroup = 13,
  kSyncGroup = 14,
  kDescribeGroups = 15,
  kListGroups = 16,
  kApiVersions = 18,
  kCreateTopics = 19,
  kDeleteTopics = 20,
  kDeleteRecords = 21,
  kInitProducerId = 22,
  kDescribeConfigs = 32,
  kAlterConfigs = 33,
  kCreatePartitions = 37,
  kDeleteGroups = 42,
  kIncrementalAlterConfigs = 44,
  kOffsetDelete = 47,
};

// One supported API: requests with `key` and a version in
// [min_version, max_version] are decoded; every other request is not. None of
// these versions is flexible (no compact strings, no tagged fields).
// ApiVersions advertises [advertised_min, max_version]: librdkafka enables
// features by overlap with old versions (gzip/snappy/lz4 need Produce v0,
// throttle times Produce/Fetch v1-2), so the range starts at 0 wherever the
// API has a v0. Clients always pick the highest common version; a request
// below min_version still closes the connection.
struct ApiInfo {
  int16_t key;
  const char* name;
  int16_t min_version;
  int16_t max_version;
  int16_t advertised_min;
};

// {key, name, min_version, max_version, advertised_min}
inline constexpr ApiInfo kSupportedApis[] = {
    {0,   "Produce",         3,  7,   0},
    {1,   "Fetch",           4,  11,  0},
    {2,   "ListOffsets",     0,  3,   0},
    {3,   "Metadata",        0,  6,   0},
    {8,   "OffsetCommit",    0,  7,   0},
    {9,   "OffsetFetch",     1,  5,   0},
    {10,  "FindCoordinator", 0,  2,   0},
    {11,  "JoinGroup",       0,  5,   0},
    {12,  "Heartbeat",       0,  3,   0},
    {13,  "LeaveGroup",      0,  3,   0},
    {14,  "SyncGroup",       0,  3,   0},
    {15,  "DescribeGroups",  0,  4,   0},
    {16,  "ListGroups",      0,  2,   0},
    {18,  "ApiVersions",     0,  2,   0},
    {19,  "CreateTopics",    0,  4,   0},
    {20,  "DeleteTopics",    0,  3,   0},
    {21,  "DeleteRecords",   0,  1,   0},
    {22,  "InitProducerId",  0,  1,   0},
    {32,  "DescribeConfigs", 0,  2,   0},
    {33,  "AlterConfigs",    0,  1,   0},
    {37,  "CreatePartitions", 0, 1,   0},
    {42,  "DeleteGroups",    0,  1,   0},
    {44,  "IncrementalAlterConfigs", 0, 0, 0},
    {47,  "OffsetDelete",    0,  0,   0},
};

// The row for `key`, or nullptr if weir does not speak that API.
const ApiInfo* FindApi(int16_t key);
// Whether `key` is supported at `version`.
bool IsSupported(int16_t key, int16_t version);

// An ApiVersions response (error NONE) listing every row of kSupportedApis
// with its advertised range.
ApiVersionsResponse SupportedApiVersions();

// The response body for an ApiVersions request whose version weir does not
// support (e.g. v3, which is flexible): the correlation id, then the v0
// layout with error UNSUPPORTED_VERSION (35) and our ranges, which is what
// clients expect so they can retry with a version from the list.
std::string EncodeApiVersionsUnsupported(int32_t correlation_id);

// One decoded request. `records` views inside it point into the frame it was
// decoded from.
using RequestBody =
    std::variant<ProduceRequest, FetchRequest, ListOffsetsRequest, MetadataRequest, OffsetCommitRequest,
                 OffsetFetchRequest, FindCoordinatorRequest, JoinGroupRequest, HeartbeatRequest, LeaveGroupRequest,
                 SyncGroupRequest, ApiVersionsRequest, CreateTopicsRequest, DeleteTopicsRequest,
                 InitProducerIdRequest, DescribeGroupsRequest, ListGroupsRequest, DeleteGroupsRequest,
                 DescribeConfigsRequest, CreatePartitionsRequest, DeleteRecordsRequest, AlterConfigsRequest,
                 IncrementalAlterConfigsRequest, OffsetDeleteRequest>;

struct DecodedRequest {
  RequestHeader header;
  RequestBody body;
  bool operator==(const DecodedRequest&) const = default;
};

// Decodes a request frame body: header v1, then the request its key and
// version name. Errors:
// - NotSupported (IsUnsupportedApi): the header was read but its key or
//   version is not in kSupportedApis. The server answers an ApiVersions request
//   with EncodeApiVersionsUnsupported (PeekRequestHeader gives the correlation
//   id) and closes the connection for any other.
// - InvalidArgument: malformed bytes (truncated, a length past the frame, a
//   bad string, an impossible array count, bytes left over), naming the field;
//   or a request whose decoded form would take more than
//   kDecodedPerFrameByte bytes per frame byte plus kDecodedAllowance.
inline constexpr uint64_t kDecodedPerFrameByte = 8;
inline constexpr uint64_t kDecodedAllowance = 64 << 10;
Result<DecodedRequest> DecodeRequest(std::string_view frame);
// The records views would dangle: decode from a buffer that outlives the result.
Result<DecodedRequest> DecodeRequest(std::string&& frame) = delete;
inline bool IsUnsupportedApi(const Status& s) { return s.code() == Code::kNotSupported; }

// Reads only the header at the start of a frame body (also for versions that
// DecodeRequest rejects: the v2 header of flexible versions starts the same).
Result<RequestHeader> PeekRequestHeader(std::string_view frame);

// The API key of the request type held by `body`.
ApiKey RequestKey(const RequestBody& body);

// Encodes a request frame body: header (api_key taken from the body's type,
// the rest from `header`) and body at header.api_version. InvalidArgument
// only for a value the wire cannot carry (see Writer). For tests and clients.
Result<std::string> EncodeRequest(const RequestHeader& header, const RequestBody& body);

}  // namespace weir::kafka
