#include "wal/record_batch.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <new>
#include <utility>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "wal/compression.h"

namespace weir::wal {
namespace {

// Byte offsets of the header fields.
constexpr size_t kBaseOffsetPos = 0;
constexpr size_t kBatchLengthPos = 8;
constexpr size_t kLeaderEpochPos = 12;
constexpr size_t kMagicPos = 16;
constexpr size_t kCrcPos = 17;
constexpr size_t kAttributesPos = 21;  // the CRC covers [21, end)
constexpr size_t kLastOffsetDeltaPos = 23;
constexpr size_t kBaseTimestampPos = 27;
constexpr size_t kMaxTimestampPos = 35;
constexpr size_t kProducerIdPos = 43;
constexpr size_t kProducerEpochPos = 51;
constexpr size_t kBaseSequencePos = 53;
constexpr size_t kRecordCountPos = 57;

// batchLength counts the bytes after itself, so a record-less batch has 49.
constexpr int32_t kMinBatchLength = static_cast<int32_t>(kRecordBatchHeaderSize - 12);
// Smallest encoded record: a one-byte length varint and six one-byte fields.
constexpr size_t kMinRecordSize = 7;
constexpr uint64_t kMaxInt32 = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

// Wrapping arithmetic, so timestamp deltas round-trip even at the int64 extremes.
int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// Record and RecordView (S: std::string or std::string_view).
template <typename S>
size_t NullableSize(const std::optional<S>& s) {
  return s ? VarintSize(static_cast<int64_t>(s->size())) + s->size() : VarintSize(-1);
}
template <typename S>
void PutNullable(std::string* out, const std::optional<S>& s) {
  if (!s) {
    PutVarint(out, -1);
    return;
  }
  PutVarint(out, static_cast<int64_t>(s->size()));
  out->append(std::string_view(*s));
}

// Rejects what a batch cannot represent: Kafka lengths and counts are int32.
template <typename R>
Status CheckEncodable(const R& r, size_t index) {
  auto too_big = [&](std::string_view field, size_t n) {
    return InvalidArgument("record {}: {} of {} bytes exceeds the int32 limit", index, field, n);
  };
  if (r.key && r.key->size() > kMaxInt32) return too_big("key", r.key->size());
  if (r.value && r.value->size() > kMaxInt32) return too_big("value", r.value->size());
  if (r.headers.size() > kMaxInt32) return InvalidArgument("record {}: too many headers", index);
  for (const auto& h : r.headers) {
    if (h.key.size() > kMaxInt32) return too_big("header key", h.key.size());
    if (h.value && h.value->size() > kMaxInt32) return too_big("header value", h.value->size());
  }
  return Status::Ok();
}

// Bytes of a record after its length varint.
template <typename R>
size_t RecordBodySize(const R& r, int64_t timestamp_delta, int64_t offset_delta) {
  size_t n = 1 /* attributes */ + VarintSize(timestamp_delta) + VarintSize(offset_delta) + NullableSize(r.key) +
             NullableSize(r.value) + VarintSize(static_cast<int64_t>(r.headers.size()));
  for (const auto& h : r.headers) {
    n += VarintSize(static_cast<int64_t>(h.key.size())) + h.key.size() + NullableSize(h.value);
  }
  return n;
}

// Reads the fields of one record body: a local of one decode, on its thread.
// Bounds-checked; every error (kCorruption) names the record index and field.
class RecordReader {
 public:
  RecordReader(std::string_view body, int32_t index) : r_(body), size_(body.size()), index_(index) {}

  size_t remaining() const { return r_.remaining(); }

