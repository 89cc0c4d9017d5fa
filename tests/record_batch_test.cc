#include "wal/record_batch.h"

#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <lz4frame.h>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "test_support.h"
#include "wal/compression.h"

namespace weir::wal {
namespace {

using namespace std::string_literals;

Record MakeRecord(int64_t ts, std::optional<std::string> key, std::optional<std::string> value,
                  std::vector<RecordHeader> headers = {}) {
  Record r;
  r.timestamp = ts;
  r.key = std::move(key);
  r.value = std::move(value);
  r.headers = std::move(headers);
  return r;
}

std::string Encode(const std::vector<Record>& records, const EncodeOptions& options = {}) {
  std::string out;
  Status st = EncodeRecordBatch(records, options, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

std::vector<Record> SmallRecords() {
  return {MakeRecord(1000, "k1"s, "v1"s), MakeRecord(1001, std::nullopt, "v2"s),
          MakeRecord(999, "k3"s, std::nullopt, {{"h", "x"s}, {"n", std::nullopt}})};
}

// Recomputes the CRC of the batch at the start of *b after a deliberate patch.
void Reseal(std::string* b) {
  StoreBE32(b->data() + 17, Crc32c(b->data() + 21, b->size() - 21));
}

void ExpectSameRecord(const Record& want, const Record& got, size_t i) {
  EXPECT_EQ(want.timestamp, got.timestamp) << "record " << i;
  EXPECT_EQ(want.key, got.key) << "record " << i;
  EXPECT_EQ(want.value, got.value) << "record " << i;
  ASSERT_EQ(want.headers.size(), got.headers.size()) << "record " << i;
  for (size_t j = 0; j < want.headers.size(); ++j) {
    EXPECT_EQ(want.headers[j].key, got.headers[j].key) << "record " << i << " header " << j;
    EXPECT_EQ(want.headers[j].value, got.headers[j].value) << "record " << i << " header " << j;
  }
}

void ExpectRoundTrip(const std::vector<Record>& records, const EncodeOptions& options) {
  std::string b = Encode(records, options);
  auto h = VerifyBatch(b);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->total_size(), b.size());
  EXPECT_EQ(h->base_offset, options.base_offset);
  EXPECT_EQ(h->record_count, static_cast<int32_t>(records.size()));
  EXPECT_EQ(h->last_offset_delta, static_cast<int32_t>(records.size() - 1));
  EXPECT_EQ(h->base_timestamp, records.front().timestamp);
  auto decoded = DecodeRecords(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ((*decoded)[i].offset, options.base_offset + static_cast<int64_t>(i));
    ExpectSameRecord(records[i], (*decoded)[i].record, i);
  }
}

TEST(RecordBatchTest, RoundTripNullEmptyBinaryAndHeaders) {
  std::string binary("\x00\xff\x80\x7f\x00"s);
  std::vector<Record> records = {
      MakeRecord(5000, std::nullopt, std::nullopt),                    // tombstone, null key
      MakeRecord(5001, ""s, ""s),                                      // empty, not null
      MakeRecord(4000, binary, binary + binary),                       // negative delta
      MakeRecord(5002, "k"s, std::nullopt, {{"a", "1"s}, {"b", std::nullopt}, {"", ""s}}),
      MakeRecord(-7, std::string(300, 'K'), std::string(20000, 'V')),  // multi-byte varints
  };
  EncodeOptions opt;
  opt.base_offset = 1234567890123;
  opt.producer_id = 42;
  opt.producer_epoch = 3;
  opt.base_sequence = 100;
  ExpectRoundTrip(records, opt);

  std::string b = Encode(records, opt);
  auto h = ParseBatchHeader(b);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->max_timestamp, 5002);
  EXPECT_EQ(h->producer_id, 42);
  EXPECT_EQ(h->producer_epoch, 3);
  EXPECT_EQ(h->base_sequence, 100);
  EXPECT_EQ(h->attributes, 0);
  EXPECT_EQ(h->last_offset(), opt.base_offset + 4);
}

TEST(RecordBatchTest, RoundTripManyRecords) {
  std::vector<Record> records;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5000; ++i) {
    Record r;
    r.timestamp = 1'700'000'000'000 + static_cast<int64_t>(rng() % 100000) - 50000;
    if (i % 3 != 0) r.key = "key-" + std::to_string(i);
    if (i % 5 != 0) r.value = std::string(rng() % 300, static_cast<char>('a' + i % 26));
    for (int j = 0; j < i % 4; ++j) {
      r.headers.push_back({"h" + std::to_string(j), j % 2 ? std::nullopt : std::optional<std::string>("v")});
    }
    records.push_back(std::move(r));
  }
  ExpectRoundTrip(records, EncodeOptions{});
}

TEST(RecordBatchTest, RoundTripExtremeTimestamps) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ExpectRoundTrip({MakeRecord(kMax, "a"s, "b"s), MakeRecord(kMin, "c"s, "d"s), MakeRecord(0, {}, {})}, {});
  ExpectRoundTrip({MakeRecord(kMin, "a"s, "b"s), MakeRecord(kMax, "c"s, "d"s)}, {});
}

TEST(RecordBatchTest, EncodeAppendsToExistingOutput) {
  std::string out = "prefix";
  ASSERT_TRUE(EncodeRecordBatch(SmallRecords(), {}, &out).ok());
  ASSERT_EQ(out.substr(0, 6), "prefix");
  std::string_view batch = std::string_view(out).substr(6);
  EXPECT_EQ(batch, Encode(SmallRecords()));
  EXPECT_TRUE(DecodeRecords(batch).ok());
}

// Hand-laid bytes; the CRC was computed independently (bitwise CRC-32C).
// Views of the same bytes encode byte for byte as the records do, compressed
// or not (Flight encodes Arrow rows through them).
TEST(RecordBatchTest, RecordViewsEncodeAsRecords) {
  std::vector<Record> records = SmallRecords();
  records.push_back(MakeRecord(5, ""s, ""s, {{"", ""s}, {"h2", std::nullopt}}));
  std::vector<RecordView> views;
  for (const Record& r : records) {
    RecordView& v = views.emplace_back();
    v.timestamp = r.timestamp;
    if (r.key) v.key = *r.key;
    if (r.value) v.value = *r.value;
    for (const RecordHeader& h : r.headers) {
      v.headers.push_back({h.key, h.value ? std::optional<std::string_view>(*h.value) : std::nullopt});
    }
  }
  for (int codec : {kCodecNone, kCodecGzip, kCodecZstd}) {
    EncodeOptions o;
    o.producer_id = 7;
    o.base_sequence = 3;
    o.attributes = static_cast<int16_t>(codec);
    std::string want, got;
    ASSERT_TRUE(EncodeRecordBatch(records, o, &want).ok());
    ASSERT_TRUE(EncodeRecordBatch(views, o, &got).ok());
    EXPECT_EQ(want, got) << "codec " << codec;
  }
  std::string none;
  EXPECT_EQ(EncodeRecordBatch(std::vector<RecordView>{}, {}, &none).code(), Code::kInvalidArgument);
  EXPECT_TRUE(none.empty());
}

