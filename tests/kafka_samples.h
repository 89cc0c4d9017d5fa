// Sample Kafka requests and responses for every supported API and version,
// each using every field that exists in that version (and only those, so a
// round trip through the wire gives back an equal struct). Shared by
// kafka_codec_test and the fuzz seed-corpus generator. Header-only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kafka/api_table.h"
#include "kafka/messages.h"

namespace weir::kafka::samples {

// Bytes that look like a record batch; the codec never looks inside.
inline constexpr std::string_view kBatchA("\x00\x00\x00\x00\x00\x00\x00\x00"
                                          "batch-a",
                                          15);
inline constexpr std::string_view kBatchB = "batch-b\xff\x01";

inline RequestBody Request(ApiKey key, int16_t v) {
  switch (key) {
    case ApiKey::kProduce: {
      ProduceRequest m;
      m.transactional_id = std::nullopt;
      m.acks = -1;
      m.timeout_ms = 30000;
      m.topic_data = {{"orders", {{0, kBatchA}, {3, std::nullopt}}}, {"caf\xc3\xa9", {}}};
      return m;
    }
    case ApiKey::kFetch: {
      FetchRequest m;
      m.replica_id = -1;
      m.max_wait_ms = 500;
      m.min_bytes = 1;
      m.max_bytes = 52428800;
      m.isolation_level = 1;
      FetchPartition p{2, -1, 42, -1, 1048576};
      if (v >= 5) p.log_start_offset = 7;
      if (v >= 9) p.current_leader_epoch = 5;
      m.topics = {{"orders", {p, {0, -1, 0, -1, 65536}}}};
      if (v >= 7) {
        m.session_id = 12;
        m.session_epoch = 3;
        m.forgotten_topics_data = {{"old", {1, 2, 3}}};
      }
      if (v >= 11) m.rack_id = "rack-1";
      return m;
    }
    case ApiKey::kListOffsets: {
      ListOffsetsRequest m;
      m.replica_id = -1;
      if (v >= 2) m.isolation_level = 1;
      ListOffsetsPartition p{1, kListOffsetsEarliest, 1};
      if (v == 0) p.max_num_offsets = 5;
      m.topics = {{"orders", {p, {2, 1700000000000, 1}}}};
      return m;
    }
    case ApiKey::kMetadata: {
      MetadataRequest m;
      m.topics = std::vector<MetadataRequestTopic>{{"orders"}, {"events"}};
      if (v >= 4) m.allow_auto_topic_creation = false;
      return m;
    }
    case ApiKey::kOffsetCommit: {
      OffsetCommitRequest m;
      m.group_id = "g1";
      if (v >= 1) {
        m.generation_id = 4;
        m.member_id = "rdkafka-1234";
      }
      if (v >= 7) m.group_instance_id = "instance-1";
      if (v >= 2 && v <= 4) m.retention_time_ms = 86400000;
      OffsetCommitRequestPartition p{0, 100, -1, -1, "meta"};
      if (v >= 6) p.committed_leader_epoch = 2;
      if (v == 1) p.commit_timestamp = 1700000000000;
      m.topics = {{"orders", {p, {1, 200, -1, -1, std::nullopt}}}};
      return m;
    }
    case ApiKey::kOffsetFetch: {
      OffsetFetchRequest m;
      m.group_id = "g1";
      m.topics = std::vector<OffsetFetchRequestTopic>{{"orders", {0, 1, 2}}};
      return m;
    }
    case ApiKey::kFindCoordinator: {
      FindCoordinatorRequest m;
      m.key = "g1";
      if (v >= 1) m.key_type = kCoordinatorKeyGroup;
      return m;
    }
    case ApiKey::kJoinGroup: {
      JoinGroupRequest m;
      m.group_id = "g1";
      m.session_timeout_ms = 10000;
      if (v >= 1) m.rebalance_timeout_ms = 300000;
      m.member_id = "";
      if (v >= 5) m.group_instance_id = "instance-1";
      m.protocol_type = "consumer";
      m.protocols = {{"range", std::string("\x00\x01\x00\x00\x00\x01\x00\x06orders", 14)}, {"roundrobin", ""}};
      return m;
    }
    case ApiKey::kHeartbeat: {
      HeartbeatRequest m{"g1", 4, "member-1", std::nullopt};
      if (v >= 3) m.group_instance_id = "instance-1";
      return m;
    }
    case ApiKey::kLeaveGroup: {
      LeaveGroupRequest m;
      m.group_id = "g1";
      if (v <= 2) {
        m.member_id = "member-1";
      } else {
        m.members = {{"member-1", std::nullopt}, {"member-2", "instance-2"}};
      }
      return m;
    }
    case ApiKey::kSyncGroup: {
      SyncGroupRequest m;
      m.group_id = "g1";
      m.generation_id = 4;
      m.member_id = "member-1";
      if (v >= 3) m.group_instance_id = "instance-1";
      m.assignments = {{"member-1", std::string("\x00\x01\x00\x00", 4)}, {"member-2", ""}};
      return m;
    }
    case ApiKey::kApiVersions:
      return ApiVersionsRequest{};
    case ApiKey::kCreateTopics: {
      CreateTopicsRequest m;
      m.topics = {{"orders", 3, 1, {}, {{"retention.ms", "3600000"}, {"cleanup.policy", std::nullopt}}},
                  {"manual", -1, -1, {{0, {1, 2}}, {1, {2, 1}}}, {}}};
      m.timeout_ms = 5000;
      if (v >= 1) m.validate_only = true;
      return m;
    }
    case ApiKey::kDeleteTopics:
      return DeleteTopicsRequest{{"orders", "events"}, 5000};
    case ApiKey::kInitProducerId:
      return InitProducerIdRequest{std::nullopt, 60000};
    case ApiKey::kDescribeGroups: {
      DescribeGroupsRequest m;
      m.groups = {"g1", "caf\xc3\xa9", ""};
      if (v >= 3) m.include_authorized_operations = true;
      return m;
    }
    case ApiKey::kListGroups:
      return ListGroupsRequest{};
    case ApiKey::kDeleteGroups:
      return DeleteGroupsRequest{{"g1", "g2"}};
    case ApiKey::kDeleteRecords:
      return DeleteRecordsRequest{{{"orders", {{0, 17}, {1, -1}}}, {"events", {}}}, 30000};
    case ApiKey::kAlterConfigs: {
      AlterConfigsRequest m;
      m.resources = {{kConfigResourceTopic, "orders", {{"retention.ms", "3600000"}, {"cleanup.policy", std::nullopt}}},
                     {kConfigResourceBroker, "1", {}}};
      m.validate_only = true;
      return m;
    }
    case ApiKey::kOffsetDelete:
      return OffsetDeleteRequest{"g1", {{"orders", {0, 3}}, {"events", {}}}};
    case ApiKey::kIncrementalAlterConfigs: {
      IncrementalAlterConfigsRequest m;
      m.resources = {{kConfigResourceTopic, "orders",
                      {{"retention.ms", kConfigOpSet, "3600000"}, {"cleanup.policy", kConfigOpAppend, "delete"},
                       {"segment.bytes", kConfigOpDelete, std::nullopt}}}};
      return m;
    }
    case ApiKey::kCreatePartitions: {
      CreatePartitionsRequest m;
      m.topics = {{"orders", 6, std::nullopt}, {"events", 3, std::vector<std::vector<int32_t>>{{1}, {1, 2}}}};
      m.timeout_ms = 30000;
      m.validate_only = true;
      return m;
    }
    case ApiKey::kDescribeConfigs: {
      DescribeConfigsRequest m;
      m.resources = {{kConfigResourceTopic, "orders", std::vector<std::string>{"retention.ms", "cleanup.policy"}},
                     {kConfigResourceBroker, "1", std::nullopt}};
      if (v >= 1) m.include_synonyms = true;
      return m;
    }
  }
  return ApiVersionsRequest{};
}

inline RequestHeader Header(ApiKey key, int16_t v, int32_t correlation_id = 7) {
  return RequestHeader{static_cast<int16_t>(key), v, correlation_id, "weir-test"};
}

// Visits every supported (key, version).
inline void ForEachApiVersion(const std::function<void(ApiKey, int16_t)>& fn) {
  for (const ApiInfo& api : kSupportedApis) {
    for (int16_t v = api.min_version; v <= api.max_version; ++v) fn(static_cast<ApiKey>(api.key), v);
  }
}

// A valid request frame body for (key, v).
inline std::string RequestFrame(ApiKey key, int16_t v) {
  auto frame = EncodeRequest(Header(key, v), Request(key, v));
  return frame.ok() ? *frame : std::string();
}

}  // namespace weir::kafka::samples
