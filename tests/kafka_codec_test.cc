// The Kafka wire codec (src/kafka): primitives, every API at every supported
// version in both directions, hand-written golden frames, and hostile input.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "kafka/api_table.h"
#include "kafka/errors.h"
#include "kafka/messages.h"
#include "kafka/wire.h"
#include "base/utf8.h"
#include "kafka_samples.h"

namespace weir::kafka {
namespace {

using namespace std::string_literals;

// "00 01 ff" -> bytes; spaces and newlines are ignored.
std::string Hex(std::string_view hex) {
  std::string out;
  int hi = -1;
  for (char c : hex) {
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else {
      continue;
    }
    if (hi < 0) {
      hi = v;
    } else {
      out.push_back(static_cast<char>(hi * 16 + v));
      hi = -1;
    }
  }
  EXPECT_EQ(hi, -1) << "odd number of hex digits";
  return out;
}

// The status of decoding the request frame written as hex (for frames that fail).
Status DecodeStatus(std::string_view hex) {
  std::string frame = Hex(hex);
  return DecodeRequest(frame).status();
}

std::string ToHex(std::string_view b) {
  std::string out;
  for (unsigned char c : b) out += fmt::format("{:02x} ", c);
  return out;
}

// ---- Primitives ---------------------------------------------------------------

TEST(KafkaWire, FixedWidthIntegersAreBigEndian) {
  std::string buf;
  Writer w(&buf);
  w.Int8(-2);
  w.Int16(0x0102);
  w.Int32(-2);
  w.Int64(0x0102030405060708);
  w.UInt32(0xfffffffe);
  w.Bool(true);
  EXPECT_EQ(buf, Hex("fe 0102 fffffffe 0102030405060708 fffffffe 01"));
  Reader r(buf);
  EXPECT_EQ(r.Int8("a"), -2);
  EXPECT_EQ(r.Int16("b"), 0x0102);
  EXPECT_EQ(r.Int32("c"), -2);
  EXPECT_EQ(r.Int64("d"), 0x0102030405060708);
  EXPECT_EQ(r.UInt32("e"), 0xfffffffeu);
  EXPECT_TRUE(r.Bool("f"));
  EXPECT_TRUE(r.Finish().ok());
}

TEST(KafkaWire, BoolIsTrueForAnyNonZeroByte) {
  std::string r_in = Hex("00 01 7f");
  Reader r(r_in);
  EXPECT_FALSE(r.Bool("a"));
  EXPECT_TRUE(r.Bool("b"));
  EXPECT_TRUE(r.Bool("c"));
}

TEST(KafkaWire, ZigzagVarints) {
  struct Case {
    int64_t value;
    const char* hex;
  };
  // Zigzag maps 0,-1,1,-2,... to 0,1,2,3,...; then base-128, low group first.
  for (const Case& c : {Case{0, "00"}, Case{-1, "01"}, Case{1, "02"}, Case{-64, "7f"}, Case{64, "8001"},
                        Case{300, "d804"}, Case{2147483647, "feffffff0f"}, Case{-2147483648LL, "ffffffff0f"}}) {
    std::string buf;
    Writer w(&buf);
    w.Varint(static_cast<int32_t>(c.value));
    EXPECT_EQ(buf, Hex(c.hex)) << c.value;
    Reader r(buf);
    EXPECT_EQ(r.Varint("v"), c.value);
    EXPECT_TRUE(r.Finish().ok());
  }
  std::string buf;
  Writer w(&buf);
  w.Varlong(INT64_MIN);
  w.Varlong(INT64_MAX);
  w.Varlong(-3);
  EXPECT_EQ(buf, Hex("ffffffffffffffffff01 feffffffffffffffff01 05"));
  Reader r(buf);
  EXPECT_EQ(r.Varlong("a"), INT64_MIN);
  EXPECT_EQ(r.Varlong("b"), INT64_MAX);
  EXPECT_EQ(r.Varlong("c"), -3);
  EXPECT_TRUE(r.Finish().ok());
}

TEST(KafkaWire, UnsignedVarint) {
  std::string buf;
  Writer w(&buf);
  w.UVarint(0);
  w.UVarint(127);
  w.UVarint(128);
  w.UVarint(UINT32_MAX);
  EXPECT_EQ(buf, Hex("00 7f 8001 ffffffff0f"));
  Reader r(buf);
  EXPECT_EQ(r.UVarint("a"), 0u);
  EXPECT_EQ(r.UVarint("b"), 127u);
  EXPECT_EQ(r.UVarint("c"), 128u);
  EXPECT_EQ(r.UVarint("d"), UINT32_MAX);
  EXPECT_TRUE(r.Finish().ok());
}

TEST(KafkaWire, VarintsRejectOverlongAndTruncated) {
  for (const char* hex : {"ffffffff1f", "ffffffffff01", "80", "ff"}) {
    std::string r_in = Hex(hex);
    Reader r(r_in);
    r.UVarint("n");
    EXPECT_FALSE(r.ok()) << hex;
  }
  std::string r_in = Hex("ffffffffffffffffff02");
  Reader r(r_in);
  r.Varlong("n");
  EXPECT_FALSE(r.ok());
}

TEST(KafkaWire, StringsAndNulls) {
  std::string buf;
  Writer w(&buf);
  w.String("ab");
  w.NullableString(std::nullopt);
  w.NullableString("");
  w.Bytes("xyz");
  w.NullableBytes(std::nullopt);
  EXPECT_EQ(buf, Hex("0002 6162 ffff 0000 00000003 78797a ffffffff"));
  Reader r(buf);
  EXPECT_EQ(r.String("a"), "ab");
  EXPECT_EQ(r.NullableString("b"), std::nullopt);
  EXPECT_EQ(r.NullableString("c"), "");
  std::string_view bytes = r.Bytes("d");
  EXPECT_EQ(bytes, "xyz");
  EXPECT_EQ(bytes.data(), buf.data() + 12) << "bytes are a view into the input";
  EXPECT_EQ(r.NullableBytes("e"), std::nullopt);
  EXPECT_TRUE(r.Finish().ok());
}

TEST(KafkaWire, StringErrorsNameTheField) {
  struct Case {
    const char* hex;
    bool nullable;
    const char* message;
  };
  for (const Case& c : {
           Case{"ffff", false, "name: string length -1 is negative"},
           Case{"fffe", true, "name: string length -2 is negative"},
           Case{"0005 6162", false, "name: string length 5 past end of frame (2 bytes left)"},
           Case{"00", false, "name: needs 2 bytes, 1 left in frame"},
           Case{"0002 c080", false, "name: string is not valid UTF-8"},       // overlong NUL
           Case{"0003 eda080", true, "name: string is not valid UTF-8"},      // surrogate
           Case{"0004 f4908080", false, "name: string is not valid UTF-8"},   // above U+10FFFF
           Case{"0002 e282", false, "name: string is not valid UTF-8"},       // truncated sequence
           Case{"0001 80", false, "name: string is not valid UTF-8"},         // lone continuation
       }) {
    std::string r_in = Hex(c.hex);
    Reader r(r_in);
    if (c.nullable) {
      r.NullableString("name");
    } else {
      r.String("name");
    }
    EXPECT_EQ(r.status().message(), c.message) << c.hex;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  }
}

TEST(KafkaWire, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));  // overlong 3-byte
  EXPECT_FALSE(IsValidUtf8("\xf0\x80\x80\xaf"));  // overlong 4-byte
  EXPECT_FALSE(IsValidUtf8("\xf5\x80\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
}

TEST(KafkaWire, RawStringSkipsUtf8Check) {
  std::string r_in = Hex("0002 c080");
  Reader r(r_in);
  EXPECT_EQ(r.NullableRawString("client_id"), "\xc0\x80"s);
  EXPECT_TRUE(r.Finish().ok());
}

TEST(KafkaWire, ArrayCountsAreCheckedAgainstTheFrame) {
  {
    std::string r_in = Hex("7fffffff 00000000");
    Reader r(r_in);
    EXPECT_EQ(r.ArrayLength("topics", 6), 0);
    EXPECT_EQ(r.status().message(),
              "topics: array count 2147483647 needs at least 12884901882 bytes, 4 left in frame");
  }
  {
    std::string r_in = Hex("00000002 0000");  // two elements of at least 1 byte fit, of 2 bytes do not
    Reader r(r_in);
    EXPECT_EQ(r.ArrayLength("a", 1), 2);
    std::string r2_in = Hex("00000002 0000");
    Reader r2(r2_in);
    EXPECT_EQ(r2.ArrayLength("a", 2), 0);
    EXPECT_FALSE(r2.ok());
    std::string r3_in = Hex("00000002 00");
    Reader r3(r3_in);
    EXPECT_EQ(r3.ArrayLength("a", 1), 0);
    EXPECT_FALSE(r3.ok());
  }
  {
    std::string r_in = Hex("ffffffff");
    Reader r(r_in);
    EXPECT_EQ(r.ArrayLength("a", 1), 0);
    EXPECT_EQ(r.status().message(), "a: array is null in a non-nullable field");
    std::string r2_in = Hex("ffffffff");
    Reader r2(r2_in);
    EXPECT_EQ(r2.NullableArrayLength("a", 1), std::nullopt);
    EXPECT_TRUE(r2.ok());
    std::string r3_in = Hex("fffffffe");
    Reader r3(r3_in);
    EXPECT_EQ(r3.NullableArrayLength("a", 1), 0);
    EXPECT_EQ(r3.status().message(), "a: array count -2 is negative");
  }
}

TEST(KafkaWire, ArrayElementsAreCappedPerRequest) {
  // Two arrays of (kMaxArrayElements / 2 + 1) one-byte elements: each fits
  // the frame, together they pass the cap, so the second count fails.
  const uint32_t half = static_cast<uint32_t>(kMaxArrayElements / 2 + 1);
  std::string in;
  for (int a = 0; a < 2; ++a) {
    for (int shift = 24; shift >= 0; shift -= 8) in.push_back(static_cast<char>(half >> shift));
    in.append(half, '\0');
  }
  Reader r(in);
  EXPECT_EQ(r.ArrayLength("a", 1), static_cast<int32_t>(half));
  for (uint32_t i = 0; i < half; ++i) r.Int8("");
  EXPECT_EQ(r.ArrayLength("b", 1), 0);
  EXPECT_EQ(r.status().message(), fmt::format("b: more than {} array elements in one request", kMaxArrayElements));
}

TEST(KafkaWire, BytesErrors) {
  std::string r_in = Hex("00000384 0102");
  Reader r(r_in);
  r.Bytes("records");
  EXPECT_EQ(r.status().message(), "records: length 900 past end of frame (2 bytes left)");
  std::string r2_in = Hex("ffffffff");
  Reader r2(r2_in);
  r2.Bytes("metadata");
  EXPECT_EQ(r2.status().message(), "metadata: length -1 (null) in a non-nullable field");
  std::string r3_in = Hex("80000000");
  Reader r3(r3_in);
  r3.NullableBytes("records");
  EXPECT_EQ(r3.status().message(), "records: length -2147483648 is negative");
}

TEST(KafkaWire, ErrorsAreStickyAndNameThePath) {
  std::string r_in = Hex("0001 61 00");
  Reader r(r_in);
  Reader::Scope root(r, "Msg");
  EXPECT_EQ(r.String("a"), "a");
  {
    Reader::Scope element(r, "items", 3);
    EXPECT_EQ(r.Int32("value"), 0);
  }
  EXPECT_EQ(r.Int8("later"), 0) << "reads after an error return zero";
  EXPECT_EQ(r.status().message(), "Msg.items[3].value: needs 4 bytes, 1 left in frame");
  EXPECT_EQ(r.Finish().message(), r.status().message());
}

TEST(KafkaWire, FinishRejectsTrailingBytes) {
  std::string r_in = Hex("0001 02");
  Reader r(r_in);
  Reader::Scope root(r, "Msg");
  r.Int16("a");
  EXPECT_EQ(r.Finish().message(), "Msg: 1 unexpected bytes after the last field");
}

TEST(KafkaWire, ReservedLengthIsPatched) {
  std::string buf = "x";
  Writer w(&buf);
  size_t at = w.ReserveLength();
  w.Raw("hello");
  w.PatchLength(at);
  EXPECT_EQ(buf, "x" + Hex("00000005") + "hello");
}

TEST(KafkaWire, WriterRejectsOverlongStrings) {
  std::string buf;
  Writer w(&buf);
  w.String(std::string(kMaxStringSize, 'a'));
  EXPECT_TRUE(w.ok());
  w.String(std::string(kMaxStringSize + 1, 'a'));
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kInvalidArgument);
}

// ---- Errors and the API table ---------------------------------------------------

TEST(KafkaErrors, CodesAndNames) {
  EXPECT_EQ(static_cast<int16_t>(ErrorCode::kUnsupportedVersion), 35);
  EXPECT_EQ(static_cast<int16_t>(ErrorCode::kUnsupportedForMessageFormat), 43);
  EXPECT_EQ(static_cast<int16_t>(ErrorCode::kOutOfOrderSequenceNumber), 45);
  EXPECT_EQ(static_cast<int16_t>(ErrorCode::kUnknownProducerId), 59);
  EXPECT_EQ(static_cast<int16_t>(ErrorCode::kThrottlingQuotaExceeded), 89);
  EXPECT_EQ(ErrorName(ErrorCode::kNotCoordinator), "NOT_COORDINATOR");
  EXPECT_EQ(ErrorName(ErrorCode::kUnknownServerError), "UNKNOWN_SERVER_ERROR");
  EXPECT_EQ(ErrorName(static_cast<ErrorCode>(1000)), "UNKNOWN_CODE");
}

TEST(KafkaApiTable, Lookup) {
  ASSERT_NE(FindApi(1), nullptr);
  EXPECT_STREQ(FindApi(1)->name, "Fetch");
  EXPECT_EQ(FindApi(1)->min_version, 4);
  EXPECT_EQ(FindApi(1)->max_version, 11);
  EXPECT_EQ(FindApi(4), nullptr);  // LeaderAndIsr: not ours
  EXPECT_TRUE(IsSupported(0, 7));
  EXPECT_FALSE(IsSupported(0, 8));
  EXPECT_FALSE(IsSupported(0, 2));
  EXPECT_FALSE(IsSupported(18, 3));
  int count = 0;
  samples::ForEachApiVersion([&](ApiKey, int16_t) { ++count; });
  EXPECT_EQ(count, 5 + 8 + 4 + 7 + 8 + 5 + 3 + 6 + 4 + 4 + 4 + 5 + 3 + 3 + 5 + 4 + 2 + 3 + 2 + 2 + 2 + 2 + 1 + 1);
}

// ---- Round trips ----------------------------------------------------------------

TEST(KafkaRoundTrip, EveryRequestAtEveryVersion) {
  samples::ForEachApiVersion([](ApiKey key, int16_t v) {
    SCOPED_TRACE(fmt::format("api {} v{}", static_cast<int>(key), v));
    RequestHeader header = samples::Header(key, v, 1000 + v);
    RequestBody body = samples::Request(key, v);
    auto frame = EncodeRequest(header, body);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    auto decoded = DecodeRequest(*frame);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->header, header);
    EXPECT_EQ(RequestKey(decoded->body), key);
    EXPECT_TRUE(decoded->body == body);
  });
}

