// Kafka request and response messages for the APIs and versions of
// api_table.h (all non-flexible), as plain structs with Kafka's field names in
// snake_case, and their codecs. docs/format/kafka-wire.md.
//
// Stateless functions over value types; thread-safe. For every API Xxx:
//   Status DecodeXxxRequest(Reader&, int16_t version, XxxRequest*)
//   void   EncodeXxxRequest(const XxxRequest&, int16_t version, Writer&)
//   void   EncodeXxxResponse(const XxxResponse&, int16_t version, Writer&)
//   Status DecodeXxxResponse(Reader&, int16_t version, XxxResponse*)
// The server uses the request decoders and response encoders; the others
// serve tests and small test clients.
//
// Rules shared by all of them:
// - `version` must be in the API's range in api_table.h (DecodeRequest checks
//   it). A field that does not exist in `version` is neither read nor written;
//   a decoder leaves it at the default shown here (Kafka's default).
// - A decoder resets *out first, consumes exactly the rest of the Reader (bytes
//   left over are an error), and returns InvalidArgument naming the field that
//   failed, e.g. "ProduceRequest.topic_data[0].partition_data[2].records:
//   length 900 past end of frame (12 bytes left)".
// - Strings are checked as UTF-8 (except the client id). Record data is never
//   copied: decoded `records` are views into the Reader's input and are valid
//   only while it is.
// - Encoders append to the Writer; they can fail only for a value the wire
//   cannot carry (see Writer), which the caller sees in Writer::status().
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kafka/errors.h"
#include "kafka/wire.h"

