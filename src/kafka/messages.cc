#include "kafka/messages.h"

#include <utility>

namespace weir::kafka {
namespace {

// Smallest wire size of each kind of field, for the array-count check: an
// element's minimum is the sum over its fields in the lowest supported
// version (an empty or null string, array or bytes included).
constexpr size_t kI16 = 2;
constexpr size_t kI32 = 4;
constexpr size_t kI64 = 8;
constexpr size_t kStr = 2;
constexpr size_t kArr = 4;
constexpr size_t kBytes = 4;

// Reads an array of `field`, calling read_one(element) for each with the
// element's index in the error path. Stops at the first error.
template <typename T, typename Fn>
void ReadArray(Reader& r, const char* field, size_t min_size, std::vector<T>* out, Fn&& read_one) {
  int32_t n = r.ArrayLength(field, min_size);
  r.Charge(field, static_cast<uint64_t>(n) * sizeof(T));
  if (r.ok()) out->reserve(out->size() + static_cast<size_t>(n));
  for (int32_t i = 0; i < n && r.ok(); ++i) {
    Reader::Scope scope(r, field, i);
    read_one(out->emplace_back());
  }
}

template <typename T, typename Fn>
void ReadNullableArray(Reader& r, const char* field, size_t min_size, std::optional<std::vector<T>>* out,
                       Fn&& read_one) {
  std::optional<int32_t> n = r.NullableArrayLength(field, min_size);
  if (!n) {
    out->reset();
    return;
  }
  out->emplace();
  r.Charge(field, static_cast<uint64_t>(*n) * sizeof(T));
  if (r.ok()) (*out)->reserve(static_cast<size_t>(*n));
  for (int32_t i = 0; i < *n && r.ok(); ++i) {
    Reader::Scope scope(r, field, i);
    read_one((*out)->emplace_back());
  }
}

void ReadInt32Array(Reader& r, const char* field, std::vector<int32_t>* out) {
  ReadArray(r, field, kI32, out, [&](int32_t& v) { v = r.Int32(""); });
}

ErrorCode ReadErrorCode(Reader& r) { return static_cast<ErrorCode>(r.Int16("error_code")); }

template <typename T, typename Fn>
void WriteArray(Writer& w, const std::vector<T>& v, Fn&& write_one) {
  w.ArrayLength(v.size());
  for (const T& e : v) write_one(e);
}

template <typename T, typename Fn>
void WriteNullableArray(Writer& w, const std::optional<std::vector<T>>& v, Fn&& write_one) {
  if (!v) {
    w.NullArray();
    return;
  }
  WriteArray(w, *v, write_one);
}

void WriteInt32Array(Writer& w, const std::vector<int32_t>& v) {
  WriteArray(w, v, [&](int32_t x) { w.Int32(x); });
}

void WriteErrorCode(Writer& w, ErrorCode e) { w.Int16(static_cast<int16_t>(e)); }

}  // namespace

// ---- Headers ------------------------------------------------------------------

Status DecodeRequestHeader(Reader& r, RequestHeader* out) {
  *out = {};
  Reader::Scope root(r, "RequestHeader");
  out->api_key = r.Int16("api_key");
  out->api_version = r.Int16("api_version");
  out->correlation_id = r.Int32("correlation_id");
  out->client_id = r.NullableRawString("client_id");
  return r.status();
}

void EncodeRequestHeader(const RequestHeader& h, Writer& w) {
  w.Int16(h.api_key);
  w.Int16(h.api_version);
  w.Int32(h.correlation_id);
  w.NullableString(h.client_id);
}

void EncodeResponseHeader(int32_t correlation_id, Writer& w) { w.Int32(correlation_id); }

Status DecodeResponseHeader(Reader& r, int32_t* correlation_id) {
  Reader::Scope root(r, "ResponseHeader");
  *correlation_id = r.Int32("correlation_id");
  return r.status();
}

// ---- Produce ------------------------------------------------------------------

Status DecodeProduceRequest(Reader& r, int16_t version, ProduceRequest* out) {
  *out = {};
  Reader::Scope root(r, "ProduceRequest");
  if (version >= 3) out->transactional_id = r.NullableString("transactional_id");
  out->acks = r.Int16("acks");
  out->timeout_ms = r.Int32("timeout_ms");
  ReadArray(r, "topic_data", kStr + kArr, &out->topic_data, [&](ProduceTopicData& t) {
    t.name = r.String("name");
    ReadArray(r, "partition_data", kI32 + kBytes, &t.partition_data, [&](ProducePartitionData& p) {
      p.index = r.Int32("index");
      p.records = r.NullableBytes("records");
    });
  });
  return r.Finish();
}

void EncodeProduceRequest(const ProduceRequest& m, int16_t version, Writer& w) {
  if (version >= 3) w.NullableString(m.transactional_id);
  w.Int16(m.acks);
  w.Int32(m.timeout_ms);
  WriteArray(w, m.topic_data, [&](const ProduceTopicData& t) {
    w.String(t.name);
    WriteArray(w, t.partition_data, [&](const ProducePartitionData& p) {
      w.Int32(p.index);
      w.NullableBytes(p.records);
    });
  });
}

namespace {
// An error message a string cannot carry (it may quote a long name) is cut at
// a character boundary rather than closing the connection.
void WriteErrorMessage(Writer& w, const std::optional<std::string>& m) {
  if (!m || m->size() <= kMaxStringSize) return w.NullableString(m);
  size_t n = kMaxStringSize;
  while (n > 0 && (static_cast<unsigned char>((*m)[n]) & 0xC0) == 0x80) --n;
  w.NullableString(std::string_view(*m).substr(0, n));
}

// KAFKA_STORAGE_ERROR came with Produce v4 and Fetch v6; older clients take it
// as fatal. As on Kafka, they get NOT_LEADER_OR_FOLLOWER instead, which they
// retry after a metadata refresh.
ErrorCode StorageErrorFor(ErrorCode e, bool client_knows_it) {
  return e == ErrorCode::kKafkaStorageError && !client_knows_it ? ErrorCode::kNotLeaderOrFollower : e;
}
}  // namespace

void EncodeProduceResponse(const ProduceResponse& m, int16_t version, Writer& w) {
  WriteArray(w, m.responses, [&](const ProduceTopicResponse& t) {
    w.String(t.name);
    WriteArray(w, t.partition_responses, [&](const ProducePartitionResponse& p) {
      w.Int32(p.index);
      WriteErrorCode(w, StorageErrorFor(p.error_code, version >= 4));
      w.Int64(p.base_offset);
      if (version >= 2) w.Int64(p.log_append_time_ms);
      if (version >= 5) w.Int64(p.log_start_offset);
    });
  });
  if (version >= 1) w.Int32(m.throttle_time_ms);
}

Status DecodeProduceResponse(Reader& r, int16_t version, ProduceResponse* out) {
  *out = {};
  Reader::Scope root(r, "ProduceResponse");
  ReadArray(r, "responses", kStr + kArr, &out->responses, [&](ProduceTopicResponse& t) {
    t.name = r.String("name");
    ReadArray(r, "partition_responses", kI32 + kI16 + kI64, &t.partition_responses,
              [&](ProducePartitionResponse& p) {
                p.index = r.Int32("index");
                p.error_code = ReadErrorCode(r);
                p.base_offset = r.Int64("base_offset");
                if (version >= 2) p.log_append_time_ms = r.Int64("log_append_time_ms");
                if (version >= 5) p.log_start_offset = r.Int64("log_start_offset");
              });
  });
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  return r.Finish();
}

// ---- Fetch --------------------------------------------------------------------

Status DecodeFetchRequest(Reader& r, int16_t version, FetchRequest* out) {
  *out = {};
  Reader::Scope root(r, "FetchRequest");
  out->replica_id = r.Int32("replica_id");
  out->max_wait_ms = r.Int32("max_wait_ms");
  out->min_bytes = r.Int32("min_bytes");
  if (version >= 3) out->max_bytes = r.Int32("max_bytes");
  if (version >= 4) out->isolation_level = r.Int8("isolation_level");
  if (version >= 7) {
    out->session_id = r.Int32("session_id");
    out->session_epoch = r.Int32("session_epoch");
  }
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](FetchTopic& t) {
    t.topic = r.String("topic");
    ReadArray(r, "partitions", kI32 + kI64 + kI32, &t.partitions, [&](FetchPartition& p) {
      p.partition = r.Int32("partition");
      if (version >= 9) p.current_leader_epoch = r.Int32("current_leader_epoch");
      p.fetch_offset = r.Int64("fetch_offset");
      if (version >= 5) p.log_start_offset = r.Int64("log_start_offset");
      p.partition_max_bytes = r.Int32("partition_max_bytes");
    });
  });
  if (version >= 7) {
    ReadArray(r, "forgotten_topics_data", kStr + kArr, &out->forgotten_topics_data, [&](ForgottenTopic& t) {
      t.topic = r.String("topic");
      ReadInt32Array(r, "partitions", &t.partitions);
    });
  }
  if (version >= 11) out->rack_id = r.String("rack_id");
  return r.Finish();
}