// Encodes m at v, decodes it back, and expects an equal message.
// `m` encoded at version `v` and decoded again (what a client reads).
template <typename T>
T Reencoded(const T& m, int16_t v, void (*encode)(const T&, int16_t, Writer&), Status (*decode)(Reader&, int16_t, T*)) {
  std::string buf;
  Writer w(&buf);
  encode(m, v, w);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  Reader r(buf);
  T got;
  Status st = decode(r, v, &got);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return got;
}

template <typename T>
void ExpectResponseRoundTrip(const T& m, int16_t v, void (*encode)(const T&, int16_t, Writer&),
                             Status (*decode)(Reader&, int16_t, T*)) {
  std::string buf;
  Writer w(&buf);
  EncodeResponseHeader(99, w);
  encode(m, v, w);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Reader r(buf);
  int32_t correlation_id = 0;
  ASSERT_TRUE(DecodeResponseHeader(r, &correlation_id).ok());
  EXPECT_EQ(correlation_id, 99);
  T got;
  Status st = decode(r, v, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(got == m);
  // Every strict prefix fails cleanly.
  for (size_t n = 4; n < buf.size(); ++n) {
    Reader prefix(std::string_view(buf).substr(4, n - 4));
    T partial;
    EXPECT_FALSE(decode(prefix, v, &partial).ok()) << "prefix of " << n << " bytes";
  }
  // A byte too many fails.
  std::string longer = buf.substr(4) + "x";
  Reader extra(longer);
  T again;
  EXPECT_FALSE(decode(extra, v, &again).ok());
}

void ResponseRoundTrip(ApiKey key, int16_t v) {
  switch (key) {
    case ApiKey::kProduce: {
      ProduceResponse m;
      ProducePartitionResponse p{0, ErrorCode::kNone, 100, -1, -1};
      if (v >= 2) p.log_append_time_ms = 1700000000000;
      if (v >= 5) p.log_start_offset = 3;
      m.responses = {{"orders", {p, {1, ErrorCode::kDuplicateSequenceNumber, 7, -1, -1}}}};
      m.throttle_time_ms = 10;
      return ExpectResponseRoundTrip(m, v, EncodeProduceResponse, DecodeProduceResponse);
    }
    case ApiKey::kFetch: {
      FetchResponse m;
      m.throttle_time_ms = 1;
      if (v >= 7) {
        m.error_code = ErrorCode::kNone;
        m.session_id = 55;
      }
      FetchPartitionData p;
      p.partition_index = 2;
      p.high_watermark = 300;
      p.last_stable_offset = 300;
      if (v >= 5) p.log_start_offset = 10;
      p.aborted_transactions = std::vector<AbortedTransaction>{{9, 100}};
      if (v >= 11) p.preferred_read_replica = -1;
      p.records = {samples::kBatchA};
      FetchPartitionData empty;
      empty.partition_index = 3;
      empty.error_code = ErrorCode::kOffsetOutOfRange;
      empty.last_stable_offset = 0;
      m.responses = {{"orders", {p, empty}}};
      return ExpectResponseRoundTrip(m, v, EncodeFetchResponse, DecodeFetchResponse);
    }
    case ApiKey::kListOffsets: {
      ListOffsetsResponse m;
      if (v >= 2) m.throttle_time_ms = 3;
      ListOffsetsPartitionResponse p;
      p.partition_index = 1;
      if (v == 0) {
        p.old_style_offsets = {42, 0};
      } else {
        p.timestamp = -1;
        p.offset = 42;
      }
      m.topics = {{"orders", {p}}};
      return ExpectResponseRoundTrip(m, v, EncodeListOffsetsResponse, DecodeListOffsetsResponse);
    }
    case ApiKey::kMetadata: {
      MetadataResponse m;
      if (v >= 3) m.throttle_time_ms = 2;
      MetadataResponseBroker b{1, "127.0.0.1", 9092, std::nullopt};
      if (v >= 1) b.rack = "r1";
      m.brokers = {b, {2, "host2", 9093, std::nullopt}};
      if (v >= 2) m.cluster_id = "weir-cluster";
      if (v >= 1) m.controller_id = 1;
      MetadataResponsePartition p{ErrorCode::kNone, 0, 1, {1}, {1}, {}};
      if (v >= 5) p.offline_replicas = {2};
      MetadataResponseTopic t{ErrorCode::kNone, "orders", false, {p}};
      MetadataResponseTopic missing{ErrorCode::kUnknownTopicOrPartition, "nope", false, {}};
      m.topics = {t, missing};
      return ExpectResponseRoundTrip(m, v, EncodeMetadataResponse, DecodeMetadataResponse);
    }
    case ApiKey::kOffsetCommit: {
      OffsetCommitResponse m;
      if (v >= 3) m.throttle_time_ms = 4;
      m.topics = {{"orders", {{0, ErrorCode::kNone}, {1, ErrorCode::kIllegalGeneration}}}};
      return ExpectResponseRoundTrip(m, v, EncodeOffsetCommitResponse, DecodeOffsetCommitResponse);
    }
    case ApiKey::kOffsetFetch: {
      OffsetFetchResponse m;
      if (v >= 3) m.throttle_time_ms = 4;
      OffsetFetchResponsePartition p{0, 100, -1, "meta", ErrorCode::kNone};
      if (v >= 5) p.committed_leader_epoch = 3;
      m.topics = {{"orders", {p, {1, -1, -1, std::nullopt, ErrorCode::kNone}}}};
      if (v >= 2) m.error_code = ErrorCode::kCoordinatorLoadInProgress;
      return ExpectResponseRoundTrip(m, v, EncodeOffsetFetchResponse, DecodeOffsetFetchResponse);
    }
    case ApiKey::kFindCoordinator: {
      FindCoordinatorResponse m;
      if (v >= 1) {
        m.throttle_time_ms = 1;
        m.error_message = "ok";
      }
      m.node_id = 1;
      m.host = "127.0.0.1";
      m.port = 9092;
      return ExpectResponseRoundTrip(m, v, EncodeFindCoordinatorResponse, DecodeFindCoordinatorResponse);
    }
    case ApiKey::kJoinGroup: {
      JoinGroupResponse m;
      if (v >= 2) m.throttle_time_ms = 1;
      m.generation_id = 4;
      m.protocol_name = "range";
      m.leader = "member-1";
      m.member_id = "member-1";
      JoinGroupResponseMember a{"member-1", std::nullopt, "\x00\x01"s};
      if (v >= 5) a.group_instance_id = "instance-1";
      m.members = {a, {"member-2", std::nullopt, ""}};
      return ExpectResponseRoundTrip(m, v, EncodeJoinGroupResponse, DecodeJoinGroupResponse);
    }
    case ApiKey::kHeartbeat: {
      HeartbeatResponse m{v >= 1 ? 5 : 0, ErrorCode::kRebalanceInProgress};
      return ExpectResponseRoundTrip(m, v, EncodeHeartbeatResponse, DecodeHeartbeatResponse);
    }
    case ApiKey::kLeaveGroup: {
      LeaveGroupResponse m;
      if (v >= 1) m.throttle_time_ms = 1;
      if (v >= 3) m.members = {{"member-1", std::nullopt, ErrorCode::kNone}, {"m2", "i2", ErrorCode::kUnknownMemberId}};
      return ExpectResponseRoundTrip(m, v, EncodeLeaveGroupResponse, DecodeLeaveGroupResponse);
    }
    case ApiKey::kSyncGroup: {
      SyncGroupResponse m{v >= 1 ? 2 : 0, ErrorCode::kNone, "\x00\x01\x00\x00\x00\x01"s};
      return ExpectResponseRoundTrip(m, v, EncodeSyncGroupResponse, DecodeSyncGroupResponse);
    }
    case ApiKey::kApiVersions: {
      ApiVersionsResponse m = SupportedApiVersions();
      if (v >= 1) m.throttle_time_ms = 6;
      return ExpectResponseRoundTrip(m, v, EncodeApiVersionsResponse, DecodeApiVersionsResponse);
    }
    case ApiKey::kCreateTopics: {
      CreateTopicsResponse m;
      if (v >= 2) m.throttle_time_ms = 1;
      CreatableTopicResult t{"orders", ErrorCode::kTopicAlreadyExists, std::nullopt};
      if (v >= 1) t.error_message = "exists";
      m.topics = {t, {"new", ErrorCode::kNone, std::nullopt}};
      return ExpectResponseRoundTrip(m, v, EncodeCreateTopicsResponse, DecodeCreateTopicsResponse);
    }
    case ApiKey::kDeleteTopics: {
      DeleteTopicsResponse m;
      if (v >= 1) m.throttle_time_ms = 1;
      m.responses = {{"orders", ErrorCode::kNone}, {"nope", ErrorCode::kUnknownTopicOrPartition}};
      return ExpectResponseRoundTrip(m, v, EncodeDeleteTopicsResponse, DecodeDeleteTopicsResponse);
    }
    case ApiKey::kInitProducerId: {
      InitProducerIdResponse m{0, ErrorCode::kNone, 4000, 2};
      return ExpectResponseRoundTrip(m, v, EncodeInitProducerIdResponse, DecodeInitProducerIdResponse);
    }
    case ApiKey::kDescribeGroups: {
      DescribeGroupsResponse m;
      if (v >= 1) m.throttle_time_ms = 2;
      DescribedGroup g{ErrorCode::kNone, "g1", "Stable", "consumer", "range", {}, 0};
      DescribedGroupMember mem{"rdkafka-1", std::nullopt, "client-1", "/127.0.0.1", "meta\x00", "assign\x01"};
      if (v >= 4) mem.group_instance_id = "instance-1";
      g.members = {mem, DescribedGroupMember{"rdkafka-2", std::nullopt, "c2", "/127.0.0.2", "", ""}};
      g.authorized_operations = v >= 3 ? 0 : std::numeric_limits<int32_t>::min();
      DescribedGroup dead{ErrorCode::kNone, "gone", "Dead", "", "", {}, std::numeric_limits<int32_t>::min()};
      m.groups = {g, dead};
      return ExpectResponseRoundTrip(m, v, EncodeDescribeGroupsResponse, DecodeDescribeGroupsResponse);
    }
    case ApiKey::kListGroups: {
      ListGroupsResponse m;
      if (v >= 1) m.throttle_time_ms = 4;
      m.groups = {{"g1", "consumer"}, {"offsets-only", ""}};
      return ExpectResponseRoundTrip(m, v, EncodeListGroupsResponse, DecodeListGroupsResponse);
    }
    case ApiKey::kDeleteGroups: {
      DeleteGroupsResponse m{5, {{"g1", ErrorCode::kNone}, {"g2", ErrorCode::kNonEmptyGroup}}};
      return ExpectResponseRoundTrip(m, v, EncodeDeleteGroupsResponse, DecodeDeleteGroupsResponse);
    }
    case ApiKey::kDeleteRecords: {
      DeleteRecordsResponse m{4, {{"orders", {{0, 17, ErrorCode::kNone}, {3, -1, ErrorCode::kOffsetOutOfRange}}},
                                  {"gone", {{0, -1, ErrorCode::kUnknownTopicOrPartition}}}}};
      return ExpectResponseRoundTrip(m, v, EncodeDeleteRecordsResponse, DecodeDeleteRecordsResponse);
    }
    case ApiKey::kOffsetDelete: {
      OffsetDeleteResponse m{ErrorCode::kNone, 2, {{"orders", {{0, ErrorCode::kNone},
                                                               {1, ErrorCode::kGroupSubscribedToTopic}}}}};
      ExpectResponseRoundTrip(m, v, EncodeOffsetDeleteResponse, DecodeOffsetDeleteResponse);
      OffsetDeleteResponse failed{ErrorCode::kGroupIdNotFound, 0, {}};
      return ExpectResponseRoundTrip(failed, v, EncodeOffsetDeleteResponse, DecodeOffsetDeleteResponse);
    }
    case ApiKey::kIncrementalAlterConfigs:  // answered with AlterConfigs' layout
    case ApiKey::kAlterConfigs: {
      AlterConfigsResponse m{3, {{ErrorCode::kNone, std::nullopt, kConfigResourceTopic, "orders"},
                                 {ErrorCode::kInvalidConfig, "read-only", kConfigResourceBroker, "1"}}};
      return ExpectResponseRoundTrip(m, v, EncodeAlterConfigsResponse, DecodeAlterConfigsResponse);
    }
    case ApiKey::kCreatePartitions: {
      CreatePartitionsResponse m{7, {{"orders", ErrorCode::kNone, std::nullopt},
                                     {"events", ErrorCode::kInvalidPartitions, "already has 3 partitions"}}};
      return ExpectResponseRoundTrip(m, v, EncodeCreatePartitionsResponse, DecodeCreatePartitionsResponse);
    }
    case ApiKey::kDescribeConfigs: {
      DescribeConfigsResponse m;
      m.throttle_time_ms = 6;
      DescribeConfigsEntry e{"retention.ms", "86400000", true, false, -1, false, {}};
      DescribeConfigsEntry null_value{"segment.bytes", std::nullopt, false, false, -1, true, {}};
      if (v == 0) {
        e.is_default = true;
      } else {
        e.config_source = kConfigSourceDefault;
        e.synonyms = {{"retention.ms", "86400000", kConfigSourceDefault}, {"log.retention.ms", std::nullopt, 4}};
        null_value.config_source = kConfigSourceDynamicTopic;
      }
      m.results = {{ErrorCode::kNone, std::nullopt, kConfigResourceTopic, "orders", {e, null_value}},
                   {ErrorCode::kInvalidRequest, "no such broker", kConfigResourceBroker, "7", {}}};
      return ExpectResponseRoundTrip(m, v, EncodeDescribeConfigsResponse, DecodeDescribeConfigsResponse);
    }
  }
  ADD_FAILURE() << "no sample response for api " << static_cast<int>(key);
}

TEST(KafkaRoundTrip, EveryResponseAtEveryVersion) {
  samples::ForEachApiVersion([](ApiKey key, int16_t v) {
    SCOPED_TRACE(fmt::format("api {} v{}", static_cast<int>(key), v));
    ResponseRoundTrip(key, v);
  });
}

TEST(KafkaRoundTrip, FetchRecordsAreConcatenatedPieces) {
  FetchResponse m;
  FetchPartitionData p;
  p.records = {samples::kBatchA, samples::kBatchB};
  m.responses = {{"t", {p}}};
  std::string buf;
  Writer w(&buf);
  EncodeFetchResponse(m, 4, w);
  Reader r(buf);
  FetchResponse got;
  ASSERT_TRUE(DecodeFetchResponse(r, 4, &got).ok());
  ASSERT_EQ(got.responses[0].partitions[0].records.size(), 1u);
  EXPECT_EQ(got.responses[0].partitions[0].records[0], std::string(samples::kBatchA) + std::string(samples::kBatchB));
  // The decoded view points into the buffer: no copy.
  std::string_view view = got.responses[0].partitions[0].records[0];
  EXPECT_GE(view.data(), buf.data());
  EXPECT_LE(view.data() + view.size(), buf.data() + buf.size());
}

// Clients older than Produce v4 / Fetch v6 take KAFKA_STORAGE_ERROR as fatal:
// they get NOT_LEADER_OR_FOLLOWER, which they retry.
TEST(KafkaRoundTrip, OldClientsGetStorageErrorsAsNotLeader) {
  ProduceResponse produce;
  produce.responses.push_back({"t", {}});
  produce.responses[0].partition_responses.push_back({});
  produce.responses[0].partition_responses[0].error_code = ErrorCode::kKafkaStorageError;
  for (int16_t v = 3; v <= 7; ++v) {
    auto got = Reencoded(produce, v, EncodeProduceResponse, DecodeProduceResponse);
    ASSERT_EQ(got.responses.size(), 1u);
    EXPECT_EQ(got.responses[0].partition_responses.at(0).error_code,
              v < 4 ? ErrorCode::kNotLeaderOrFollower : ErrorCode::kKafkaStorageError)
        << "produce v" << v;
  }
  FetchResponse fetch;
  FetchPartitionData p;
  p.error_code = ErrorCode::kKafkaStorageError;
  fetch.responses = {{"t", {p}}};
  for (int16_t v = 4; v <= 11; ++v) {
    auto got = Reencoded(fetch, v, EncodeFetchResponse, DecodeFetchResponse);
    ASSERT_EQ(got.responses.size(), 1u);
    EXPECT_EQ(got.responses[0].partitions.at(0).error_code,
              v < 6 ? ErrorCode::kNotLeaderOrFollower : ErrorCode::kKafkaStorageError)
        << "fetch v" << v;
  }
}

// A message quoting a long name is cut (at a character boundary), not a
// reason to close the connection with every other resource's answer.
TEST(KafkaRoundTrip, LongErrorMessagesAreCut) {
  CreateTopicsResponse m;
  m.topics.push_back({"t", ErrorCode::kUnknownTopicOrPartition, "topic " + std::string(kMaxStringSize - 7, 'x') + "\u00e9!"});
  auto got = Reencoded(m, 1, EncodeCreateTopicsResponse, DecodeCreateTopicsResponse);
  ASSERT_EQ(got.topics.size(), 1u);
  ASSERT_TRUE(got.topics[0].error_message.has_value());
  EXPECT_EQ(*got.topics[0].error_message, m.topics[0].error_message->substr(0, kMaxStringSize - 1));
}

TEST(KafkaRoundTrip, NullAndEmptyVariants) {
  // Metadata v1+: null topics = all topics; v0 writes an empty array instead.
  MetadataRequest all;
  all.topics = std::nullopt;
  for (int16_t v : {1, 4, 6}) {
    auto frame = EncodeRequest(samples::Header(ApiKey::kMetadata, v), all);
    ASSERT_TRUE(frame.ok());
    auto got = DecodeRequest(*frame);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_FALSE(std::get<MetadataRequest>(got->body).topics.has_value());
  }
  auto v0 = EncodeRequest(samples::Header(ApiKey::kMetadata, 0), all);
  ASSERT_TRUE(v0.ok());
  auto got0 = DecodeRequest(*v0);
  ASSERT_TRUE(got0.ok());
  EXPECT_EQ(std::get<MetadataRequest>(got0->body).topics, std::vector<MetadataRequestTopic>{});

  // OffsetFetch v2+: null topics; v1 cannot express it.
  OffsetFetchRequest every{"g", std::nullopt};
  auto f2 = EncodeRequest(samples::Header(ApiKey::kOffsetFetch, 2), every);
  ASSERT_TRUE(f2.ok());
  auto g2 = DecodeRequest(*f2);
  ASSERT_TRUE(g2.ok());
  EXPECT_FALSE(std::get<OffsetFetchRequest>(g2->body).topics.has_value());
  EXPECT_FALSE(EncodeRequest(samples::Header(ApiKey::kOffsetFetch, 1), every).ok());

  // A null client id and a null produce records field survive.
  RequestHeader h = samples::Header(ApiKey::kProduce, 3);
  h.client_id = std::nullopt;
  ProduceRequest p;
  p.topic_data = {{"t", {{0, std::nullopt}}}};
  auto pf = EncodeRequest(h, p);
  ASSERT_TRUE(pf.ok());
  auto pg = DecodeRequest(*pf);
  ASSERT_TRUE(pg.ok());
  EXPECT_EQ(pg->header.client_id, std::nullopt);
  EXPECT_TRUE(std::get<ProduceRequest>(pg->body) == p);
}

// Arrays of many minimal elements decode: the per-element minimum sizes used
// for the count check are not larger than the real minimum.
TEST(KafkaRoundTrip, ManyMinimalElements) {
  constexpr int kN = 200;
  std::vector<RequestBody> bodies;
  std::vector<std::pair<ApiKey, int16_t>> at;
  {
    ProduceRequest m;
    m.topic_data.resize(kN);
    m.topic_data[0].partition_data.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kProduce, 3});
  }
  {
    FetchRequest m;
    m.topics.resize(kN);
    m.topics[0].partitions.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kFetch, 4});
  }
  {
    FetchRequest m;
    m.forgotten_topics_data.resize(kN);
    m.forgotten_topics_data[0].partitions.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kFetch, 7});
  }
  {
    ListOffsetsRequest m;
    m.topics.resize(kN);
    m.topics[0].partitions.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kListOffsets, 1});
  }
  {
    MetadataRequest m;
    m.topics.emplace(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kMetadata, 0});
  }
  {
    OffsetCommitRequest m;
    m.topics.resize(kN);
    m.topics[0].partitions.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kOffsetCommit, 0});
  }
  {
    OffsetFetchRequest m;
    m.topics.emplace(kN);
    (*m.topics)[0].partition_indexes.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kOffsetFetch, 1});
  }
  {
    JoinGroupRequest m;
    m.protocols.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kJoinGroup, 0});
  }
  {
    LeaveGroupRequest m;
    m.members.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kLeaveGroup, 3});
  }
  {
    SyncGroupRequest m;
    m.assignments.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kSyncGroup, 0});
  }
  {
    CreateTopicsRequest m;
    m.topics.resize(kN);
    m.topics[0].assignments.resize(kN);
    m.topics[0].assignments[0].broker_ids.resize(kN);
    m.topics[0].configs.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kCreateTopics, 0});
  }
  {
    DeleteTopicsRequest m;
    m.topic_names.resize(kN);
    bodies.push_back(m);
    at.push_back({ApiKey::kDeleteTopics, 0});
  }
  for (size_t i = 0; i < bodies.size(); ++i) {
    auto frame = EncodeRequest(samples::Header(at[i].first, at[i].second), bodies[i]);
    ASSERT_TRUE(frame.ok());
    auto got = DecodeRequest(*frame);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(got->body == bodies[i]) << "api " << static_cast<int>(at[i].first);
  }

  // The same for responses with nested arrays of minimal elements.
  MetadataResponse meta;
  meta.brokers.resize(kN);
  meta.topics.resize(kN);
  meta.topics[0].partitions.resize(kN);
  meta.topics[0].partitions[0].replica_nodes.resize(kN);
  std::string buf;
  Writer w(&buf);
  EncodeMetadataResponse(meta, 0, w);
  Reader r(buf);
  MetadataResponse meta_got;
  EXPECT_TRUE(DecodeMetadataResponse(r, 0, &meta_got).ok());
  EXPECT_TRUE(meta_got == meta);
  FetchResponse fetch;
  fetch.responses.resize(kN);
  fetch.responses[0].partitions.resize(kN);
  buf.clear();
  EncodeFetchResponse(fetch, 4, w);
  Reader r2(buf);
  FetchResponse fetch_got;
  EXPECT_TRUE(DecodeFetchResponse(r2, 4, &fetch_got).ok());
  EXPECT_TRUE(fetch_got == fetch);
  ListOffsetsResponse lo;
  lo.topics.resize(kN);
  lo.topics[0].partitions.resize(kN);
  buf.clear();
  EncodeListOffsetsResponse(lo, 0, w);
  Reader r3(buf);
  ListOffsetsResponse lo_got;
  EXPECT_TRUE(DecodeListOffsetsResponse(r3, 0, &lo_got).ok());
  EXPECT_TRUE(lo_got == lo);
}