namespace weir::kafka {

// ---- Request header (v1) and response header (v0) ---------------------------

// Request header v1, the only one the supported (non-flexible) versions use:
// api_key, api_version, correlation_id, client_id (nullable; not checked as
// UTF-8, since some clients send arbitrary bytes and it is only logged).
struct RequestHeader {
  int16_t api_key = 0;
  int16_t api_version = 0;
  int32_t correlation_id = 0;
  std::optional<std::string> client_id;
  bool operator==(const RequestHeader&) const = default;
};

// Reads a header v1 from the start of r. Leaves r at the body.
Status DecodeRequestHeader(Reader& r, RequestHeader* out);
void EncodeRequestHeader(const RequestHeader& header, Writer& w);
// Response header v0 (every supported version): the correlation id alone.
void EncodeResponseHeader(int32_t correlation_id, Writer& w);
Status DecodeResponseHeader(Reader& r, int32_t* correlation_id);

// ---- Produce (key 0), v3-7 --------------------------------------------------

struct ProducePartitionData {
  int32_t index = 0;
  std::optional<std::string_view> records;  // RecordBatch bytes as sent; view into the frame
  bool operator==(const ProducePartitionData&) const = default;
};
struct ProduceTopicData {
  std::string name;
  std::vector<ProducePartitionData> partition_data;
  bool operator==(const ProduceTopicData&) const = default;
};
struct ProduceRequest {
  std::optional<std::string> transactional_id;  // v3+
  int16_t acks = 0;  // 0: no response is sent; 1 or -1: after durability
  int32_t timeout_ms = 0;
  std::vector<ProduceTopicData> topic_data;
  bool operator==(const ProduceRequest&) const = default;
};

struct ProducePartitionResponse {
  int32_t index = 0;
  ErrorCode error_code = ErrorCode::kNone;
  int64_t base_offset = -1;  // -1 where the partition failed, as Kafka sends
  int64_t log_append_time_ms = -1;  // v2+
  int64_t log_start_offset = -1;    // v5+
  bool operator==(const ProducePartitionResponse&) const = default;
};
struct ProduceTopicResponse {
  std::string name;
  std::vector<ProducePartitionResponse> partition_responses;
  bool operator==(const ProduceTopicResponse&) const = default;
};
struct ProduceResponse {
  std::vector<ProduceTopicResponse> responses;
  int32_t throttle_time_ms = 0;  // v1+ (after the responses on the wire)
  bool operator==(const ProduceResponse&) const = default;
};

Status DecodeProduceRequest(Reader& r, int16_t version, ProduceRequest* out);
void EncodeProduceRequest(const ProduceRequest& m, int16_t version, Writer& w);
void EncodeProduceResponse(const ProduceResponse& m, int16_t version, Writer& w);
Status DecodeProduceResponse(Reader& r, int16_t version, ProduceResponse* out);

// ---- Fetch (key 1), v4-11 ---------------------------------------------------

struct FetchPartition {
  int32_t partition = 0;
  int32_t current_leader_epoch = -1;  // v9+
  int64_t fetch_offset = 0;
  int64_t log_start_offset = -1;  // v5+
  int32_t partition_max_bytes = 0;
  bool operator==(const FetchPartition&) const = default;
};
struct FetchTopic {
  std::string topic;
  std::vector<FetchPartition> partitions;
  bool operator==(const FetchTopic&) const = default;
};
struct ForgottenTopic {
  std::string topic;
  std::vector<int32_t> partitions;
  bool operator==(const ForgottenTopic&) const = default;
};
struct FetchRequest {
  int32_t replica_id = -1;
  int32_t max_wait_ms = 0;
  int32_t min_bytes = 0;
  int32_t max_bytes = 0x7fffffff;  // v3+
  int8_t isolation_level = 0;      // v4+: 0 read uncommitted, 1 read committed
  int32_t session_id = 0;          // v7+
  int32_t session_epoch = -1;      // v7+
  std::vector<FetchTopic> topics;
  std::vector<ForgottenTopic> forgotten_topics_data;  // v7+
  std::string rack_id;                                // v11+
  bool operator==(const FetchRequest&) const = default;
};

struct AbortedTransaction {
  int64_t producer_id = 0;
  int64_t first_offset = 0;
  bool operator==(const AbortedTransaction&) const = default;
};
struct FetchPartitionData {
  int32_t partition_index = 0;
  ErrorCode error_code = ErrorCode::kNone;
  int64_t high_watermark = -1;  // -1 where the partition failed, as Kafka sends
  int64_t last_stable_offset = -1;  // v4+
  int64_t log_start_offset = -1;    // v5+
  std::optional<std::vector<AbortedTransaction>> aborted_transactions;  // v4+, nullable
  int32_t preferred_read_replica = -1;                                  // v11+
  // Record batches, concatenated on the wire under one int32 length, never
  // re-encoded. The encoder takes any number of pieces; the decoder yields one
  // view of the whole field (none when it is empty or null).
  std::vector<std::string_view> records;
  bool operator==(const FetchPartitionData&) const = default;
};
struct FetchableTopicResponse {
  std::string topic;
  std::vector<FetchPartitionData> partitions;
  bool operator==(const FetchableTopicResponse&) const = default;
};
struct FetchResponse {
  int32_t throttle_time_ms = 0;  // v1+
  ErrorCode error_code = ErrorCode::kNone;  // v7+
  int32_t session_id = 0;                   // v7+
  std::vector<FetchableTopicResponse> responses;
  bool operator==(const FetchResponse&) const = default;
};

Status DecodeFetchRequest(Reader& r, int16_t version, FetchRequest* out);
void EncodeFetchRequest(const FetchRequest& m, int16_t version, Writer& w);
void EncodeFetchResponse(const FetchResponse& m, int16_t version, Writer& w);
Status DecodeFetchResponse(Reader& r, int16_t version, FetchResponse* out);

// ---- ListOffsets (key 2), v0-3 ----------------------------------------------

// Special timestamps: -1 latest (the high watermark), -2 earliest.
inline constexpr int64_t kListOffsetsLatest = -1;
inline constexpr int64_t kListOffsetsEarliest = -2;

struct ListOffsetsPartition {
  int32_t partition_index = 0;
  int64_t timestamp = 0;
  int32_t max_num_offsets = 1;  // v0 only
  bool operator==(const ListOffsetsPartition&) const = default;
};
struct ListOffsetsTopic {
  std::string name;
  std::vector<ListOffsetsPartition> partitions;
  bool operator==(const ListOffsetsTopic&) const = default;
};
struct ListOffsetsRequest {
  int32_t replica_id = -1;
  int8_t isolation_level = 0;  // v2+
  std::vector<ListOffsetsTopic> topics;
  bool operator==(const ListOffsetsRequest&) const = default;
};

struct ListOffsetsPartitionResponse {
  int32_t partition_index = 0;
  ErrorCode error_code = ErrorCode::kNone;
  std::vector<int64_t> old_style_offsets;  // v0 only
  int64_t timestamp = -1;                  // v1+
  int64_t offset = -1;                     // v1+
  bool operator==(const ListOffsetsPartitionResponse&) const = default;
};
struct ListOffsetsTopicResponse {
  std::string name;
  std::vector<ListOffsetsPartitionResponse> partitions;
  bool operator==(const ListOffsetsTopicResponse&) const = default;
};
struct ListOffsetsResponse {
  int32_t throttle_time_ms = 0;  // v2+
  std::vector<ListOffsetsTopicResponse> topics;
  bool operator==(const ListOffsetsResponse&) const = default;
};

Status DecodeListOffsetsRequest(Reader& r, int16_t version, ListOffsetsRequest* out);
void EncodeListOffsetsRequest(const ListOffsetsRequest& m, int16_t version, Writer& w);
void EncodeListOffsetsResponse(const ListOffsetsResponse& m, int16_t version, Writer& w);
Status DecodeListOffsetsResponse(Reader& r, int16_t version, ListOffsetsResponse* out);

// ---- Metadata (key 3), v0-6 -------------------------------------------------

struct MetadataRequestTopic {
  std::string name;
  bool operator==(const MetadataRequestTopic&) const = default;
};
struct MetadataRequest {
  // nullopt = all topics (v1+; in v0 an empty array means all topics, and a
  // null one is an error).
  std::optional<std::vector<MetadataRequestTopic>> topics;
  bool allow_auto_topic_creation = true;  // v4+
  bool operator==(const MetadataRequest&) const = default;
};

struct MetadataResponseBroker {
  int32_t node_id = 0;
  std::string host;
  int32_t port = 0;
  std::optional<std::string> rack;  // v1+
  bool operator==(const MetadataResponseBroker&) const = default;
};
struct MetadataResponsePartition {
  ErrorCode error_code = ErrorCode::kNone;
  int32_t partition_index = 0;
  int32_t leader_id = 0;
  std::vector<int32_t> replica_nodes;
  std::vector<int32_t> isr_nodes;
  std::vector<int32_t> offline_replicas;  // v5+
  bool operator==(const MetadataResponsePartition&) const = default;
};
struct MetadataResponseTopic {
  ErrorCode error_code = ErrorCode::kNone;
  std::string name;
  bool is_internal = false;  // v1+
  std::vector<MetadataResponsePartition> partitions;
  bool operator==(const MetadataResponseTopic&) const = default;
};
struct MetadataResponse {
  int32_t throttle_time_ms = 0;  // v3+
  std::vector<MetadataResponseBroker> brokers;
  std::optional<std::string> cluster_id;  // v2+
  int32_t controller_id = -1;             // v1+
  std::vector<MetadataResponseTopic> topics;
  bool operator==(const MetadataResponse&) const = default;
};

Status DecodeMetadataRequest(Reader& r, int16_t version, MetadataRequest* out);
void EncodeMetadataRequest(const MetadataRequest& m, int16_t version, Writer& w);
void EncodeMetadataResponse(const MetadataResponse& m, int16_t version, Writer& w);
Status DecodeMetadataResponse(Reader& r, int16_t version, MetadataResponse* out);

// ---- OffsetCommit (key 8), v0-7 ---------------------------------------------

struct OffsetCommitRequestPartition {
  int32_t partition_index = 0;
  int64_t committed_offset = 0;
  int32_t committed_leader_epoch = -1;  // v6+
  int64_t commit_timestamp = -1;        // v1 only
  std::optional<std::string> committed_metadata;
  bool operator==(const OffsetCommitRequestPartition&) const = default;
};
struct OffsetCommitRequestTopic {
  std::string name;
  std::vector<OffsetCommitRequestPartition> partitions;
  bool operator==(const OffsetCommitRequestTopic&) const = default;
};
struct OffsetCommitRequest {
  std::string group_id;
  int32_t generation_id = -1;  // v1+ (GenerationIdOrMemberEpoch in newer schemas)
  std::string member_id;       // v1+
  std::optional<std::string> group_instance_id;  // v7+
  int64_t retention_time_ms = -1;                // v2-4
  std::vector<OffsetCommitRequestTopic> topics;
  bool operator==(const OffsetCommitRequest&) const = default;
};

struct OffsetCommitResponsePartition {
  int32_t partition_index = 0;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const OffsetCommitResponsePartition&) const = default;
};
struct OffsetCommitResponseTopic {
  std::string name;
  std::vector<OffsetCommitResponsePartition> partitions;
  bool operator==(const OffsetCommitResponseTopic&) const = default;
};
struct OffsetCommitResponse {
  int32_t throttle_time_ms = 0;  // v3+
  std::vector<OffsetCommitResponseTopic> topics;
  bool operator==(const OffsetCommitResponse&) const = default;
};