TEST(RecordBatchTest, GoldenLayout) {
  std::vector<Record> records = {
      MakeRecord(1000, "k"s, "v"s),
      MakeRecord(990, std::nullopt, std::nullopt, {{"h", std::nullopt}}),
  };
  EncodeOptions opt;
  opt.base_offset = 5;
  opt.partition_leader_epoch = 7;
  opt.producer_id = 0x0102030405060708;
  opt.producer_epoch = 0x0A0B;
  opt.base_sequence = 0x11223344;
  std::string b = Encode(records, opt);

  const std::string want =
      "\x00\x00\x00\x00\x00\x00\x00\x05"s  //  0 baseOffset 5
      "\x00\x00\x00\x44"s                  //  8 batchLength 68
      "\x00\x00\x00\x07"s                  // 12 partitionLeaderEpoch 7
      "\x02"s                              // 16 magic
      "\xef\x29\x31\x41"s                  // 17 crc
      "\x00\x00"s                          // 21 attributes
      "\x00\x00\x00\x01"s                  // 23 lastOffsetDelta 1
      "\x00\x00\x00\x00\x00\x00\x03\xe8"s  // 27 baseTimestamp 1000
      "\x00\x00\x00\x00\x00\x00\x03\xe8"s  // 35 maxTimestamp 1000
      "\x01\x02\x03\x04\x05\x06\x07\x08"s  // 43 producerId
      "\x0a\x0b"s                          // 51 producerEpoch
      "\x11\x22\x33\x44"s                  // 53 baseSequence
      "\x00\x00\x00\x02"s                  // 57 recordCount 2
      // record 0: length 8, attrs, tsDelta 0, offsetDelta 0, key "k", value "v", 0 headers
      "\x10\x00\x00\x00\x02k\x02v\x00"s
      // record 1: length 9, attrs, tsDelta -10, offsetDelta 1, null key, null value,
      // 1 header: key "h", null value
      "\x12\x00\x13\x02\x01\x01\x02\x02h\x01"s;
  ASSERT_EQ(want.size(), 80u);
  EXPECT_EQ(b, want);

  EXPECT_EQ(b[16], kRecordBatchMagic);
  EXPECT_EQ(LoadBE32(b.data() + 17), Crc32c(std::string_view(b).substr(21)));
  EXPECT_EQ(LoadBE16(b.data() + 21), 0);
  EXPECT_EQ(LoadBE32(b.data() + 57), 2u);

  auto h = VerifyBatch(want);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->crc, 0xEF293141u);
  EXPECT_EQ(h->batch_length, 68);
  EXPECT_EQ(h->partition_leader_epoch, 7);
  EXPECT_EQ(h->producer_epoch, 0x0A0B);
  auto d = DecodeRecords(want);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[1].offset, 6);
  ExpectSameRecord(records[1], (*d)[1].record, 1);
}

TEST(RecordBatchTest, EveryByteFlipUnderCrcIsDetected) {
  const std::string b = Encode(SmallRecords());
  for (size_t i = 17; i < b.size(); ++i) {  // the stored CRC itself, then [21, end)
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::string c = b;
      c[i] = static_cast<char>(c[i] ^ mask);
      auto h = VerifyBatch(c);
      ASSERT_FALSE(h.ok()) << "byte " << i;
      EXPECT_EQ(h.status().code(), Code::kCorruption);
      EXPECT_NE(h.status().message().find("CRC mismatch"), std::string::npos) << h.status().ToString();
      EXPECT_EQ(DecodeRecords(c).status().code(), Code::kCorruption);
    }
  }
}

TEST(RecordBatchTest, BaseOffsetAndLeaderEpochAreOutsideCrc) {
  const std::string b = Encode(SmallRecords());
  for (size_t i : {0, 3, 7, 12, 15}) {
    std::string c = b;
    c[i] = static_cast<char>(c[i] ^ 0x5a);
    auto h = VerifyBatch(c);
    EXPECT_TRUE(h.ok()) << "byte " << i << ": " << h.status().ToString();
  }
}

// A CRC extended by a verified batch follows from the batch's own CRC and its
// first 21 bytes, whatever those bytes (baseOffset and leader epoch are
// outside its CRC).
TEST(RecordBatchTest, CrcExtendedByAVerifiedBatch) {
  std::string b = Encode(SmallRecords());
  for (int64_t base : {int64_t{0}, int64_t{7}, int64_t{1} << 40}) {
    SetBaseOffset(&b, 0, base);
    auto h = VerifyBatch(b);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    for (uint32_t before : {0u, Crc32c("earlier batches")}) {
      EXPECT_EQ(Crc32cExtendVerifiedBatch(before, *h, b), Crc32cExtend(before, b.data(), b.size()))
          << "base offset " << base;
    }
  }
}

TEST(RecordBatchTest, EveryTruncationIsCorruption) {
  const std::string b = Encode(SmallRecords());
  for (size_t n = 0; n < b.size(); ++n) {
    std::string_view t = std::string_view(b).substr(0, n);
    auto p = ParseBatchHeader(t);
    ASSERT_FALSE(p.ok()) << n;
    EXPECT_EQ(p.status().code(), Code::kCorruption);
    EXPECT_NE(p.status().message().find("truncated"), std::string::npos) << p.status().ToString();
    EXPECT_EQ(VerifyBatch(t).status().code(), Code::kCorruption) << n;
    EXPECT_EQ(DecodeRecords(t).status().code(), Code::kCorruption) << n;
  }
  EXPECT_EQ(ParseBatchHeader(std::string_view(b).substr(0, 10)).status().message(),
            "record batch truncated: 10 bytes, header needs 61");
  EXPECT_EQ(ParseBatchHeader(std::string_view(b).substr(0, 70)).status().message(),
            "record batch truncated: header says " + std::to_string(b.size()) + " bytes, have 70");
}

TEST(RecordBatchTest, BadMagic) {
  std::string b = Encode(SmallRecords());
  for (char magic : {'\x00', '\x01', '\x03', '\xff'}) {
    b[16] = magic;
    auto h = ParseBatchHeader(b);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), Code::kCorruption);
    EXPECT_NE(h.status().message().find("magic " + std::to_string(static_cast<int8_t>(magic))), std::string::npos)
        << h.status().ToString();
  }
}

TEST(RecordBatchTest, BadHeaderFields) {
  const std::string b = Encode(SmallRecords());
  auto patched = [&](size_t pos, uint32_t v) {
    std::string c = b;
    StoreBE32(c.data() + pos, v);
    Reseal(&c);
    return c;
  };
  EXPECT_EQ(ParseBatchHeader(patched(8, 48)).status().code(), Code::kCorruption);          // batchLength < 49
  EXPECT_EQ(ParseBatchHeader(patched(8, 0xFFFFFFFF)).status().code(), Code::kCorruption);  // negative
  EXPECT_EQ(ParseBatchHeader(patched(57, 0xFFFFFFFF)).status().code(), Code::kCorruption); // recordCount -1
  EXPECT_EQ(ParseBatchHeader(patched(23, 0x80000000)).status().code(), Code::kCorruption); // lastOffsetDelta
  EXPECT_NE(VerifyBatch(patched(57, 0xFFFFFFFF)).status().message().find("recordCount -1"), std::string::npos);
  // A huge recordCount must not make the decoder reserve for it.
  auto d = DecodeRecords(patched(57, 0x7FFFFFFF));
  EXPECT_EQ(d.status().code(), Code::kCorruption);
  // Too few / too many records for the bytes present.
  EXPECT_EQ(DecodeRecords(patched(57, 2)).status().code(), Code::kCorruption);
  EXPECT_NE(DecodeRecords(patched(57, 2)).status().message().find("after record 1"), std::string::npos);
  EXPECT_NE(DecodeRecords(patched(57, 4)).status().message().find("record 3"), std::string::npos);
}

TEST(RecordBatchTest, ParseDoesNotCheckCrcButVerifyDoes) {
  std::string b = Encode(SmallRecords());
  b.back() = static_cast<char>(b.back() ^ 1);
  EXPECT_TRUE(ParseBatchHeader(b).ok());
  auto v = VerifyBatch(b);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message().rfind("record batch CRC mismatch: stored 0x", 0), 0u) << v.status().ToString();
}