void EncodeFetchRequest(const FetchRequest& m, int16_t version, Writer& w) {
  w.Int32(m.replica_id);
  w.Int32(m.max_wait_ms);
  w.Int32(m.min_bytes);
  if (version >= 3) w.Int32(m.max_bytes);
  if (version >= 4) w.Int8(m.isolation_level);
  if (version >= 7) {
    w.Int32(m.session_id);
    w.Int32(m.session_epoch);
  }
  WriteArray(w, m.topics, [&](const FetchTopic& t) {
    w.String(t.topic);
    WriteArray(w, t.partitions, [&](const FetchPartition& p) {
      w.Int32(p.partition);
      if (version >= 9) w.Int32(p.current_leader_epoch);
      w.Int64(p.fetch_offset);
      if (version >= 5) w.Int64(p.log_start_offset);
      w.Int32(p.partition_max_bytes);
    });
  });
  if (version >= 7) {
    WriteArray(w, m.forgotten_topics_data, [&](const ForgottenTopic& t) {
      w.String(t.topic);
      WriteInt32Array(w, t.partitions);
    });
  }
  if (version >= 11) w.String(m.rack_id);
}

void EncodeFetchResponse(const FetchResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  if (version >= 7) {
    WriteErrorCode(w, m.error_code);
    w.Int32(m.session_id);
  }
  WriteArray(w, m.responses, [&](const FetchableTopicResponse& t) {
    w.String(t.topic);
    WriteArray(w, t.partitions, [&](const FetchPartitionData& p) {
      w.Int32(p.partition_index);
      WriteErrorCode(w, StorageErrorFor(p.error_code, version >= 6));
      w.Int64(p.high_watermark);
      if (version >= 4) w.Int64(p.last_stable_offset);
      if (version >= 5) w.Int64(p.log_start_offset);
      if (version >= 4) {
        WriteNullableArray(w, p.aborted_transactions, [&](const AbortedTransaction& a) {
          w.Int64(a.producer_id);
          w.Int64(a.first_offset);
        });
      }
      if (version >= 11) w.Int32(p.preferred_read_replica);
      size_t at = w.ReserveLength();
      for (std::string_view piece : p.records) w.Raw(piece);
      w.PatchLength(at);
    });
  });
}

Status DecodeFetchResponse(Reader& r, int16_t version, FetchResponse* out) {
  *out = {};
  Reader::Scope root(r, "FetchResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  if (version >= 7) {
    out->error_code = ReadErrorCode(r);
    out->session_id = r.Int32("session_id");
  }
  ReadArray(r, "responses", kStr + kArr, &out->responses, [&](FetchableTopicResponse& t) {
    t.topic = r.String("topic");
    // v4 minimum: index, error, high watermark, last stable offset, aborted (null), records.
    ReadArray(r, "partitions", kI32 + kI16 + kI64 + kI64 + kArr + kBytes, &t.partitions,
              [&](FetchPartitionData& p) {
                p.partition_index = r.Int32("partition_index");
                p.error_code = ReadErrorCode(r);
                p.high_watermark = r.Int64("high_watermark");
                if (version >= 4) p.last_stable_offset = r.Int64("last_stable_offset");
                if (version >= 5) p.log_start_offset = r.Int64("log_start_offset");
                if (version >= 4) {
                  ReadNullableArray(r, "aborted_transactions", kI64 + kI64, &p.aborted_transactions,
                                    [&](AbortedTransaction& a) {
                                      a.producer_id = r.Int64("producer_id");
                                      a.first_offset = r.Int64("first_offset");
                                    });
                }
                if (version >= 11) p.preferred_read_replica = r.Int32("preferred_read_replica");
                std::optional<std::string_view> records = r.NullableBytes("records");
                if (records && !records->empty()) p.records.push_back(*records);
              });
  });
  return r.Finish();
}

// ---- ListOffsets --------------------------------------------------------------

Status DecodeListOffsetsRequest(Reader& r, int16_t version, ListOffsetsRequest* out) {
  *out = {};
  Reader::Scope root(r, "ListOffsetsRequest");
  out->replica_id = r.Int32("replica_id");
  if (version >= 2) out->isolation_level = r.Int8("isolation_level");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](ListOffsetsTopic& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI64, &t.partitions, [&](ListOffsetsPartition& p) {
      p.partition_index = r.Int32("partition_index");
      p.timestamp = r.Int64("timestamp");
      if (version == 0) p.max_num_offsets = r.Int32("max_num_offsets");
    });
  });
  return r.Finish();
}

void EncodeListOffsetsRequest(const ListOffsetsRequest& m, int16_t version, Writer& w) {
  w.Int32(m.replica_id);
  if (version >= 2) w.Int8(m.isolation_level);
  WriteArray(w, m.topics, [&](const ListOffsetsTopic& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const ListOffsetsPartition& p) {
      w.Int32(p.partition_index);
      w.Int64(p.timestamp);
      if (version == 0) w.Int32(p.max_num_offsets);
    });
  });
}

void EncodeListOffsetsResponse(const ListOffsetsResponse& m, int16_t version, Writer& w) {
  if (version >= 2) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.topics, [&](const ListOffsetsTopicResponse& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const ListOffsetsPartitionResponse& p) {
      w.Int32(p.partition_index);
      WriteErrorCode(w, p.error_code);
      if (version == 0) {
        WriteArray(w, p.old_style_offsets, [&](int64_t o) { w.Int64(o); });
      } else {
        w.Int64(p.timestamp);
        w.Int64(p.offset);
      }
    });
  });
}