Status DecodeOffsetCommitRequest(Reader& r, int16_t version, OffsetCommitRequest* out);
void EncodeOffsetCommitRequest(const OffsetCommitRequest& m, int16_t version, Writer& w);
void EncodeOffsetCommitResponse(const OffsetCommitResponse& m, int16_t version, Writer& w);
Status DecodeOffsetCommitResponse(Reader& r, int16_t version, OffsetCommitResponse* out);

// ---- OffsetFetch (key 9), v1-5 ----------------------------------------------

struct OffsetFetchRequestTopic {
  std::string name;
  std::vector<int32_t> partition_indexes;
  bool operator==(const OffsetFetchRequestTopic&) const = default;
};
struct OffsetFetchRequest {
  std::string group_id;
  // nullopt = every committed offset of the group (v2+; an error in v1).
  std::optional<std::vector<OffsetFetchRequestTopic>> topics;
  bool operator==(const OffsetFetchRequest&) const = default;
};

struct OffsetFetchResponsePartition {
  int32_t partition_index = 0;
  int64_t committed_offset = -1;
  int32_t committed_leader_epoch = -1;  // v5+
  std::optional<std::string> metadata;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const OffsetFetchResponsePartition&) const = default;
};
struct OffsetFetchResponseTopic {
  std::string name;
  std::vector<OffsetFetchResponsePartition> partitions;
  bool operator==(const OffsetFetchResponseTopic&) const = default;
};
struct OffsetFetchResponse {
  int32_t throttle_time_ms = 0;  // v3+
  std::vector<OffsetFetchResponseTopic> topics;
  ErrorCode error_code = ErrorCode::kNone;  // v2+ (after the topics on the wire)
  bool operator==(const OffsetFetchResponse&) const = default;
};

Status DecodeOffsetFetchRequest(Reader& r, int16_t version, OffsetFetchRequest* out);
void EncodeOffsetFetchRequest(const OffsetFetchRequest& m, int16_t version, Writer& w);
void EncodeOffsetFetchResponse(const OffsetFetchResponse& m, int16_t version, Writer& w);
Status DecodeOffsetFetchResponse(Reader& r, int16_t version, OffsetFetchResponse* out);

