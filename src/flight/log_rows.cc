#include "flight/log_rows.h"

#include <limits>

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
      if (f.type != ArrowType::kMap || f.children.size() != 1 || f.children[0].children.size() != 2 ||
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

Result<std::vector<wal::Record>> LogRecords(const LogColumns& cols, const std::vector<ArrayView>& columns,
                                            int64_t now_ms) {
  const ArrayView& value = columns.at(static_cast<size_t>(cols.value));
  const int64_t rows = value.length;
  std::vector<wal::Record> out;
  out.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    wal::Record r;
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
          wal::RecordHeader h;
          h.key.assign(names.Bytes(j));
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