  Status U8(std::string_view field, uint8_t* v) {
    if (!r_.GetU8(v)) return Overrun(field);
    return Status::Ok();
  }
  Status Varint(std::string_view field, int64_t* v) {
    if (!r_.GetVarint(v)) return Overrun(field);
    return Status::Ok();
  }
  // An int32 field: Kafka's readers refuse more than 5 bytes.
  Status Varint32(std::string_view field, int64_t* v) {
    int32_t v32 = 0;
    if (!r_.GetVarint32(&v32)) return Overrun(field);
    *v = v32;
    return Status::Ok();
  }
  // A length-prefixed byte string; -1 is null where `nullable`. A null `out`
  // only checks it.
  Status Bytes(std::string_view field, bool nullable, std::optional<std::string>* out) {
    int64_t len = 0;
    WEIR_RETURN_IF_ERROR(Varint32(field, &len));
    if (len == -1 && nullable) {
      if (out) out->reset();
      return Status::Ok();
    }
    if (len < 0) return Corruption("record {}: {} length {} is invalid", index_, field, len);
    if (static_cast<uint64_t>(len) > r_.remaining()) {
      return Corruption("record {}: {} length {} exceeds the {} bytes left in the record", index_, field, len,
                        r_.remaining());
    }
    std::string_view bytes;
    r_.GetBytes(static_cast<size_t>(len), &bytes);
    if (out) out->emplace(bytes);
    return Status::Ok();
  }

 private:
  Status Overrun(std::string_view field) const {
    return Corruption("record {}: {} is truncated or malformed (record length {})", index_, field, size_);
  }