TEST(RecordBatchTest, ForEachBatchWalksConcatenation) {
  std::string all;
  std::vector<size_t> starts;
  for (int i = 0; i < 3; ++i) {
    starts.push_back(all.size());
    EncodeOptions opt;
    opt.base_offset = i * 10;
    std::vector<Record> recs(static_cast<size_t>(i + 1), MakeRecord(i, "k"s, "v"s));
    ASSERT_TRUE(EncodeRecordBatch(recs, opt, &all).ok());
  }
  std::vector<int64_t> bases;
  size_t bytes = 0;
  Status st = ForEachBatch(all, [&](const BatchHeader& h, std::string_view batch) {
    bases.push_back(h.base_offset);
    bytes += batch.size();
    EXPECT_EQ(batch.size(), h.total_size());
    EXPECT_TRUE(DecodeRecords(batch).ok());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(bases, (std::vector<int64_t>{0, 10, 20}));
  EXPECT_EQ(bytes, all.size());

  // The callback's error stops the walk.
  int calls = 0;
  st = ForEachBatch(all, [&](const BatchHeader&, std::string_view) {
    ++calls;
    return Corruption("stop");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.message(), "stop");

  std::string bad = all;
  bad[starts[1] + 40] = static_cast<char>(bad[starts[1] + 40] ^ 0x10);
  calls = 0;
  st = ForEachBatch(bad, [&](const BatchHeader&, std::string_view) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("batch 1 at byte " + std::to_string(starts[1])), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("CRC mismatch"), std::string::npos) << st.ToString();

  // A trailing partial batch is reported as truncated.
  st = ForEachBatch(std::string_view(all).substr(0, all.size() - 1),
                    [](const BatchHeader&, std::string_view) { return Status::Ok(); });
  EXPECT_NE(st.message().find("batch 2 at byte " + std::to_string(starts[2])), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.ToString();
}

TEST(RecordBatchTest, SetBaseOffsetKeepsCrcValid) {
  std::string all = "xyz";
  ASSERT_TRUE(EncodeRecordBatch(SmallRecords(), {}, &all).ok());
  const size_t second = all.size();
  ASSERT_TRUE(EncodeRecordBatch(SmallRecords(), {}, &all).ok());
  const uint32_t crc_before = LoadBE32(all.data() + second + 17);

  SetBaseOffset(&all, second, 0x0123456789ABCDEF);
  std::string_view batch = std::string_view(all).substr(second);
  auto h = VerifyBatch(batch);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->base_offset, 0x0123456789ABCDEF);
  EXPECT_EQ(h->crc, crc_before);
  auto d = DecodeRecords(batch);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[2].offset, 0x0123456789ABCDEF + 2);
  // The first batch is untouched.
  EXPECT_EQ(VerifyBatch(std::string_view(all).substr(3))->base_offset, 0);
  EXPECT_EQ(all.substr(0, 3), "xyz");
}

TEST(RecordBatchTest, EncoderRejectsBadInput) {
  std::string out = "keep";
  Status st = EncodeRecordBatch(std::vector<Record>{}, {}, &out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  for (int16_t codec = 5; codec <= 7; ++codec) {  // 1-4 are the Kafka codecs
    EncodeOptions opt;
    opt.attributes = codec;
    const Status bad = EncodeRecordBatch(SmallRecords(), opt, &out);
    EXPECT_EQ(bad.code(), Code::kInvalidArgument) << codec;
    EXPECT_NE(bad.message().find("unknown compression codec " + std::to_string(codec)), std::string::npos)
        << bad.ToString();
  }
  EncodeOptions control;
  control.attributes = kControlFlag;
  EXPECT_EQ(EncodeRecordBatch(SmallRecords(), control, &out).code(), Code::kInvalidArgument);
  EXPECT_EQ(out, "keep");  // nothing appended on failure

  EncodeOptions txn;
  txn.attributes = kTransactionalFlag;
  std::string b = Encode(SmallRecords(), txn);
  EXPECT_EQ(VerifyBatch(b)->attributes, kTransactionalFlag);
}

TEST(RecordBatchTest, CodecBitsOverPlainRecordsAreCorruption) {
  for (int codec = 1; codec <= 4; ++codec) {
    std::string b = Encode(SmallRecords());
    b[22] = static_cast<char>(codec);  // attributes low byte
    Reseal(&b);
    auto h = VerifyBatch(b);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->compression(), codec);
    auto d = DecodeRecords(b);
    ASSERT_FALSE(d.ok()) << codec;
    EXPECT_EQ(d.status().code(), Code::kCorruption) << d.status().ToString();
    EXPECT_NE(d.status().message().find(std::string(CodecName(codec)) + "-compressed records are corrupt"),
              std::string::npos)
        << d.status().ToString();
  }
  for (int codec = 5; codec <= 7; ++codec) {
    std::string b = Encode(SmallRecords());
    b[22] = static_cast<char>(codec);
    Reseal(&b);
    auto d = DecodeRecords(b);
    EXPECT_EQ(d.status().code(), Code::kNotSupported) << d.status().ToString();
    EXPECT_NE(d.status().message().find("unknown compression codec " + std::to_string(codec)), std::string::npos)
        << d.status().ToString();
  }
}

TEST(RecordBatchTest, ControlBatchDecodes) {
  std::string b = Encode(SmallRecords());
  b[22] = static_cast<char>(kControlFlag | kTransactionalFlag);
  Reseal(&b);
  auto d = DecodeRecords(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->size(), 3u);
}

TEST(RecordBatchTest, LogAppendTimeUsesMaxTimestamp) {
  EncodeOptions opt;
  opt.attributes = kTimestampLogAppendTime;
  std::string b = Encode(SmallRecords(), opt);
  auto d = DecodeRecords(b);
  ASSERT_TRUE(d.ok());
  for (const DecodedRecord& r : *d) EXPECT_EQ(r.record.timestamp, 1001);
}

// Builds a one-record batch whose record bytes are given verbatim.
std::string BatchWithRecordBytes(std::string_view record, int32_t count = 1) {
  std::string b = Encode({MakeRecord(0, std::nullopt, std::nullopt)});
  b.resize(61);
  b.append(record);
  StoreBE32(b.data() + 8, static_cast<uint32_t>(b.size() - 12));
  StoreBE32(b.data() + 57, static_cast<uint32_t>(count));
  Reseal(&b);
  return b;
}

TEST(RecordBatchTest, MalformedRecordsNameTheRecord) {
  // Sanity: the minimal record (length 6, everything zero/null) decodes.
  ASSERT_TRUE(DecodeRecords(BatchWithRecordBytes("\x0c\x00\x00\x00\x01\x01\x00"s)).ok());

  struct Case {
    const char* name;
    std::string bytes;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"length past end", "\x0e\x00\x00\x00\x01\x01\x00"s, "record 0: length 7"},
      {"negative length", "\x01\x00\x00\x00\x01\x01\x00"s, "record 0: length -1"},
      {"key length -2", "\x0c\x00\x00\x00\x03\x01\x00"s, "record 0: key length -2"},
      {"key overruns", "\x0c\x00\x00\x00\x08\x01\x00"s, "record 0: key length 4"},
      {"value overruns", "\x0c\x00\x00\x00\x01\x04\x00"s, "record 0: value length 2"},
      {"length too long", "\x0e\x00\x00\x00\x01\x01\x00\x00"s, "record 0: 1 bytes left over"},
      {"length too short", "\x0a\x00\x00\x00\x01\x01\x00"s, "record 0: headerCount is truncated"},
      {"negative header count", "\x0c\x00\x00\x00\x01\x01\x01"s, "record 0: headerCount -1"},
      {"null header key", "\x10\x00\x00\x00\x01\x01\x02\x01\x01"s, "record 0: header key length -1"},
      {"offsetDelta past last", "\x0c\x00\x00\x02\x01\x01\x00"s, "record 0: offsetDelta 1"},
      {"negative offsetDelta", "\x0c\x00\x00\x01\x01\x01\x00"s, "record 0: offsetDelta -1"},
      {"varint past record end", "\x0c\x00\xff\xff\xff\xff\xff"s, "record 0: timestampDelta is truncated"},
      {"overlong varint", "\x18\x00"s + std::string(11, '\xff'), "record 0: timestampDelta is truncated or malformed"},
      {"trailing garbage", "\x0c\x00\x00\x00\x01\x01\x00\x00\x00\x00\x00\x00\x00"s, "trailing bytes after record 0"},
  };
  for (const Case& c : cases) {
    auto d = DecodeRecords(BatchWithRecordBytes(c.bytes));
    ASSERT_FALSE(d.ok()) << c.name;
    EXPECT_EQ(d.status().code(), Code::kCorruption) << c.name;
    EXPECT_NE(d.status().message().find(c.want), std::string::npos) << c.name << ": " << d.status().ToString();
  }
}

// Headers take two bytes on the wire but far more decoded: a batch of too
// many is refused before its headers are allocated, by the producer-side
// check and by a reader's decode alike.
TEST(RecordBatchTest, TooManyHeadersToDecodeAreRefused) {
  auto record_with_headers = [](int64_t n) {
    std::string fields = "\x00\x00\x00\x01\x01"s;  // attributes, deltas, null key and value
    PutVarint(&fields, n);
    for (int64_t i = 0; i < n; ++i) fields += "\x00\x01"s;  // empty key, null value
    std::string rec;
    PutVarint(&rec, static_cast<int64_t>(fields.size()));
    return rec + fields;
  };
  const int64_t too_many = static_cast<int64_t>(kMaxDecodedRecordsOverheadBytes / kRecordHeaderCost) + 1;
  const std::string b = BatchWithRecordBytes(record_with_headers(too_many));
  auto h = VerifyBatch(b);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Status st = ValidateRecords(*h, b);
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("too many records and headers"), std::string::npos) << st.ToString();
  // A reader allows twice the producer-side limit (a batch once accepted
  // stays readable if the limits change), and no more.
  const int64_t too_many_to_read = static_cast<int64_t>(OverheadLimit(true) / kRecordHeaderCost) + 1;
  auto unread = DecodeRecords(BatchWithRecordBytes(record_with_headers(too_many_to_read)));
  EXPECT_EQ(unread.status().code(), Code::kCorruption);
  EXPECT_NE(unread.status().message().find("too many records and headers"), std::string::npos)
      << unread.status().ToString();
  const int64_t most = static_cast<int64_t>((kMaxDecodedRecordsOverheadBytes - kDecodedRecordCost) / kRecordHeaderCost);
  const std::string accepted = BatchWithRecordBytes(record_with_headers(most));
  auto ah = VerifyBatch(accepted);
  ASSERT_TRUE(ah.ok()) << ah.status().ToString();
  ASSERT_OK(ValidateRecords(*ah, accepted));
  auto read = DecodeRecords(accepted);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->at(0).record.headers.size(), static_cast<size_t>(most));
  // A thousand headers decode.
  auto fine = DecodeRecords(BatchWithRecordBytes(record_with_headers(1000)));
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fine->at(0).record.headers.size(), 1000u);
}