// ---- FindCoordinator (key 10), v0-2 -----------------------------------------

inline constexpr int8_t kCoordinatorKeyGroup = 0;
inline constexpr int8_t kCoordinatorKeyTransaction = 1;

struct FindCoordinatorRequest {
  std::string key;
  int8_t key_type = kCoordinatorKeyGroup;  // v1+
  bool operator==(const FindCoordinatorRequest&) const = default;
};
struct FindCoordinatorResponse {
  int32_t throttle_time_ms = 0;  // v1+
  ErrorCode error_code = ErrorCode::kNone;
  std::optional<std::string> error_message;  // v1+
  int32_t node_id = 0;
  std::string host;
  int32_t port = 0;
  bool operator==(const FindCoordinatorResponse&) const = default;
};

Status DecodeFindCoordinatorRequest(Reader& r, int16_t version, FindCoordinatorRequest* out);
void EncodeFindCoordinatorRequest(const FindCoordinatorRequest& m, int16_t version, Writer& w);
void EncodeFindCoordinatorResponse(const FindCoordinatorResponse& m, int16_t version, Writer& w);
Status DecodeFindCoordinatorResponse(Reader& r, int16_t version, FindCoordinatorResponse* out);

// ---- JoinGroup (key 11), v0-5 -----------------------------------------------
// Protocol metadata and assignments are opaque bytes the broker passes
// through; they are owned copies because the coordinator keeps them.

struct JoinGroupRequestProtocol {
  std::string name;
  std::string metadata;  // bytes
  bool operator==(const JoinGroupRequestProtocol&) const = default;
};
struct JoinGroupRequest {
  std::string group_id;
  int32_t session_timeout_ms = 0;
  int32_t rebalance_timeout_ms = -1;  // v1+
  std::string member_id;
  std::optional<std::string> group_instance_id;  // v5+
  std::string protocol_type;
  std::vector<JoinGroupRequestProtocol> protocols;
  bool operator==(const JoinGroupRequest&) const = default;
};

struct JoinGroupResponseMember {
  std::string member_id;
  std::optional<std::string> group_instance_id;  // v5+
  std::string metadata;                          // bytes
  bool operator==(const JoinGroupResponseMember&) const = default;
};
struct JoinGroupResponse {
  int32_t throttle_time_ms = 0;  // v2+
  ErrorCode error_code = ErrorCode::kNone;
  int32_t generation_id = -1;
  std::string protocol_name;
  std::string leader;
  std::string member_id;
  std::vector<JoinGroupResponseMember> members;
  bool operator==(const JoinGroupResponse&) const = default;
};

Status DecodeJoinGroupRequest(Reader& r, int16_t version, JoinGroupRequest* out);
void EncodeJoinGroupRequest(const JoinGroupRequest& m, int16_t version, Writer& w);
void EncodeJoinGroupResponse(const JoinGroupResponse& m, int16_t version, Writer& w);
Status DecodeJoinGroupResponse(Reader& r, int16_t version, JoinGroupResponse* out);

// ---- Heartbeat (key 12), v0-3 -----------------------------------------------

struct HeartbeatRequest {
  std::string group_id;
  int32_t generation_id = 0;
  std::string member_id;
  std::optional<std::string> group_instance_id;  // v3+
  bool operator==(const HeartbeatRequest&) const = default;
};
struct HeartbeatResponse {
  int32_t throttle_time_ms = 0;  // v1+
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const HeartbeatResponse&) const = default;
};

Status DecodeHeartbeatRequest(Reader& r, int16_t version, HeartbeatRequest* out);
void EncodeHeartbeatRequest(const HeartbeatRequest& m, int16_t version, Writer& w);
void EncodeHeartbeatResponse(const HeartbeatResponse& m, int16_t version, Writer& w);
Status DecodeHeartbeatResponse(Reader& r, int16_t version, HeartbeatResponse* out);

// ---- LeaveGroup (key 13), v0-3 ----------------------------------------------

struct MemberIdentity {
  std::string member_id;
  std::optional<std::string> group_instance_id;
  bool operator==(const MemberIdentity&) const = default;
};
struct LeaveGroupRequest {
  std::string group_id;
  std::string member_id;                // v0-2
  std::vector<MemberIdentity> members;  // v3+
  bool operator==(const LeaveGroupRequest&) const = default;
};

struct LeaveGroupMemberResponse {
  std::string member_id;
  std::optional<std::string> group_instance_id;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const LeaveGroupMemberResponse&) const = default;
};
struct LeaveGroupResponse {
  int32_t throttle_time_ms = 0;  // v1+
  ErrorCode error_code = ErrorCode::kNone;
  std::vector<LeaveGroupMemberResponse> members;  // v3+
  bool operator==(const LeaveGroupResponse&) const = default;
};

Status DecodeLeaveGroupRequest(Reader& r, int16_t version, LeaveGroupRequest* out);
void EncodeLeaveGroupRequest(const LeaveGroupRequest& m, int16_t version, Writer& w);
void EncodeLeaveGroupResponse(const LeaveGroupResponse& m, int16_t version, Writer& w);
Status DecodeLeaveGroupResponse(Reader& r, int16_t version, LeaveGroupResponse* out);

