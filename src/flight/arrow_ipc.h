// A reader for Arrow IPC messages (the columnar format's Message, Schema and
// RecordBatch flatbuffers, and a record batch's body), written here because
// Debian 12 packages no Arrow C++ library. It reads what a Flight DoPut
// carries: one Schema message, then RecordBatch messages. Dictionary batches,
// tensors and the view and union layouts are refused (kNotSupported).
// Stateless functions, thread-safe; every offset and length is checked
// before use, so hostile bytes give an error, never a read out of bounds
// (fuzzed by tests/fuzz/arrow_ipc_fuzz.cc). Format notes: docs/format/arrow-ipc.md.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::flight {

// A compressed body may decompress to at most this much in all.
inline constexpr size_t kMaxIpcDecompressedBytes = 64u << 20;
// Fields (columns and their children) a schema may have, at most, and how deep they may nest.
inline constexpr size_t kMaxIpcFields = 1024;
inline constexpr int kMaxIpcNesting = 16;

// Arrow's Type union, by its numbers in Schema.fbs.
enum class ArrowType : uint8_t {
  kNone = 0, kNull = 1, kInt = 2, kFloatingPoint = 3, kBinary = 4, kUtf8 = 5, kBool = 6, kDecimal = 7,
  kDate = 8, kTime = 9, kTimestamp = 10, kInterval = 11, kList = 12, kStruct = 13, kUnion = 14,
  kFixedSizeBinary = 15, kFixedSizeList = 16, kMap = 17, kDuration = 18, kLargeBinary = 19,
  kLargeUtf8 = 20, kLargeList = 21, kRunEndEncoded = 22, kBinaryView = 23, kUtf8View = 24,
  kListView = 25, kLargeListView = 26,
};
// "int", "utf8", "timestamp", ... ("type 99" past the known ones).
std::string ArrowTypeName(ArrowType t);

enum class TimeUnit : uint8_t { kSecond = 0, kMillisecond = 1, kMicrosecond = 2, kNanosecond = 3 };

struct ArrowField {
  std::string name;
  bool nullable = true;
  ArrowType type = ArrowType::kNone;
  int bit_width = 0;       // kInt
  bool is_signed = false;  // kInt
  TimeUnit unit = TimeUnit::kMillisecond;  // kTimestamp
  bool dictionary_encoded = false;
  std::vector<ArrowField> children;
};

struct ArrowSchema {
  std::vector<ArrowField> fields;
};

struct FieldNode {
  int64_t length = 0;
  int64_t null_count = 0;
};
struct BufferRef {
  int64_t offset = 0;
  int64_t length = 0;
};

struct RecordBatchMeta {
  int64_t length = 0;  // rows
  std::vector<FieldNode> nodes;
  std::vector<BufferRef> buffers;
  // Arrow's BodyCompression codec: none, LZ4_FRAME (0) or ZSTD (1).
  std::optional<int> codec;
};

enum class MessageKind { kSchema, kRecordBatch, kDictionaryBatch, kTensor, kSparseTensor };

struct IpcMessage {
  MessageKind kind = MessageKind::kSchema;
  int16_t version = 0;  // MetadataVersion: 3 = V4, 4 = V5
  int64_t body_length = 0;
  std::optional<ArrowSchema> schema;   // kSchema
  std::optional<RecordBatchMeta> batch;  // kRecordBatch
};

// Parses one Message flatbuffer (a FlightData's data_header; the bytes after
// an IPC stream's continuation marker and length). kInvalidArgument names
// what is wrong; kNotSupported for versions before V4, big-endian schemas
// and message kinds other than Schema and RecordBatch.
Result<IpcMessage> ParseMessage(std::string_view header);

// One column (or child) of a record batch, its buffers resolved against the
// body: views into the body, or into `storage` of ResolveBatch when the body
// was compressed, so valid while both live; read-only, so any thread. Only the
// layouts ResolveBatch accepts appear.
struct ArrayView {
  const ArrowField* field = nullptr;
  int64_t length = 0;
  int64_t null_count = 0;
  std::string_view validity;  // empty: no nulls
  std::string_view offsets;   // binary, utf8, list, map: (length + 1) offsets, 4 or 8 bytes each
  std::string_view values;    // fixed width values, or the bytes binary offsets point into
  std::vector<ArrayView> children;

  bool IsNull(int64_t i) const {
    if (null_count == 0 || validity.empty()) return false;
    return (static_cast<uint8_t>(validity[static_cast<size_t>(i >> 3)]) & (1u << (i & 7))) == 0;
  }
  // Element i of an offsets buffer (4 or 8 bytes wide as the type says).
  int64_t Offset(int64_t i) const;
  // Row i of a binary or utf8 column (checked by ResolveBatch).
  std::string_view Bytes(int64_t i) const {
    const int64_t a = Offset(i), b = Offset(i + 1);
    return values.substr(static_cast<size_t>(a), static_cast<size_t>(b - a));
  }
  // Row i of a 64-bit integer or timestamp column.
  int64_t Int64(int64_t i) const;
};

// Resolves a RecordBatch's nodes and buffers, in Arrow's depth-first field
// order, against `body` (decompressing into `storage`), and checks every
// buffer's size, offsets and child lengths for the layouts weir reads: int,
// timestamp, binary, utf8, their large forms, struct, list and map. Other
// layouts are kNotSupported naming the column.
Result<std::vector<ArrayView>> ResolveBatch(const ArrowSchema& schema, const RecordBatchMeta& batch,
                                            std::string_view body, std::deque<std::string>* storage);

}  // namespace weir::flight
