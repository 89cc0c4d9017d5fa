#include "flight/log_rows.h"

#include <limits>

#include <flatbuffers/flatbuffers.h>

#include "base/bytes.h"

namespace weir::flight {

namespace {

bool IsBytes(ArrowType t) {
  return t == ArrowType::kBinary || t == ArrowType::kUtf8 || t == ArrowType::kLargeBinary ||
         t == ArrowType::kLargeUtf8;
}

constexpr const char* kShape =
    "a log table's columns are value (binary or utf8), and optionally key (binary or utf8), timestamp "
    "(timestamp or int64 milliseconds) and headers (map of utf8 or binary to binary or utf8)";

Result<int64_t> ToMillis(const ArrowField& f, int64_t v) {
  if (f.type == ArrowType::kInt) return v;
  switch (f.unit) {
    case TimeUnit::kSecond:
      if (v > std::numeric_limits<int64_t>::max() / 1000 || v < std::numeric_limits<int64_t>::min() / 1000) {
        return InvalidArgument("timestamp {} s is out of range", v);
      }
      return v * 1000;
    case TimeUnit::kMillisecond: return v;
    case TimeUnit::kMicrosecond: return v / 1000 - (v % 1000 < 0 ? 1 : 0);
    case TimeUnit::kNanosecond: return v / 1000000 - (v % 1000000 < 0 ? 1 : 0);
  }
  return v;
}

}  // namespace

Result<LogColumns> CheckLogSchema(const ArrowSchema& schema) {
  LogColumns c;
  for (size_t i = 0; i < schema.fields.size(); ++i) {
    const ArrowField& f = schema.fields[i];
    const int idx = static_cast<int>(i);
    auto twice = [&](int prev) -> Status {
      return prev >= 0 ? InvalidArgument("column '{}' appears twice", f.name) : Status::Ok();
    };
    auto wrong = [&]() { return InvalidArgument("column '{}' is {}: {}", f.name, ArrowTypeName(f.type), kShape); };
    if (f.dictionary_encoded) return InvalidArgument("column '{}' is dictionary-encoded: {}", f.name, kShape);
    if (f.name == "key" || f.name == "value") {
      int& slot = f.name == "key" ? c.key : c.value;
      WEIR_RETURN_IF_ERROR(twice(slot));
      if (!IsBytes(f.type)) return wrong();
      slot = idx;
    } else if (f.name == "timestamp") {
      WEIR_RETURN_IF_ERROR(twice(c.timestamp));
      if (f.type != ArrowType::kTimestamp && !(f.type == ArrowType::kInt && f.bit_width == 64 && f.is_signed)) {
        return wrong();
      }
      c.timestamp = idx;
    } else if (f.name == "headers") {
      WEIR_RETURN_IF_ERROR(twice(c.headers));
      if (f.type != ArrowType::kMap || f.children.size() != 1 || f.children[0].type != ArrowType::kStruct ||
          f.children[0].dictionary_encoded || f.children[0].children.size() != 2 ||
          !IsBytes(f.children[0].children[0].type) || !IsBytes(f.children[0].children[1].type) ||
          f.children[0].children[0].dictionary_encoded || f.children[0].children[1].dictionary_encoded) {
        return wrong();
      }
      c.headers = idx;
    } else {
      return InvalidArgument("unknown column '{}': {}", f.name, kShape);
    }
  }
  if (c.value < 0) return InvalidArgument("no value column: {}", kShape);
  return c;
}

Result<std::vector<wal::RecordView>> LogRecords(const LogColumns& cols, const std::vector<ArrayView>& columns,
                                                int64_t now_ms) {
  const ArrayView& value = columns.at(static_cast<size_t>(cols.value));
  const int64_t rows = value.length;
  std::vector<wal::RecordView> out;
  out.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    wal::RecordView r;
    if (!value.IsNull(i)) r.value.emplace(value.Bytes(i));
    if (cols.key >= 0) {
      const ArrayView& key = columns[static_cast<size_t>(cols.key)];
      if (!key.IsNull(i)) r.key.emplace(key.Bytes(i));
    }
    r.timestamp = now_ms;
    if (cols.timestamp >= 0) {
      const ArrayView& ts = columns[static_cast<size_t>(cols.timestamp)];
      if (!ts.IsNull(i)) {
        auto ms = ToMillis(*ts.field, ts.Int64(i));
        if (!ms.ok()) return ms.status().WithContext(fmt::format("row {}", i));
        r.timestamp = *ms;
      }
    }
    if (cols.headers >= 0) {
      const ArrayView& map = columns[static_cast<size_t>(cols.headers)];
      if (!map.IsNull(i)) {
        const ArrayView& entries = map.children[0];
        const ArrayView& names = entries.children[0];
        const ArrayView& values = entries.children[1];
        for (int64_t j = map.Offset(i); j < map.Offset(i + 1); ++j) {
          if (entries.IsNull(j)) return InvalidArgument("row {}: a null header entry", i);
          wal::RecordHeaderView h;
          h.key = names.Bytes(j);
          if (!values.IsNull(j)) h.value.emplace(values.Bytes(j));
          r.headers.push_back(std::move(h));
        }
        if (r.headers.size() == 1 && r.headers[0].key.empty()) {
          return InvalidArgument("row {}: one header with an empty name is the shape of an S2 command record", i);
        }
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

uint64_t LogRecordsBytes(const LogColumns& cols, const std::vector<ArrayView>& columns) {
  // Bytes rows [from, to) of a binary column span (offsets are checked).
  auto span = [](const ArrayView& a, int64_t from, int64_t to) -> uint64_t {
    return to > from ? static_cast<uint64_t>(a.Offset(to) - a.Offset(from)) : 0;
  };
  uint64_t n = 0;
  for (int c : {cols.key, cols.value}) {
    if (c >= 0) n += span(columns[static_cast<size_t>(c)], 0, columns[static_cast<size_t>(c)].length);
  }
  if (cols.headers >= 0) {
    const ArrayView& map = columns[static_cast<size_t>(cols.headers)];
    if (map.length > 0) {
      const int64_t from = map.Offset(0), to = map.Offset(map.length);
      const ArrayView& entries = map.children[0];
      n += span(entries.children[0], from, to) + span(entries.children[1], from, to);
    }
  }
  return n;
}

uint64_t LogRecordsHeaderCount(const LogColumns& cols, const std::vector<ArrayView>& columns) {
  if (cols.headers < 0) return 0;
  const ArrayView& map = columns[static_cast<size_t>(cols.headers)];
  return map.length > 0 ? static_cast<uint64_t>(map.Offset(map.length) - map.Offset(0)) : 0;
}

uint32_t KafkaPartitionOf(std::string_view key, uint32_t partitions) {
  constexpr uint32_t m = 0x5bd1e995;
  constexpr int r = 24;
  const auto* data = reinterpret_cast<const uint8_t*>(key.data());
  const auto length = static_cast<uint32_t>(key.size());
  uint32_t h = 0x9747b28cu ^ length;
  const uint32_t length4 = length / 4;
  for (uint32_t i = 0; i < length4; ++i) {
    const uint32_t i4 = i * 4;
    uint32_t k = data[i4] | (uint32_t{data[i4 + 1]} << 8) | (uint32_t{data[i4 + 2]} << 16) |
                 (uint32_t{data[i4 + 3]} << 24);
    k *= m;
    k ^= k >> r;
    k *= m;
    h *= m;
    h ^= k;
  }
  const uint32_t tail = length & ~3u;
  switch (length % 4) {
    case 3: h ^= uint32_t{data[tail + 2]} << 16; [[fallthrough]];
    case 2: h ^= uint32_t{data[tail + 1]} << 8; [[fallthrough]];
    case 1:
      h ^= data[tail];
      h *= m;
  }
  h ^= h >> 13;
  h *= m;
  h ^= h >> 15;
  return (h & 0x7fffffffu) % partitions;
}

}  // namespace weir::flight

// ---- Writing (DoGet) ----------------------------------------------------------

namespace weir::flight {

namespace {

using FbOffset = flatbuffers::Offset<void>;

// Table field slots (Message.fbs and Schema.fbs order), as arrow_ipc.cc reads them.
constexpr flatbuffers::voffset_t Slot(int i) { return static_cast<flatbuffers::voffset_t>(4 + 2 * i); }
constexpr int16_t kMetadataV5 = 4;
constexpr uint8_t kHeaderSchema = 1, kHeaderRecordBatch = 3;

FbOffset EmptyTable(flatbuffers::FlatBufferBuilder& b) { return FbOffset(b.EndTable(b.StartTable())); }

FbOffset FieldOf(flatbuffers::FlatBufferBuilder& b, const char* name, bool nullable, ArrowType type, FbOffset type_table,
                 const std::vector<FbOffset>& children) {
  auto n = b.CreateString(name);
  auto kids = b.CreateVector(children);
  const auto start = b.StartTable();
  b.AddOffset(Slot(0), n);
  b.AddElement<uint8_t>(Slot(1), nullable ? 1 : 0, 0);
  b.AddElement<uint8_t>(Slot(2), static_cast<uint8_t>(type), 0);
  b.AddOffset(Slot(3), type_table);
  b.AddOffset(Slot(5), kids);
  return FbOffset(b.EndTable(start));
}

std::string MessageOf(flatbuffers::FlatBufferBuilder& b, uint8_t header_type, FbOffset header, int64_t body_length) {
  const auto start = b.StartTable();
  b.AddElement<int64_t>(Slot(3), body_length, 0);
  b.AddOffset(Slot(2), header);
  b.AddElement<int16_t>(Slot(0), kMetadataV5, 0);
  b.AddElement<uint8_t>(Slot(1), header_type, 0);
  b.Finish(flatbuffers::Offset<void>(b.EndTable(start)));
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

// A record batch body being laid out, its columns' buffers each padded to 8
// bytes: a local of one encode call (LogReadBatchMessage), on its thread.
struct BodyWriter {
  std::string body;
  std::vector<std::pair<int64_t, int64_t>> buffers;  // (offset, length)
  std::vector<std::pair<int64_t, int64_t>> nodes;    // (length, null_count)

  void Buffer(std::string_view bytes) {
    buffers.emplace_back(static_cast<int64_t>(body.size()), static_cast<int64_t>(bytes.size()));
    body.append(bytes);
    body.resize((body.size() + 7) / 8 * 8, '\0');
  }
  // A validity bitmap, left out when nothing is null.
  void Validity(const std::vector<bool>& valid, int64_t nulls) {
    if (nulls == 0) return Buffer({});
    std::string bits((valid.size() + 7) / 8, '\0');
    for (size_t i = 0; i < valid.size(); ++i) {
      if (valid[i]) bits[i / 8] = static_cast<char>(bits[i / 8] | (1 << (i % 8)));
    }
    Buffer(bits);
  }
  // A nullable binary column of `values`.
  void BinaryColumn(const std::vector<const std::string*>& values) {
    std::vector<bool> valid(values.size());
    std::string offsets, data;
    int64_t nulls = 0;
    PutLE32(&offsets, 0);
    for (size_t i = 0; i < values.size(); ++i) {
      valid[i] = values[i] != nullptr;
      if (values[i]) data += *values[i];
      nulls += values[i] == nullptr;
      PutLE32(&offsets, static_cast<uint32_t>(data.size()));
    }
    nodes.emplace_back(static_cast<int64_t>(values.size()), nulls);
    Validity(valid, nulls);
    Buffer(offsets);
    Buffer(data);
  }
  void Int64Column(const std::vector<int64_t>& values) {
    std::string data;
    for (int64_t v : values) PutLE64(&data, static_cast<uint64_t>(v));
    nodes.emplace_back(static_cast<int64_t>(values.size()), 0);
    Buffer({});
    Buffer(data);
  }
};

}  // namespace

std::string LogReadSchemaMessage() {
  flatbuffers::FlatBufferBuilder b(1024);
  std::vector<FbOffset> fields;
  const auto int_start = b.StartTable();
  b.AddElement<int32_t>(Slot(0), 64, 0);
  b.AddElement<uint8_t>(Slot(1), 1, 0);
  const FbOffset int64(b.EndTable(int_start));
  fields.push_back(FieldOf(b, "offset", false, ArrowType::kInt, int64, {}));
  const auto ts_start = b.StartTable();
  b.AddElement<int16_t>(Slot(0), static_cast<int16_t>(TimeUnit::kMillisecond), 0);
  const FbOffset ts(b.EndTable(ts_start));
  fields.push_back(FieldOf(b, "timestamp", false, ArrowType::kTimestamp, ts, {}));
  fields.push_back(FieldOf(b, "key", true, ArrowType::kBinary, EmptyTable(b), {}));
  fields.push_back(FieldOf(b, "value", true, ArrowType::kBinary, EmptyTable(b), {}));
  const FbOffset entry_key = FieldOf(b, "key", false, ArrowType::kBinary, EmptyTable(b), {});
  const FbOffset entry_value = FieldOf(b, "value", true, ArrowType::kBinary, EmptyTable(b), {});
  const FbOffset entries = FieldOf(b, "entries", false, ArrowType::kStruct, EmptyTable(b), {entry_key, entry_value});
  const FbOffset map(EmptyTable(b));  // keysSorted: false (the default)
  fields.push_back(FieldOf(b, "headers", false, ArrowType::kMap, map, {entries}));
  auto vec = b.CreateVector(fields);
  const auto start = b.StartTable();
  b.AddOffset(Slot(1), vec);  // endianness: little (the default)
  const FbOffset schema(b.EndTable(start));
  return MessageOf(b, kHeaderSchema, schema, 0);
}

IpcBytes LogReadBatchMessage(const std::vector<ReadRow>& rows) {
  BodyWriter w;
  std::vector<int64_t> offsets, times;
  std::vector<const std::string*> keys, values, header_names, header_values;
  std::string map_offsets;
  PutLE32(&map_offsets, 0);
  for (const auto& r : rows) {
    offsets.push_back(static_cast<int64_t>(r.offset));
    times.push_back(r.record->timestamp);
    keys.push_back(r.record->key ? &*r.record->key : nullptr);
    values.push_back(r.record->value ? &*r.record->value : nullptr);
    for (const auto& h : r.record->headers) {
      header_names.push_back(&h.key);
      header_values.push_back(h.value ? &*h.value : nullptr);
    }
    PutLE32(&map_offsets, static_cast<uint32_t>(header_names.size()));
  }
  w.Int64Column(offsets);
  w.Int64Column(times);
  w.BinaryColumn(keys);
  w.BinaryColumn(values);
  // headers: a map (validity, offsets), its entries struct (validity), then
  // the entries' key and value columns.
  w.nodes.emplace_back(static_cast<int64_t>(rows.size()), 0);
  w.Buffer({});
  w.Buffer(map_offsets);
  w.nodes.emplace_back(static_cast<int64_t>(header_names.size()), 0);
  w.Buffer({});
  w.BinaryColumn(header_names);
  w.BinaryColumn(header_values);

  flatbuffers::FlatBufferBuilder b(1024);
  std::vector<int64_t> flat_nodes, flat_buffers;
  for (auto [a, c] : w.nodes) flat_nodes.insert(flat_nodes.end(), {a, c});
  for (auto [a, c] : w.buffers) flat_buffers.insert(flat_buffers.end(), {a, c});
  // Vectors of 16-byte structs, written as 8-byte aligned int64 pairs.
  auto struct_vector = [&](const std::vector<int64_t>& v) {
    b.StartVector(v.size() / 2, 16);
    for (size_t i = v.size(); i > 0; --i) b.PushElement(v[i - 1]);
    return FbOffset(b.EndVector(v.size() / 2));
  };
  const FbOffset nodes = struct_vector(flat_nodes);
  const FbOffset buffers = struct_vector(flat_buffers);
  const auto start = b.StartTable();
  b.AddElement<int64_t>(Slot(0), static_cast<int64_t>(rows.size()), 0);
  b.AddOffset(Slot(1), nodes);
  b.AddOffset(Slot(2), buffers);
  const FbOffset batch(b.EndTable(start));
  IpcBytes out;
  out.header = MessageOf(b, kHeaderRecordBatch, batch, static_cast<int64_t>(w.body.size()));
  out.body = std::move(w.body);
  return out;
}

std::string EncapsulatedMessage(std::string_view header) {
  const size_t padded = (header.size() + 7) / 8 * 8;
  std::string out;
  PutLE32(&out, 0xffffffffu);
  PutLE32(&out, static_cast<uint32_t>(padded));
  out.append(header);
  out.resize(8 + padded, '\0');
  return out;
}

}  // namespace weir::flight
