#include "flight/arrow_ipc.h"

#include <cstring>
#include <memory>

#include <flatbuffers/flatbuffers.h>

#include "base/bytes.h"
#include "wal/compression.h"

namespace weir::flight {

namespace {

using flatbuffers::Table;
using flatbuffers::Verifier;
using flatbuffers::voffset_t;

// A table's field i is at vtable slot 4 + 2i (Message.fbs, Schema.fbs order).
constexpr voffset_t Slot(int i) { return static_cast<voffset_t>(4 + 2 * i); }

// Message
constexpr voffset_t kMsgVersion = Slot(0), kMsgHeaderType = Slot(1), kMsgHeader = Slot(2), kMsgBodyLength = Slot(3);
// Schema
constexpr voffset_t kSchemaEndianness = Slot(0), kSchemaFields = Slot(1);
// Field
constexpr voffset_t kFieldName = Slot(0), kFieldNullable = Slot(1), kFieldTypeType = Slot(2), kFieldType = Slot(3),
                    kFieldDictionary = Slot(4), kFieldChildren = Slot(5);
// Int, Timestamp
constexpr voffset_t kIntBitWidth = Slot(0), kIntSigned = Slot(1), kTimestampUnit = Slot(0);
// RecordBatch, BodyCompression
constexpr voffset_t kBatchLength = Slot(0), kBatchNodes = Slot(1), kBatchBuffers = Slot(2), kBatchCompression = Slot(3);
constexpr voffset_t kCompressionCodec = Slot(0), kCompressionMethod = Slot(1);

constexpr uint8_t kHeaderSchema = 1, kHeaderDictionaryBatch = 2, kHeaderRecordBatch = 3, kHeaderTensor = 4,
                  kHeaderSparseTensor = 5;
constexpr int16_t kMetadataV4 = 3;

using TableVector = flatbuffers::Vector<flatbuffers::Offset<Table>>;

Status Bad(std::string_view what) { return InvalidArgument("Arrow IPC message: {}", what); }

// Verifies and enters a sub-table at `slot` (may be absent: nullptr). The
// caller ends it with v.EndTable().
Result<const Table*> SubTable(Verifier& v, const Table* t, voffset_t slot, std::string_view what) {
  if (!t->VerifyOffset(v, slot)) return Bad(what);
  const Table* sub = t->GetPointer<const Table*>(slot);
  if (sub != nullptr && !sub->VerifyTableStart(v)) return Bad(what);
  return sub;
}

Result<ArrowField> ParseField(Verifier& v, const Table* f, int depth, size_t* count) {
  if (depth > kMaxIpcNesting) return Bad(fmt::format("fields nest deeper than {}", kMaxIpcNesting));
  if (++*count > kMaxIpcFields) return Bad(fmt::format("more than {} fields", kMaxIpcFields));
  if (!f->VerifyOffset(v, kFieldName) || !f->VerifyField<uint8_t>(v, kFieldNullable, 1) ||
      !f->VerifyField<uint8_t>(v, kFieldTypeType, 1) || !f->VerifyOffset(v, kFieldDictionary) ||
      !f->VerifyOffset(v, kFieldChildren)) {
    return Bad("a field is damaged");
  }
  ArrowField out;
  const auto* name = f->GetPointer<const flatbuffers::String*>(kFieldName);
  if (name != nullptr) {
    if (!v.VerifyString(name)) return Bad("a field name is damaged");
    out.name.assign(name->c_str(), name->size());
  }
  out.nullable = f->GetField<uint8_t>(kFieldNullable, 0) != 0;
  out.type = static_cast<ArrowType>(f->GetField<uint8_t>(kFieldTypeType, 0));
  out.dictionary_encoded = f->GetPointer<const Table*>(kFieldDictionary) != nullptr;
  WEIR_ASSIGN_OR_RETURN(const Table* type, SubTable(v, f, kFieldType, "a field type is damaged"));
  if (type == nullptr) return Bad(fmt::format("field '{}' has no type", out.name));
  if (out.type == ArrowType::kInt) {
    if (!type->VerifyField<int32_t>(v, kIntBitWidth, 4) || !type->VerifyField<uint8_t>(v, kIntSigned, 1)) {
      return Bad("an int type is damaged");
    }
    out.bit_width = type->GetField<int32_t>(kIntBitWidth, 0);
    out.is_signed = type->GetField<uint8_t>(kIntSigned, 0) != 0;
    if (out.bit_width != 8 && out.bit_width != 16 && out.bit_width != 32 && out.bit_width != 64) {
      return Bad(fmt::format("field '{}': int of {} bits", out.name, out.bit_width));
    }
  } else if (out.type == ArrowType::kTimestamp) {
    if (!type->VerifyField<int16_t>(v, kTimestampUnit, 2)) return Bad("a timestamp type is damaged");
    const int16_t unit = type->GetField<int16_t>(kTimestampUnit, 0);
    if (unit < 0 || unit > 3) return Bad(fmt::format("field '{}': time unit {}", out.name, unit));
    out.unit = static_cast<TimeUnit>(unit);
  }
  if (!v.EndTable()) return Bad("a field type is damaged");
  const auto* children = f->GetPointer<const TableVector*>(kFieldChildren);
  if (children != nullptr) {
    if (!v.VerifyVector(children)) return Bad("a field's children are damaged");
    for (flatbuffers::uoffset_t i = 0; i < children->size(); ++i) {
      const Table* c = children->Get(i);
      if (!c->VerifyTableStart(v)) return Bad("a child field is damaged");
      WEIR_ASSIGN_OR_RETURN(auto child, ParseField(v, c, depth + 1, count));
      if (!v.EndTable()) return Bad("a child field is damaged");
      out.children.push_back(std::move(child));
    }
  }
  return out;
}

Result<ArrowSchema> ParseSchema(Verifier& v, const Table* s) {
  if (!s->VerifyField<int16_t>(v, kSchemaEndianness, 2) || !s->VerifyOffset(v, kSchemaFields)) {
    return Bad("the schema is damaged");
  }
  if (s->GetField<int16_t>(kSchemaEndianness, 0) != 0) return NotSupported("Arrow IPC: big-endian data is not supported");
  ArrowSchema out;
  const auto* fields = s->GetPointer<const TableVector*>(kSchemaFields);
  if (fields == nullptr) return out;
  if (!v.VerifyVector(fields)) return Bad("the schema's fields are damaged");
  size_t count = 0;
  for (flatbuffers::uoffset_t i = 0; i < fields->size(); ++i) {
    const Table* f = fields->Get(i);
    if (!f->VerifyTableStart(v)) return Bad("a field is damaged");
    WEIR_ASSIGN_OR_RETURN(auto field, ParseField(v, f, 1, &count));
    if (!v.EndTable()) return Bad("a field is damaged");
    out.fields.push_back(std::move(field));
  }
  return out;
}

// A vector of 16-byte structs (FieldNode, Buffer: two little-endian int64).
Result<std::vector<std::pair<int64_t, int64_t>>> StructPairs(Verifier& v, const Table* t, voffset_t slot,
                                                             std::string_view what) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (!t->VerifyOffset(v, slot)) return Bad(what);
  const auto* vec = t->GetPointer<const flatbuffers::Vector<uint8_t>*>(slot);
  if (vec == nullptr) return out;
  if (!v.VerifyVectorOrString(reinterpret_cast<const uint8_t*>(vec), 16)) return Bad(what);
  const char* p = reinterpret_cast<const char*>(vec->Data());
  out.reserve(vec->size());
  for (flatbuffers::uoffset_t i = 0; i < vec->size(); ++i, p += 16) {
    out.emplace_back(static_cast<int64_t>(LoadLE64(p)), static_cast<int64_t>(LoadLE64(p + 8)));
  }
  return out;
}

Result<RecordBatchMeta> ParseRecordBatch(Verifier& v, const Table* b) {
  if (!b->VerifyField<int64_t>(v, kBatchLength, 8)) return Bad("the record batch is damaged");
  RecordBatchMeta out;
  out.length = b->GetField<int64_t>(kBatchLength, 0);
  if (out.length < 0) return Bad(fmt::format("a record batch of {} rows", out.length));
  WEIR_ASSIGN_OR_RETURN(auto nodes, StructPairs(v, b, kBatchNodes, "the record batch's nodes are damaged"));
  WEIR_ASSIGN_OR_RETURN(auto buffers, StructPairs(v, b, kBatchBuffers, "the record batch's buffers are damaged"));
  for (auto [length, nulls] : nodes) out.nodes.push_back({length, nulls});
  for (auto [offset, length] : buffers) out.buffers.push_back({offset, length});
  WEIR_ASSIGN_OR_RETURN(const Table* c, SubTable(v, b, kBatchCompression, "the body compression is damaged"));
  if (c != nullptr) {
    if (!c->VerifyField<int8_t>(v, kCompressionCodec, 1) || !c->VerifyField<int8_t>(v, kCompressionMethod, 1)) {
      return Bad("the body compression is damaged");
    }
    const int8_t codec = c->GetField<int8_t>(kCompressionCodec, 0);
    if (codec != 0 && codec != 1) return NotSupported("Arrow IPC: body compression codec {} is not supported", codec);
    if (c->GetField<int8_t>(kCompressionMethod, 0) != 0) {
      return NotSupported("Arrow IPC: only per-buffer body compression is supported");
    }
    out.codec = codec;
    if (!v.EndTable()) return Bad("the body compression is damaged");
  }
  return out;
}

}  // namespace