TEST(RecordBatchTest, ValidationWantsEachOffsetDeltaToBeItsIndex) {
  // Two records both at offsetDelta 0: a reader would see one offset twice
  // and miss the next, so a producer's batch like this is refused.
  const std::string rec = "\x0c\x00\x00\x00\x01\x01\x00"s;
  std::string b = BatchWithRecordBytes(rec + rec, 2);
  auto h = VerifyBatch(b);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Status st = ValidateRecords(*h, b);
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("record 1: offsetDelta 0 is not its index"), std::string::npos) << st.ToString();
  // Dense deltas pass.
  std::string good = Encode(SmallRecords());
  auto gh = VerifyBatch(good);
  ASSERT_TRUE(gh.ok());
  EXPECT_TRUE(ValidateRecords(*gh, good).ok());
}

TEST(RecordBatchTest, FuzzNeverCrashes) {
  std::mt19937_64 rng(20240611);
  auto byte = [&] { return static_cast<char>(rng() & 0xff); };

  // Random byte strings, some with a plausible header prefix.
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s(rng() % 200, '\0');
    for (char& c : s) c = byte();
    if (s.size() >= 61 && iter % 2 == 0) {
      s[16] = 2;
      StoreBE32(s.data() + 8, static_cast<uint32_t>(s.size() - 12));
      if (iter % 4 == 0) Reseal(&s);
    }
    auto d = DecodeRecords(s);
    if (iter % 4 != 0) {
      EXPECT_FALSE(d.ok()) << iter;
    }
  }

  // Mutations of valid batches; resealed ones exercise the record decoder.
  std::vector<Record> base = SmallRecords();
  base.push_back(MakeRecord(12345, std::string(200, 'k'), std::string(300, 'v'), {{"hk", "hv"s}}));
  const std::string valid = Encode(base);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {  // all edits land in [21, end)
      const uint64_t op = m.size() > 22 ? rng() % 4 : 3;
      if (op <= 1) {
        m[21 + rng() % (m.size() - 21)] = byte();
      } else if (op == 2) {
        m.resize(21 + rng() % (m.size() - 21));
      } else {
        m.insert(21 + rng() % (m.size() - 20), 1, byte());
      }
    }
    // The header is untouched, so an unsealed mutant fails iff its batch bytes changed.
    const bool changed = m.size() < valid.size() || m.compare(0, valid.size(), valid) != 0;
    const bool reseal = iter % 2 == 0;
    if (reseal) {
      if (m.size() >= 61) StoreBE32(m.data() + 8, static_cast<uint32_t>(m.size() - 12));
      Reseal(&m);
    }
    auto d = DecodeRecords(m);
    if (!reseal) {
      EXPECT_EQ(d.ok(), !changed) << iter;
    }
    if (d.ok()) {
      auto h = VerifyBatch(m);
      ASSERT_TRUE(h.ok());
      EXPECT_EQ(d->size(), static_cast<size_t>(h->record_count));
    }
  }
}


// ---- Compression ------------------------------------------------------------------

constexpr int kCodecs[] = {kCodecGzip, kCodecSnappy, kCodecLz4, kCodecZstd};

std::string Compress(int codec, std::string_view raw) {
  auto c = CompressRecords(codec, raw);
  EXPECT_TRUE(c.ok()) << CodecName(codec) << ": " << c.status().ToString();
  return c.ok() ? *c : std::string();
}

// Compressible but not trivial: words from a small vocabulary, some random bytes.
std::string Payload(size_t n, uint64_t seed = 1) {
  static const char* kWords[] = {"kafka ", "weir ", "record ", "batch ", "offset ", "\x00\x01", "stream "};
  std::mt19937_64 rng(seed);
  std::string out;
  while (out.size() < n) {
    if (rng() % 8 == 0) {
      out.push_back(static_cast<char>(rng() & 0xff));
    } else {
      out += kWords[rng() % 7];
    }
  }
  out.resize(n);
  return out;
}

TEST(CompressionTest, RoundTripEveryCodec) {
  const std::string payloads[] = {"", "x", Payload(100), Payload(70000, 2), Payload(1 << 20, 3),
                                  std::string(300000, '\0')};
  for (int codec : {kCodecNone, kCodecGzip, kCodecSnappy, kCodecLz4, kCodecZstd}) {
    for (const std::string& raw : payloads) {
      const std::string c = Compress(codec, raw);
      if (codec != kCodecNone && raw.size() >= 70000) {
        EXPECT_LT(c.size(), raw.size() / 2) << CodecName(codec) << " " << raw.size();
      }
      auto d = DecompressRecords(codec, c, raw.size());
      ASSERT_TRUE(d.ok()) << CodecName(codec) << " " << raw.size() << ": " << d.status().ToString();
      EXPECT_TRUE(*d == raw) << CodecName(codec) << " " << raw.size();
    }
  }
  EXPECT_EQ(CodecName(0), "none");
  EXPECT_EQ(CodecName(1), "gzip");
  EXPECT_EQ(CodecName(2), "snappy");
  EXPECT_EQ(CodecName(3), "lz4");
  EXPECT_EQ(CodecName(4), "zstd");
  EXPECT_EQ(CodecName(5), "unknown");
}

