// Kafka RecordBatch v2 (magic 2): the chunk layout of every WAL slot and
// segment. Kafka batches are stored as sent; other front-ends encode records
// with EncodeRecordBatch. Stateless functions, thread-safe.
//
// Layout (big-endian), 61-byte header then the records:
//   baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (=2)
//   | crc uint32 (CRC-32C of everything from attributes to the end)
//   | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64
//   | producerId int64 | producerEpoch int16 | baseSequence int32 | recordCount int32
//   | records...
// Each record: length varint | attributes int8 | timestampDelta varint
//   | offsetDelta varint | keyLength varint (-1 = null) | key | valueLength varint
//   | value | headerCount varint | headers (keyLen varint, key, valueLen varint, value)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::wal {

inline constexpr size_t kRecordBatchHeaderSize = 61;
inline constexpr int8_t kRecordBatchMagic = 2;
inline constexpr int64_t kNoProducerId = -1;
inline constexpr int16_t kNoProducerEpoch = -1;
inline constexpr int32_t kNoSequence = -1;

// DecodeRecords refuses a compressed batch whose records decompress to more
// than this (a decompression bomb). Kafka producers' default batch sizes are
// around 1 MB, so real batches stay well below it.
inline constexpr size_t kMaxDecompressedRecordsBytes = 64 * 1024 * 1024;
// A batch whose decoded records and headers would take more than this in
// memory, besides their bytes, is refused by ValidateRecords: a header costs
// two bytes on the wire, so bytes alone do not bound a decode. Costs are
// fixed numbers, not sizeof (which a new field or another standard library
// changes): half a million records or about 900,000 headers. DecodeRecords,
// which reads stored batches, allows twice as much, so a batch once accepted
// stays readable if these change.
inline constexpr size_t kDecodedRecordCost = 128;
inline constexpr size_t kRecordHeaderCost = 72;
inline constexpr size_t kMaxDecodedRecordsOverheadBytes = 64 * 1024 * 1024;
// The limit ValidateRecords (ingest) or DecodeRecords (reads) applies.
constexpr size_t OverheadLimit(bool reading) {
  return reading ? 2 * kMaxDecodedRecordsOverheadBytes : kMaxDecodedRecordsOverheadBytes;
}

// attributes bits (Kafka): 0-2 compression, 3 timestamp type, 4 transactional, 5 control.
inline constexpr int16_t kCompressionMask = 0x07;
inline constexpr int16_t kTimestampLogAppendTime = 0x08;
inline constexpr int16_t kTransactionalFlag = 0x10;
inline constexpr int16_t kControlFlag = 0x20;

struct RecordHeader {
  std::string key;
  std::optional<std::string> value;  // Kafka allows null header values
};

// One record as a front-end hands it over / a reader gets it back.
struct Record {
  int64_t timestamp = 0;               // Unix ms
  std::optional<std::string> key;      // nullopt = null key
  std::optional<std::string> value;    // nullopt = null value (a Kafka tombstone)
  std::vector<RecordHeader> headers;
};

// A record whose bytes live elsewhere (an Arrow batch's buffers), encoded as
// a Record is without copying them into one first. The views must outlive
// the EncodeRecordBatch call.
struct RecordHeaderView {
  std::string_view key;
  std::optional<std::string_view> value;
};
struct RecordView {
  int64_t timestamp = 0;
  std::optional<std::string_view> key;
  std::optional<std::string_view> value;
  std::vector<RecordHeaderView> headers;
};

// The fixed fields of a batch header.
struct BatchHeader {
  int64_t base_offset = 0;
  int32_t batch_length = 0;  // bytes after the batchLength field
  int32_t partition_leader_epoch = 0;
  int8_t magic = kRecordBatchMagic;
  uint32_t crc = 0;
  int16_t attributes = 0;
  int32_t last_offset_delta = 0;
  int64_t base_timestamp = 0;
  int64_t max_timestamp = 0;
  int64_t producer_id = kNoProducerId;
  int16_t producer_epoch = kNoProducerEpoch;
  int32_t base_sequence = kNoSequence;
  int32_t record_count = 0;

  size_t total_size() const { return 12 + static_cast<size_t>(batch_length); }
  int64_t last_offset() const { return base_offset + last_offset_delta; }
  int compression() const { return attributes & kCompressionMask; }
};