// ---- SyncGroup (key 14), v0-3 -----------------------------------------------

struct SyncGroupRequestAssignment {
  std::string member_id;
  std::string assignment;  // bytes
  bool operator==(const SyncGroupRequestAssignment&) const = default;
};
struct SyncGroupRequest {
  std::string group_id;
  int32_t generation_id = 0;
  std::string member_id;
  std::optional<std::string> group_instance_id;  // v3+
  std::vector<SyncGroupRequestAssignment> assignments;
  bool operator==(const SyncGroupRequest&) const = default;
};
struct SyncGroupResponse {
  int32_t throttle_time_ms = 0;  // v1+
  ErrorCode error_code = ErrorCode::kNone;
  std::string assignment;  // bytes
  bool operator==(const SyncGroupResponse&) const = default;
};

Status DecodeSyncGroupRequest(Reader& r, int16_t version, SyncGroupRequest* out);
void EncodeSyncGroupRequest(const SyncGroupRequest& m, int16_t version, Writer& w);
void EncodeSyncGroupResponse(const SyncGroupResponse& m, int16_t version, Writer& w);
Status DecodeSyncGroupResponse(Reader& r, int16_t version, SyncGroupResponse* out);

// ---- ApiVersions (key 18), v0-2 ---------------------------------------------

struct ApiVersionsRequest {  // no fields before v3
  bool operator==(const ApiVersionsRequest&) const = default;
};
struct ApiVersion {
  int16_t api_key = 0;
  int16_t min_version = 0;
  int16_t max_version = 0;
  bool operator==(const ApiVersion&) const = default;
};
struct ApiVersionsResponse {
  ErrorCode error_code = ErrorCode::kNone;
  std::vector<ApiVersion> api_keys;
  int32_t throttle_time_ms = 0;  // v1+
  bool operator==(const ApiVersionsResponse&) const = default;
};

Status DecodeApiVersionsRequest(Reader& r, int16_t version, ApiVersionsRequest* out);
void EncodeApiVersionsRequest(const ApiVersionsRequest& m, int16_t version, Writer& w);
void EncodeApiVersionsResponse(const ApiVersionsResponse& m, int16_t version, Writer& w);
Status DecodeApiVersionsResponse(Reader& r, int16_t version, ApiVersionsResponse* out);

// ---- CreateTopics (key 19), v0-4 --------------------------------------------

struct CreatableReplicaAssignment {
  int32_t partition_index = 0;
  std::vector<int32_t> broker_ids;
  bool operator==(const CreatableReplicaAssignment&) const = default;
};
struct CreatableTopicConfig {
  std::string name;
  std::optional<std::string> value;
  bool operator==(const CreatableTopicConfig&) const = default;
};
struct CreatableTopic {
  std::string name;
  int32_t num_partitions = 0;       // -1: the broker's default (v4+ clients)
  int16_t replication_factor = 0;   // -1: the broker's default
  std::vector<CreatableReplicaAssignment> assignments;
  std::vector<CreatableTopicConfig> configs;
  bool operator==(const CreatableTopic&) const = default;
};
struct CreateTopicsRequest {
  std::vector<CreatableTopic> topics;
  int32_t timeout_ms = 60000;
  bool validate_only = false;  // v1+
  bool operator==(const CreateTopicsRequest&) const = default;
};

struct CreatableTopicResult {
  std::string name;
  ErrorCode error_code = ErrorCode::kNone;
  std::optional<std::string> error_message;  // v1+
  bool operator==(const CreatableTopicResult&) const = default;
};
struct CreateTopicsResponse {
  int32_t throttle_time_ms = 0;  // v2+
  std::vector<CreatableTopicResult> topics;
  bool operator==(const CreateTopicsResponse&) const = default;
};

Status DecodeCreateTopicsRequest(Reader& r, int16_t version, CreateTopicsRequest* out);
void EncodeCreateTopicsRequest(const CreateTopicsRequest& m, int16_t version, Writer& w);
void EncodeCreateTopicsResponse(const CreateTopicsResponse& m, int16_t version, Writer& w);
Status DecodeCreateTopicsResponse(Reader& r, int16_t version, CreateTopicsResponse* out);

// ---- DeleteTopics (key 20), v0-3 --------------------------------------------

struct DeleteTopicsRequest {
  std::vector<std::string> topic_names;
  int32_t timeout_ms = 0;
  bool operator==(const DeleteTopicsRequest&) const = default;
};
struct DeletableTopicResult {
  std::string name;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const DeletableTopicResult&) const = default;
};
struct DeleteTopicsResponse {
  int32_t throttle_time_ms = 0;  // v1+
  std::vector<DeletableTopicResult> responses;
  bool operator==(const DeleteTopicsResponse&) const = default;
};