Status DecodeListOffsetsResponse(Reader& r, int16_t version, ListOffsetsResponse* out) {
  *out = {};
  Reader::Scope root(r, "ListOffsetsResponse");
  if (version >= 2) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](ListOffsetsTopicResponse& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI16 + kArr, &t.partitions, [&](ListOffsetsPartitionResponse& p) {
      p.partition_index = r.Int32("partition_index");
      p.error_code = ReadErrorCode(r);
      if (version == 0) {
        ReadArray(r, "old_style_offsets", kI64, &p.old_style_offsets, [&](int64_t& o) { o = r.Int64(""); });
      } else {
        p.timestamp = r.Int64("timestamp");
        p.offset = r.Int64("offset");
      }
    });
  });
  return r.Finish();
}

// ---- Metadata -----------------------------------------------------------------

Status DecodeMetadataRequest(Reader& r, int16_t version, MetadataRequest* out) {
  *out = {};
  Reader::Scope root(r, "MetadataRequest");
  auto read_topic = [&](MetadataRequestTopic& t) { t.name = r.String("name"); };
  if (version >= 1) {
    ReadNullableArray(r, "topics", kStr, &out->topics, read_topic);
  } else {
    ReadArray(r, "topics", kStr, &out->topics.emplace(), read_topic);
  }
  if (version >= 4) out->allow_auto_topic_creation = r.Bool("allow_auto_topic_creation");
  return r.Finish();
}

void EncodeMetadataRequest(const MetadataRequest& m, int16_t version, Writer& w) {
  auto write_topic = [&](const MetadataRequestTopic& t) { w.String(t.name); };
  if (version >= 1) {
    WriteNullableArray(w, m.topics, write_topic);
  } else {
    // v0 has no null: an empty array asks for every topic.
    WriteArray(w, m.topics.value_or(std::vector<MetadataRequestTopic>{}), write_topic);
  }
  if (version >= 4) w.Bool(m.allow_auto_topic_creation);
}

void EncodeMetadataResponse(const MetadataResponse& m, int16_t version, Writer& w) {
  if (version >= 3) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.brokers, [&](const MetadataResponseBroker& b) {
    w.Int32(b.node_id);
    w.String(b.host);
    w.Int32(b.port);
    if (version >= 1) w.NullableString(b.rack);
  });
  if (version >= 2) w.NullableString(m.cluster_id);
  if (version >= 1) w.Int32(m.controller_id);
  WriteArray(w, m.topics, [&](const MetadataResponseTopic& t) {
    WriteErrorCode(w, t.error_code);
    w.String(t.name);
    if (version >= 1) w.Bool(t.is_internal);
    WriteArray(w, t.partitions, [&](const MetadataResponsePartition& p) {
      WriteErrorCode(w, p.error_code);
      w.Int32(p.partition_index);
      w.Int32(p.leader_id);
      WriteInt32Array(w, p.replica_nodes);
      WriteInt32Array(w, p.isr_nodes);
      if (version >= 5) WriteInt32Array(w, p.offline_replicas);
    });
  });
}

Status DecodeMetadataResponse(Reader& r, int16_t version, MetadataResponse* out) {
  *out = {};
  Reader::Scope root(r, "MetadataResponse");
  if (version >= 3) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "brokers", kI32 + kStr + kI32, &out->brokers, [&](MetadataResponseBroker& b) {
    b.node_id = r.Int32("node_id");
    b.host = r.String("host");
    b.port = r.Int32("port");
    if (version >= 1) b.rack = r.NullableString("rack");
  });
  if (version >= 2) out->cluster_id = r.NullableString("cluster_id");
  if (version >= 1) out->controller_id = r.Int32("controller_id");
  ReadArray(r, "topics", kI16 + kStr + kArr, &out->topics, [&](MetadataResponseTopic& t) {
    t.error_code = ReadErrorCode(r);
    t.name = r.String("name");
    if (version >= 1) t.is_internal = r.Bool("is_internal");
    ReadArray(r, "partitions", kI16 + kI32 + kI32 + kArr + kArr, &t.partitions, [&](MetadataResponsePartition& p) {
      p.error_code = ReadErrorCode(r);
      p.partition_index = r.Int32("partition_index");
      p.leader_id = r.Int32("leader_id");
      ReadInt32Array(r, "replica_nodes", &p.replica_nodes);
      ReadInt32Array(r, "isr_nodes", &p.isr_nodes);
      if (version >= 5) ReadInt32Array(r, "offline_replicas", &p.offline_replicas);
    });
  });
  return r.Finish();
}

// ---- OffsetCommit -------------------------------------------------------------

Status DecodeOffsetCommitRequest(Reader& r, int16_t version, OffsetCommitRequest* out) {
  *out = {};
  Reader::Scope root(r, "OffsetCommitRequest");
  out->group_id = r.String("group_id");
  if (version >= 1) {
    out->generation_id = r.Int32("generation_id");
    out->member_id = r.String("member_id");
  }
  if (version >= 7) out->group_instance_id = r.NullableString("group_instance_id");
  if (version >= 2 && version <= 4) out->retention_time_ms = r.Int64("retention_time_ms");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](OffsetCommitRequestTopic& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI64 + kStr, &t.partitions, [&](OffsetCommitRequestPartition& p) {
      p.partition_index = r.Int32("partition_index");
      p.committed_offset = r.Int64("committed_offset");
      if (version >= 6) p.committed_leader_epoch = r.Int32("committed_leader_epoch");
      if (version == 1) p.commit_timestamp = r.Int64("commit_timestamp");
      p.committed_metadata = r.NullableRawString("committed_metadata");
    });
  });
  return r.Finish();
}

void EncodeOffsetCommitRequest(const OffsetCommitRequest& m, int16_t version, Writer& w) {
  w.String(m.group_id);
  if (version >= 1) {
    w.Int32(m.generation_id);
    w.String(m.member_id);
  }
  if (version >= 7) w.NullableString(m.group_instance_id);
  if (version >= 2 && version <= 4) w.Int64(m.retention_time_ms);
  WriteArray(w, m.topics, [&](const OffsetCommitRequestTopic& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const OffsetCommitRequestPartition& p) {
      w.Int32(p.partition_index);
      w.Int64(p.committed_offset);
      if (version >= 6) w.Int32(p.committed_leader_epoch);
      if (version == 1) w.Int64(p.commit_timestamp);
      w.NullableString(p.committed_metadata);
    });
  });
}

void EncodeOffsetCommitResponse(const OffsetCommitResponse& m, int16_t version, Writer& w) {
  if (version >= 3) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.topics, [&](const OffsetCommitResponseTopic& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const OffsetCommitResponsePartition& p) {
      w.Int32(p.partition_index);
      WriteErrorCode(w, p.error_code);
    });
  });
}

Status DecodeOffsetCommitResponse(Reader& r, int16_t version, OffsetCommitResponse* out) {
  *out = {};
  Reader::Scope root(r, "OffsetCommitResponse");
  if (version >= 3) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](OffsetCommitResponseTopic& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI16, &t.partitions, [&](OffsetCommitResponsePartition& p) {
      p.partition_index = r.Int32("partition_index");
      p.error_code = ReadErrorCode(r);
    });
  });
  return r.Finish();
}