struct EncodeOptions {
  int64_t base_offset = 0;
  int32_t partition_leader_epoch = 0;
  int64_t producer_id = kNoProducerId;
  int16_t producer_epoch = kNoProducerEpoch;
  int32_t base_sequence = kNoSequence;
  // Compression bits 1-4 compress the record section with that codec
  // (compression.h) as a Kafka producer does; the CRC covers the compressed bytes.
  int16_t attributes = 0;
};

// Appends one batch holding `records` (offsets base_offset + i) to *out.
// Fails with kInvalidArgument (appending nothing) for an empty record list, an
// unknown codec (5-7), the control flag, or a batch past the int32 length limit.
Status EncodeRecordBatch(const std::vector<Record>& records, const EncodeOptions& options, std::string* out);
Status EncodeRecordBatch(const std::vector<RecordView>& records, const EncodeOptions& options, std::string* out);

// Parses and checks the 61-byte header at the start of `data` (magic, length
// bounds); does not verify the CRC.
Result<BatchHeader> ParseBatchHeader(std::string_view data);

// Parses the header and verifies the CRC of the first batch in `data`.
// kCorruption names the field or CRC that failed.
Result<BatchHeader> VerifyBatch(std::string_view data);
// VerifyBatch without its checks of the fields the CRC covers (a negative
// record count or lastOffsetDelta): the framing and the CRC only, for a
// caller that judges those fields itself.
Result<BatchHeader> VerifyBatchCrc(std::string_view data);

// Crc32cExtend(crc, batch) for a whole batch (h.total_size() bytes of
// `batch`) whose header `h` came from VerifyBatch: its CRC, checked against
// the bytes, covers all but their first 21, so this costs 21 bytes and one
// Crc32cCombine instead of a second pass over the batch.
uint32_t Crc32cExtendVerifiedBatch(uint32_t crc, const BatchHeader& h, std::string_view batch);

// Verifies one batch and decodes its records, decompressing the record section
// first if the batch is compressed (its records may take at most
// `max_decompressed` bytes, else kCorruption naming the limit). Offsets are
// base_offset + offsetDelta of each record. kCorruption for damaged bytes,
// kNotSupported for an unknown codec (5-7).
struct DecodedRecord {
  int64_t offset = 0;
  Record record;
};
Result<std::vector<DecodedRecord>> DecodeRecords(std::string_view batch,
                                                 size_t max_decompressed = kMaxDecompressedRecordsBytes);
// The checks of DecodeRecords (decompressing if needed) without keeping the
// records, for a batch VerifyBatch already checked (`verified` is its answer):
// what a broker does before it stores a producer's batch as sent. Also
// checks that each record's offsetDelta is its index (a reader would
// otherwise see repeated offsets and gaps). `max_timestamp` (if set) gets the
// largest record timestamp; `command_at` (if set) the index of the first
// record shaped like an S2 command record (exactly one header, its name
// empty), or -1.
Status ValidateRecords(const BatchHeader& verified, std::string_view batch,
                       size_t max_decompressed = kMaxDecompressedRecordsBytes, int64_t* max_timestamp = nullptr,
                       int32_t* command_at = nullptr);

// Rewrites baseOffset of the batch starting at byte pos, in place (it is outside the CRC).
void SetBaseOffset(std::string* batch, size_t pos, int64_t base_offset);

// Stamps a whole batch (starting at byte 0) with the broker's clock, as
// Kafka's LogAppendTime does: sets the timestamp-type bit and maxTimestamp,
// then recomputes the CRC.
void SetLogAppendTime(std::string* batch, int64_t timestamp_ms);
// Makes a whole batch a CreateTime batch whose maxTimestamp is
// `timestamp_ms`: clears the timestamp-type bit, sets maxTimestamp, then
// recomputes the CRC.
void SetCreateTime(std::string* batch, int64_t timestamp_ms);

// Walks a concatenation of batches, verifying each; calls fn(header, bytes) for
// each. Stops at the first failure, naming the batch index and byte position.
template <typename Fn>
Status ForEachBatch(std::string_view data, Fn&& fn) {
  size_t pos = 0;
  size_t index = 0;
  while (pos < data.size()) {
    auto h = VerifyBatch(data.substr(pos));
    if (!h.ok()) return h.status().WithContext("batch " + std::to_string(index) + " at byte " + std::to_string(pos));
    WEIR_RETURN_IF_ERROR(fn(*h, data.substr(pos, h->total_size())));
    pos += h->total_size();
    ++index;
  }
  return Status::Ok();
}

}  // namespace weir::wal