std::string ArrowTypeName(ArrowType t) {
  static constexpr const char* kNames[] = {
      "none", "null", "int", "floating point", "binary", "utf8", "bool", "decimal", "date", "time",
      "timestamp", "interval", "list", "struct", "union", "fixed size binary", "fixed size list", "map",
      "duration", "large binary", "large utf8", "large list", "run-end encoded", "binary view", "utf8 view",
      "list view", "large list view"};
  const auto i = static_cast<size_t>(t);
  return i < std::size(kNames) ? kNames[i] : fmt::format("type {}", i);
}

Result<IpcMessage> ParseMessage(std::string_view header) {
  if (header.size() < 8) return Bad("shorter than a flatbuffer");
  if (header.size() > (size_t{1} << 31)) return Bad("too large");
  // Flatbuffer scalars are read in place: copy to 8-byte aligned memory.
  std::unique_ptr<uint64_t[]> aligned(new uint64_t[(header.size() + 7) / 8]);
  std::memcpy(aligned.get(), header.data(), header.size());
  const auto* buf = reinterpret_cast<const uint8_t*>(aligned.get());
  Verifier v(buf, header.size(), /*max_depth=*/64, /*max_tables=*/4 * kMaxIpcFields + 64);
  if (v.VerifyOffset(0) == 0) return Bad("no root table");
  const Table* m = flatbuffers::GetRoot<Table>(buf);
  if (!m->VerifyTableStart(v) || !m->VerifyField<int16_t>(v, kMsgVersion, 2) ||
      !m->VerifyField<uint8_t>(v, kMsgHeaderType, 1) || !m->VerifyField<int64_t>(v, kMsgBodyLength, 8)) {
    return Bad("the message table is damaged");
  }
  IpcMessage out;
  out.version = m->GetField<int16_t>(kMsgVersion, 0);
  if (out.version < kMetadataV4) {
    return NotSupported("Arrow IPC: metadata version V{} is not supported (V4 or V5 is)", out.version + 1);
  }
  out.body_length = m->GetField<int64_t>(kMsgBodyLength, 0);
  if (out.body_length < 0) return Bad("a negative body length");
  const uint8_t kind = m->GetField<uint8_t>(kMsgHeaderType, 0);
  switch (kind) {
    case kHeaderSchema: out.kind = MessageKind::kSchema; break;
    case kHeaderRecordBatch: out.kind = MessageKind::kRecordBatch; break;
    case kHeaderDictionaryBatch: return NotSupported("Arrow IPC: dictionary batches are not supported");
    case kHeaderTensor: return NotSupported("Arrow IPC: tensors are not supported");
    case kHeaderSparseTensor: return NotSupported("Arrow IPC: sparse tensors are not supported");
    default: return Bad(fmt::format("unknown header type {}", kind));
  }
  WEIR_ASSIGN_OR_RETURN(const Table* h, SubTable(v, m, kMsgHeader, "the message header is damaged"));
  if (h == nullptr) return Bad("the message has no header");
  if (out.kind == MessageKind::kSchema) {
    WEIR_ASSIGN_OR_RETURN(auto schema, ParseSchema(v, h));
    out.schema = std::move(schema);
  } else {
    WEIR_ASSIGN_OR_RETURN(auto batch, ParseRecordBatch(v, h));
    out.batch = std::move(batch);
  }
  if (!v.EndTable() || !v.EndTable()) return Bad("the message is damaged");
  return out;
}