  ByteReader r_;
  size_t size_;
  int32_t index_;
};

// Decodes record `index` into *out, or with a null `out` only checks it,
// then also that its offsetDelta is its index (offsets dense, as a producer
// writes them). `timestamp` (if set) gets the record's timestamp, as a reader
// sees it.
Status DecodeRecord(ByteReader* batch, const BatchHeader& h, int32_t index, DecodedRecord* out, int64_t* timestamp,
                    size_t* overhead, bool* command_shaped = nullptr) {
  int32_t length = 0;
  if (!batch->GetVarint32(&length)) {
    return Corruption("record {}: length is truncated or malformed ({} bytes left in the batch)", index,
                      batch->remaining());
  }
  if (length < 0 || static_cast<uint64_t>(length) > batch->remaining()) {
    return Corruption("record {}: length {} does not fit the {} bytes left in the batch", index, length,
                      batch->remaining());
  }
  std::string_view body;
  batch->GetBytes(static_cast<size_t>(length), &body);
  RecordReader r(body, index);

  uint8_t attributes = 0;  // unused by Kafka v2
  int64_t timestamp_delta = 0;
  int64_t offset_delta = 0;
  WEIR_RETURN_IF_ERROR(r.U8("attributes", &attributes));
  WEIR_RETURN_IF_ERROR(r.Varint("timestampDelta", &timestamp_delta));
  WEIR_RETURN_IF_ERROR(r.Varint32("offsetDelta", &offset_delta));
  if (offset_delta < 0 || offset_delta > h.last_offset_delta) {
    return Corruption("record {}: offsetDelta {} is outside [0, lastOffsetDelta {}]", index, offset_delta,
                      h.last_offset_delta);
  }
  if (!out && offset_delta != index) {
    return Corruption("record {}: offsetDelta {} is not its index (offsets in a batch are dense)", index,
                      offset_delta);
  }
  Record scratch;
  Record& rec = out ? out->record : scratch;
  WEIR_RETURN_IF_ERROR(r.Bytes("key", true, out ? &rec.key : nullptr));
  WEIR_RETURN_IF_ERROR(r.Bytes("value", true, out ? &rec.value : nullptr));

  int64_t header_count = 0;
  WEIR_RETURN_IF_ERROR(r.Varint32("headerCount", &header_count));
  // Each header takes at least two bytes (two one-byte length varints).
  if (header_count < 0 || static_cast<uint64_t>(header_count) > r.remaining() / 2) {
    return Corruption("record {}: headerCount {} does not fit the {} bytes left in the record", index, header_count,
                      r.remaining());
  }
  *overhead += static_cast<size_t>(header_count) * kRecordHeaderCost;
  if (*overhead > OverheadLimit(out != nullptr)) {
    return Corruption("record {}: the batch has too many records and headers to decode (more than {} bytes of them)",
                      index, OverheadLimit(out != nullptr));
  }
  if (out) rec.headers.resize(static_cast<size_t>(header_count));
  const bool shape_wanted = command_shaped != nullptr && header_count == 1;
  for (int64_t i = 0; i < header_count; ++i) {
    std::optional<std::string> key;
    WEIR_RETURN_IF_ERROR(r.Bytes("header key", false, out || shape_wanted ? &key : nullptr));
    if (shape_wanted) *command_shaped = key->empty();
    RecordHeader* hdr = out ? &rec.headers[static_cast<size_t>(i)] : nullptr;
    if (hdr) hdr->key = std::move(*key);
    WEIR_RETURN_IF_ERROR(r.Bytes("header value", true, hdr ? &hdr->value : nullptr));
  }
  if (r.remaining() != 0) {
    return Corruption("record {}: {} bytes left over after its fields (length {})", index, r.remaining(), length);
  }
  const int64_t ts =
      (h.attributes & kTimestampLogAppendTime) ? h.max_timestamp : WrapAdd(h.base_timestamp, timestamp_delta);
  if (timestamp) *timestamp = ts;
  if (!out) return Status::Ok();
  out->offset = WrapAdd(h.base_offset, offset_delta);
  rec.timestamp = ts;
  return Status::Ok();
}

// Reads the header and checks what locating the batch needs: size, magic, length.
Result<BatchHeader> ParseFraming(std::string_view data) {
  if (data.size() < kRecordBatchHeaderSize) {
    return Corruption("record batch truncated: {} bytes, header needs {}", data.size(), kRecordBatchHeaderSize);
  }
  const char* p = data.data();
  BatchHeader h;
  h.base_offset = static_cast<int64_t>(LoadBE64(p + kBaseOffsetPos));
  h.batch_length = static_cast<int32_t>(LoadBE32(p + kBatchLengthPos));
  h.partition_leader_epoch = static_cast<int32_t>(LoadBE32(p + kLeaderEpochPos));
  h.magic = static_cast<int8_t>(p[kMagicPos]);
  h.crc = LoadBE32(p + kCrcPos);
  h.attributes = static_cast<int16_t>(LoadBE16(p + kAttributesPos));
  h.last_offset_delta = static_cast<int32_t>(LoadBE32(p + kLastOffsetDeltaPos));
  h.base_timestamp = static_cast<int64_t>(LoadBE64(p + kBaseTimestampPos));
  h.max_timestamp = static_cast<int64_t>(LoadBE64(p + kMaxTimestampPos));
  h.producer_id = static_cast<int64_t>(LoadBE64(p + kProducerIdPos));
  h.producer_epoch = static_cast<int16_t>(LoadBE16(p + kProducerEpochPos));
  h.base_sequence = static_cast<int32_t>(LoadBE32(p + kBaseSequencePos));
  h.record_count = static_cast<int32_t>(LoadBE32(p + kRecordCountPos));

  if (h.magic != kRecordBatchMagic) {
    return Corruption("record batch magic {} is not supported (want {})", h.magic, kRecordBatchMagic);
  }
  if (h.batch_length < kMinBatchLength) {
    return Corruption("record batch length {} is below the minimum {}", h.batch_length, kMinBatchLength);
  }
  if (h.total_size() > data.size()) {
    return Corruption("record batch truncated: header says {} bytes, have {}", h.total_size(), data.size());
  }
  return h;
}

// Checks the CRC-covered header fields.
Status CheckFields(const BatchHeader& h) {
  if (h.record_count < 0) return Corruption("record batch recordCount {} is negative", h.record_count);
  if (h.last_offset_delta < 0) return Corruption("record batch lastOffsetDelta {} is negative", h.last_offset_delta);
  return Status::Ok();
}

// Encodes the batch uncompressed, then replaces its record section with the
// compressed one and reseals it, as a Kafka producer does.
template <typename R>
Status EncodeCompressed(const std::vector<R>& records, const EncodeOptions& options, std::string* out) {
  const int codec = options.attributes & kCompressionMask;
  EncodeOptions plain_options = options;
  plain_options.attributes = static_cast<int16_t>(options.attributes & ~kCompressionMask);
  std::string plain;
  WEIR_RETURN_IF_ERROR(EncodeRecordBatch(records, plain_options, &plain));
  WEIR_ASSIGN_OR_RETURN(const std::string compressed,
                        CompressRecords(codec, std::string_view(plain).substr(kRecordBatchHeaderSize)));
  const uint64_t batch_length = static_cast<uint64_t>(kMinBatchLength) + compressed.size();
  if (batch_length > kMaxInt32) return InvalidArgument("record batch exceeds the int32 length limit");

  const size_t start = out->size();
  out->reserve(start + 12 + batch_length);
  out->append(plain, 0, kRecordBatchHeaderSize);
  out->append(compressed);
  char* batch = out->data() + start;
  StoreBE32(batch + kBatchLengthPos, static_cast<uint32_t>(batch_length));
  batch[kAttributesPos] = static_cast<char>(static_cast<uint16_t>(options.attributes) >> 8);
  batch[kAttributesPos + 1] = static_cast<char>(options.attributes & 0xff);
  StoreBE32(batch + kCrcPos, Crc32c(batch + kAttributesPos, out->size() - start - kAttributesPos));
  return Status::Ok();
}

// EncodeRecordBatch, for Record and RecordView.
template <typename R>
Status EncodeBatch(const std::vector<R>& records, const EncodeOptions& options, std::string* out) {
  if (records.empty()) return InvalidArgument("record batch needs at least one record");
  const int codec = options.attributes & kCompressionMask;
  if (codec > kCodecZstd) {
    return InvalidArgument("unknown compression codec {} (known: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)", codec);
  }
  if (options.attributes & kControlFlag) return InvalidArgument("cannot encode control record batches");
  if (codec != kCodecNone) return EncodeCompressed(records, options, out);
  if (records.size() - 1 > kMaxInt32) return InvalidArgument("record batch of {} records is too large", records.size());

  // Kafka producers: baseTimestamp is the first record's, deltas may be negative.
  const int64_t base_timestamp = records.front().timestamp;
  int64_t max_timestamp = base_timestamp;
  std::vector<size_t> body_sizes;
  body_sizes.reserve(records.size());
  uint64_t batch_length = kMinBatchLength;
  for (size_t i = 0; i < records.size(); ++i) {
    const R& r = records[i];
    WEIR_RETURN_IF_ERROR(CheckEncodable(r, i));
    max_timestamp = std::max(max_timestamp, r.timestamp);
    const size_t body = RecordBodySize(r, WrapSub(r.timestamp, base_timestamp), static_cast<int64_t>(i));
    body_sizes.push_back(body);
    batch_length += VarintSize(static_cast<int64_t>(body)) + body;
    if (batch_length > kMaxInt32) return InvalidArgument("record batch exceeds the int32 length limit");
  }

  const size_t start = out->size();
  out->reserve(start + 12 + batch_length);
  PutBE64(out, static_cast<uint64_t>(options.base_offset));
  PutBE32(out, static_cast<uint32_t>(batch_length));
  PutBE32(out, static_cast<uint32_t>(options.partition_leader_epoch));
  out->push_back(static_cast<char>(kRecordBatchMagic));
  PutBE32(out, 0);  // CRC, filled in below
  PutBE16(out, static_cast<uint16_t>(options.attributes));
  PutBE32(out, static_cast<uint32_t>(records.size() - 1));
  PutBE64(out, static_cast<uint64_t>(base_timestamp));
  PutBE64(out, static_cast<uint64_t>(max_timestamp));
  PutBE64(out, static_cast<uint64_t>(options.producer_id));
  PutBE16(out, static_cast<uint16_t>(options.producer_epoch));
  PutBE32(out, static_cast<uint32_t>(options.base_sequence));
  PutBE32(out, static_cast<uint32_t>(records.size()));

  for (size_t i = 0; i < records.size(); ++i) {
    const R& r = records[i];
    PutVarint(out, static_cast<int64_t>(body_sizes[i]));
    out->push_back(0);  // record attributes
    PutVarint(out, WrapSub(r.timestamp, base_timestamp));
    PutVarint(out, static_cast<int64_t>(i));
    PutNullable(out, r.key);
    PutNullable(out, r.value);
    PutVarint(out, static_cast<int64_t>(r.headers.size()));
    for (const auto& h : r.headers) {
      PutVarint(out, static_cast<int64_t>(h.key.size()));
      out->append(h.key);
      PutNullable(out, h.value);
    }
  }
  assert(out->size() - start == 12 + batch_length);

  char* batch = out->data() + start;
  StoreBE32(batch + kCrcPos, Crc32c(batch + kAttributesPos, out->size() - start - kAttributesPos));
  return Status::Ok();
}

}  // namespace

Status EncodeRecordBatch(const std::vector<Record>& records, const EncodeOptions& options, std::string* out) {
  return EncodeBatch(records, options, out);
}

Status EncodeRecordBatch(const std::vector<RecordView>& records, const EncodeOptions& options, std::string* out) {
  return EncodeBatch(records, options, out);
}

Result<BatchHeader> ParseBatchHeader(std::string_view data) {
  WEIR_ASSIGN_OR_RETURN(BatchHeader h, ParseFraming(data));
  WEIR_RETURN_IF_ERROR(CheckFields(h));
  return h;
}

// Checks the CRC before the covered fields, so a damaged byte reads as a CRC mismatch.
Result<BatchHeader> VerifyBatchCrc(std::string_view data) {
  WEIR_ASSIGN_OR_RETURN(BatchHeader h, ParseFraming(data));
  const uint32_t computed = Crc32c(data.substr(kAttributesPos, h.total_size() - kAttributesPos));
  if (computed != h.crc) {
    return Corruption("record batch CRC mismatch: stored 0x{:08x}, computed 0x{:08x}", h.crc, computed);
  }
  return h;
}

Result<BatchHeader> VerifyBatch(std::string_view data) {
  WEIR_ASSIGN_OR_RETURN(BatchHeader h, VerifyBatchCrc(data));
  WEIR_RETURN_IF_ERROR(CheckFields(h));
  return h;
}

uint32_t Crc32cExtendVerifiedBatch(uint32_t crc, const BatchHeader& h, std::string_view batch) {
  return Crc32cCombine(Crc32cExtend(crc, batch.data(), kAttributesPos), h.crc, h.total_size() - kAttributesPos);
}

// Decodes the first batch in `batch`; bytes after it are ignored, as in VerifyBatch.
namespace {
// DecodeRecords, or with a null `out` ValidateRecords; `h` is VerifyBatch's.
Status WalkRecords(const BatchHeader& h, std::string_view batch, size_t max_decompressed,
                   std::vector<DecodedRecord>* out, int64_t* max_timestamp = nullptr, int32_t* command_at = nullptr) {
  std::string_view body = batch.substr(kRecordBatchHeaderSize, h.total_size() - kRecordBatchHeaderSize);
  std::string decompressed;
  if (h.compression() != kCodecNone) {
    // Ingest (ValidateRecords) refuses what Kafka's readers could not read.
    auto d = DecompressRecords(h.compression(), body, max_decompressed, /*as_ingested=*/out == nullptr);
    if (!d.ok()) return d.status().WithContext("record batch");
    decompressed = std::move(d).value();
    body = decompressed;
  }
  // Bound recordCount by the bytes present before reserving for it.
  if (static_cast<size_t>(h.record_count) > body.size() / kMinRecordSize) {
    return Corruption("record batch recordCount {} does not fit its {} bytes of records", h.record_count, body.size());
  }
  const size_t max_overhead = OverheadLimit(out != nullptr);
  size_t overhead = static_cast<size_t>(h.record_count) * kDecodedRecordCost;
  if (overhead > max_overhead) {
    return Corruption("record batch recordCount {} is too many records to decode (more than {} bytes of them)",
                      h.record_count, max_overhead);
  }
  if (out) out->resize(static_cast<size_t>(h.record_count));
  ByteReader reader(body);
  int64_t ts = 0;
  if (command_at) *command_at = -1;
  for (int32_t i = 0; i < h.record_count; ++i) {
    bool shaped = false;
    WEIR_RETURN_IF_ERROR(DecodeRecord(&reader, h, i, out ? &(*out)[static_cast<size_t>(i)] : nullptr, &ts, &overhead,
                                      command_at && *command_at < 0 ? &shaped : nullptr));
    if (shaped) *command_at = i;
    if (max_timestamp) *max_timestamp = i == 0 ? ts : std::max(*max_timestamp, ts);
  }
  if (reader.remaining() != 0) {
    if (h.record_count == 0) return Corruption("record batch of 0 records has {} bytes of records", reader.remaining());
    return Corruption("record batch has {} trailing bytes after record {}", reader.remaining(), h.record_count - 1);
  }
  return Status::Ok();
}
}  // namespace

Result<std::vector<DecodedRecord>> DecodeRecords(std::string_view batch, size_t max_decompressed) {
  WEIR_ASSIGN_OR_RETURN(BatchHeader h, VerifyBatch(batch));
  std::vector<DecodedRecord> records;
  try {
    WEIR_RETURN_IF_ERROR(WalkRecords(h, batch, max_decompressed, &records));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory decoding a record batch of {} records", h.record_count);
  }
  return records;
}

Status ValidateRecords(const BatchHeader& verified, std::string_view batch, size_t max_decompressed,
                       int64_t* max_timestamp, int32_t* command_at) {
  if (batch.size() < verified.total_size()) return Corruption("record batch shorter than its header says");
  return WalkRecords(verified, batch, max_decompressed, nullptr, max_timestamp, command_at);
}

void SetBaseOffset(std::string* batch, size_t pos, int64_t base_offset) {
  assert(pos <= batch->size() && batch->size() - pos >= kRecordBatchHeaderSize);
  if (pos > batch->size() || batch->size() - pos < 8) return;
  const auto v = static_cast<uint64_t>(base_offset);
  char* p = batch->data() + pos + kBaseOffsetPos;
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * (7 - i)));
}