Status DecodeDeleteTopicsRequest(Reader& r, int16_t version, DeleteTopicsRequest* out);
void EncodeDeleteTopicsRequest(const DeleteTopicsRequest& m, int16_t version, Writer& w);
void EncodeDeleteTopicsResponse(const DeleteTopicsResponse& m, int16_t version, Writer& w);
Status DecodeDeleteTopicsResponse(Reader& r, int16_t version, DeleteTopicsResponse* out);

// ---- InitProducerId (key 22), v0-1 ------------------------------------------

struct InitProducerIdRequest {
  std::optional<std::string> transactional_id;  // non-null: transactional (weir rejects it)
  int32_t transaction_timeout_ms = 0;
  bool operator==(const InitProducerIdRequest&) const = default;
};
struct InitProducerIdResponse {
  int32_t throttle_time_ms = 0;
  ErrorCode error_code = ErrorCode::kNone;
  int64_t producer_id = -1;
  int16_t producer_epoch = 0;
  bool operator==(const InitProducerIdResponse&) const = default;
};

Status DecodeInitProducerIdRequest(Reader& r, int16_t version, InitProducerIdRequest* out);
void EncodeInitProducerIdRequest(const InitProducerIdRequest& m, int16_t version, Writer& w);
void EncodeInitProducerIdResponse(const InitProducerIdResponse& m, int16_t version, Writer& w);
Status DecodeInitProducerIdResponse(Reader& r, int16_t version, InitProducerIdResponse* out);

// ---- Group administration: DescribeGroups (key 15) v0-4, ListGroups (key 16)
// v0-2, DeleteGroups (key 42) v0-1 ---------------------------------------------

struct DescribeGroupsRequest {
  std::vector<std::string> groups;
  bool include_authorized_operations = false;  // v3+
  bool operator==(const DescribeGroupsRequest&) const = default;
};
struct DescribedGroupMember {
  std::string member_id;
  std::optional<std::string> group_instance_id;  // v4+
  std::string client_id;
  std::string client_host;
  std::string member_metadata;    // bytes
  std::string member_assignment;  // bytes
  bool operator==(const DescribedGroupMember&) const = default;
};
struct DescribedGroup {
  ErrorCode error_code = ErrorCode::kNone;
  std::string group_id;
  std::string group_state;  // "Dead" for a group that does not exist
  std::string protocol_type;
  std::string protocol_data;  // the selected protocol (assignor) name
  std::vector<DescribedGroupMember> members;
  int32_t authorized_operations = std::numeric_limits<int32_t>::min();  // v3+; min: not requested
  bool operator==(const DescribedGroup&) const = default;
};
struct DescribeGroupsResponse {
  int32_t throttle_time_ms = 0;  // v1+
  std::vector<DescribedGroup> groups;
  bool operator==(const DescribeGroupsResponse&) const = default;
};

Status DecodeDescribeGroupsRequest(Reader& r, int16_t version, DescribeGroupsRequest* out);
void EncodeDescribeGroupsRequest(const DescribeGroupsRequest& m, int16_t version, Writer& w);
void EncodeDescribeGroupsResponse(const DescribeGroupsResponse& m, int16_t version, Writer& w);
Status DecodeDescribeGroupsResponse(Reader& r, int16_t version, DescribeGroupsResponse* out);

struct ListGroupsRequest {  // no fields before v4
  bool operator==(const ListGroupsRequest&) const = default;
};
struct ListedGroup {
  std::string group_id;
  std::string protocol_type;
  bool operator==(const ListedGroup&) const = default;
};
struct ListGroupsResponse {
  int32_t throttle_time_ms = 0;  // v1+
  ErrorCode error_code = ErrorCode::kNone;
  std::vector<ListedGroup> groups;
  bool operator==(const ListGroupsResponse&) const = default;
};

Status DecodeListGroupsRequest(Reader& r, int16_t version, ListGroupsRequest* out);
void EncodeListGroupsRequest(const ListGroupsRequest& m, int16_t version, Writer& w);
void EncodeListGroupsResponse(const ListGroupsResponse& m, int16_t version, Writer& w);
Status DecodeListGroupsResponse(Reader& r, int16_t version, ListGroupsResponse* out);

struct DeleteGroupsRequest {
  std::vector<std::string> groups_names;
  bool operator==(const DeleteGroupsRequest&) const = default;
};
struct DeletableGroupResult {
  std::string group_id;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const DeletableGroupResult&) const = default;
};
struct DeleteGroupsResponse {
  int32_t throttle_time_ms = 0;
  std::vector<DeletableGroupResult> results;
  bool operator==(const DeleteGroupsResponse&) const = default;
};

Status DecodeDeleteGroupsRequest(Reader& r, int16_t version, DeleteGroupsRequest* out);
void EncodeDeleteGroupsRequest(const DeleteGroupsRequest& m, int16_t version, Writer& w);
void EncodeDeleteGroupsResponse(const DeleteGroupsResponse& m, int16_t version, Writer& w);
Status DecodeDeleteGroupsResponse(Reader& r, int16_t version, DeleteGroupsResponse* out);

// ---- DescribeConfigs (key 32), v0-2 ---------------------------------------------