int64_t ArrayView::Offset(int64_t i) const {
  const bool wide = field->type == ArrowType::kLargeBinary || field->type == ArrowType::kLargeUtf8 ||
                    field->type == ArrowType::kLargeList;
  const char* p = offsets.data();
  if (wide) return static_cast<int64_t>(LoadLE64(p + 8 * i));
  return static_cast<int32_t>(LoadLE32(p + 4 * i));
}

int64_t ArrayView::Int64(int64_t i) const { return static_cast<int64_t>(LoadLE64(values.data() + 8 * i)); }

namespace {

// Walks a batch's nodes and buffers in field order: a local of one
// ResolveBatch call, on its thread. Every node and buffer is bounds-checked
// against the body; a bad one is an error, never an out-of-range read.
class BatchWalker {
 public:
  BatchWalker(const RecordBatchMeta& batch, std::string_view body, std::deque<std::string>* storage)
      : batch_(batch), body_(body), storage_(storage) {}

  Result<ArrayView> Column(const ArrowField& f) {
    if (node_ >= batch_.nodes.size()) return Bad("the record batch has fewer field nodes than its schema needs");
    const FieldNode n = batch_.nodes[node_++];
    if (n.length < 0 || n.null_count < 0 || n.null_count > n.length) {
      return Bad(fmt::format("column '{}': {} rows with {} nulls", f.name, n.length, n.null_count));
    }
    if (f.dictionary_encoded) return NotSupported("column '{}': dictionary-encoded columns are not supported", f.name);
    ArrayView a;
    a.field = &f;
    a.length = n.length;
    a.null_count = n.null_count;
    switch (f.type) {
      case ArrowType::kInt:
      case ArrowType::kTimestamp: {
        WEIR_RETURN_IF_ERROR(Validity(&a));
        WEIR_ASSIGN_OR_RETURN(a.values, Buffer());
        const size_t width = f.type == ArrowType::kInt ? static_cast<size_t>(f.bit_width / 8) : 8;
        if (a.values.size() / width < static_cast<uint64_t>(a.length)) {
          return Bad(fmt::format("column '{}': its values buffer is short", f.name));
        }
        return a;
      }
      case ArrowType::kBinary:
      case ArrowType::kUtf8:
      case ArrowType::kLargeBinary:
      case ArrowType::kLargeUtf8: {
        WEIR_RETURN_IF_ERROR(Validity(&a));
        WEIR_ASSIGN_OR_RETURN(a.offsets, Buffer());
        WEIR_ASSIGN_OR_RETURN(a.values, Buffer());
        WEIR_ASSIGN_OR_RETURN(int64_t end, CheckOffsets(a));
        if (static_cast<uint64_t>(end) > a.values.size()) {
          return Bad(fmt::format("column '{}': offsets point past its data", f.name));
        }
        return a;
      }
      case ArrowType::kList:
      case ArrowType::kLargeList:
      case ArrowType::kMap: {
        if (f.children.size() != 1) return Bad(fmt::format("column '{}': a list or map has one child", f.name));
        WEIR_RETURN_IF_ERROR(Validity(&a));
        WEIR_ASSIGN_OR_RETURN(a.offsets, Buffer());
        WEIR_ASSIGN_OR_RETURN(int64_t end, CheckOffsets(a));
        WEIR_ASSIGN_OR_RETURN(auto child, Column(f.children[0]));
        if (child.length < end) return Bad(fmt::format("column '{}': offsets point past its child", f.name));
        if (f.type == ArrowType::kMap &&
            (child.field->type != ArrowType::kStruct || child.field->children.size() != 2 ||
             child.children[0].null_count != 0)) {
          return Bad(fmt::format("column '{}': a map's entries are a struct of a non-null key and a value", f.name));
        }
        a.children.push_back(std::move(child));
        return a;
      }
      case ArrowType::kStruct: {
        WEIR_RETURN_IF_ERROR(Validity(&a));
        for (const auto& c : f.children) {
          WEIR_ASSIGN_OR_RETURN(auto child, Column(c));
          if (child.length < a.length) return Bad(fmt::format("column '{}': a child is shorter than it", f.name));
          a.children.push_back(std::move(child));
        }
        return a;
      }
      default:
        return NotSupported("column '{}': Arrow type {} is not supported", f.name, ArrowTypeName(f.type));
    }
  }