// ---- OffsetFetch --------------------------------------------------------------

Status DecodeOffsetFetchRequest(Reader& r, int16_t version, OffsetFetchRequest* out) {
  *out = {};
  Reader::Scope root(r, "OffsetFetchRequest");
  out->group_id = r.String("group_id");
  auto read_topic = [&](OffsetFetchRequestTopic& t) {
    t.name = r.String("name");
    ReadInt32Array(r, "partition_indexes", &t.partition_indexes);
  };
  if (version >= 2) {
    ReadNullableArray(r, "topics", kStr + kArr, &out->topics, read_topic);
  } else {
    ReadArray(r, "topics", kStr + kArr, &out->topics.emplace(), read_topic);
  }
  return r.Finish();
}

void EncodeOffsetFetchRequest(const OffsetFetchRequest& m, int16_t version, Writer& w) {
  w.String(m.group_id);
  auto write_topic = [&](const OffsetFetchRequestTopic& t) {
    w.String(t.name);
    WriteInt32Array(w, t.partition_indexes);
  };
  if (!m.topics && version < 2) {
    w.Fail("OffsetFetchRequest.topics: null (all topics) needs v2+");
    w.ArrayLength(0);
    return;
  }
  WriteNullableArray(w, m.topics, write_topic);
}

void EncodeOffsetFetchResponse(const OffsetFetchResponse& m, int16_t version, Writer& w) {
  if (version >= 3) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.topics, [&](const OffsetFetchResponseTopic& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const OffsetFetchResponsePartition& p) {
      w.Int32(p.partition_index);
      w.Int64(p.committed_offset);
      if (version >= 5) w.Int32(p.committed_leader_epoch);
      w.NullableString(p.metadata);
      WriteErrorCode(w, p.error_code);
    });
  });
  if (version >= 2) WriteErrorCode(w, m.error_code);
}

Status DecodeOffsetFetchResponse(Reader& r, int16_t version, OffsetFetchResponse* out) {
  *out = {};
  Reader::Scope root(r, "OffsetFetchResponse");
  if (version >= 3) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](OffsetFetchResponseTopic& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI64 + kStr + kI16, &t.partitions, [&](OffsetFetchResponsePartition& p) {
      p.partition_index = r.Int32("partition_index");
      p.committed_offset = r.Int64("committed_offset");
      if (version >= 5) p.committed_leader_epoch = r.Int32("committed_leader_epoch");
      p.metadata = r.NullableRawString("metadata");
      p.error_code = ReadErrorCode(r);
    });
  });
  if (version >= 2) out->error_code = ReadErrorCode(r);
  return r.Finish();
}

// ---- FindCoordinator ----------------------------------------------------------

Status DecodeFindCoordinatorRequest(Reader& r, int16_t version, FindCoordinatorRequest* out) {
  *out = {};
  Reader::Scope root(r, "FindCoordinatorRequest");
  out->key = r.String("key");
  if (version >= 1) out->key_type = r.Int8("key_type");
  return r.Finish();
}

void EncodeFindCoordinatorRequest(const FindCoordinatorRequest& m, int16_t version, Writer& w) {
  w.String(m.key);
  if (version >= 1) w.Int8(m.key_type);
}

void EncodeFindCoordinatorResponse(const FindCoordinatorResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
  if (version >= 1) WriteErrorMessage(w, m.error_message);
  w.Int32(m.node_id);
  w.String(m.host);
  w.Int32(m.port);
}

