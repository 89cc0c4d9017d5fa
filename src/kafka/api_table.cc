#include "kafka/api_table.h"

#include <utility>

namespace weir::kafka {
namespace {

template <typename T>
Status DecodeAs(Status (*decode)(Reader&, int16_t, T*), Reader& r, int16_t version, RequestBody* body) {
  T m;
  WEIR_RETURN_IF_ERROR(decode(r, version, &m));
  *body = std::move(m);
  return Status::Ok();
}

Status DecodeBody(Reader& r, ApiKey key, int16_t version, RequestBody* body) {
  switch (key) {
    case ApiKey::kProduce: return DecodeAs(DecodeProduceRequest, r, version, body);
    case ApiKey::kFetch: return DecodeAs(DecodeFetchRequest, r, version, body);
    case ApiKey::kListOffsets: return DecodeAs(DecodeListOffsetsRequest, r, version, body);
    case ApiKey::kMetadata: return DecodeAs(DecodeMetadataRequest, r, version, body);
    case ApiKey::kOffsetCommit: return DecodeAs(DecodeOffsetCommitRequest, r, version, body);
    case ApiKey::kOffsetFetch: return DecodeAs(DecodeOffsetFetchRequest, r, version, body);
    case ApiKey::kFindCoordinator: return DecodeAs(DecodeFindCoordinatorRequest, r, version, body);
    case ApiKey::kJoinGroup: return DecodeAs(DecodeJoinGroupRequest, r, version, body);
    case ApiKey::kHeartbeat: return DecodeAs(DecodeHeartbeatRequest, r, version, body);
    case ApiKey::kLeaveGroup: return DecodeAs(DecodeLeaveGroupRequest, r, version, body);
    case ApiKey::kSyncGroup: return DecodeAs(DecodeSyncGroupRequest, r, version, body);
    case ApiKey::kApiVersions: return DecodeAs(DecodeApiVersionsRequest, r, version, body);
    case ApiKey::kCreateTopics: return DecodeAs(DecodeCreateTopicsRequest, r, version, body);
    case ApiKey::kDeleteTopics: return DecodeAs(DecodeDeleteTopicsRequest, r, version, body);
    case ApiKey::kInitProducerId: return DecodeAs(DecodeInitProducerIdRequest, r, version, body);
    case ApiKey::kDescribeGroups: return DecodeAs(DecodeDescribeGroupsRequest, r, version, body);
    case ApiKey::kListGroups: return DecodeAs(DecodeListGroupsRequest, r, version, body);
    case ApiKey::kDeleteGroups: return DecodeAs(DecodeDeleteGroupsRequest, r, version, body);
    case ApiKey::kDescribeConfigs: return DecodeAs(DecodeDescribeConfigsRequest, r, version, body);
    case ApiKey::kCreatePartitions: return DecodeAs(DecodeCreatePartitionsRequest, r, version, body);
    case ApiKey::kDeleteRecords: return DecodeAs(DecodeDeleteRecordsRequest, r, version, body);
    case ApiKey::kAlterConfigs: return DecodeAs(DecodeAlterConfigsRequest, r, version, body);
    case ApiKey::kIncrementalAlterConfigs:
      return DecodeAs(DecodeIncrementalAlterConfigsRequest, r, version, body);
    case ApiKey::kOffsetDelete: return DecodeAs(DecodeOffsetDeleteRequest, r, version, body);
  }
  return Internal("kafka: api key {} is in the table but has no decoder", static_cast<int>(key));
}

// One overload per alternative of RequestBody: std::visit fails to compile if
// one is missing.
struct KeyOf {
  ApiKey operator()(const ProduceRequest&) const { return ApiKey::kProduce; }
  ApiKey operator()(const FetchRequest&) const { return ApiKey::kFetch; }
  ApiKey operator()(const ListOffsetsRequest&) const { return ApiKey::kListOffsets; }
  ApiKey operator()(const MetadataRequest&) const { return ApiKey::kMetadata; }
  ApiKey operator()(const OffsetCommitRequest&) const { return ApiKey::kOffsetCommit; }
  ApiKey operator()(const OffsetFetchRequest&) const { return ApiKey::kOffsetFetch; }
  ApiKey operator()(const FindCoordinatorRequest&) const { return ApiKey::kFindCoordinator; }
  ApiKey operator()(const JoinGroupRequest&) const { return ApiKey::kJoinGroup; }
  ApiKey operator()(const HeartbeatRequest&) const { return ApiKey::kHeartbeat; }
  ApiKey operator()(const LeaveGroupRequest&) const { return ApiKey::kLeaveGroup; }
  ApiKey operator()(const SyncGroupRequest&) const { return ApiKey::kSyncGroup; }
  ApiKey operator()(const ApiVersionsRequest&) const { return ApiKey::kApiVersions; }
  ApiKey operator()(const CreateTopicsRequest&) const { return ApiKey::kCreateTopics; }
  ApiKey operator()(const DeleteTopicsRequest&) const { return ApiKey::kDeleteTopics; }
  ApiKey operator()(const InitProducerIdRequest&) const { return ApiKey::kInitProducerId; }
  ApiKey operator()(const DescribeGroupsRequest&) const { return ApiKey::kDescribeGroups; }
  ApiKey operator()(const ListGroupsRequest&) const { return ApiKey::kListGroups; }
  ApiKey operator()(const DeleteGroupsRequest&) const { return ApiKey::kDeleteGroups; }
  ApiKey operator()(const DescribeConfigsRequest&) const { return ApiKey::kDescribeConfigs; }
  ApiKey operator()(const CreatePartitionsRequest&) const { return ApiKey::kCreatePartitions; }
  ApiKey operator()(const DeleteRecordsRequest&) const { return ApiKey::kDeleteRecords; }
  ApiKey operator()(const AlterConfigsRequest&) const { return ApiKey::kAlterConfigs; }
  ApiKey operator()(const IncrementalAlterConfigsRequest&) const { return ApiKey::kIncrementalAlterConfigs; }
  ApiKey operator()(const OffsetDeleteRequest&) const { return ApiKey::kOffsetDelete; }
};

struct EncodeBody {
  int16_t v;
  Writer& w;
  void operator()(const ProduceRequest& m) const { EncodeProduceRequest(m, v, w); }
  void operator()(const FetchRequest& m) const { EncodeFetchRequest(m, v, w); }
  void operator()(const ListOffsetsRequest& m) const { EncodeListOffsetsRequest(m, v, w); }
  void operator()(const MetadataRequest& m) const { EncodeMetadataRequest(m, v, w); }
  void operator()(const OffsetCommitRequest& m) const { EncodeOffsetCommitRequest(m, v, w); }
  void operator()(const OffsetFetchRequest& m) const { EncodeOffsetFetchRequest(m, v, w); }
  void operator()(const FindCoordinatorRequest& m) const { EncodeFindCoordinatorRequest(m, v, w); }
  void operator()(const JoinGroupRequest& m) const { EncodeJoinGroupRequest(m, v, w); }
  void operator()(const HeartbeatRequest& m) const { EncodeHeartbeatRequest(m, v, w); }
  void operator()(const LeaveGroupRequest& m) const { EncodeLeaveGroupRequest(m, v, w); }
  void operator()(const SyncGroupRequest& m) const { EncodeSyncGroupRequest(m, v, w); }
  void operator()(const ApiVersionsRequest& m) const { EncodeApiVersionsRequest(m, v, w); }
  void operator()(const CreateTopicsRequest& m) const { EncodeCreateTopicsRequest(m, v, w); }
  void operator()(const DeleteTopicsRequest& m) const { EncodeDeleteTopicsRequest(m, v, w); }
  void operator()(const InitProducerIdRequest& m) const { EncodeInitProducerIdRequest(m, v, w); }
  void operator()(const DescribeGroupsRequest& m) const { EncodeDescribeGroupsRequest(m, v, w); }
  void operator()(const ListGroupsRequest& m) const { EncodeListGroupsRequest(m, v, w); }
  void operator()(const DeleteGroupsRequest& m) const { EncodeDeleteGroupsRequest(m, v, w); }
  void operator()(const DescribeConfigsRequest& m) const { EncodeDescribeConfigsRequest(m, v, w); }
  void operator()(const CreatePartitionsRequest& m) const { EncodeCreatePartitionsRequest(m, v, w); }
  void operator()(const DeleteRecordsRequest& m) const { EncodeDeleteRecordsRequest(m, v, w); }
  void operator()(const AlterConfigsRequest& m) const { EncodeAlterConfigsRequest(m, v, w); }
  void operator()(const IncrementalAlterConfigsRequest& m) const { EncodeIncrementalAlterConfigsRequest(m, v, w); }
  void operator()(const OffsetDeleteRequest& m) const { EncodeOffsetDeleteRequest(m, v, w); }
};

}  // namespace

const ApiInfo* FindApi(int16_t key) {
  for (const ApiInfo& api : kSupportedApis) {
    if (api.key == key) return &api;
  }
  return nullptr;
}

bool IsSupported(int16_t key, int16_t version) {
  const ApiInfo* api = FindApi(key);
  return api != nullptr && version >= api->min_version && version <= api->max_version;
}

ApiVersionsResponse SupportedApiVersions() {
  ApiVersionsResponse resp;
  for (const ApiInfo& api : kSupportedApis) resp.api_keys.push_back({api.key, api.advertised_min, api.max_version});
  return resp;
}

std::string EncodeApiVersionsUnsupported(int32_t correlation_id) {
  ApiVersionsResponse resp = SupportedApiVersions();
  resp.error_code = ErrorCode::kUnsupportedVersion;
  std::string out;
  Writer w(&out);
  EncodeResponseHeader(correlation_id, w);
  EncodeApiVersionsResponse(resp, /*version=*/0, w);
  return out;
}

Result<RequestHeader> PeekRequestHeader(std::string_view frame) {
  Reader r(frame);
  RequestHeader header;
  WEIR_RETURN_IF_ERROR(DecodeRequestHeader(r, &header));
  return header;
}

Result<DecodedRequest> DecodeRequest(std::string_view frame) {
  Reader r(frame);
  // Requests wait decoded for their turn, holding only their frame's share
  // of the request budget: one whose decoded form would be far larger (a
  // million empty group names) is refused. Real ones take up to about 6x
  // their frame (OffsetCommit's partitions; most 1-3x).
  r.SetDecodedLimit(kDecodedPerFrameByte * frame.size() + kDecodedAllowance);
  DecodedRequest out;
  WEIR_RETURN_IF_ERROR(DecodeRequestHeader(r, &out.header));
  const RequestHeader& h = out.header;
  const ApiInfo* api = FindApi(h.api_key);
  if (api == nullptr) return NotSupported("kafka: api key {} is not supported", h.api_key);
  if (h.api_version < api->min_version || h.api_version > api->max_version) {
    return NotSupported("kafka: {} v{} is not supported (v{}-{})", api->name, h.api_version, api->min_version,
                        api->max_version);
  }
  WEIR_RETURN_IF_ERROR(DecodeBody(r, static_cast<ApiKey>(h.api_key), h.api_version, &out.body));
  return out;
}

ApiKey RequestKey(const RequestBody& body) { return std::visit(KeyOf{}, body); }

Result<std::string> EncodeRequest(const RequestHeader& header, const RequestBody& body) {
  RequestHeader h = header;
  h.api_key = static_cast<int16_t>(RequestKey(body));
  std::string out;
  Writer w(&out);
  EncodeRequestHeader(h, w);
  std::visit(EncodeBody{h.api_version, w}, body);
  if (!w.ok()) return w.status();
  return out;
}

}  // namespace weir::kafka