// ---- Golden frames, written by hand from the protocol guide ---------------------

void ExpectRequestGolden(const std::string& frame, const RequestHeader& header, const RequestBody& body) {
  auto decoded = DecodeRequest(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->header, header);
  EXPECT_TRUE(decoded->body == body);
  auto encoded = EncodeRequest(header, body);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(ToHex(*encoded), ToHex(frame));
}

template <typename T>
void ExpectResponseGolden(const std::string& frame, int32_t correlation_id, const T& m, int16_t v,
                          void (*encode)(const T&, int16_t, Writer&), Status (*decode)(Reader&, int16_t, T*)) {
  std::string buf;
  Writer w(&buf);
  EncodeResponseHeader(correlation_id, w);
  encode(m, v, w);
  EXPECT_EQ(ToHex(buf), ToHex(frame));
  Reader r(frame);
  int32_t got_id = 0;
  ASSERT_TRUE(DecodeResponseHeader(r, &got_id).ok());
  EXPECT_EQ(got_id, correlation_id);
  T got;
  Status st = decode(r, v, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(got == m);
}

TEST(KafkaGolden, ApiVersionsRequests) {
  for (int16_t v = 0; v <= 2; ++v) {
    std::string frame = Hex("0012") + std::string(1, '\0') + std::string(1, static_cast<char>(v)) +
                        Hex("00000001"   // correlation_id
                            "0002 6162"  // client_id "ab"
                        );               // no body fields before v3
    ExpectRequestGolden(frame, RequestHeader{18, v, 1, "ab"}, ApiVersionsRequest{});
  }
}

TEST(KafkaGolden, ApiVersionsResponses) {
  ApiVersionsResponse m;
  m.api_keys = {{0, 3, 7}, {18, 0, 2}};
  m.throttle_time_ms = 5;
  const std::string v0 = Hex(
      "00000001"         // correlation_id
      "0000"             // error_code
      "00000002"         // api_keys count
      "0000 0003 0007"   // Produce 3-7
      "0012 0000 0002"); // ApiVersions 0-2
  ApiVersionsResponse m0 = m;
  m0.throttle_time_ms = 0;  // not in v0
  ExpectResponseGolden(v0, 1, m0, 0, EncodeApiVersionsResponse, DecodeApiVersionsResponse);
  for (int16_t v : {1, 2}) {
    ExpectResponseGolden(v0 + Hex("00000005"), 1, m, v, EncodeApiVersionsResponse, DecodeApiVersionsResponse);
  }
}

TEST(KafkaGolden, ApiVersionsUnsupportedAnswer) {
  std::string got = EncodeApiVersionsUnsupported(9);
  std::string want = Hex(
      "00000009"  // correlation_id
      "0023"      // error_code 35 UNSUPPORTED_VERSION
      "00000018"  // 24 APIs
      "0000 0000 0007"  // Produce: decoded from v3, advertised from v0
      "0001 0000 000b"  // Fetch: decoded from v4
      "0002 0000 0003"
      "0003 0000 0006"
      "0008 0000 0007"
      "0009 0000 0005"  // OffsetFetch: decoded from v1
      "000a 0000 0002"
      "000b 0000 0005"
      "000c 0000 0003"
      "000d 0000 0003"
      "000e 0000 0003"
      "000f 0000 0004"  // DescribeGroups
      "0010 0000 0002"  // ListGroups
      "0012 0000 0002"
      "0013 0000 0004"
      "0014 0000 0003"
      "0015 0000 0001"    // DeleteRecords
      "0016 0000 0001"
      "0020 0000 0002"    // DescribeConfigs
      "0021 0000 0001"    // AlterConfigs
      "0025 0000 0001"    // CreatePartitions
      "002a 0000 0001"    // DeleteGroups
      "002c 0000 0000"    // IncrementalAlterConfigs
      "002f 0000 0000");  // OffsetDelete
  EXPECT_EQ(ToHex(got), ToHex(want));
}

TEST(KafkaGolden, MetadataV1) {
  const std::string request = Hex(
      "0003 0001 00000002 ffff"  // Metadata v1, correlation 2, client_id null
      "00000001 0006 6f7264657273");  // topics ["orders"]
  MetadataRequest m;
  m.topics = std::vector<MetadataRequestTopic>{{"orders"}};
  ExpectRequestGolden(request, RequestHeader{3, 1, 2, std::nullopt}, m);

  const std::string all = Hex("0003 0001 00000002 ffff ffffffff");  // topics null: all
  MetadataRequest every;
  every.topics = std::nullopt;
  ExpectRequestGolden(all, RequestHeader{3, 1, 2, std::nullopt}, every);

  const std::string response = Hex(
      "00000002"                    // correlation_id
      "00000001"                    // brokers count
      "00000001 0001 68 00002384 ffff"  // node 1, host "h", port 9092, rack null
      "00000001"                    // controller_id
      "00000001"                    // topics count
      "0000 0001 74 00"             // error 0, name "t", is_internal false
      "00000001"                    // partitions count
      "0000 00000000 00000001"      // error 0, partition 0, leader 1
      "00000001 00000001"           // replicas [1]
      "00000001 00000001");         // isr [1]
  MetadataResponse resp;
  resp.brokers = {{1, "h", 9092, std::nullopt}};
  resp.controller_id = 1;
  resp.topics = {{ErrorCode::kNone, "t", false, {{ErrorCode::kNone, 0, 1, {1}, {1}, {}}}}};
  ExpectResponseGolden(response, 2, resp, 1, EncodeMetadataResponse, DecodeMetadataResponse);
}

TEST(KafkaGolden, ProduceV3) {
  const std::string request = Hex(
      "0000 0003 00000003 0001 63"  // Produce v3, correlation 3, client_id "c"
      "ffff"                        // transactional_id null
      "ffff"                        // acks -1
      "000003e8"                    // timeout_ms 1000
      "00000001 0001 74"            // topic_data: "t"
      "00000001 00000000"           // partition_data: index 0
      "00000003 78797a");           // records "xyz"
  ProduceRequest m;
  m.acks = -1;
  m.timeout_ms = 1000;
  m.topic_data = {{"t", {{0, "xyz"}}}};
  ExpectRequestGolden(request, RequestHeader{0, 3, 3, "c"}, m);

  const std::string response = Hex(
      "00000003"                    // correlation_id
      "00000001 0001 74"            // responses: "t"
      "00000001 00000000 0000"      // partition 0, error 0
      "0000000000000005"            // base_offset 5
      "ffffffffffffffff"            // log_append_time_ms -1
      "00000000");                  // throttle_time_ms
  ProduceResponse resp;
  resp.responses = {{"t", {{0, ErrorCode::kNone, 5, -1, -1}}}};
  ExpectResponseGolden(response, 3, resp, 3, EncodeProduceResponse, DecodeProduceResponse);
}

TEST(KafkaGolden, FetchV4) {
  const std::string request = Hex(
      "0001 0004 00000004 ffff"     // Fetch v4, correlation 4, client_id null
      "ffffffff"                    // replica_id -1
      "000001f4"                    // max_wait_ms 500
      "00000001"                    // min_bytes 1
      "00100000"                    // max_bytes 1 MiB
      "00"                          // isolation_level 0
      "00000001 0001 74"            // topics: "t"
      "00000001 00000000"           // partitions: partition 0
      "000000000000000a"            // fetch_offset 10
      "00010000");                  // partition_max_bytes 64 KiB
  FetchRequest m;
  m.max_wait_ms = 500;
  m.min_bytes = 1;
  m.max_bytes = 1048576;
  m.topics = {{"t", {{0, -1, 10, -1, 65536}}}};
  ExpectRequestGolden(request, RequestHeader{1, 4, 4, std::nullopt}, m);

  const std::string response = Hex(
      "00000004"                    // correlation_id
      "00000000"                    // throttle_time_ms
      "00000001 0001 74"            // responses: "t"
      "00000001 00000000 0000"      // partition 0, error 0
      "000000000000000c"            // high_watermark 12
      "000000000000000c"            // last_stable_offset 12
      "ffffffff"                    // aborted_transactions null
      "00000003 78797a");           // records "xyz"
  FetchResponse resp;
  FetchPartitionData p;
  p.high_watermark = 12;
  p.last_stable_offset = 12;
  p.records = {"xyz"};
  resp.responses = {{"t", {p}}};
  ExpectResponseGolden(response, 4, resp, 4, EncodeFetchResponse, DecodeFetchResponse);
}

// ---- Hostile input ------------------------------------------------------------

TEST(KafkaHostile, EveryTruncationOfEveryRequestFails) {
  samples::ForEachApiVersion([](ApiKey key, int16_t v) {
    std::string frame = samples::RequestFrame(key, v);
    ASSERT_FALSE(frame.empty());
    for (size_t n = 0; n < frame.size(); ++n) {
      auto got = DecodeRequest(std::string_view(frame).substr(0, n));
      ASSERT_FALSE(got.ok()) << "api " << static_cast<int>(key) << " v" << v << " prefix " << n;
      EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
    }
  });
}

// A request that decodes to far more than its frame (tiny elements, each a
// struct or a string object) is refused; real requests of many elements are
// not.
TEST(KafkaHostile, RequestsThatDecodeFarLargerThanTheirFrameFail) {
  DeleteGroupsRequest empties;
  empties.groups_names.resize(100000);  // 2 bytes each on the wire, 32 decoded
  auto frame = EncodeRequest(samples::Header(ApiKey::kDeleteGroups, 1), empties);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  auto got = DecodeRequest(*frame);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
  EXPECT_NE(got.status().message().find("decoded request would take more than"), std::string::npos)
      << got.status().message();

  DeleteGroupsRequest named;
  for (int i = 0; i < 20000; ++i) named.groups_names.push_back(fmt::format("consumer-group-{:08}", i));
  frame = EncodeRequest(samples::Header(ApiKey::kDeleteGroups, 1), named);
  ASSERT_TRUE(frame.ok());
  EXPECT_TRUE(DecodeRequest(*frame).ok());

  FetchRequest fetch;
  fetch.topics.resize(100);
  for (auto& t : fetch.topics) {
    t.topic = "a-topic-with-a-name";
    t.partitions.resize(1000);
  }
  frame = EncodeRequest(samples::Header(ApiKey::kFetch, 4), fetch);
  ASSERT_TRUE(frame.ok());
  EXPECT_TRUE(DecodeRequest(*frame).ok());
}

TEST(KafkaHostile, TrailingBytesFail) {
  samples::ForEachApiVersion([](ApiKey key, int16_t v) {
    std::string frame = samples::RequestFrame(key, v) + "\x00"s;
    auto got = DecodeRequest(frame);
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("1 unexpected bytes after the last field"), std::string::npos)
        << got.status().message();
  });
}