TEST(CompressionTest, UnknownCodec) {
  for (int codec : {5, 6, 7, -1, 100}) {
    auto d = DecompressRecords(codec, "abc", 100);
    EXPECT_EQ(d.status().code(), Code::kNotSupported) << codec;
    EXPECT_NE(d.status().message().find("unknown compression codec " + std::to_string(codec)), std::string::npos)
        << d.status().ToString();
    EXPECT_EQ(CompressRecords(codec, "abc").status().code(), Code::kInvalidArgument) << codec;
  }
}

// The two snappy forms Kafka clients send: raw (librdkafka, kafkajs) and the
// snappy-java framing (the Java client).
TEST(CompressionTest, SnappyJavaFraming) {
  const std::string raw = Payload(100000, 4);
  const std::pair<std::string_view, size_t> cases[] = {
      {raw, size_t{1} << 15},  {raw, 99999}, {raw, 100000}, {raw, size_t{1} << 20},
      {std::string_view(raw).substr(0, 5000), 7},  // many tiny blocks
  };
  for (const auto& [input, block] : cases) {
    ASSERT_OK_AND_ASSIGN(std::string framed, CompressSnappyJavaFramed(input, block));
    EXPECT_EQ(framed.substr(0, 16), "\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"s);
    ASSERT_OK_AND_ASSIGN(std::string back, DecompressRecords(kCodecSnappy, framed, input.size()));
    EXPECT_TRUE(back == input) << block;
  }
  // Header only: no blocks, no records.
  ASSERT_OK_AND_ASSIGN(std::string empty, CompressSnappyJavaFramed(""));
  EXPECT_EQ(empty.size(), 16u);
  ASSERT_OK_AND_ASSIGN(std::string none, DecompressRecords(kCodecSnappy, empty, 10));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(CompressSnappyJavaFramed("x", 0).status().code(), Code::kInvalidArgument);
}

// Vectors made outside weir: `printf 'kafka records, kafka records, kafka
// records!\n' | gzip -c -n` (gzip 1.12), `| zstd -c` (1.5.4: streamed, so the
// frame has no content size), `| lz4 -c` (1.9.4: content checksum, no size);
// snappy by hand from the format description.
TEST(CompressionTest, GoldenVectors) {
  const std::string text = "kafka records, kafka records, kafka records!\n";
  struct Vector {
    int codec;
    std::string bytes;
    std::string want;
  };
  const std::vector<Vector> vectors = {
      {kCodecGzip,
       "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xcb\x4e\x4c\xcb\x4e\x54\x28\x4a\x4d\xce\x2f\x4a\x29\xd6\x51\xc8"
       "\xc6\xc3\x55\xe4\x02\x00\xc8\x63\x58\xd0\x2d\x00\x00\x00"s,
       text},
      {kCodecZstd,
       "\x28\xb5\x2f\xfd\x04\x58\xbd\x00\x00\x88\x6b\x61\x66\x6b\x61\x20\x72\x65\x63\x6f\x72\x64\x73\x2c\x20\x21"
       "\x0a\x01\x00\xc2\xcc\x3a\xec\x0d\x46\x23"s,
       text},
      {kCodecLz4,
       "\x04\x22\x4d\x18\x64\x40\xa7\x1a\x00\x00\x00\xff\x00\x6b\x61\x66\x6b\x61\x20\x72\x65\x63\x6f\x72\x64\x73"
       "\x2c\x20\x0f\x00\x06\x50\x72\x64\x73\x21\x0a\x00\x00\x00\x00\x87\x5e\xaa\x21"s,
       text},
      // Raw snappy: length 12; literal "abc" (tag (3-1)<<2); copy of 9 bytes
      // from offset 3 (1-byte-offset form: tag (9-4)<<2 | 1, offset 3).
      {kCodecSnappy, "\x0c\x08" "abc" "\x15\x03"s, "abcabcabcabc"},
      // The same block in the snappy-java framing, split in two blocks.
      {kCodecSnappy,
       "\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"s + "\x00\x00\x00\x07"s + "\x0c\x08" "abc" "\x15\x03"s +
           "\x00\x00\x00\x04"s + "\x02\x04xy"s,
       "abcabcabcabcxy"},
  };
  for (const Vector& v : vectors) {
    auto d = DecompressRecords(v.codec, v.bytes, 1000);
    ASSERT_TRUE(d.ok()) << CodecName(v.codec) << ": " << d.status().ToString();
    EXPECT_EQ(*d, v.want) << CodecName(v.codec);
  }
}

// The records of GoldenLayout above (19 bytes), compressed outside weir
// (gzip -n, lz4, zstd as in GoldenVectors; snappy as one literal by hand), in
// batches whose CRCs were computed independently (bitwise CRC-32C in Python).
TEST(CompressionTest, GoldenCompressedBatches) {
  struct Golden {
    int codec;
    uint32_t crc;
    std::string compressed;
  };
  const std::vector<Golden> goldens = {
      {kCodecGzip, 0x6fc3b802,
       "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x13\x60\x60\x60\x60\xca\x66\x2a\x63\x10\x62\x10\x66\x62\x64\x64"
       "\x62\xca\x60\x04\x00\x92\x27\x60\xca\x13\x00\x00\x00"s},
      {kCodecSnappy, 0x5c63d099,
       "\x13\x48\x10\x00\x00\x00\x02\x6b\x02\x76\x00\x12\x00\x13\x02\x01\x01\x02\x02\x68\x01"s},
      {kCodecLz4, 0x61610e3a,
       "\x04\x22\x4d\x18\x64\x40\xa7\x13\x00\x00\x80\x10\x00\x00\x00\x02\x6b\x02\x76\x00\x12\x00\x13\x02\x01\x01"
       "\x02\x02\x68\x01\x00\x00\x00\x00\xed\x1d\x75\x04"s},
      {kCodecZstd, 0x63203a0d,
       "\x28\xb5\x2f\xfd\x04\x58\x99\x00\x00\x10\x00\x00\x00\x02\x6b\x02\x76\x00\x12\x00\x13\x02\x01\x01\x02\x02"
       "\x68\x01\x65\x33\x0d\x8b"s},
  };
  const std::vector<Record> want = {
      MakeRecord(1000, "k"s, "v"s),
      MakeRecord(990, std::nullopt, std::nullopt, {{"h", std::nullopt}}),
  };
  for (const Golden& g : goldens) {
    std::string b;
    PutBE64(&b, 5);                                          // baseOffset
    PutBE32(&b, static_cast<uint32_t>(49 + g.compressed.size()));  // batchLength
    PutBE32(&b, 7);                                          // partitionLeaderEpoch
    b.push_back(2);                                          // magic
    PutBE32(&b, g.crc);
    PutBE16(&b, static_cast<uint16_t>(g.codec));             // attributes
    PutBE32(&b, 1);                                          // lastOffsetDelta
    PutBE64(&b, 1000);                                       // baseTimestamp
    PutBE64(&b, 1000);                                       // maxTimestamp
    PutBE64(&b, 0x0102030405060708);                         // producerId
    PutBE16(&b, 0x0A0B);                                     // producerEpoch
    PutBE32(&b, 0x11223344);                                 // baseSequence
    PutBE32(&b, 2);                                          // recordCount
    b += g.compressed;

    auto h = VerifyBatch(b);
    ASSERT_TRUE(h.ok()) << CodecName(g.codec) << ": " << h.status().ToString();
    EXPECT_EQ(h->compression(), g.codec);
    auto d = DecodeRecords(b);
    ASSERT_TRUE(d.ok()) << CodecName(g.codec) << ": " << d.status().ToString();
    ASSERT_EQ(d->size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ((*d)[i].offset, 5 + static_cast<int64_t>(i));
      ExpectSameRecord(want[i], (*d)[i].record, i);
    }
    // A one-literal snappy block is also what the encoder writes for these records.
    if (g.codec == kCodecSnappy) {
      EncodeOptions opt;
      opt.base_offset = 5;
      opt.partition_leader_epoch = 7;
      opt.producer_id = 0x0102030405060708;
      opt.producer_epoch = 0x0A0B;
      opt.base_sequence = 0x11223344;
      opt.attributes = kCodecSnappy;
      EXPECT_EQ(Encode(want, opt), b);
    }
  }
}