  Status Done() const {
    if (node_ != batch_.nodes.size() || buffer_ != batch_.buffers.size()) {
      return Bad(fmt::format("the record batch has {} field nodes and {} buffers; its schema needs {} and {}",
                             batch_.nodes.size(), batch_.buffers.size(), node_, buffer_));
    }
    return Status::Ok();
  }

 private:
  Result<std::string_view> Buffer() {
    if (buffer_ >= batch_.buffers.size()) return Bad("the record batch has fewer buffers than its schema needs");
    const BufferRef r = batch_.buffers[buffer_++];
    if (r.offset < 0 || r.length < 0 || static_cast<uint64_t>(r.offset) > body_.size() ||
        static_cast<uint64_t>(r.length) > body_.size() - static_cast<uint64_t>(r.offset)) {
      return Bad(fmt::format("a buffer at {} of {} bytes is outside the {}-byte body", r.offset, r.length,
                             body_.size()));
    }
    std::string_view data = body_.substr(static_cast<size_t>(r.offset), static_cast<size_t>(r.length));
    if (!batch_.codec || data.empty()) return data;
    // A compressed buffer: its uncompressed length (int64 LE; -1 = stored
    // as is), then the frame.
    if (data.size() < 8) return Bad("a compressed buffer is shorter than its length prefix");
    const auto raw = static_cast<int64_t>(LoadLE64(data.data()));
    data.remove_prefix(8);
    if (raw == -1) return data;
    if (raw == 0) return std::string_view();  // Arrow Java writes an empty buffer as its prefix alone
    if (raw < 0 || static_cast<uint64_t>(raw) > kMaxIpcDecompressedBytes - decompressed_) {
      return Bad(fmt::format("the body decompresses to more than {} bytes", kMaxIpcDecompressedBytes));
    }
    auto out = wal::DecompressRecords(*batch_.codec == 0 ? wal::kCodecLz4 : wal::kCodecZstd, data,
                                      static_cast<size_t>(raw));
    if (!out.ok()) return Bad(fmt::format("a compressed buffer: {}", out.status().message()));
    if (out->size() != static_cast<size_t>(raw)) {
      return Bad(fmt::format("a buffer decompressed to {} bytes, not the {} it names", out->size(), raw));
    }
    decompressed_ += out->size();
    storage_->push_back(std::move(*out));
    return std::string_view(storage_->back());
  }

