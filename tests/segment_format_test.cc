#include "log/segment_format.h"
#include "log/segment_index_cache.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "wal/record_batch.h"
#include "test_support.h"

namespace weir::log {
namespace {

constexpr uint64_t kStream = 42;

// Batches of one stream with dense offsets from `start`, and every record's
// timestamp by offset.
struct Stream {
  uint64_t start = 0;
  std::vector<std::string> batches;
  std::vector<int64_t> ts;  // ts[offset - start]

  uint64_t end() const { return start + ts.size(); }
  std::string Concat() const {
    std::string s;
    for (const std::string& b : batches) s += b;
    return s;
  }
};

std::string EncodeBatch(const std::vector<wal::Record>& records, uint64_t base_offset) {
  wal::EncodeOptions eo;
  eo.base_offset = static_cast<int64_t>(base_offset);
  std::string out;
  Status st = wal::EncodeRecordBatch(records, eo, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// 1-5 records per batch, values of 0..3000 bytes, timestamps that jitter
// within a batch and every seventh batch stepping far back in time.
Stream MakeStream(uint64_t start, int batch_count, uint32_t seed) {
  std::mt19937 rng(seed);
  Stream s;
  s.start = start;
  int64_t clock = 1'700'000'000'000;
  for (int b = 0; b < batch_count; ++b) {
    std::vector<wal::Record> recs(1 + rng() % 5);
    const bool old = b % 7 == 6;
    for (wal::Record& r : recs) {
      clock += rng() % 40;
      r.timestamp = clock - static_cast<int64_t>(rng() % 200) - (old ? 5000 : 0);
      const size_t size = rng() % 3 == 0 ? rng() % 3000 : rng() % 100;
      r.value = std::string(size, static_cast<char>('a' + rng() % 26));
      if (rng() % 2) r.key = "k" + std::to_string(s.ts.size());
      s.ts.push_back(r.timestamp);
    }
    s.batches.push_back(EncodeBatch(recs, s.end() - recs.size()));
  }
  return s;
}

std::string Build(const Stream& s, size_t interval, SegmentBuilder* b = nullptr) {
  SegmentBuilder local(kStream, interval);
  if (b == nullptr) b = &local;
  for (const std::string& batch : s.batches) {
    Status st = b->Add(batch);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  auto obj = b->Finish();
  EXPECT_TRUE(obj.ok()) << obj.status().ToString();
  return obj.ok() ? *obj : std::string();
}

void StoreLE64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

// Recomputes the data, footer and index CRCs after a deliberate patch.
void Reseal(std::string* obj) {
  char* f = obj->data() + obj->size() - kSegmentFooterSize;
  const uint64_t data_end = LoadLE64(f + 48);
  StoreLE32(f + 60, Crc32c(obj->data(), data_end));
  StoreLE32(f + 64, Crc32c(f, 64));
  StoreLE32(f + 68, Crc32c(obj->data() + data_end, obj->size() - 4 - data_end));
}

void ExpectSameFooter(const SegmentFooter& a, const SegmentFooter& b) {
  EXPECT_EQ(a.stream_id, b.stream_id);
  EXPECT_EQ(a.start_offset, b.start_offset);
  EXPECT_EQ(a.end_offset, b.end_offset);
  EXPECT_EQ(a.first_timestamp_ms, b.first_timestamp_ms);
  EXPECT_EQ(a.last_timestamp_ms, b.last_timestamp_ms);
  EXPECT_EQ(a.data_end, b.data_end);
  EXPECT_EQ(a.index_count, b.index_count);
  EXPECT_EQ(a.data_crc, b.data_crc);
}

// The index entries the interval rule calls for, computed from the batches.
std::vector<SegmentIndexEntry> ExpectedIndex(const Stream& s, size_t interval) {
  std::vector<SegmentIndexEntry> out;
  uint64_t pos = 0;
  uint64_t last = 0;
  int64_t max_ts = std::numeric_limits<int64_t>::min();
  for (const std::string& b : s.batches) {
    auto h = wal::VerifyBatch(b);
    EXPECT_TRUE(h.ok());
    max_ts = std::max(max_ts, h->max_timestamp);
    if (out.empty() || pos - last >= interval) {
      out.push_back({static_cast<uint64_t>(h->base_offset), max_ts, pos});
      last = pos;
    }
    pos += b.size();
  }
  return out;
}

// The data region walked batch by batch, as a reader would.
struct Walked {
  std::map<uint64_t, size_t> batch_at;  // byte position -> batch number
  std::vector<wal::BatchHeader> headers;
  std::vector<std::vector<wal::DecodedRecord>> records;
};

Walked Walk(std::string_view obj, const SegmentFooter& f) {
  Walked w;
  uint64_t pos = 0;
  Status st = wal::ForEachBatch(obj.substr(0, f.data_end), [&](const wal::BatchHeader& h, std::string_view bytes) {
    w.batch_at[pos] = w.headers.size();
    w.headers.push_back(h);
    auto recs = wal::DecodeRecords(bytes);
    if (!recs.ok()) return recs.status();
    w.records.push_back(*recs);
    pos += bytes.size();
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return w;
}

struct Decoded {
  SegmentFooter footer;
  std::vector<SegmentIndexEntry> index;
};

Decoded DecodeAsReader(std::string_view obj) {
  Decoded d;
  auto f = DecodeSegmentFooter(obj.substr(obj.size() - kSegmentFooterSize), obj.size());
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return d;
  d.footer = *f;
  auto index = DecodeSegmentIndex(*f, obj.substr(f->data_end));
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  if (index.ok()) d.index = *index;
  return d;
}

bool Contains(const Status& st, std::string_view text) { return st.message().find(text) != std::string::npos; }

TEST(SegmentBuilder, FooterFields) {
  Stream s = MakeStream(1000, 40, 1);
  SegmentBuilder b(kStream, 4096);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.start_offset(), b.end_offset());
  std::string obj = Build(s, 4096, &b);
  EXPECT_FALSE(b.empty());
  EXPECT_EQ(b.start_offset(), s.start);
  EXPECT_EQ(b.end_offset(), s.end());
  const std::string data = s.Concat();
  EXPECT_EQ(b.data_bytes(), data.size());

  const SegmentFooter& f = b.footer();
  EXPECT_EQ(f.stream_id, kStream);
  EXPECT_EQ(f.start_offset, 1000u);
  EXPECT_EQ(f.end_offset, s.end());
  EXPECT_EQ(f.first_timestamp_ms, wal::VerifyBatch(s.batches[0])->base_timestamp);
  EXPECT_EQ(f.last_timestamp_ms, *std::max_element(s.ts.begin(), s.ts.end()));
  EXPECT_EQ(f.data_end, data.size());
  EXPECT_EQ(f.data_crc, Crc32c(data));
  EXPECT_EQ(obj.size(), data.size() + f.index_count * kSegmentIndexEntrySize + kSegmentFooterSize);
  EXPECT_EQ(obj.substr(0, data.size()), data);
  EXPECT_EQ(obj.substr(obj.size() - kSegmentFooterSize, 4), "WSEG");

  // The 72-byte tail alone, and the whole object, decode to the same footer.
  Decoded d = DecodeAsReader(obj);
  ExpectSameFooter(d.footer, f);
  auto whole = DecodeSegmentFooter(obj, obj.size());
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ExpectSameFooter(*whole, f);
  auto verified = VerifySegment(obj);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  ExpectSameFooter(*verified, f);
}

// Long batches' share of the data CRC is derived from their own CRC (no
// second pass); short ones are read again. Either way it is the data's CRC,
// also after a failed Add whose long batch was walked before a bad one.
TEST(SegmentBuilder, DataCrcOverLongAndShortBatches) {
  std::mt19937 rng(5);
  uint64_t offset = 300;
  // One record of random bytes, the batch exactly `size` bytes long.
  auto batch_of = [&](size_t size) {
    std::vector<wal::Record> recs(1);
    recs[0].timestamp = 1'700'000'000'000;
    std::string batch;
    for (size_t value = size - 80; batch.size() != size;) {
      recs[0].value = std::string(value, '\0');
      for (char& c : *recs[0].value) c = static_cast<char>(rng());
      batch = EncodeBatch(recs, offset);
      value += size - batch.size();  // the framing's size is the same a byte either side
    }
    ++offset;
    return batch;
  };
  std::string data;
  SegmentBuilder b(kStream, 1 << 20);
  for (size_t size : {size_t{100}, size_t{16383}, size_t{16384}, size_t{16385}, size_t{200000}, size_t{40000}}) {
    const std::string batch = batch_of(size);
    ASSERT_EQ(batch.size(), size);
    data += batch;
    ASSERT_TRUE(b.Add(batch).ok());
  }
  // A long good batch then a damaged one: refused whole, the CRC untouched.
  std::string good = batch_of(50000);
  std::string bad = batch_of(20000);
  bad[100] ^= 1;
  ASSERT_FALSE(b.Add(good + bad).ok());
  --offset;  // `bad`'s offset is free again; `good` is added on its own
  ASSERT_TRUE(b.Add(good).ok());
  data += good;
  auto obj = b.Finish();
  ASSERT_TRUE(obj.ok()) << obj.status().ToString();
  EXPECT_EQ(b.footer().data_crc, Crc32c(data));
  auto verified = VerifySegment(*obj);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(verified->data_crc, Crc32c(data));
}

TEST(SegmentBuilder, AddAcceptsManyBatchesAtOnce) {
  Stream s = MakeStream(7, 20, 2);
  std::string one_by_one = Build(s, 1000);
  SegmentBuilder b(kStream, 1000);
  const std::string data = s.Concat();
  ASSERT_TRUE(b.Add(std::string_view(data).substr(0, s.batches[0].size() + s.batches[1].size())).ok());
  ASSERT_TRUE(b.Add(std::string_view(data).substr(s.batches[0].size() + s.batches[1].size())).ok());
  auto obj = b.Finish();
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ(*obj, one_by_one);
}

TEST(SegmentIndex, RoundTripAndIntervalRule) {
  Stream s = MakeStream(500, 60, 3);
  for (size_t interval : {size_t{0}, size_t{1}, size_t{100}, size_t{2000}, size_t{10000}, size_t{1} << 40}) {
    SCOPED_TRACE(interval);
    std::string obj = Build(s, interval);
    Decoded d = DecodeAsReader(obj);
    std::vector<SegmentIndexEntry> want = ExpectedIndex(s, interval);
    ASSERT_EQ(d.index.size(), want.size());
    EXPECT_EQ(d.footer.index_count, want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(d.index[i].base_offset, want[i].base_offset) << i;
      EXPECT_EQ(d.index[i].max_timestamp_ms, want[i].max_timestamp_ms) << i;
      EXPECT_EQ(d.index[i].position, want[i].position) << i;
    }
    if (interval <= 1) {
      EXPECT_EQ(d.index.size(), s.batches.size());
    }
    if (interval >= size_t{1} << 40) {
      EXPECT_EQ(d.index.size(), 1u);
    }
    // Indexed positions are at least `interval` apart.
    for (size_t i = 1; i < d.index.size(); ++i) EXPECT_GE(d.index[i].position - d.index[i - 1].position, interval);
    EXPECT_TRUE(VerifySegment(obj).ok());
  }
}

TEST(SegmentIndex, IntervalBoundaryIsInclusive) {
  // Equal-sized batches: an interval of exactly one batch indexes every batch,
  // one byte more indexes every other batch.
  Stream s;
  for (int i = 0; i < 6; ++i) {
    std::vector<wal::Record> recs(2);
    recs[0].timestamp = recs[1].timestamp = 1000 + i;
    recs[0].value = recs[1].value = std::string(50, 'x');
    s.batches.push_back(EncodeBatch(recs, s.end()));
    s.ts.insert(s.ts.end(), 2, 1000 + i);
  }
  const size_t size = s.batches[0].size();
  EXPECT_EQ(DecodeAsReader(Build(s, size)).index.size(), 6u);
  std::vector<SegmentIndexEntry> every_other = DecodeAsReader(Build(s, size + 1)).index;
  ASSERT_EQ(every_other.size(), 3u);
  EXPECT_EQ(every_other[1].position, 2 * size);
  EXPECT_EQ(every_other[1].base_offset, 4u);
  EXPECT_EQ(DecodeAsReader(Build(s, 2 * size + 1)).index.size(), 2u);
}

TEST(SegmentIndex, TimestampsAreARunningMaxOverNonMonotonicBatches) {
  // Batch timestamps 100, 50 (older), 300, 200: the running max never drops.
  Stream s;
  s.start = 10;
  for (int64_t ts : {100, 50, 300, 200}) {
    std::vector<wal::Record> recs(2);
    recs[0].timestamp = ts;
    recs[1].timestamp = ts - 10;  // maxTimestamp is the first record's, baseTimestamp too
    recs[0].value = recs[1].value = "v";
    s.batches.push_back(EncodeBatch(recs, s.end()));
    s.ts.push_back(recs[0].timestamp);
    s.ts.push_back(recs[1].timestamp);
  }
  std::string obj = Build(s, 0);
  Decoded d = DecodeAsReader(obj);
  ASSERT_EQ(d.index.size(), 4u);
  EXPECT_EQ(d.index[0].max_timestamp_ms, 100);
  EXPECT_EQ(d.index[1].max_timestamp_ms, 100);
  EXPECT_EQ(d.index[2].max_timestamp_ms, 300);
  EXPECT_EQ(d.index[3].max_timestamp_ms, 300);
  EXPECT_EQ(d.footer.first_timestamp_ms, 100);
  EXPECT_EQ(d.footer.last_timestamp_ms, 300);
  // ts 60: only batch 0 (max 100) could start it, so start at 0.
  EXPECT_EQ(SeekTimestamp(d.index, 60), 0u);
  // ts 150: everything up to batch 1 is below it; batch 2 holds 300.
  EXPECT_EQ(SeekTimestamp(d.index, 150), d.index[1].position);
  EXPECT_EQ(SeekTimestamp(d.index, 301), d.index[3].position);
  EXPECT_EQ(SeekTimestamp(d.index, std::numeric_limits<int64_t>::min()), 0u);
}

TEST(SegmentSeek, EveryOffset) {
  Stream s = MakeStream(1u << 20, 50, 4);
  for (size_t interval : {size_t{1}, size_t{1500}, size_t{1} << 40}) {
    SCOPED_TRACE(interval);
    std::string obj = Build(s, interval);
    Decoded d = DecodeAsReader(obj);
    Walked w = Walk(obj, d.footer);
    for (uint64_t off = s.start; off < s.end(); ++off) {
      const uint64_t pos = SeekOffset(d.index, off);
      auto at = w.batch_at.find(pos);
      ASSERT_NE(at, w.batch_at.end()) << "offset " << off << ": position " << pos << " is not a batch";
      size_t i = at->second;
      ASSERT_LE(static_cast<uint64_t>(w.headers[i].base_offset), off);
      while (i < w.headers.size() && static_cast<uint64_t>(w.headers[i].last_offset()) < off) ++i;
      ASSERT_LT(i, w.headers.size()) << "offset " << off << " not found scanning from " << pos;
      EXPECT_LE(static_cast<uint64_t>(w.headers[i].base_offset), off);
    }
    EXPECT_EQ(SeekOffset(d.index, 0), 0u);
    EXPECT_EQ(SeekOffset(d.index, s.start - 1), 0u);
    EXPECT_EQ(SeekOffset(d.index, s.end() + 100), d.index.back().position);
  }
}

TEST(SegmentSeek, EveryTimestamp) {
  Stream s = MakeStream(0, 50, 5);
  std::set<int64_t> targets = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  for (int64_t ts : s.ts) targets.insert({ts - 1, ts, ts + 1});
  for (size_t interval : {size_t{1}, size_t{1500}, size_t{1} << 40}) {
    SCOPED_TRACE(interval);
    std::string obj = Build(s, interval);
    Decoded d = DecodeAsReader(obj);
    Walked w = Walk(obj, d.footer);
    for (int64_t target : targets) {
      // The answer: the first offset whose timestamp is >= target, if any.
      auto first = std::find_if(s.ts.begin(), s.ts.end(), [&](int64_t ts) { return ts >= target; });
      const uint64_t pos = SeekTimestamp(d.index, target);
      auto at = w.batch_at.find(pos);
      ASSERT_NE(at, w.batch_at.end()) << "ts " << target << ": position " << pos << " is not a batch";
      std::optional<int64_t> found;
      for (size_t i = at->second; i < w.records.size() && !found; ++i) {
        for (const wal::DecodedRecord& r : w.records[i]) {
          if (r.record.timestamp >= target) {
            found = r.offset;
            break;
          }
        }
      }
      if (first == s.ts.end()) {
        EXPECT_FALSE(found.has_value()) << "ts " << target;
      } else {
        ASSERT_TRUE(found.has_value()) << "ts " << target << " not found scanning from " << pos;
        EXPECT_EQ(static_cast<uint64_t>(*found), s.start + static_cast<uint64_t>(first - s.ts.begin()))
            << "ts " << target << " from position " << pos;
      }
    }
  }
}

TEST(SegmentBuilder, RejectsNonContiguousAddAndAddsNothing) {
  Stream s = MakeStream(100, 4, 6);
  Stream later = MakeStream(s.end() + 1, 1, 7);    // a gap of one offset
  Stream overlap = MakeStream(s.end() - 1, 1, 8);  // re-uses the last offset
  SegmentBuilder b(kStream, 0);
  ASSERT_TRUE(b.Add(s.batches[0]).ok());
  ASSERT_TRUE(b.Add(s.batches[1]).ok());
  const uint64_t end = b.end_offset();
  const size_t bytes = b.data_bytes();

  Status st = b.Add(s.batches[3]);  // skips batch 2
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(st, "is not the segment's end offset")) << st.ToString();
  // Batch 2 is fine but batch 3 after it is not either: all or nothing.
  st = b.Add(s.batches[2] + later.batches[0]);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(st, "batch 1 at byte " + std::to_string(s.batches[2].size()))) << st.ToString();
  EXPECT_EQ(b.Add(s.batches[1]).code(), Code::kInvalidArgument);  // already added
  EXPECT_EQ(b.end_offset(), end);
  EXPECT_EQ(b.data_bytes(), bytes);

  ASSERT_TRUE(b.Add(s.batches[2] + s.batches[3]).ok());
  EXPECT_EQ(b.Add(overlap.batches[0]).code(), Code::kInvalidArgument);
  auto obj = b.Finish();
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ(*obj, Build(s, 0));  // the rejected Adds left no trace
}

TEST(SegmentBuilder, RejectsMalformedBatches) {
  Stream s = MakeStream(0, 3, 9);
  SegmentBuilder b(kStream);
  ASSERT_TRUE(b.Add(s.batches[0]).ok());
  const size_t bytes = b.data_bytes();

  std::string bad_crc = s.batches[1];
  bad_crc[bad_crc.size() - 1] ^= 1;
  Status st = b.Add(bad_crc);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(st, "CRC mismatch")) << st.ToString();

  EXPECT_EQ(b.Add(std::string_view(s.batches[1]).substr(0, s.batches[1].size() - 1)).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b.Add(s.batches[1] + "junk").code(), Code::kInvalidArgument);
  EXPECT_EQ(b.Add("").code(), Code::kInvalidArgument);

  std::string negative = s.batches[1];
  wal::SetBaseOffset(&negative, 0, -5);
  SegmentBuilder fresh(kStream);
  EXPECT_EQ(fresh.Add(negative).code(), Code::kInvalidArgument);
  EXPECT_TRUE(fresh.empty());

  EXPECT_EQ(b.data_bytes(), bytes);
  ASSERT_TRUE(b.Add(s.batches[1]).ok());
}

// AddView + FinishTail describe exactly the bytes Add + Finish produce.
TEST(SegmentBuilder, ViewsAndTailMakeTheSameObject) {
  const Stream st = MakeStream(40, 30, 9);
  SegmentBuilder copied(kStream, 1000);
  SegmentBuilder viewed(kStream, 1000);
  for (const std::string& b : st.batches) {
    ASSERT_OK(copied.Add(b));
    ASSERT_OK(viewed.AddView(b));
  }
  auto whole = copied.Finish();
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto tail = viewed.FinishTail();
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  std::string joined;
  for (std::string_view v : viewed.views()) joined.append(v);
  joined += *tail;
  EXPECT_TRUE(joined == *whole);
  EXPECT_EQ(viewed.views().size(), st.batches.size());

  // A view builder has no whole object to return; the modes do not mix.
  SegmentBuilder v2(kStream);
  ASSERT_OK(v2.AddView(st.batches[0]));
  EXPECT_EQ(v2.Add(st.batches[1]).code(), Code::kInvalidArgument);
  EXPECT_EQ(v2.Finish().status().code(), Code::kInvalidArgument);
  SegmentBuilder c2(kStream);
  ASSERT_OK(c2.Add(st.batches[0]));
  EXPECT_EQ(c2.AddView(st.batches[1]).code(), Code::kInvalidArgument);
}

TEST(SegmentBuilder, FinishRules) {
  SegmentBuilder empty(kStream);
  auto r = empty.Finish();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);

  Stream s = MakeStream(0, 2, 10);
  SegmentBuilder b(kStream);
  ASSERT_TRUE(b.Add(s.batches[0]).ok());
  ASSERT_TRUE(b.Finish().ok());
  EXPECT_EQ(b.Finish().status().code(), Code::kInvalidArgument);
  EXPECT_EQ(b.Add(s.batches[1]).code(), Code::kInvalidArgument);
}

TEST(VerifySegment, EverySingleByteFlipIsDetected) {
  Stream s = MakeStream(5, 3, 11);
  std::string obj = Build(s, 0);  // three index entries
  ASSERT_TRUE(VerifySegment(obj).ok());
  for (size_t i = 0; i < obj.size(); ++i) {
    for (int mask : {0x01, 0x80}) {
      std::string bad = obj;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      auto r = VerifySegment(bad);
      ASSERT_FALSE(r.ok()) << "flip " << mask << " at byte " << i << " not detected";
      EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
    }
  }
  // From the 72-byte tail alone, a flip in any footer field is detected too.
  std::string tail = obj.substr(obj.size() - kSegmentFooterSize);
  for (size_t i = 0; i < kSegmentFooterSize - 4; ++i) {
    std::string bad = tail;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    EXPECT_FALSE(DecodeSegmentFooter(bad, obj.size()).ok()) << "footer byte " << i;
  }
}

TEST(VerifySegment, ANewerFooterVersionIsNamed) {
  Stream s = MakeStream(5, 3, 11);
  std::string obj = Build(s, 0);
  std::string tail = obj.substr(obj.size() - kSegmentFooterSize);
  tail[4] = 2;  // version 2, the CRC left as version 1's
  auto f = DecodeSegmentFooter(tail, obj.size());
  EXPECT_EQ(f.status().code(), Code::kCorruption);
  EXPECT_NE(f.status().message().find("unknown version 2"), std::string::npos) << f.status().ToString();
}

TEST(VerifySegment, TruncationsAreDetected) {
  Stream s = MakeStream(5, 12, 12);
  std::string obj = Build(s, 500);
  for (size_t n = 0; n < obj.size(); ++n) {
    auto r = VerifySegment(std::string_view(obj).substr(0, n));
    ASSERT_FALSE(r.ok()) << "truncated to " << n;
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    r = VerifySegment(std::string_view(obj).substr(obj.size() - n));
    ASSERT_FALSE(r.ok()) << "front cut to " << n;
  }
  // The right tail with the wrong object size.
  std::string_view tail = std::string_view(obj).substr(obj.size() - kSegmentFooterSize);
  auto f = DecodeSegmentFooter(tail, obj.size() + 24);
  EXPECT_FALSE(f.ok());
  EXPECT_TRUE(Contains(f.status(), "do not fill")) << f.status().ToString();
  EXPECT_EQ(DecodeSegmentFooter(tail.substr(1), obj.size()).status().code(), Code::kCorruption);
  EXPECT_EQ(DecodeSegmentFooter(obj, 10).status().code(), Code::kInvalidArgument);
  // An index GET of the wrong length.
  Decoded d = DecodeAsReader(obj);
  auto idx = DecodeSegmentIndex(d.footer, std::string_view(obj).substr(d.footer.data_end + 1));
  EXPECT_TRUE(Contains(idx.status(), "need")) << idx.status().ToString();
}

TEST(VerifySegment, DataFlipsAreCaughtByTheDataCrc) {
  Stream s = MakeStream(5, 6, 13);
  std::string obj = Build(s, 0);
  // A record byte, and a baseOffset byte (outside the batch's own CRC).
  for (size_t at : {size_t{s.batches[0].size() + 61}, size_t{s.batches[0].size() + 7}}) {
    std::string bad = obj;
    bad[at] ^= 1;
    auto r = VerifySegment(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(Contains(r.status(), "segment data CRC mismatch: stored 0x")) << r.status().ToString();
    // Index and footer are intact, so a reader seeking still decodes them.
    DecodeAsReader(bad);
  }
  // With every CRC recomputed, the dense-offset check still catches a moved batch.
  std::string bad = obj;
  wal::SetBaseOffset(&bad, s.batches[0].size() + s.batches[1].size(), 1000);
  Reseal(&bad);
  auto r = VerifySegment(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "batch 2 at byte")) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "baseOffset 1000, expected")) << r.status().ToString();
  // And a damaged record batch is named by its batch CRC.
  bad = obj;
  bad[s.batches[0].size() + 61] ^= 1;
  Reseal(&bad);
  r = VerifySegment(bad);
  EXPECT_TRUE(Contains(r.status(), "segment data: batch 1 at byte")) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "record batch CRC mismatch")) << r.status().ToString();
}