// Batches written by a real Kafka client: librdkafka 2.0.2 through kcat
// (`kcat -P -z CODEC -K: -X enable.idempotence=true`, three keyed records),
// sent to weir's Kafka listener and read back from its segment objects, so
// byte for byte as the client sealed them. (snappy is librdkafka's raw form;
// lz4 one frame of 64 KiB independent blocks without checksums.)
TEST(CompressionTest, LibrdkafkaBatches) {
  struct Captured {
    int codec;
    std::string batch;
  };
  const std::vector<Captured> captured = {
      {kCodecGzip,
       "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x72\x00\x00\x00\x00\x02\xf5\xe8\xe2\x1b\x00\x01\x00\x00\x00"
       "\x02\x00\x00\x01\xa2\x2d\x3f\x89\x9c\x00\x00\x01\xa2\x2d\x3f\x89\x9c\x00\x00\x00\x00\x00\x00\x00\x01\x00"
       "\x00\x00\x00\x00\x00\x00\x00\x00\x03\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x53\x63\x60\x60\x60\xc9\x36"
       "\x14\xcb\x48\xcd\xc9\xc9\x57\xc8\x4e\x4c\xcb\x4e\x64\x50\x61\x60\x60\x62\xc9\x36\x12\x81\x88\x95\xa7\x66"
       "\x16\x31\x18\x01\x55\x01\x85\x94\x20\x42\x48\x24\x03\x00\xca\xee\x35\x53\x41\x00\x00\x00"s},
      {kCodecSnappy,
       "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x6e\x00\x00\x00\x00\x02\x9e\xb2\x34\xf5\x00\x02\x00\x00\x00"
       "\x02\x00\x00\x01\xa2\x2d\x3f\x8a\x1b\x00\x00\x01\xa2\x2d\x3f\x8a\x1b\x00\x00\x00\x00\x00\x00\x00\x02\x00"
       "\x00\x00\x00\x00\x00\x00\x00\x00\x03\x41\x6c\x26\x00\x00\x00\x04\x6b\x31\x16\x68\x65\x6c\x6c\x6f\x20\x6b"
       "\x61\x66\x6b\x61\x00\x24\x00\x00\x02\x04\x6b\x32\x14\x09\x14\x30\x77\x65\x69\x72\x00\x32\x00\x00\x04\x04"
       "\x6b\x32\x22\x09\x13\x2c\x68\x65\x6c\x6c\x6f\x20\x68\x65\x6c\x6c\x6f\x00"s},
      {kCodecLz4,
       "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x88\x00\x00\x00\x00\x02\xaf\xf7\xdc\x7b\x00\x03\x00\x00\x00"
       "\x02\x00\x00\x01\xa2\x2d\x3f\xb9\xfc\x00\x00\x01\xa2\x2d\x3f\xb9\xfc\x00\x00\x00\x00\x00\x00\x00\x01\x00"
       "\x00\x00\x00\x00\x00\x00\x00\x00\x03\x04\x22\x4d\x18\x60\x40\x82\x48\x00\x00\x00\xff\x05\x6e\x00\x00\x00"
       "\x04\x6b\x31\x5e\x68\x65\x6c\x6c\x6f\x20\x6b\x61\x66\x6b\x61\x20\x0c\x00\x10\x92\x00\x66\x00\x00\x02\x04"
       "\x6b\x32\x56\x2c\x00\x43\x77\x65\x69\x72\x37\x00\x0f\x0b\x00\x07\x83\x00\x6e\x00\x00\x04\x04\x6b\x32\x6c"
       "\x00\x02\x3a\x00\x0f\x06\x00\x0c\x50\x65\x6c\x6c\x6f\x00\x00\x00\x00\x00"s},
      {kCodecZstd,
       "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x70\x00\x00\x00\x00\x02\x33\xeb\x2d\x88\x00\x04\x00\x00\x00"
       "\x02\x00\x00\x01\xa2\x2d\x3f\x8b\x16\x00\x00\x01\xa2\x2d\x3f\x8b\x16\x00\x00\x00\x00\x00\x00\x00\x04\x00"
       "\x00\x00\x00\x00\x00\x00\x00\x00\x03\x28\xb5\x2f\xfd\x00\x58\xb5\x01\x00\xa4\x02\x26\x00\x00\x00\x04\x6b"
       "\x31\x16\x68\x65\x6c\x6c\x6f\x20\x6b\x61\x66\x6b\x61\x00\x24\x00\x00\x02\x04\x6b\x32\x14\x77\x65\x69\x72"
       "\x00\x32\x00\x00\x04\x04\x6b\x32\x22\x00\x03\x00\x29\x06\xb0\x39\x3e\x37\x4c\x27"s},
  };
  for (const Captured& c : captured) {
    auto h = VerifyBatch(c.batch);
    ASSERT_TRUE(h.ok()) << CodecName(c.codec) << ": " << h.status().ToString();
    EXPECT_EQ(h->total_size(), c.batch.size());
    EXPECT_EQ(h->compression(), c.codec);
    EXPECT_EQ(h->record_count, 3);
    EXPECT_GE(h->producer_id, 1);  // idempotent: an id from InitProducerId
    EXPECT_EQ(h->producer_epoch, 0);
    EXPECT_EQ(h->base_sequence, 0);
    auto d = DecodeRecords(c.batch);
    ASSERT_TRUE(d.ok()) << CodecName(c.codec) << ": " << d.status().ToString();
    ASSERT_EQ(d->size(), 3u);
    const bool long_values = c.codec == kCodecLz4;  // lz4 needed longer values to pay off
    const std::vector<std::pair<std::string, std::string>> want = {
        {"k1", long_values ? "hello kafka hello kafka hello kafka hello kafka" : "hello kafka"},
        {"k2", long_values ? "hello weir hello weir hello weir hello weir" : "hello weir"},
        {"k2", long_values ? "hello hello hello hello hello hello hello hello" : "hello hello hello"},
    };
    for (size_t i = 0; i < 3; ++i) {
      const DecodedRecord& r = (*d)[i];
      EXPECT_EQ(r.offset, static_cast<int64_t>(i));
      EXPECT_EQ(r.record.key, want[i].first) << CodecName(c.codec) << " record " << i;
      EXPECT_EQ(r.record.value, want[i].second) << CodecName(c.codec) << " record " << i;
      EXPECT_EQ(r.record.timestamp, h->base_timestamp);
      EXPECT_TRUE(r.record.headers.empty());
    }
  }
}