  Status Validity(ArrayView* a) {
    WEIR_ASSIGN_OR_RETURN(auto bits, Buffer());
    if (a->null_count == 0) return Status::Ok();  // the bitmap may be left out
    const uint64_t need = static_cast<uint64_t>(a->length / 8 + (a->length % 8 != 0));
    if (bits.size() < need) return Bad(fmt::format("column '{}': its validity bitmap is short", a->field->name));
    a->validity = bits;
    return Status::Ok();
  }

  // Checks (length + 1) offsets: non-negative, non-decreasing; returns the last.
  static Result<int64_t> CheckOffsets(const ArrayView& a) {
    if (a.length == 0) return int64_t{0};  // the buffer may be empty
    const bool wide = a.field->type == ArrowType::kLargeBinary || a.field->type == ArrowType::kLargeUtf8 ||
                      a.field->type == ArrowType::kLargeList;
    const size_t width = wide ? 8 : 4;
    if (a.offsets.size() / width <= static_cast<uint64_t>(a.length)) {
      return Bad(fmt::format("column '{}': its offsets buffer is short", a.field->name));
    }
    int64_t prev = a.Offset(0);
    if (prev < 0) return Bad(fmt::format("column '{}': a negative offset", a.field->name));
    for (int64_t i = 1; i <= a.length; ++i) {
      const int64_t o = a.Offset(i);
      if (o < prev) return Bad(fmt::format("column '{}': offsets go backwards at row {}", a.field->name, i - 1));
      prev = o;
    }
    return prev;
  }

  const RecordBatchMeta& batch_;
  std::string_view body_;
  std::deque<std::string>* storage_;
  size_t node_ = 0, buffer_ = 0;
  uint64_t decompressed_ = 0;
};

}  // namespace

Result<std::vector<ArrayView>> ResolveBatch(const ArrowSchema& schema, const RecordBatchMeta& batch,
                                            std::string_view body, std::deque<std::string>* storage) {
  BatchWalker w(batch, body, storage);
  std::vector<ArrayView> out;
  out.reserve(schema.fields.size());
  for (const auto& f : schema.fields) {
    WEIR_ASSIGN_OR_RETURN(auto col, w.Column(f));
    if (col.length != batch.length) {
      return Bad(fmt::format("column '{}' has {} rows in a batch of {}", f.name, col.length, batch.length));
    }
    out.push_back(std::move(col));
  }
  WEIR_RETURN_IF_ERROR(w.Done());
  return out;
}

}  // namespace weir::flight