Status DecodeFindCoordinatorResponse(Reader& r, int16_t version, FindCoordinatorResponse* out) {
  *out = {};
  Reader::Scope root(r, "FindCoordinatorResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  if (version >= 1) out->error_message = r.NullableString("error_message");
  out->node_id = r.Int32("node_id");
  out->host = r.String("host");
  out->port = r.Int32("port");
  return r.Finish();
}

// ---- JoinGroup ----------------------------------------------------------------

Status DecodeJoinGroupRequest(Reader& r, int16_t version, JoinGroupRequest* out) {
  *out = {};
  Reader::Scope root(r, "JoinGroupRequest");
  out->group_id = r.String("group_id");
  out->session_timeout_ms = r.Int32("session_timeout_ms");
  if (version >= 1) out->rebalance_timeout_ms = r.Int32("rebalance_timeout_ms");
  out->member_id = r.String("member_id");
  if (version >= 5) out->group_instance_id = r.NullableString("group_instance_id");
  out->protocol_type = r.String("protocol_type");
  ReadArray(r, "protocols", kStr + kBytes, &out->protocols, [&](JoinGroupRequestProtocol& p) {
    p.name = r.String("name");
    p.metadata = std::string(r.Bytes("metadata"));
  });
  return r.Finish();
}

void EncodeJoinGroupRequest(const JoinGroupRequest& m, int16_t version, Writer& w) {
  w.String(m.group_id);
  w.Int32(m.session_timeout_ms);
  if (version >= 1) w.Int32(m.rebalance_timeout_ms);
  w.String(m.member_id);
  if (version >= 5) w.NullableString(m.group_instance_id);
  w.String(m.protocol_type);
  WriteArray(w, m.protocols, [&](const JoinGroupRequestProtocol& p) {
    w.String(p.name);
    w.Bytes(p.metadata);
  });
}

void EncodeJoinGroupResponse(const JoinGroupResponse& m, int16_t version, Writer& w) {
  if (version >= 2) w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
  w.Int32(m.generation_id);
  w.String(m.protocol_name);
  w.String(m.leader);
  w.String(m.member_id);
  WriteArray(w, m.members, [&](const JoinGroupResponseMember& mem) {
    w.String(mem.member_id);
    if (version >= 5) w.NullableString(mem.group_instance_id);
    w.Bytes(mem.metadata);
  });
}

Status DecodeJoinGroupResponse(Reader& r, int16_t version, JoinGroupResponse* out) {
  *out = {};
  Reader::Scope root(r, "JoinGroupResponse");
  if (version >= 2) out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  out->generation_id = r.Int32("generation_id");
  out->protocol_name = r.String("protocol_name");
  out->leader = r.String("leader");
  out->member_id = r.String("member_id");
  ReadArray(r, "members", kStr + kBytes, &out->members, [&](JoinGroupResponseMember& mem) {
    mem.member_id = r.String("member_id");
    if (version >= 5) mem.group_instance_id = r.NullableString("group_instance_id");
    mem.metadata = std::string(r.Bytes("metadata"));
  });
  return r.Finish();
}

// ---- Heartbeat ----------------------------------------------------------------

Status DecodeHeartbeatRequest(Reader& r, int16_t version, HeartbeatRequest* out) {
  *out = {};
  Reader::Scope root(r, "HeartbeatRequest");
  out->group_id = r.String("group_id");
  out->generation_id = r.Int32("generation_id");
  out->member_id = r.String("member_id");
  if (version >= 3) out->group_instance_id = r.NullableString("group_instance_id");
  return r.Finish();
}

void EncodeHeartbeatRequest(const HeartbeatRequest& m, int16_t version, Writer& w) {
  w.String(m.group_id);
  w.Int32(m.generation_id);
  w.String(m.member_id);
  if (version >= 3) w.NullableString(m.group_instance_id);
}

void EncodeHeartbeatResponse(const HeartbeatResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
}

Status DecodeHeartbeatResponse(Reader& r, int16_t version, HeartbeatResponse* out) {
  *out = {};
  Reader::Scope root(r, "HeartbeatResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  return r.Finish();
}

// ---- LeaveGroup ---------------------------------------------------------------

Status DecodeLeaveGroupRequest(Reader& r, int16_t version, LeaveGroupRequest* out) {
  *out = {};
  Reader::Scope root(r, "LeaveGroupRequest");
  out->group_id = r.String("group_id");
  if (version <= 2) {
    out->member_id = r.String("member_id");
  } else {
    ReadArray(r, "members", kStr + kStr, &out->members, [&](MemberIdentity& m) {
      m.member_id = r.String("member_id");
      m.group_instance_id = r.NullableString("group_instance_id");
    });
  }
  return r.Finish();
}

void EncodeLeaveGroupRequest(const LeaveGroupRequest& m, int16_t version, Writer& w) {
  w.String(m.group_id);
  if (version <= 2) {
    w.String(m.member_id);
  } else {
    WriteArray(w, m.members, [&](const MemberIdentity& mem) {
      w.String(mem.member_id);
      w.NullableString(mem.group_instance_id);
    });
  }
}

void EncodeLeaveGroupResponse(const LeaveGroupResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
  if (version >= 3) {
    WriteArray(w, m.members, [&](const LeaveGroupMemberResponse& mem) {
      w.String(mem.member_id);
      w.NullableString(mem.group_instance_id);
      WriteErrorCode(w, mem.error_code);
    });
  }
}

Status DecodeLeaveGroupResponse(Reader& r, int16_t version, LeaveGroupResponse* out) {
  *out = {};
  Reader::Scope root(r, "LeaveGroupResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  if (version >= 3) {
    ReadArray(r, "members", kStr + kStr + kI16, &out->members, [&](LeaveGroupMemberResponse& mem) {
      mem.member_id = r.String("member_id");
      mem.group_instance_id = r.NullableString("group_instance_id");
      mem.error_code = ReadErrorCode(r);
    });
  }
  return r.Finish();
}

// ---- SyncGroup ----------------------------------------------------------------

Status DecodeSyncGroupRequest(Reader& r, int16_t version, SyncGroupRequest* out) {
  *out = {};
  Reader::Scope root(r, "SyncGroupRequest");
  out->group_id = r.String("group_id");
  out->generation_id = r.Int32("generation_id");
  out->member_id = r.String("member_id");
  if (version >= 3) out->group_instance_id = r.NullableString("group_instance_id");
  ReadArray(r, "assignments", kStr + kBytes, &out->assignments, [&](SyncGroupRequestAssignment& a) {
    a.member_id = r.String("member_id");
    a.assignment = std::string(r.Bytes("assignment"));
  });
  return r.Finish();
}

void EncodeSyncGroupRequest(const SyncGroupRequest& m, int16_t version, Writer& w) {
  w.String(m.group_id);
  w.Int32(m.generation_id);
  w.String(m.member_id);
  if (version >= 3) w.NullableString(m.group_instance_id);
  WriteArray(w, m.assignments, [&](const SyncGroupRequestAssignment& a) {
    w.String(a.member_id);
    w.Bytes(a.assignment);
  });
}

void EncodeSyncGroupResponse(const SyncGroupResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
  w.Bytes(m.assignment);
}

Status DecodeSyncGroupResponse(Reader& r, int16_t version, SyncGroupResponse* out) {
  *out = {};
  Reader::Scope root(r, "SyncGroupResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  out->assignment = std::string(r.Bytes("assignment"));
  return r.Finish();
}

// ---- ApiVersions --------------------------------------------------------------

Status DecodeApiVersionsRequest(Reader& r, int16_t /*version*/, ApiVersionsRequest* out) {
  *out = {};
  Reader::Scope root(r, "ApiVersionsRequest");
  return r.Finish();
}

void EncodeApiVersionsRequest(const ApiVersionsRequest& /*m*/, int16_t /*version*/, Writer& /*w*/) {}

void EncodeApiVersionsResponse(const ApiVersionsResponse& m, int16_t version, Writer& w) {
  WriteErrorCode(w, m.error_code);
  WriteArray(w, m.api_keys, [&](const ApiVersion& a) {
    w.Int16(a.api_key);
    w.Int16(a.min_version);
    w.Int16(a.max_version);
  });
  if (version >= 1) w.Int32(m.throttle_time_ms);
}

Status DecodeApiVersionsResponse(Reader& r, int16_t version, ApiVersionsResponse* out) {
  *out = {};
  Reader::Scope root(r, "ApiVersionsResponse");
  out->error_code = ReadErrorCode(r);
  ReadArray(r, "api_keys", kI16 + kI16 + kI16, &out->api_keys, [&](ApiVersion& a) {
    a.api_key = r.Int16("api_key");
    a.min_version = r.Int16("min_version");
    a.max_version = r.Int16("max_version");
  });
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  return r.Finish();
}

// ---- CreateTopics -------------------------------------------------------------

Status DecodeCreateTopicsRequest(Reader& r, int16_t version, CreateTopicsRequest* out) {
  *out = {};
  Reader::Scope root(r, "CreateTopicsRequest");
  ReadArray(r, "topics", kStr + kI32 + kI16 + kArr + kArr, &out->topics, [&](CreatableTopic& t) {
    t.name = r.String("name");
    t.num_partitions = r.Int32("num_partitions");
    t.replication_factor = r.Int16("replication_factor");
    ReadArray(r, "assignments", kI32 + kArr, &t.assignments, [&](CreatableReplicaAssignment& a) {
      a.partition_index = r.Int32("partition_index");
      ReadInt32Array(r, "broker_ids", &a.broker_ids);
    });
    ReadArray(r, "configs", kStr + kStr, &t.configs, [&](CreatableTopicConfig& c) {
      c.name = r.String("name");
      c.value = r.NullableString("value");
    });
  });
  out->timeout_ms = r.Int32("timeout_ms");
  if (version >= 1) out->validate_only = r.Bool("validate_only");
  return r.Finish();
}

void EncodeCreateTopicsRequest(const CreateTopicsRequest& m, int16_t version, Writer& w) {
  WriteArray(w, m.topics, [&](const CreatableTopic& t) {
    w.String(t.name);
    w.Int32(t.num_partitions);
    w.Int16(t.replication_factor);
    WriteArray(w, t.assignments, [&](const CreatableReplicaAssignment& a) {
      w.Int32(a.partition_index);
      WriteInt32Array(w, a.broker_ids);
    });
    WriteArray(w, t.configs, [&](const CreatableTopicConfig& c) {
      w.String(c.name);
      w.NullableString(c.value);
    });
  });
  w.Int32(m.timeout_ms);
  if (version >= 1) w.Bool(m.validate_only);
}

void EncodeCreateTopicsResponse(const CreateTopicsResponse& m, int16_t version, Writer& w) {
  if (version >= 2) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.topics, [&](const CreatableTopicResult& t) {
    w.String(t.name);
    WriteErrorCode(w, t.error_code);
    if (version >= 1) WriteErrorMessage(w, t.error_message);
  });
}

Status DecodeCreateTopicsResponse(Reader& r, int16_t version, CreateTopicsResponse* out) {
  *out = {};
  Reader::Scope root(r, "CreateTopicsResponse");
  if (version >= 2) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "topics", kStr + kI16, &out->topics, [&](CreatableTopicResult& t) {
    t.name = r.String("name");
    t.error_code = ReadErrorCode(r);
    if (version >= 1) t.error_message = r.NullableString("error_message");
  });
  return r.Finish();
}

// ---- DeleteTopics -------------------------------------------------------------

Status DecodeDeleteTopicsRequest(Reader& r, int16_t /*version*/, DeleteTopicsRequest* out) {
  *out = {};
  Reader::Scope root(r, "DeleteTopicsRequest");
  ReadArray(r, "topic_names", kStr, &out->topic_names, [&](std::string& name) { name = r.String(""); });
  out->timeout_ms = r.Int32("timeout_ms");
  return r.Finish();
}

void EncodeDeleteTopicsRequest(const DeleteTopicsRequest& m, int16_t /*version*/, Writer& w) {
  WriteArray(w, m.topic_names, [&](const std::string& name) { w.String(name); });
  w.Int32(m.timeout_ms);
}

void EncodeDeleteTopicsResponse(const DeleteTopicsResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.responses, [&](const DeletableTopicResult& t) {
    w.String(t.name);
    WriteErrorCode(w, t.error_code);
  });
}

