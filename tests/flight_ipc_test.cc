// The Arrow IPC reader and the log-row mapping (src/flight), against IPC
// streams written by Apache Arrow's JavaScript library
// (tests/flight/fixtures, made by tests/flight/js/make_fixtures.mjs), and
// against those streams damaged every way a byte can be.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "base/bytes.h"
#include "flight/arrow_ipc.h"
#include "flight/log_rows.h"
#include "wal/compression.h"

namespace weir::flight {
namespace {

struct Message {
  std::string header;
  std::string body;
};

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(WEIR_FLIGHT_FIXTURES) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Splits an IPC stream into its messages (continuation marker, length,
// flatbuffer, body of the length the message names).
std::vector<Message> Split(const std::string& stream) {
  std::vector<Message> out;
  size_t pos = 0;
  while (pos + 8 <= stream.size()) {
    EXPECT_EQ(LoadLE32(stream.data() + pos), 0xffffffffu);
    const uint32_t len = LoadLE32(stream.data() + pos + 4);
    if (len == 0) break;
    Message m;
    m.header = stream.substr(pos + 8, len);
    auto parsed = ParseMessage(m.header);
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    if (!parsed.ok()) break;
    m.body = stream.substr(pos + 8 + len, static_cast<size_t>(parsed->body_length));
    out.push_back(std::move(m));
    pos += 8 + len + static_cast<size_t>(parsed->body_length);
  }
  return out;
}

// Schema message, then the records of every batch.
Result<std::vector<std::vector<wal::Record>>> Decode(const std::vector<Message>& msgs, int64_t now_ms = 42) {
  if (msgs.empty()) return InvalidArgument("no messages");
  WEIR_ASSIGN_OR_RETURN(auto s, ParseMessage(msgs[0].header));
  if (s.kind != MessageKind::kSchema) return InvalidArgument("first is not a schema");
  WEIR_ASSIGN_OR_RETURN(auto cols, CheckLogSchema(*s.schema));
  std::vector<std::vector<wal::Record>> out;
  for (size_t i = 1; i < msgs.size(); ++i) {
    WEIR_ASSIGN_OR_RETURN(auto m, ParseMessage(msgs[i].header));
    if (m.kind != MessageKind::kRecordBatch) return InvalidArgument("not a batch");
    std::deque<std::string> storage;
    WEIR_ASSIGN_OR_RETURN(auto arrays, ResolveBatch(*s.schema, *m.batch, msgs[i].body, &storage));
    WEIR_ASSIGN_OR_RETURN(auto records, LogRecords(cols, arrays, now_ms));
    // Copied out: the views die with `storage` and the messages.
    auto& copied = out.emplace_back();
    for (const auto& v : records) {
      wal::Record r;
      r.timestamp = v.timestamp;
      if (v.key) r.key.emplace(*v.key);
      if (v.value) r.value.emplace(*v.value);
      for (const auto& h : v.headers) {
        auto& rh = r.headers.emplace_back();
        rh.key = h.key;
        if (h.value) rh.value.emplace(*h.value);
      }
      copied.push_back(std::move(r));
    }
  }
  return out;
}

TEST(ArrowIpc, ReadsEveryLogColumnWithNulls) {
  auto msgs = Split(ReadFixture("log_rows.arrows"));
  ASSERT_EQ(msgs.size(), 3u);
  auto s = ParseMessage(msgs[0].header);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->schema->fields.size(), 4u);
  EXPECT_EQ(s->schema->fields[3].type, ArrowType::kMap);
  auto batches = Decode(msgs, 42);
  ASSERT_TRUE(batches.ok()) << batches.status().ToString();
  ASSERT_EQ(batches->size(), 2u);
  const auto& b = (*batches)[0];
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].key, "k1");
  EXPECT_EQ(b[0].value, "one");
  EXPECT_EQ(b[0].timestamp, 1700000000001);
  ASSERT_EQ(b[0].headers.size(), 2u);
  EXPECT_EQ(b[0].headers[0].key, "trace");
  EXPECT_EQ(b[0].headers[0].value, "t1");
  EXPECT_EQ(b[0].headers[1].key, "empty");
  EXPECT_FALSE(b[0].headers[1].value.has_value());
  EXPECT_FALSE(b[1].key.has_value());
  EXPECT_EQ(b[1].value, "two");
  EXPECT_EQ(b[1].timestamp, 42) << "a null timestamp is the time given";
  EXPECT_TRUE(b[1].headers.empty());
  EXPECT_FALSE(b[2].value.has_value()) << "a null value is a tombstone";
  ASSERT_EQ(b[2].headers.size(), 2u);
  EXPECT_EQ(b[2].headers[1].key, "b");
  EXPECT_EQ(b[2].headers[1].value, "y");
  const auto& c = (*batches)[1];
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].timestamp, -1500);
  EXPECT_TRUE(c[0].headers.empty());
}