TEST(KafkaHostile, ErrorsNameTheFieldPath) {
  // Produce v3 whose second partition's records claim 900 bytes.
  std::string frame = Hex(
      "0000 0003 00000001 ffff"
      "ffff 0001 00000064"
      "00000001 0001 74"
      "00000002"
      "00000000 00000001 61"     // partition 0, records "a"
      "00000001 00000384 6263");  // partition 1, records length 900
  auto got = DecodeRequest(frame);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "ProduceRequest.topic_data[0].partition_data[1].records: length 900 past end of frame (2 bytes left)");

  // An invalid UTF-8 topic name in Fetch.
  std::string fetch = Hex(
      "0001 0004 00000001 ffff"
      "ffffffff 00000000 00000000 00000000 00"
      "00000001 0002 c0ae"
      "00000000");
  auto f = DecodeRequest(fetch);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(), "FetchRequest.topics[0].topic: string is not valid UTF-8");
}

TEST(KafkaHostile, HugeArrayCountsFailWithoutAllocating) {
  // Metadata v1 claiming 2^31-1 topics in a 16-byte frame.
  std::string frame = Hex("0003 0001 00000001 ffff 7fffffff");
  auto got = DecodeRequest(frame);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "MetadataRequest.topics: array count 2147483647 needs at least 4294967294 bytes, 0 left in frame");
  // CreateTopics with a plausible count whose elements are too small.
  std::string ct = Hex("0013 0000 00000001 ffff 00000003 0000 00000001 0001 00000000 00000000 00002710");
  auto got2 = DecodeRequest(ct);
  ASSERT_FALSE(got2.ok());
  EXPECT_EQ(got2.status().code(), Code::kInvalidArgument);
  // Negative counts.
  Status got3 = DecodeStatus("0003 0001 00000001 ffff 80000000");
  ASSERT_FALSE(got3.ok());
  EXPECT_EQ(got3.message(), "MetadataRequest.topics: array count -2147483648 is negative");
  // v0 has no null topics.
  Status got4 = DecodeStatus("0003 0000 00000001 ffff ffffffff");
  ASSERT_FALSE(got4.ok());
  EXPECT_EQ(got4.message(), "MetadataRequest.topics: array is null in a non-nullable field");
}