Status DecodeDeleteTopicsResponse(Reader& r, int16_t version, DeleteTopicsResponse* out) {
  *out = {};
  Reader::Scope root(r, "DeleteTopicsResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "responses", kStr + kI16, &out->responses, [&](DeletableTopicResult& t) {
    t.name = r.String("name");
    t.error_code = ReadErrorCode(r);
  });
  return r.Finish();
}

// ---- InitProducerId -----------------------------------------------------------

Status DecodeInitProducerIdRequest(Reader& r, int16_t /*version*/, InitProducerIdRequest* out) {
  *out = {};
  Reader::Scope root(r, "InitProducerIdRequest");
  out->transactional_id = r.NullableString("transactional_id");
  out->transaction_timeout_ms = r.Int32("transaction_timeout_ms");
  return r.Finish();
}

void EncodeInitProducerIdRequest(const InitProducerIdRequest& m, int16_t /*version*/, Writer& w) {
  w.NullableString(m.transactional_id);
  w.Int32(m.transaction_timeout_ms);
}

void EncodeInitProducerIdResponse(const InitProducerIdResponse& m, int16_t /*version*/, Writer& w) {
  w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
  w.Int64(m.producer_id);
  w.Int16(m.producer_epoch);
}

Status DecodeInitProducerIdResponse(Reader& r, int16_t /*version*/, InitProducerIdResponse* out) {
  *out = {};
  Reader::Scope root(r, "InitProducerIdResponse");
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  out->producer_id = r.Int64("producer_id");
  out->producer_epoch = r.Int16("producer_epoch");
  return r.Finish();
}

// ---- DescribeGroups, ListGroups, DeleteGroups -----------------------------------

Status DecodeDescribeGroupsRequest(Reader& r, int16_t version, DescribeGroupsRequest* out) {
  *out = {};
  Reader::Scope root(r, "DescribeGroupsRequest");
  ReadArray(r, "groups", kStr, &out->groups, [&](std::string& g) { g = r.String("group"); });
  if (version >= 3) out->include_authorized_operations = r.Bool("include_authorized_operations");
  return r.Finish();
}

void EncodeDescribeGroupsRequest(const DescribeGroupsRequest& m, int16_t version, Writer& w) {
  WriteArray(w, m.groups, [&](const std::string& g) { w.String(g); });
  if (version >= 3) w.Bool(m.include_authorized_operations);
}

void EncodeDescribeGroupsResponse(const DescribeGroupsResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteArray(w, m.groups, [&](const DescribedGroup& g) {
    WriteErrorCode(w, g.error_code);
    w.String(g.group_id);
    w.String(g.group_state);
    w.String(g.protocol_type);
    w.String(g.protocol_data);
    WriteArray(w, g.members, [&](const DescribedGroupMember& mem) {
      w.String(mem.member_id);
      if (version >= 4) w.NullableString(mem.group_instance_id);
      w.String(mem.client_id);
      w.String(mem.client_host);
      w.Bytes(mem.member_metadata);
      w.Bytes(mem.member_assignment);
    });
    if (version >= 3) w.Int32(g.authorized_operations);
  });
}

Status DecodeDescribeGroupsResponse(Reader& r, int16_t version, DescribeGroupsResponse* out) {
  *out = {};
  Reader::Scope root(r, "DescribeGroupsResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "groups", kI16 + 4 * kStr + kArr, &out->groups, [&](DescribedGroup& g) {
    g.error_code = ReadErrorCode(r);
    g.group_id = r.String("group_id");
    g.group_state = r.String("group_state");
    g.protocol_type = r.String("protocol_type");
    g.protocol_data = r.String("protocol_data");
    ReadArray(r, "members", 3 * kStr + 2 * kBytes, &g.members, [&](DescribedGroupMember& mem) {
      mem.member_id = r.String("member_id");
      if (version >= 4) mem.group_instance_id = r.NullableString("group_instance_id");
      mem.client_id = r.String("client_id");
      mem.client_host = r.String("client_host");
      mem.member_metadata = std::string(r.Bytes("member_metadata"));
      mem.member_assignment = std::string(r.Bytes("member_assignment"));
    });
    if (version >= 3) g.authorized_operations = r.Int32("authorized_operations");
  });
  return r.Finish();
}

Status DecodeListGroupsRequest(Reader& r, int16_t /*version*/, ListGroupsRequest* out) {
  *out = {};
  Reader::Scope root(r, "ListGroupsRequest");
  return r.Finish();
}

void EncodeListGroupsRequest(const ListGroupsRequest& /*m*/, int16_t /*version*/, Writer& /*w*/) {}

void EncodeListGroupsResponse(const ListGroupsResponse& m, int16_t version, Writer& w) {
  if (version >= 1) w.Int32(m.throttle_time_ms);
  WriteErrorCode(w, m.error_code);
  WriteArray(w, m.groups, [&](const ListedGroup& g) {
    w.String(g.group_id);
    w.String(g.protocol_type);
  });
}

Status DecodeListGroupsResponse(Reader& r, int16_t version, ListGroupsResponse* out) {
  *out = {};
  Reader::Scope root(r, "ListGroupsResponse");
  if (version >= 1) out->throttle_time_ms = r.Int32("throttle_time_ms");
  out->error_code = ReadErrorCode(r);
  ReadArray(r, "groups", 2 * kStr, &out->groups, [&](ListedGroup& g) {
    g.group_id = r.String("group_id");
    g.protocol_type = r.String("protocol_type");
  });
  return r.Finish();
}

Status DecodeDeleteGroupsRequest(Reader& r, int16_t /*version*/, DeleteGroupsRequest* out) {
  *out = {};
  Reader::Scope root(r, "DeleteGroupsRequest");
  ReadArray(r, "groups_names", kStr, &out->groups_names, [&](std::string& g) { g = r.String("group"); });
  return r.Finish();
}