TEST(ArrowIpc, ReadsLargeOffsetsNanosecondsAndInt64Milliseconds) {
  auto large = Decode(Split(ReadFixture("large_ns.arrows")), 7);
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  const auto& r = (*large)[0];
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].value, "alpha");
  EXPECT_EQ(r[1].value, "");
  EXPECT_EQ(r[2].value, "gamma");
  EXPECT_EQ(r[0].key, "a");
  EXPECT_FALSE(r[1].key.has_value());
  EXPECT_EQ(r[0].timestamp, 1700000000123);
  EXPECT_EQ(r[1].timestamp, -2500);
  EXPECT_EQ(r[2].timestamp, 7);
  auto ints = Decode(Split(ReadFixture("int64_ts.arrows")));
  ASSERT_TRUE(ints.ok()) << ints.status().ToString();
  ASSERT_EQ((*ints)[0].size(), 2u);
  EXPECT_EQ((*ints)[0][1].timestamp, 1700000000001);
  EXPECT_EQ((*ints)[0][1].value, "y");
}

TEST(ArrowIpc, RefusesColumnsThatAreNotALogTablesByName) {
  auto r = Decode(Split(ReadFixture("float_value.arrows")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("column 'value' is floating point"), std::string::npos) << r.status().ToString();
}

// A copy of the batch's body with every buffer compressed by `codec` (Arrow
// LZ4_FRAME 0, ZSTD 1): an 8-byte uncompressed length, then the frame (none
// for an empty buffer).
std::pair<RecordBatchMeta, std::string> Compress(const RecordBatchMeta& meta, const std::string& body, int codec) {
  RecordBatchMeta out = meta;
  out.codec = codec;
  std::string compressed;
  for (auto& b : out.buffers) {
    const std::string raw = body.substr(static_cast<size_t>(b.offset), static_cast<size_t>(b.length));
    const size_t at = compressed.size();
    // An empty buffer as Arrow Java writes it: the length prefix (0) alone.
    PutLE64(&compressed, raw.size());
    if (!raw.empty()) {
      auto frame = wal::CompressRecords(codec == 0 ? wal::kCodecLz4 : wal::kCodecZstd, raw);
      EXPECT_TRUE(frame.ok());
      compressed += *frame;
    }
    b.offset = static_cast<int64_t>(at);
    b.length = static_cast<int64_t>(compressed.size() - at);
    compressed.resize((compressed.size() + 7) / 8 * 8, '\0');
  }
  return {out, compressed};
}

TEST(ArrowIpc, ReadsLz4AndZstdCompressedBodies) {
  auto msgs = Split(ReadFixture("log_rows.arrows"));
  auto s = ParseMessage(msgs[0].header);
  auto m = ParseMessage(msgs[1].header);
  ASSERT_TRUE(s.ok() && m.ok());
  auto cols = CheckLogSchema(*s->schema);
  ASSERT_TRUE(cols.ok());
  for (int codec : {0, 1}) {
    auto [meta, body] = Compress(*m->batch, msgs[1].body, codec);
    std::deque<std::string> storage;
    auto arrays = ResolveBatch(*s->schema, meta, body, &storage);
    ASSERT_TRUE(arrays.ok()) << codec << ": " << arrays.status().ToString();
    EXPECT_FALSE(storage.empty());
    auto records = LogRecords(*cols, *arrays, 0);
    ASSERT_TRUE(records.ok());
    ASSERT_EQ(records->size(), 3u);
    EXPECT_EQ((*records)[0].value, "one");
    EXPECT_EQ((*records)[2].headers[1].value, "y");
    // An uncompressed length past the limit is refused before decompressing.
    std::string bomb = body;
    const auto& first = meta.buffers[1];  // the first non-empty buffer (key's offsets)
    ASSERT_GT(first.length, 8);
    std::string len;
    PutLE64(&len, kMaxIpcDecompressedBytes + 1);
    bomb.replace(static_cast<size_t>(first.offset), 8, len);
    storage.clear();
    auto refused = ResolveBatch(*s->schema, meta, bomb, &storage);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("decompresses to more than"), std::string::npos)
        << refused.status().ToString();
  }
}