TEST(KafkaHostile, ClientIdIsNotCheckedAsUtf8) {
  std::string frame = Hex("0012 0000 00000001 0002 ff00");
  auto got = DecodeRequest(frame);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->header.client_id, "\xff\x00"s);
}

TEST(KafkaHostile, UnknownKeysAndVersionsAreNotSupported) {
  Status unknown = DecodeStatus("0004 0000 00000001 ffff");  // LeaderAndIsr
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(IsUnsupportedApi(unknown));
  EXPECT_EQ(unknown.message(), "kafka: api key 4 is not supported");

  Status old = DecodeStatus("0000 0002 00000001 ffff");  // Produce v2
  ASSERT_FALSE(old.ok());
  EXPECT_TRUE(IsUnsupportedApi(old));
  EXPECT_EQ(old.message(), "kafka: Produce v2 is not supported (v3-7)");

  Status negative = DecodeStatus("ffff 0000 00000001 ffff");
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(IsUnsupportedApi(negative));

  // An ApiVersions v3 request as librdkafka sends it: header v2 (client id as
  // a classic string, then an empty tagged-field section), compact strings.
  std::string v3 = Hex("0012 0003 0000002a 0007 7264 6b61 666b 61 00 0b 6c696272646b61666b61 06 322e302e30 00");
  auto flexible = DecodeRequest(v3);
  ASSERT_FALSE(flexible.ok());
  EXPECT_TRUE(IsUnsupportedApi(flexible.status()));
  auto header = PeekRequestHeader(v3);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->api_key, 18);
  EXPECT_EQ(header->api_version, 3);
  EXPECT_EQ(header->correlation_id, 42);
  EXPECT_EQ(header->client_id, "rdkafka");

  // Malformed input is not "unsupported".
  Status short_header = DecodeStatus("0012 00");
  ASSERT_FALSE(short_header.ok());
  EXPECT_FALSE(IsUnsupportedApi(short_header));
  EXPECT_EQ(short_header.message(), "RequestHeader.api_version: needs 2 bytes, 1 left in frame");
}

}  // namespace
}  // namespace weir::kafka