void EncodeDeleteGroupsRequest(const DeleteGroupsRequest& m, int16_t /*version*/, Writer& w) {
  WriteArray(w, m.groups_names, [&](const std::string& g) { w.String(g); });
}

void EncodeDeleteGroupsResponse(const DeleteGroupsResponse& m, int16_t /*version*/, Writer& w) {
  w.Int32(m.throttle_time_ms);
  WriteArray(w, m.results, [&](const DeletableGroupResult& g) {
    w.String(g.group_id);
    WriteErrorCode(w, g.error_code);
  });
}

Status DecodeDeleteGroupsResponse(Reader& r, int16_t /*version*/, DeleteGroupsResponse* out) {
  *out = {};
  Reader::Scope root(r, "DeleteGroupsResponse");
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "results", kStr + kI16, &out->results, [&](DeletableGroupResult& g) {
    g.group_id = r.String("group_id");
    g.error_code = ReadErrorCode(r);
  });
  return r.Finish();
}

// ---- DescribeConfigs ----------------------------------------------------------

Status DecodeDescribeConfigsRequest(Reader& r, int16_t version, DescribeConfigsRequest* out) {
  *out = {};
  Reader::Scope root(r, "DescribeConfigsRequest");
  ReadArray(r, "resources", 1 + kStr + kArr, &out->resources, [&](DescribeConfigsResource& res) {
    res.resource_type = r.Int8("resource_type");
    res.resource_name = r.String("resource_name");
    ReadNullableArray(r, "configuration_keys", kStr, &res.configuration_keys,
                      [&](std::string& k) { k = r.String("key"); });
  });
  if (version >= 1) out->include_synonyms = r.Bool("include_synonyms");
  return r.Finish();
}

void EncodeDescribeConfigsRequest(const DescribeConfigsRequest& m, int16_t version, Writer& w) {
  WriteArray(w, m.resources, [&](const DescribeConfigsResource& res) {
    w.Int8(res.resource_type);
    w.String(res.resource_name);
    WriteNullableArray(w, res.configuration_keys, [&](const std::string& k) { w.String(k); });
  });
  if (version >= 1) w.Bool(m.include_synonyms);
}

void EncodeDescribeConfigsResponse(const DescribeConfigsResponse& m, int16_t version, Writer& w) {
  w.Int32(m.throttle_time_ms);
  WriteArray(w, m.results, [&](const DescribeConfigsResult& res) {
    WriteErrorCode(w, res.error_code);
    WriteErrorMessage(w, res.error_message);
    w.Int8(res.resource_type);
    w.String(res.resource_name);
    WriteArray(w, res.configs, [&](const DescribeConfigsEntry& e) {
      w.String(e.name);
      w.NullableString(e.value);
      w.Bool(e.read_only);
      if (version == 0) {
        w.Bool(e.is_default);
      } else {
        w.Int8(e.config_source);
      }
      w.Bool(e.is_sensitive);
      if (version >= 1) {
        WriteArray(w, e.synonyms, [&](const DescribeConfigsSynonym& syn) {
          w.String(syn.name);
          w.NullableString(syn.value);
          w.Int8(syn.source);
        });
      }
    });
  });
}

Status DecodeDescribeConfigsResponse(Reader& r, int16_t version, DescribeConfigsResponse* out) {
  *out = {};
  Reader::Scope root(r, "DescribeConfigsResponse");
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "results", kI16 + kStr + 1 + kStr + kArr, &out->results, [&](DescribeConfigsResult& res) {
    res.error_code = ReadErrorCode(r);
    res.error_message = r.NullableString("error_message");
    res.resource_type = r.Int8("resource_type");
    res.resource_name = r.String("resource_name");
    ReadArray(r, "configs", 2 * kStr + 3, &res.configs, [&](DescribeConfigsEntry& e) {
      e.name = r.String("name");
      e.value = r.NullableString("value");
      e.read_only = r.Bool("read_only");
      if (version == 0) {
        e.is_default = r.Bool("is_default");
      } else {
        e.config_source = r.Int8("config_source");
      }
      e.is_sensitive = r.Bool("is_sensitive");
      if (version >= 1) {
        ReadArray(r, "synonyms", 2 * kStr + 1, &e.synonyms, [&](DescribeConfigsSynonym& syn) {
          syn.name = r.String("name");
          syn.value = r.NullableString("value");
          syn.source = r.Int8("source");
        });
      }
    });
  });
  return r.Finish();
}

// ---- CreatePartitions -----------------------------------------------------------

Status DecodeCreatePartitionsRequest(Reader& r, int16_t /*version*/, CreatePartitionsRequest* out) {
  *out = {};
  Reader::Scope root(r, "CreatePartitionsRequest");
  ReadArray(r, "topics", kStr + kI32 + kArr, &out->topics, [&](CreatePartitionsTopic& t) {
    t.name = r.String("name");
    t.count = r.Int32("count");
    ReadNullableArray(r, "assignments", kArr, &t.assignments,
                      [&](std::vector<int32_t>& brokers) { ReadInt32Array(r, "broker_ids", &brokers); });
  });
  out->timeout_ms = r.Int32("timeout_ms");
  out->validate_only = r.Bool("validate_only");
  return r.Finish();
}

void EncodeCreatePartitionsRequest(const CreatePartitionsRequest& m, int16_t /*version*/, Writer& w) {
  WriteArray(w, m.topics, [&](const CreatePartitionsTopic& t) {
    w.String(t.name);
    w.Int32(t.count);
    WriteNullableArray(w, t.assignments, [&](const std::vector<int32_t>& brokers) { WriteInt32Array(w, brokers); });
  });
  w.Int32(m.timeout_ms);
  w.Bool(m.validate_only);
}

void EncodeCreatePartitionsResponse(const CreatePartitionsResponse& m, int16_t /*version*/, Writer& w) {
  w.Int32(m.throttle_time_ms);
  WriteArray(w, m.results, [&](const CreatePartitionsTopicResult& res) {
    w.String(res.name);
    WriteErrorCode(w, res.error_code);
    WriteErrorMessage(w, res.error_message);
  });
}

Status DecodeCreatePartitionsResponse(Reader& r, int16_t /*version*/, CreatePartitionsResponse* out) {
  *out = {};
  Reader::Scope root(r, "CreatePartitionsResponse");
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "results", kStr + kI16 + kStr, &out->results, [&](CreatePartitionsTopicResult& res) {
    res.name = r.String("name");
    res.error_code = ReadErrorCode(r);
    res.error_message = r.NullableString("error_message");
  });
  return r.Finish();
}

// ---- DeleteRecords ----------------------------------------------------------------

Status DecodeDeleteRecordsRequest(Reader& r, int16_t /*version*/, DeleteRecordsRequest* out) {
  *out = {};
  Reader::Scope root(r, "DeleteRecordsRequest");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](DeleteRecordsTopic& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI64, &t.partitions, [&](DeleteRecordsPartition& p) {
      p.partition_index = r.Int32("partition_index");
      p.offset = r.Int64("offset");
    });
  });
  out->timeout_ms = r.Int32("timeout_ms");
  return r.Finish();
}

void EncodeDeleteRecordsRequest(const DeleteRecordsRequest& m, int16_t /*version*/, Writer& w) {
  WriteArray(w, m.topics, [&](const DeleteRecordsTopic& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const DeleteRecordsPartition& p) {
      w.Int32(p.partition_index);
      w.Int64(p.offset);
    });
  });
  w.Int32(m.timeout_ms);
}