namespace {
// Sets or clears the timestamp-type bit, sets maxTimestamp, then the CRC.
void SetTimestamps(std::string* batch, bool log_append_time, int64_t timestamp_ms) {
  if (batch->size() < kRecordBatchHeaderSize) return;
  char* p = batch->data();
  uint16_t attrs = static_cast<uint16_t>((static_cast<uint8_t>(p[kAttributesPos]) << 8) |
                                         static_cast<uint8_t>(p[kAttributesPos + 1]));
  if (log_append_time) {
    attrs |= static_cast<uint16_t>(kTimestampLogAppendTime);
  } else {
    attrs &= static_cast<uint16_t>(~kTimestampLogAppendTime);
  }
  p[kAttributesPos] = static_cast<char>(attrs >> 8);
  p[kAttributesPos + 1] = static_cast<char>(attrs);
  const auto ts = static_cast<uint64_t>(timestamp_ms);
  for (int i = 0; i < 8; ++i) p[kMaxTimestampPos + i] = static_cast<char>(ts >> (8 * (7 - i)));
  StoreBE32(p + kCrcPos, Crc32c(p + kAttributesPos, batch->size() - kAttributesPos));
}
}  // namespace

void SetCreateTime(std::string* batch, int64_t timestamp_ms) { SetTimestamps(batch, false, timestamp_ms); }
void SetLogAppendTime(std::string* batch, int64_t timestamp_ms) { SetTimestamps(batch, true, timestamp_ms); }

}  // namespace weir::wal