TEST(CompressionTest, EncodeCompressedBatches) {
  std::vector<Record> records;
  for (int i = 0; i < 500; ++i) {
    records.push_back(MakeRecord(1'700'000'000'000 + i, "key-" + std::to_string(i % 10), Payload(200, i),
                                 {{"trace", "abc"s}}));
  }
  EncodeOptions plain_opt;
  plain_opt.base_offset = 1000;
  plain_opt.producer_id = 77;
  plain_opt.producer_epoch = 2;
  plain_opt.base_sequence = 10;
  plain_opt.attributes = kTransactionalFlag;
  const std::string plain = Encode(records, plain_opt);
  for (int codec : kCodecs) {
    EncodeOptions opt = plain_opt;
    opt.attributes = static_cast<int16_t>(codec | kTransactionalFlag);
    std::string out = "prefix";
    ASSERT_OK(EncodeRecordBatch(records, opt, &out));
    ASSERT_EQ(out.substr(0, 6), "prefix");
    const std::string b = out.substr(6);
    EXPECT_LT(b.size(), plain.size() / 2) << CodecName(codec);

    auto h = VerifyBatch(b);
    ASSERT_TRUE(h.ok()) << CodecName(codec) << ": " << h.status().ToString();
    EXPECT_EQ(h->total_size(), b.size());
    EXPECT_EQ(h->attributes, codec | kTransactionalFlag);
    EXPECT_EQ(h->compression(), codec);
    EXPECT_EQ(h->record_count, 500);
    EXPECT_EQ(h->last_offset_delta, 499);
    EXPECT_EQ(h->producer_id, 77);
    EXPECT_EQ(h->base_sequence, 10);
    EXPECT_EQ(h->max_timestamp, 1'700'000'000'499);
    // The header matches the uncompressed batch's except for length, CRC and attributes.
    EXPECT_EQ(b.substr(23, 38), plain.substr(23, 38));
    // The record section is exactly the compressed records of the plain batch.
    ASSERT_OK_AND_ASSIGN(std::string section, DecompressRecords(codec, std::string_view(b).substr(61), 1 << 24));
    EXPECT_TRUE(section == plain.substr(61)) << CodecName(codec);

    auto d = DecodeRecords(b);
    ASSERT_TRUE(d.ok()) << CodecName(codec) << ": " << d.status().ToString();
    ASSERT_EQ(d->size(), records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ((*d)[i].offset, 1000 + static_cast<int64_t>(i));
      ExpectSameRecord(records[i], (*d)[i].record, i);
    }

    // The CRC covers the compressed bytes.
    std::string flipped = b;
    flipped[b.size() - 3] = static_cast<char>(flipped[b.size() - 3] ^ 0x40);
    EXPECT_NE(VerifyBatch(flipped).status().message().find("CRC mismatch"), std::string::npos) << CodecName(codec);
  }
}

TEST(CompressionTest, DecompressedRecordsAreValidated) {
  // A well-compressed record section that is not valid records.
  for (int codec : kCodecs) {
    std::string b = Encode(SmallRecords());
    const std::string bad_records = "\x0e\x00\x00\x00\x01\x01\x00"s;  // record 0: length past the end
    const std::string c = Compress(codec, bad_records);
    b.resize(61);
    b += c;
    StoreBE32(b.data() + 8, static_cast<uint32_t>(b.size() - 12));
    StoreBE32(b.data() + 57, 1);
    b[22] = static_cast<char>(codec);
    Reseal(&b);
    auto d = DecodeRecords(b);
    EXPECT_EQ(d.status().code(), Code::kCorruption) << CodecName(codec);
    EXPECT_NE(d.status().message().find("record 0: length 7"), std::string::npos) << d.status().ToString();
  }
}

TEST(CompressionTest, TruncatedInputIsCorruptionNamingTheCodec) {
  const std::string raw = Payload(3000, 5);
  for (int codec : kCodecs) {
    const std::string c = Compress(codec, raw);
    for (size_t n = 0; n < c.size(); ++n) {
      auto d = DecompressRecords(codec, std::string_view(c).substr(0, n), raw.size());
      ASSERT_FALSE(d.ok()) << CodecName(codec) << " prefix " << n;
      EXPECT_EQ(d.status().code(), Code::kCorruption) << d.status().ToString();
      EXPECT_NE(d.status().message().find(std::string(CodecName(codec)) + "-compressed records are corrupt"),
                std::string::npos)
          << n << ": " << d.status().ToString();
    }
  }
  // snappy-java: every cut inside the header or a block (a cut between blocks
  // is a shorter valid stream: the framing has no end mark).
  const std::string framed = *CompressSnappyJavaFramed(raw, 1000);
  std::set<size_t> boundaries;
  for (size_t pos = 16; pos < framed.size(); pos += 4 + LoadBE32(framed.data() + pos)) boundaries.insert(pos);
  for (size_t n = 8; n < framed.size(); ++n) {
    if (boundaries.count(n)) continue;
    auto d = DecompressRecords(kCodecSnappy, std::string_view(framed).substr(0, n), raw.size());
    ASSERT_FALSE(d.ok()) << "prefix " << n;
    EXPECT_EQ(d.status().code(), Code::kCorruption) << d.status().ToString();
    EXPECT_NE(d.status().message().find("snappy"), std::string::npos) << d.status().ToString();
  }
}

TEST(CompressionTest, GarbageAndTrailingBytesAreCorruption) {
  const std::string raw = Payload(5000, 6);
  for (int codec : kCodecs) {
    for (const std::string& garbage : {"not compressed at all"s, std::string(64, '\xff'), std::string(64, '\0')}) {
      // (As raw snappy, 64 zero bytes claim 0 bytes of output, then a literal.)
      auto d = DecompressRecords(codec, garbage, 1 << 20);
      ASSERT_FALSE(d.ok()) << CodecName(codec) << " " << garbage.size();
      EXPECT_EQ(d.status().code(), Code::kCorruption) << d.status().ToString();
      EXPECT_NE(d.status().message().find(CodecName(codec)), std::string::npos) << d.status().ToString();
    }
    const std::string c = Compress(codec, raw);
    auto d = DecompressRecords(codec, c + "junk", raw.size());
    EXPECT_EQ(d.status().code(), Code::kCorruption) << CodecName(codec) << ": " << d.status().ToString();
  }
}

// gzip members, LZ4 frames and zstd frames may follow each other; each is read.
TEST(CompressionTest, ConcatenatedStreams) {
  const std::string a = Payload(10000, 7);
  const std::string b = Payload(20000, 8);
  for (int codec : {kCodecGzip, kCodecLz4, kCodecZstd}) {
    const std::string c = Compress(codec, a) + Compress(codec, b);
    ASSERT_OK_AND_ASSIGN(std::string d, DecompressRecords(codec, c, a.size() + b.size()));
    EXPECT_TRUE(d == a + b) << CodecName(codec);
    // Java's readers take several gzip members and zstd frames, but one lz4 frame only.
    auto ingested = DecompressRecords(codec, c, a.size() + b.size(), /*as_ingested=*/true);
    if (codec == kCodecLz4) {
      EXPECT_EQ(ingested.status().code(), Code::kCorruption);
      EXPECT_NE(ingested.status().message().find("after the first frame"), std::string::npos)
          << ingested.status().ToString();
    } else {
      ASSERT_TRUE(ingested.ok()) << CodecName(codec) << ": " << ingested.status().ToString();
      EXPECT_TRUE(*ingested == a + b) << CodecName(codec);
    }
  }
}

// An LZ4 frame made by liblz4 with the given block mode and dictionary id.
std::string Lz4Frame(std::string_view raw, LZ4F_blockMode_t mode, unsigned dict_id = 0) {
  LZ4F_preferences_t prefs{};
  prefs.frameInfo.blockSizeID = LZ4F_max64KB;
  prefs.frameInfo.blockMode = mode;
  prefs.frameInfo.dictID = dict_id;
  std::string out(LZ4F_compressFrameBound(raw.size(), &prefs), '\0');
  const size_t n = LZ4F_compressFrame(out.data(), out.size(), raw.data(), raw.size(), &prefs);
  EXPECT_FALSE(LZ4F_isError(n));
  out.resize(LZ4F_isError(n) ? 0 : n);
  return out;
}