TEST(DecodeSegment, PreciseMessages) {
  Stream s = MakeStream(5, 6, 14);
  std::string obj = Build(s, 0);
  const size_t foot = obj.size() - kSegmentFooterSize;
  const size_t index_at = foot - 6 * kSegmentIndexEntrySize;

  auto footer_error = [&](std::string bad) { return DecodeSegmentFooter(bad, bad.size()).status(); };
  std::string bad = obj;
  bad[foot + 20] ^= 1;
  Status st = footer_error(bad);
  EXPECT_TRUE(Contains(st, "segment footer CRC mismatch: stored 0x")) << st.ToString();
  bad = obj;
  bad[foot] = 'X';
  EXPECT_TRUE(Contains(footer_error(bad), "bad magic"));
  bad = obj;
  bad[foot + 4] = 9;
  Reseal(&bad);
  EXPECT_TRUE(Contains(footer_error(bad), "unknown version 9"));
  bad = obj;
  bad[index_at + 3] ^= 1;
  st = footer_error(bad);
  EXPECT_TRUE(Contains(st, "segment index CRC mismatch")) << st.ToString();

  // Index monotonicity, with the CRCs recomputed so only the rule can fail.
  auto index_error = [&](size_t entry, size_t field, uint64_t v) {
    std::string b = obj;
    StoreLE64(b.data() + index_at + entry * kSegmentIndexEntrySize + field, v);
    Reseal(&b);
    auto f = DecodeSegmentFooter(b, b.size());
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return f.ok() ? DecodeSegmentIndex(*f, std::string_view(b).substr(f->data_end)).status() : f.status();
  };
  Decoded d = DecodeAsReader(obj);
  st = index_error(3, 16, d.index[1].position);
  EXPECT_TRUE(Contains(st, fmt::format("segment index entry 3: position {} not after {}", d.index[1].position,
                                       d.index[2].position)))
      << st.ToString();
  st = index_error(2, 0, d.index[1].base_offset);
  EXPECT_TRUE(Contains(st, "segment index entry 2: base offset")) << st.ToString();
  st = index_error(0, 16, 5);
  EXPECT_TRUE(Contains(st, "segment index entry 0: position 5 is not 0")) << st.ToString();
  st = index_error(0, 0, 6);
  EXPECT_TRUE(Contains(st, "is not the start offset 5")) << st.ToString();
  st = index_error(5, 16, d.footer.data_end);
  EXPECT_TRUE(Contains(st, "segment index entry 5: position")) << st.ToString();
  st = index_error(5, 0, d.footer.end_offset);
  EXPECT_TRUE(Contains(st, "not below the end offset")) << st.ToString();
  st = index_error(4, 8, 0);
  EXPECT_TRUE(Contains(st, "segment index entry 4: max timestamp 0 below")) << st.ToString();
  // A resealed index entry off a batch boundary passes the index rules but not VerifySegment.
  std::string b = obj;
  StoreLE64(b.data() + index_at + 2 * kSegmentIndexEntrySize + 16, d.index[2].position + 1);
  Reseal(&b);
  st = VerifySegment(b).status();
  EXPECT_TRUE(Contains(st, "segment index entry 2: position")) << st.ToString();

  // A footer from another segment does not fit this index.
  std::string other = Build(MakeStream(5, 6, 15), 0);
  Decoded od = DecodeAsReader(other);
  if (od.footer.index_count == d.footer.index_count) {
    EXPECT_EQ(DecodeSegmentIndex(od.footer, std::string_view(obj).substr(d.footer.data_end)).status().code(),
              Code::kInvalidArgument);
  }
}

}  // namespace
// The footer-and-index cache keeps at most its byte bound, dropping the
// least recently used entry first; an entry larger than the bound is not kept.
TEST(SegmentIndexCacheTest, KeepsItsBoundDroppingTheLeastRecentlyUsed) {
  auto entry = [](size_t n) {
    auto e = std::make_shared<SegmentIndexCache::Entry>();
    e->index.resize(n);
    return e;
  };
  // Entries of 200 index entries (4,800 bytes, plus a little): two fit, three do not.
  SegmentIndexCache cache(12000);
  cache.Insert("a", entry(200));
  cache.Insert("b", entry(200));
  ASSERT_EQ(cache.size(), 2u);
  ASSERT_NE(cache.Find("a"), nullptr);  // now the most recent: "b" goes first
  cache.Insert("c", entry(200));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_LE(cache.bytes(), 12000u);
  EXPECT_EQ(cache.Find("b"), nullptr);
  EXPECT_NE(cache.Find("a"), nullptr);
  EXPECT_NE(cache.Find("c"), nullptr);
  cache.Erase("a");
  EXPECT_EQ(cache.Find("a"), nullptr);
  cache.Insert("huge", entry(1000));  // more than the bound by itself
  EXPECT_EQ(cache.Find("huge"), nullptr);
  EXPECT_NE(cache.Find("c"), nullptr);
  SegmentIndexCache none(0);
  none.Insert("a", entry(1));
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.bytes(), 0u);
}

}  // namespace weir::log