void EncodeDeleteRecordsResponse(const DeleteRecordsResponse& m, int16_t /*version*/, Writer& w) {
  w.Int32(m.throttle_time_ms);
  WriteArray(w, m.topics, [&](const DeleteRecordsTopicResult& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const DeleteRecordsPartitionResult& p) {
      w.Int32(p.partition_index);
      w.Int64(p.low_watermark);
      WriteErrorCode(w, p.error_code);
    });
  });
}

Status DecodeDeleteRecordsResponse(Reader& r, int16_t /*version*/, DeleteRecordsResponse* out) {
  *out = {};
  Reader::Scope root(r, "DeleteRecordsResponse");
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](DeleteRecordsTopicResult& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI64 + kI16, &t.partitions, [&](DeleteRecordsPartitionResult& p) {
      p.partition_index = r.Int32("partition_index");
      p.low_watermark = r.Int64("low_watermark");
      p.error_code = ReadErrorCode(r);
    });
  });
  return r.Finish();
}

// ---- AlterConfigs -----------------------------------------------------------------

Status DecodeAlterConfigsRequest(Reader& r, int16_t /*version*/, AlterConfigsRequest* out) {
  *out = {};
  Reader::Scope root(r, "AlterConfigsRequest");
  ReadArray(r, "resources", 1 + kStr + kArr, &out->resources, [&](AlterConfigsResource& res) {
    res.resource_type = r.Int8("resource_type");
    res.resource_name = r.String("resource_name");
    ReadArray(r, "configs", kStr + kStr, &res.configs, [&](AlterConfigsEntry& c) {
      c.name = r.String("name");
      c.value = r.NullableString("value");
    });
  });
  out->validate_only = r.Bool("validate_only");
  return r.Finish();
}

void EncodeAlterConfigsRequest(const AlterConfigsRequest& m, int16_t /*version*/, Writer& w) {
  WriteArray(w, m.resources, [&](const AlterConfigsResource& res) {
    w.Int8(res.resource_type);
    w.String(res.resource_name);
    WriteArray(w, res.configs, [&](const AlterConfigsEntry& c) {
      w.String(c.name);
      w.NullableString(c.value);
    });
  });
  w.Bool(m.validate_only);
}

void EncodeAlterConfigsResponse(const AlterConfigsResponse& m, int16_t /*version*/, Writer& w) {
  w.Int32(m.throttle_time_ms);
  WriteArray(w, m.responses, [&](const AlterConfigsResult& res) {
    WriteErrorCode(w, res.error_code);
    WriteErrorMessage(w, res.error_message);
    w.Int8(res.resource_type);
    w.String(res.resource_name);
  });
}

Status DecodeAlterConfigsResponse(Reader& r, int16_t /*version*/, AlterConfigsResponse* out) {
  *out = {};
  Reader::Scope root(r, "AlterConfigsResponse");
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "responses", kI16 + kStr + 1 + kStr, &out->responses, [&](AlterConfigsResult& res) {
    res.error_code = ReadErrorCode(r);
    res.error_message = r.NullableString("error_message");
    res.resource_type = r.Int8("resource_type");
    res.resource_name = r.String("resource_name");
  });
  return r.Finish();
}

// ---- IncrementalAlterConfigs ---------------------------------------------------------

Status DecodeIncrementalAlterConfigsRequest(Reader& r, int16_t /*version*/, IncrementalAlterConfigsRequest* out) {
  *out = {};
  Reader::Scope root(r, "IncrementalAlterConfigsRequest");
  ReadArray(r, "resources", 1 + kStr + kArr, &out->resources, [&](IncrementalAlterConfigsResource& res) {
    res.resource_type = r.Int8("resource_type");
    res.resource_name = r.String("resource_name");
    ReadArray(r, "configs", kStr + 1 + kStr, &res.configs, [&](IncrementalAlterConfigsEntry& c) {
      c.name = r.String("name");
      c.op = r.Int8("config_operation");
      c.value = r.NullableString("value");
    });
  });
  out->validate_only = r.Bool("validate_only");
  return r.Finish();
}

void EncodeIncrementalAlterConfigsRequest(const IncrementalAlterConfigsRequest& m, int16_t /*version*/, Writer& w) {
  WriteArray(w, m.resources, [&](const IncrementalAlterConfigsResource& res) {
    w.Int8(res.resource_type);
    w.String(res.resource_name);
    WriteArray(w, res.configs, [&](const IncrementalAlterConfigsEntry& c) {
      w.String(c.name);
      w.Int8(c.op);
      w.NullableString(c.value);
    });
  });
  w.Bool(m.validate_only);
}

// ---- OffsetDelete ------------------------------------------------------------------

Status DecodeOffsetDeleteRequest(Reader& r, int16_t /*version*/, OffsetDeleteRequest* out) {
  *out = {};
  Reader::Scope root(r, "OffsetDeleteRequest");
  out->group_id = r.String("group_id");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](OffsetDeleteTopic& t) {
    t.name = r.String("name");
    ReadInt32Array(r, "partitions", &t.partitions);
  });
  return r.Finish();
}

void EncodeOffsetDeleteRequest(const OffsetDeleteRequest& m, int16_t /*version*/, Writer& w) {
  w.String(m.group_id);
  WriteArray(w, m.topics, [&](const OffsetDeleteTopic& t) {
    w.String(t.name);
    WriteInt32Array(w, t.partitions);
  });
}

void EncodeOffsetDeleteResponse(const OffsetDeleteResponse& m, int16_t /*version*/, Writer& w) {
  WriteErrorCode(w, m.error_code);
  w.Int32(m.throttle_time_ms);
  WriteArray(w, m.topics, [&](const OffsetDeleteTopicResult& t) {
    w.String(t.name);
    WriteArray(w, t.partitions, [&](const OffsetDeletePartitionResult& p) {
      w.Int32(p.partition_index);
      WriteErrorCode(w, p.error_code);
    });
  });
}

Status DecodeOffsetDeleteResponse(Reader& r, int16_t /*version*/, OffsetDeleteResponse* out) {
  *out = {};
  Reader::Scope root(r, "OffsetDeleteResponse");
  out->error_code = ReadErrorCode(r);
  out->throttle_time_ms = r.Int32("throttle_time_ms");
  ReadArray(r, "topics", kStr + kArr, &out->topics, [&](OffsetDeleteTopicResult& t) {
    t.name = r.String("name");
    ReadArray(r, "partitions", kI32 + kI16, &t.partitions, [&](OffsetDeletePartitionResult& p) {
      p.partition_index = r.Int32("partition_index");
      p.error_code = ReadErrorCode(r);
    });
  });
  return r.Finish();
}

std::optional<std::vector<std::string>> ConsumerSubscriptionTopics(std::string_view metadata) {
  Reader r(metadata);
  Reader::Scope root(r, "ConsumerProtocolSubscription");
  r.Int16("version");
  std::vector<std::string> topics;
  ReadArray(r, "topics", kStr, &topics, [&](std::string& t) { t = r.String("topic"); });
  if (!r.ok()) return std::nullopt;
  return topics;  // the rest (user data, owned partitions, ...) is not needed
}

}  // namespace weir::kafka