inline constexpr int8_t kConfigResourceTopic = 2;
inline constexpr int8_t kConfigResourceBroker = 4;
// config_source (v1+)
inline constexpr int8_t kConfigSourceDynamicTopic = 1;
inline constexpr int8_t kConfigSourceStaticBroker = 4;
inline constexpr int8_t kConfigSourceDefault = 5;

struct DescribeConfigsResource {
  int8_t resource_type = 0;
  std::string resource_name;
  std::optional<std::vector<std::string>> configuration_keys;  // null: all
  bool operator==(const DescribeConfigsResource&) const = default;
};
struct DescribeConfigsRequest {
  std::vector<DescribeConfigsResource> resources;
  bool include_synonyms = false;  // v1+
  bool operator==(const DescribeConfigsRequest&) const = default;
};
struct DescribeConfigsSynonym {
  std::string name;
  std::optional<std::string> value;
  int8_t source = 0;
  bool operator==(const DescribeConfigsSynonym&) const = default;
};
struct DescribeConfigsEntry {
  std::string name;
  std::optional<std::string> value;
  bool read_only = false;
  bool is_default = false;    // v0
  int8_t config_source = -1;  // v1+
  bool is_sensitive = false;
  std::vector<DescribeConfigsSynonym> synonyms;  // v1+
  bool operator==(const DescribeConfigsEntry&) const = default;
};
struct DescribeConfigsResult {
  ErrorCode error_code = ErrorCode::kNone;
  std::optional<std::string> error_message;
  int8_t resource_type = 0;
  std::string resource_name;
  std::vector<DescribeConfigsEntry> configs;
  bool operator==(const DescribeConfigsResult&) const = default;
};
struct DescribeConfigsResponse {
  int32_t throttle_time_ms = 0;
  std::vector<DescribeConfigsResult> results;
  bool operator==(const DescribeConfigsResponse&) const = default;
};

Status DecodeDescribeConfigsRequest(Reader& r, int16_t version, DescribeConfigsRequest* out);
void EncodeDescribeConfigsRequest(const DescribeConfigsRequest& m, int16_t version, Writer& w);
void EncodeDescribeConfigsResponse(const DescribeConfigsResponse& m, int16_t version, Writer& w);
Status DecodeDescribeConfigsResponse(Reader& r, int16_t version, DescribeConfigsResponse* out);

// ---- CreatePartitions (key 37), v0-1 --------------------------------------------

struct CreatePartitionsTopic {
  std::string name;
  int32_t count = 0;  // the new total
  // One broker list per new partition; null: the broker chooses.
  std::optional<std::vector<std::vector<int32_t>>> assignments;
  bool operator==(const CreatePartitionsTopic&) const = default;
};
struct CreatePartitionsRequest {
  std::vector<CreatePartitionsTopic> topics;
  int32_t timeout_ms = 0;
  bool validate_only = false;
  bool operator==(const CreatePartitionsRequest&) const = default;
};
struct CreatePartitionsTopicResult {
  std::string name;
  ErrorCode error_code = ErrorCode::kNone;
  std::optional<std::string> error_message;
  bool operator==(const CreatePartitionsTopicResult&) const = default;
};
struct CreatePartitionsResponse {
  int32_t throttle_time_ms = 0;
  std::vector<CreatePartitionsTopicResult> results;
  bool operator==(const CreatePartitionsResponse&) const = default;
};

Status DecodeCreatePartitionsRequest(Reader& r, int16_t version, CreatePartitionsRequest* out);
void EncodeCreatePartitionsRequest(const CreatePartitionsRequest& m, int16_t version, Writer& w);
void EncodeCreatePartitionsResponse(const CreatePartitionsResponse& m, int16_t version, Writer& w);
Status DecodeCreatePartitionsResponse(Reader& r, int16_t version, CreatePartitionsResponse* out);

// ---- DeleteRecords (key 21), v0-1 ------------------------------------------------

struct DeleteRecordsPartition {
  int32_t partition_index = 0;
  int64_t offset = 0;  // delete records below this; -1: the high watermark
  bool operator==(const DeleteRecordsPartition&) const = default;
};
struct DeleteRecordsTopic {
  std::string name;
  std::vector<DeleteRecordsPartition> partitions;
  bool operator==(const DeleteRecordsTopic&) const = default;
};
struct DeleteRecordsRequest {
  std::vector<DeleteRecordsTopic> topics;
  int32_t timeout_ms = 0;
  bool operator==(const DeleteRecordsRequest&) const = default;
};
struct DeleteRecordsPartitionResult {
  int32_t partition_index = 0;
  int64_t low_watermark = 0;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const DeleteRecordsPartitionResult&) const = default;
};
struct DeleteRecordsTopicResult {
  std::string name;
  std::vector<DeleteRecordsPartitionResult> partitions;
  bool operator==(const DeleteRecordsTopicResult&) const = default;
};
struct DeleteRecordsResponse {
  int32_t throttle_time_ms = 0;
  std::vector<DeleteRecordsTopicResult> topics;
  bool operator==(const DeleteRecordsResponse&) const = default;
};

