// The record-section codecs of Kafka RecordBatch v2: gzip, snappy, lz4 and
// zstd (attributes bits 0-2). Kafka batches are stored as sent; these turn
// their records back into bytes for readers, and build compressed batches for
// tests and benchmarks. Stateless functions, thread-safe; each call makes and
// frees its own codec context. No exception escapes.
//
// Formats, as Kafka clients send them (docs/format/record_batch.md):
//   gzip    a gzip stream (RFC 1952); several members are read in sequence
//   snappy  raw snappy (librdkafka) or the snappy-java framing (the Java
//           client): magic "\x82SNAPPY\0", version and compatible version
//           (int32 BE each, not checked), then blocks of int32 BE length +
//           raw snappy; told apart by the magic, which no valid raw snappy
//           stream can start with (its first element would be a copy)
//   lz4     LZ4 frames (not the bare block format); several in sequence
//           (on ingest: one frame, independent blocks, no dictionary id)
//   zstd    zstd frames, streamed, so a frame without a content size is fine
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace weir::wal {

// Codec ids: the compression bits of a batch's attributes.
inline constexpr int kCodecNone = 0;
inline constexpr int kCodecGzip = 1;
inline constexpr int kCodecSnappy = 2;
inline constexpr int kCodecLz4 = 3;
inline constexpr int kCodecZstd = 4;

// "none", "gzip", "snappy", "lz4", "zstd", or "unknown".
std::string_view CodecName(int codec);

// Decompresses a batch's record section. The output may be at most
// `max_output` bytes: more is kCorruption naming the limit (a decompression
// bomb is refused as soon as it passes the limit; retrying cannot help).
// Damaged or truncated input is kCorruption naming the codec; an unknown
// codec (5-7) kNotSupported; an allocation failure kResourceExhausted.
// kCodecNone returns a copy of the input (bounded the same way).
// `as_ingested`: also refuse what Kafka's own readers cannot read, so no
// batch is stored that a Java consumer would fail on: for lz4, anything but
// one frame of independent blocks without a dictionary id (the Java client's
// KafkaLZ4BlockInputStream reads no more). Reads of stored batches leave it
// false and take every form listed above.
Result<std::string> DecompressRecords(int codec, std::string_view compressed, size_t max_output,
                                      bool as_ingested = false);
// Whether a DecompressRecords failure is its output passing the limit (not
// damaged input).
bool DecompressedPastLimit(const Status& st);

// Compresses a record section as a Kafka producer would: gzip, raw snappy
// (as librdkafka sends it), one LZ4 frame, one zstd frame (level 3).
// kCodecNone returns a copy; an unknown codec is kInvalidArgument.
Result<std::string> CompressRecords(int codec, std::string_view raw);

// The snappy-java framing of the Java client, blocks of `block_size` input
// bytes (snappy-java's default is 32 KiB); DecompressRecords reads both forms.
Result<std::string> CompressSnappyJavaFramed(std::string_view raw, size_t block_size = 32 * 1024);

}  // namespace weir::wal