TEST(ArrowIpc, RefusesOffsetsThatGoBackwardsOrPastTheData) {
  auto msgs = Split(ReadFixture("log_rows.arrows"));
  auto s = ParseMessage(msgs[0].header);
  auto m = ParseMessage(msgs[1].header);
  ASSERT_TRUE(s.ok() && m.ok());
  // Buffers: key validity, offsets, data; value validity, offsets, data; ...
  const BufferRef offsets = m->batch->buffers[4];
  ASSERT_GE(offsets.length, 16);
  std::string body = msgs[1].body;
  StoreLE32(body.data() + offsets.offset + 4, 1000);  // row 0 ends past the data
  std::deque<std::string> storage;
  auto r = ResolveBatch(*s->schema, *m->batch, body, &storage);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("backwards"), std::string::npos) << r.status().ToString();
  body = msgs[1].body;
  StoreLE32(body.data() + offsets.offset + 12, 1000);  // the last offset past the data
  r = ResolveBatch(*s->schema, *m->batch, body, &storage);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("past its data"), std::string::npos) << r.status().ToString();
}

// Every prefix of every message, and every byte of every message flipped:
// an error or a result, never a crash (this runs under ASan and UBSan in CI).
TEST(ArrowIpc, DamagedMessagesGiveErrorsNotCrashes) {
  for (const char* f : {"log_rows.arrows", "large_ns.arrows", "int64_ts.arrows"}) {
    const auto msgs = Split(ReadFixture(f));
    ASSERT_GE(msgs.size(), 2u);
    for (size_t which = 0; which < msgs.size(); ++which) {
      const std::string& header = msgs[which].header;
      size_t refused = 0;
      for (size_t cut = 0; cut < header.size(); ++cut) {
        auto copy = msgs;
        copy[which].header.resize(cut);
        refused += !Decode(copy).ok();
      }
      EXPECT_GT(refused, 0u) << f;
      for (size_t i = 0; i < header.size(); ++i) {
        for (uint8_t x : {0x01, 0x80, 0xff}) {
          auto copy = msgs;
          copy[which].header[i] = static_cast<char>(copy[which].header[i] ^ x);
          Decode(copy).status().IgnoreError();
        }
      }
      for (size_t cut = 0; cut < msgs[which].body.size(); cut += 7) {
        auto copy = msgs;
        copy[which].body.resize(cut);
        Decode(copy).status().IgnoreError();
      }
    }
  }
}