Status DecodeDeleteRecordsRequest(Reader& r, int16_t version, DeleteRecordsRequest* out);
void EncodeDeleteRecordsRequest(const DeleteRecordsRequest& m, int16_t version, Writer& w);
void EncodeDeleteRecordsResponse(const DeleteRecordsResponse& m, int16_t version, Writer& w);
Status DecodeDeleteRecordsResponse(Reader& r, int16_t version, DeleteRecordsResponse* out);

// ---- AlterConfigs (key 33), v0-1 -------------------------------------------------

struct AlterConfigsEntry {
  std::string name;
  std::optional<std::string> value;
  bool operator==(const AlterConfigsEntry&) const = default;
};
struct AlterConfigsResource {
  int8_t resource_type = 0;  // kConfigResourceTopic or kConfigResourceBroker
  std::string resource_name;
  std::vector<AlterConfigsEntry> configs;  // the resource's whole new set
  bool operator==(const AlterConfigsResource&) const = default;
};
struct AlterConfigsRequest {
  std::vector<AlterConfigsResource> resources;
  bool validate_only = false;
  bool operator==(const AlterConfigsRequest&) const = default;
};
struct AlterConfigsResult {
  ErrorCode error_code = ErrorCode::kNone;
  std::optional<std::string> error_message;
  int8_t resource_type = 0;
  std::string resource_name;
  bool operator==(const AlterConfigsResult&) const = default;
};
struct AlterConfigsResponse {
  int32_t throttle_time_ms = 0;
  std::vector<AlterConfigsResult> responses;
  bool operator==(const AlterConfigsResponse&) const = default;
};

Status DecodeAlterConfigsRequest(Reader& r, int16_t version, AlterConfigsRequest* out);
void EncodeAlterConfigsRequest(const AlterConfigsRequest& m, int16_t version, Writer& w);
void EncodeAlterConfigsResponse(const AlterConfigsResponse& m, int16_t version, Writer& w);
Status DecodeAlterConfigsResponse(Reader& r, int16_t version, AlterConfigsResponse* out);

// ---- IncrementalAlterConfigs (key 44), v0 -----------------------------------------
// The response is AlterConfigsResponse (the same layout at v0).

inline constexpr int8_t kConfigOpSet = 0;
inline constexpr int8_t kConfigOpDelete = 1;
inline constexpr int8_t kConfigOpAppend = 2;    // list configs only
inline constexpr int8_t kConfigOpSubtract = 3;  // list configs only

struct IncrementalAlterConfigsEntry {
  std::string name;
  int8_t op = kConfigOpSet;
  std::optional<std::string> value;
  bool operator==(const IncrementalAlterConfigsEntry&) const = default;
};
struct IncrementalAlterConfigsResource {
  int8_t resource_type = 0;
  std::string resource_name;
  std::vector<IncrementalAlterConfigsEntry> configs;
  bool operator==(const IncrementalAlterConfigsResource&) const = default;
};
struct IncrementalAlterConfigsRequest {
  std::vector<IncrementalAlterConfigsResource> resources;
  bool validate_only = false;
  bool operator==(const IncrementalAlterConfigsRequest&) const = default;
};

Status DecodeIncrementalAlterConfigsRequest(Reader& r, int16_t version, IncrementalAlterConfigsRequest* out);
void EncodeIncrementalAlterConfigsRequest(const IncrementalAlterConfigsRequest& m, int16_t version, Writer& w);

// ---- OffsetDelete (key 47), v0 ----------------------------------------------------

struct OffsetDeleteTopic {
  std::string name;
  std::vector<int32_t> partitions;
  bool operator==(const OffsetDeleteTopic&) const = default;
};
struct OffsetDeleteRequest {
  std::string group_id;
  std::vector<OffsetDeleteTopic> topics;
  bool operator==(const OffsetDeleteRequest&) const = default;
};
struct OffsetDeletePartitionResult {
  int32_t partition_index = 0;
  ErrorCode error_code = ErrorCode::kNone;
  bool operator==(const OffsetDeletePartitionResult&) const = default;
};
struct OffsetDeleteTopicResult {
  std::string name;
  std::vector<OffsetDeletePartitionResult> partitions;
  bool operator==(const OffsetDeleteTopicResult&) const = default;
};
struct OffsetDeleteResponse {
  ErrorCode error_code = ErrorCode::kNone;  // for the whole group
  int32_t throttle_time_ms = 0;
  std::vector<OffsetDeleteTopicResult> topics;
  bool operator==(const OffsetDeleteResponse&) const = default;
};

Status DecodeOffsetDeleteRequest(Reader& r, int16_t version, OffsetDeleteRequest* out);
void EncodeOffsetDeleteRequest(const OffsetDeleteRequest& m, int16_t version, Writer& w);
void EncodeOffsetDeleteResponse(const OffsetDeleteResponse& m, int16_t version, Writer& w);
Status DecodeOffsetDeleteResponse(Reader& r, int16_t version, OffsetDeleteResponse* out);

// The topics of a consumer protocol Subscription (member metadata of protocol
// type "consumer"): every version starts with version (int16) and topics
// (array of strings). nullopt if the bytes do not hold that much.
std::optional<std::vector<std::string>> ConsumerSubscriptionTopics(std::string_view metadata);

}  // namespace weir::kafka