// Kafka's Java reader (KafkaLZ4BlockInputStream) takes one frame of
// independent blocks without a dictionary id: a batch it could not read is
// refused on ingest (a consumer would fail at it for ever), and read as
// liblz4 reads it when it is already stored.
TEST(CompressionTest, IngestTakesOnlyTheLz4FramesKafkaReadersRead) {
  const std::string raw = Payload(200000, 3);  // several 64 KiB blocks
  const std::string independent = Lz4Frame(raw, LZ4F_blockIndependent);
  ASSERT_OK_AND_ASSIGN(std::string ok, DecompressRecords(kCodecLz4, independent, raw.size(), true));
  EXPECT_TRUE(ok == raw);
  ASSERT_OK_AND_ASSIGN(std::string ours, DecompressRecords(kCodecLz4, Compress(kCodecLz4, raw), raw.size(), true));
  EXPECT_TRUE(ours == raw);

  struct Case {
    const char* name;
    std::string frame;
    const char* why;
  };
  std::string skippable = "\x50\x2a\x4d\x18\x04\x00\x00\x00"s + "abcd" + independent;
  const std::vector<Case> cases = {
      {"linked blocks", Lz4Frame(raw, LZ4F_blockLinked), "linked blocks"},
      {"dictionary id", Lz4Frame(raw, LZ4F_blockIndependent, 7), "dictionary id"},
      {"skippable frame first", skippable, "frame magic 0x184d2a50"},
      {"trailing skippable frame", independent + "\x50\x2a\x4d\x18\x00\x00\x00\x00"s, "after the first frame"},
  };
  for (const Case& c : cases) {
    auto refused = DecompressRecords(kCodecLz4, c.frame, raw.size(), /*as_ingested=*/true);
    EXPECT_EQ(refused.status().code(), Code::kCorruption) << c.name;
    EXPECT_NE(refused.status().message().find(c.why), std::string::npos) << c.name << ": " << refused.status().ToString();
    // Stored before this check, such a batch still reads.
    auto read = DecompressRecords(kCodecLz4, c.frame, raw.size());
    ASSERT_TRUE(read.ok()) << c.name << ": " << read.status().ToString();
    EXPECT_TRUE(*read == raw) << c.name;
  }

  // Through the producer-side check, as a Kafka produce or REST append takes it.
  std::vector<Record> records;
  // Over one 64 KiB block: liblz4 marks a frame of one block independent.
  for (int i = 0; i < 300; ++i) records.push_back(MakeRecord(1'700'000'000'000 + i, std::nullopt, Payload(300, i), {}));
  EncodeOptions opt;
  opt.attributes = kCodecLz4;
  std::string batch;
  ASSERT_OK(EncodeRecordBatch(records, opt, &batch));
  std::string section = batch.substr(kRecordBatchHeaderSize);
  ASSERT_OK_AND_ASSIGN(std::string plain, DecompressRecords(kCodecLz4, section, 1 << 20));
  auto with_section = [&](const std::string& s) {
    std::string b = batch.substr(0, kRecordBatchHeaderSize) + s;
    StoreBE32(b.data() + 8, static_cast<uint32_t>(b.size() - 12));  // batchLength
    StoreBE32(b.data() + 17, Crc32c(b.data() + 21, b.size() - 21));
    return b;
  };
  for (const auto& [good, s] : {std::pair{true, section}, std::pair{false, Lz4Frame(plain, LZ4F_blockLinked)}}) {
    const std::string b = with_section(s);
    auto h = VerifyBatch(b);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(ValidateRecords(*h, b).ok(), good) << ValidateRecords(*h, b).ToString();
    auto decoded = DecodeRecords(b);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->size(), 300u);
  }
}

TEST(CompressionTest, DamagedBytesNeverCrash) {
  std::mt19937_64 rng(99);
  const std::string raw = Payload(4000, 9);
  std::vector<std::pair<int, std::string>> inputs;
  for (int codec : kCodecs) inputs.emplace_back(codec, Compress(codec, raw));
  inputs.emplace_back(kCodecSnappy, *CompressSnappyJavaFramed(raw, 500));
  for (const auto& [codec, c] : inputs) {
    for (int iter = 0; iter < 1500; ++iter) {
      std::string m = c;
      for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
        m[rng() % m.size()] = static_cast<char>(rng() & 0xff);
      }
      auto d = DecompressRecords(codec, m, raw.size() + 100);
      if (!d.ok()) {
        EXPECT_EQ(d.status().code(), Code::kCorruption) << CodecName(codec) << ": " << d.status().ToString();
      } else {
        EXPECT_LE(d->size(), raw.size() + 100);
      }
    }
  }
}

TEST(CompressionTest, DecompressionBombStopsAtTheLimit) {
  const std::string zeros(8 << 20, '\0');
  std::vector<std::pair<int, std::string>> inputs;
  for (int codec : kCodecs) inputs.emplace_back(codec, Compress(codec, zeros));
  inputs.emplace_back(kCodecSnappy, *CompressSnappyJavaFramed(zeros));
  for (const auto& [codec, c] : inputs) {
    EXPECT_LT(c.size(), zeros.size() / 20) << CodecName(codec);
    for (size_t limit : {size_t{0}, size_t{1}, size_t{1} << 20, zeros.size() - 1}) {
      auto d = DecompressRecords(codec, c, limit);
      ASSERT_FALSE(d.ok()) << CodecName(codec) << " limit " << limit;
      EXPECT_EQ(d.status().code(), Code::kCorruption) << d.status().ToString();
      EXPECT_NE(d.status().message().find("limit of " + std::to_string(limit) + " bytes"), std::string::npos)
          << d.status().ToString();
      EXPECT_NE(d.status().message().find(CodecName(codec)), std::string::npos) << d.status().ToString();
    }
    // Exactly at the limit is fine.
    ASSERT_OK_AND_ASSIGN(std::string exact, DecompressRecords(codec, c, zeros.size()));
    EXPECT_EQ(exact.size(), zeros.size());
  }
  EXPECT_EQ(DecompressRecords(kCodecNone, "abc", 2).status().code(), Code::kCorruption);
  EXPECT_TRUE(DecompressRecords(kCodecNone, "abc", 3).ok());
  // A raw snappy header claiming more than the limit is refused before any allocation.
  auto claim = DecompressRecords(kCodecSnappy, "\xff\xff\xff\xff\x0f"s, 1 << 20);
  EXPECT_EQ(claim.status().code(), Code::kCorruption);
  EXPECT_NE(claim.status().message().find("limit of 1048576 bytes"), std::string::npos) << claim.status().ToString();

  // Through DecodeRecords: the default bound and an explicit one.
  std::vector<Record> big = {MakeRecord(1, std::nullopt, std::string(3 << 20, 'z'))};
  EncodeOptions opt;
  opt.attributes = kCodecZstd;
  const std::string batch = Encode(big, opt);
  EXPECT_LT(batch.size(), 4096u);
  ASSERT_TRUE(DecodeRecords(batch).ok());
  auto refused = DecodeRecords(batch, 1 << 20);
  EXPECT_EQ(refused.status().code(), Code::kCorruption);
  EXPECT_EQ(refused.status().message(),
            "record batch: zstd-compressed records decompress to more than the limit of 1048576 bytes");
  EXPECT_EQ(kMaxDecompressedRecordsBytes, size_t{64} << 20);
}

}  // namespace
}  // namespace weir::wal