TEST(ArrowIpc, RefusesMessagesItDoesNotRead) {
  EXPECT_EQ(ParseMessage("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseMessage(std::string(64, '\0')).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseMessage(std::string(64, '\xff')).status().code(), Code::kInvalidArgument);
}

TEST(LogRows, RefusesUnknownDuplicateAndMissingColumns) {
  ArrowSchema s;
  ArrowField value;
  value.name = "value";
  value.type = ArrowType::kBinary;
  s.fields = {value};
  EXPECT_TRUE(CheckLogSchema(s).ok());
  s.fields.push_back(value);
  EXPECT_NE(CheckLogSchema(s).status().message().find("appears twice"), std::string::npos);
  s.fields = {value};
  ArrowField extra = value;
  extra.name = "colour";
  s.fields.push_back(extra);
  EXPECT_NE(CheckLogSchema(s).status().message().find("unknown column 'colour'"), std::string::npos);
  s.fields = {};
  EXPECT_NE(CheckLogSchema(s).status().message().find("no value column"), std::string::npos);
  ArrowField ts;
  ts.name = "timestamp";
  ts.type = ArrowType::kInt;
  ts.bit_width = 32;
  ts.is_signed = true;
  s.fields = {value, ts};
  EXPECT_NE(CheckLogSchema(s).status().message().find("column 'timestamp' is int"), std::string::npos);
  // headers: a map whose entries are a struct of two byte columns, none
  // dictionary-encoded; anything else is refused at the schema.
  ArrowField entries;
  entries.name = "entries";
  entries.type = ArrowType::kStruct;
  ArrowField k = value, v = value;
  k.name = "key";
  v.name = "value";
  entries.children = {k, v};
  ArrowField headers;
  headers.name = "headers";
  headers.type = ArrowType::kMap;
  headers.children = {entries};
  s.fields = {value, headers};
  EXPECT_TRUE(CheckLogSchema(s).ok());
  headers.children[0].type = ArrowType::kList;
  s.fields = {value, headers};
  EXPECT_NE(CheckLogSchema(s).status().message().find("column 'headers' is"), std::string::npos);
  headers.children[0].type = ArrowType::kStruct;
  headers.children[0].dictionary_encoded = true;
  s.fields = {value, headers};
  EXPECT_EQ(CheckLogSchema(s).status().code(), Code::kInvalidArgument);
}

// DoGet's messages read back by the reader (the JavaScript suite reads them
// with Apache Arrow's own library).
TEST(LogRows, ReadMessagesRoundTrip) {
  auto schema_msg = ParseMessage(LogReadSchemaMessage());
  ASSERT_TRUE(schema_msg.ok()) << schema_msg.status().ToString();
  const ArrowSchema& schema = *schema_msg->schema;
  ASSERT_EQ(schema.fields.size(), 5u);
  EXPECT_EQ(schema.fields[0].name, "offset");
  EXPECT_EQ(schema.fields[4].type, ArrowType::kMap);
  std::vector<wal::Record> records(3);
  records[0].timestamp = 1700000000001;
  records[0].key = "k";
  records[0].value = "one";
  records[0].headers = {{"h1", std::string("x")}, {"h2", std::nullopt}};
  records[1].timestamp = -5;
  records[2].timestamp = 7;
  records[2].value = std::string(100, 'z');
  std::vector<ReadRow> rows;
  for (size_t i = 0; i < records.size(); ++i) rows.push_back(ReadRow{40 + i, &records[i]});
  IpcBytes b = LogReadBatchMessage(rows);
  auto m = ParseMessage(b.header);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(static_cast<size_t>(m->body_length), b.body.size());
  std::deque<std::string> storage;
  auto cols = ResolveBatch(schema, *m->batch, b.body, &storage);
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  const auto& c = *cols;
  EXPECT_EQ(c[0].Int64(2), 42);
  EXPECT_EQ(c[1].Int64(1), -5);
  EXPECT_EQ(c[2].Bytes(0), "k");
  EXPECT_TRUE(c[2].IsNull(1));
  EXPECT_TRUE(c[3].IsNull(1));
  EXPECT_EQ(c[3].Bytes(2), std::string(100, 'z'));
  const ArrayView& map = c[4];
  EXPECT_EQ(map.Offset(0), 0);
  EXPECT_EQ(map.Offset(1), 2);
  EXPECT_EQ(map.Offset(3), 2);
  EXPECT_EQ(map.children[0].children[0].Bytes(1), "h2");
  EXPECT_EQ(map.children[0].children[1].Bytes(0), "x");
  EXPECT_TRUE(map.children[0].children[1].IsNull(1));
  const std::string enc = EncapsulatedMessage(LogReadSchemaMessage());
  EXPECT_EQ(LoadLE32(enc.data()), 0xffffffffu);
  EXPECT_EQ(enc.size() % 8, 0u);
  EXPECT_TRUE(ParseMessage(std::string_view(enc).substr(8, LoadLE32(enc.data() + 4))).ok());
}

// Kafka's murmur2 (the Java client's Utils.murmur2 test vectors), as a
// positive int: partitions 2^31 leave the hash itself.
TEST(LogRows, KafkaPartitionerMatchesJavasMurmur2) {
  const std::pair<std::string, int32_t> cases[] = {
      {"21", -973932308},
      {"foobar", -790332482},
      {"a-little-bit-long-string", -985981536},
      {"a-little-bit-longer-string", -1486304829},
      {"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
      {"abc", 479470107},
  };
  for (const auto& [key, hash] : cases) {
    EXPECT_EQ(KafkaPartitionOf(key, 0x80000000u), static_cast<uint32_t>(hash) & 0x7fffffffu) << key;
  }
  EXPECT_LT(KafkaPartitionOf("anything", 7), 7u);
}

}  // namespace
}  // namespace weir::flight
