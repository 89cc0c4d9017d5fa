#include "wal/record_batch.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "base/bytes.h"
#include "base/crc32c.h"

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
  Status st = EncodeRecordBatch({}, {}, &out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  for (int16_t codec = 1; codec <= 7; ++codec) {
    EncodeOptions opt;
    opt.attributes = codec;
    EXPECT_EQ(EncodeRecordBatch(SmallRecords(), opt, &out).code(), Code::kInvalidArgument) << codec;
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

TEST(RecordBatchTest, CompressedBatchIsNotSupported) {
  std::string b = Encode(SmallRecords());
  b[22] = 4;  // attributes low byte: codec 4 (zstd)
  Reseal(&b);
  auto h = VerifyBatch(b);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->compression(), 4);
  auto d = DecodeRecords(b);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kNotSupported);
  EXPECT_EQ(d.status().message(), "compressed record batches (codec 4) cannot be decoded yet");
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

}  // namespace
}  // namespace weir::wal
