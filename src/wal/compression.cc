// Kafka's record-section codecs over zlib, snappy, liblz4 (frame API) and
// libzstd (streaming API).
#include "wal/compression.h"

#include <lz4frame.h>
#include <snappy.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <new>

#include "base/bytes.h"

namespace weir::wal {
namespace {

constexpr std::string_view kSnappyJavaMagic("\x82SNAPPY\0", 8);
constexpr size_t kSnappyJavaHeaderSize = 16;  // magic, version, compatible version
constexpr uint32_t kSnappyJavaVersion = 1;
constexpr size_t kFirstOutputChunk = 64 * 1024;

// Every message of TooLarge holds it (DecompressedPastLimit looks for it).
constexpr std::string_view kPastLimit = "the limit of";

Status TooLarge(int codec, size_t max_output) {
  if (codec == kCodecNone) return Corruption("records exceed {} {} bytes", kPastLimit, max_output);
  return Corruption("{}-compressed records decompress to more than {} {} bytes", CodecName(codec), kPastLimit,
                    max_output);
}

Status Damaged(int codec, std::string_view why) {
  return Corruption("{}-compressed records are corrupt: {}", CodecName(codec), why);
}

// An output buffer for streaming decoders, a local of one decompress call
// (its thread). It grows geometrically up to one byte past the limit, so
// passing the limit is seen (kCorruption) without writing past it.
class BoundedOutput {
 public:
  BoundedOutput(int codec, size_t max_output)
      : codec_(codec),
        max_output_(max_output),
        cap_(max_output == std::numeric_limits<size_t>::max() ? max_output : max_output + 1) {}

  // Room to write into; grows the buffer when full. kCorruption past the limit.
  Status MakeRoom() {
    if (used_ > max_output_) return TooLarge(codec_, max_output_);
    if (used_ < buf_.size()) return Status::Ok();
    if (buf_.size() >= cap_) return TooLarge(codec_, max_output_);
    const size_t grown = buf_.size() > cap_ / 2 ? cap_ : std::max(buf_.size() * 2, kFirstOutputChunk);
    buf_.resize(std::min(grown, cap_));
    return Status::Ok();
  }
  char* next() { return buf_.data() + used_; }
  size_t room() const { return buf_.size() - used_; }
  bool full() const { return used_ == buf_.size(); }
  // Records n bytes written at next(); kCorruption if that passed the limit.
  Status Advance(size_t n) {
    used_ += n;
    return used_ > max_output_ ? TooLarge(codec_, max_output_) : Status::Ok();
  }
  std::string Take() && {
    buf_.resize(used_);
    return std::move(buf_);
  }

 private:
  int codec_;
  size_t max_output_;
  size_t cap_;
  std::string buf_;
  size_t used_ = 0;
};

uInt ClampUInt(size_t n) { return static_cast<uInt>(std::min<size_t>(n, UINT_MAX)); }

// ---- gzip ---------------------------------------------------------------------

Result<std::string> GunzipRecords(std::string_view in, size_t max_output) {
  z_stream zs{};
  // 16 + MAX_WBITS: a gzip header and trailer, not zlib's.
  int rc = inflateInit2(&zs, 16 + MAX_WBITS);
  if (rc != Z_OK) {
    return rc == Z_MEM_ERROR ? ResourceExhausted("gzip: out of memory") : Internal("gzip: inflateInit2 failed: {}", rc);
  }
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);
  BoundedOutput out(kCodecGzip, max_output);
  size_t consumed = 0;
  while (true) {
    WEIR_RETURN_IF_ERROR(out.MakeRoom());
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + consumed));
    zs.avail_in = ClampUInt(in.size() - consumed);
    zs.next_out = reinterpret_cast<Bytef*>(out.next());
    zs.avail_out = ClampUInt(out.room());
    const uInt in_before = zs.avail_in;
    const uInt out_before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    consumed += in_before - zs.avail_in;
    WEIR_RETURN_IF_ERROR(out.Advance(out_before - zs.avail_out));
    if (rc == Z_STREAM_END) {
      if (consumed == in.size()) break;
      // Another gzip member follows (Java's GZIPInputStream reads them too).
      if (inflateReset(&zs) != Z_OK) return Internal("gzip: inflateReset failed");
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR) {
      if (zs.avail_out == 0) continue;  // the output was full: make room
      return Damaged(kCodecGzip, fmt::format("truncated ({} input bytes end inside the stream)", in.size()));
    }
    if (rc == Z_MEM_ERROR) return ResourceExhausted("gzip: out of memory");
    return Damaged(kCodecGzip, zs.msg != nullptr ? zs.msg : fmt::format("inflate error {}", rc));
  }
  return std::move(out).Take();
}

Result<std::string> GzipRecords(std::string_view raw) {
  z_stream zs{};
  int rc = deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  if (rc != Z_OK) {
    return rc == Z_MEM_ERROR ? ResourceExhausted("gzip: out of memory") : Internal("gzip: deflateInit2 failed: {}", rc);
  }
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, deflateEnd);
  std::string out(deflateBound(&zs, ClampUInt(raw.size())) + 64, '\0');
  size_t consumed = 0;
  size_t produced = 0;
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data() + consumed));
    zs.avail_in = ClampUInt(raw.size() - consumed);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = ClampUInt(out.size() - produced);
    const uInt in_before = zs.avail_in;
    const uInt out_before = zs.avail_out;
    const bool last = consumed + in_before == raw.size();
    rc = deflate(&zs, last ? Z_FINISH : Z_NO_FLUSH);
    consumed += in_before - zs.avail_in;
    produced += out_before - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK && rc != Z_BUF_ERROR) return Internal("gzip: deflate failed: {}", rc);
  }
  out.resize(produced);
  return out;
}

// ---- snappy -------------------------------------------------------------------

// One raw snappy block appended to *out, within the limit.
Status UnsnappyBlock(std::string_view block, size_t max_output, std::string* out) {
  size_t n = 0;
  if (!snappy::GetUncompressedLength(block.data(), block.size(), &n)) {
    return Damaged(kCodecSnappy, "bad uncompressed-length prefix");
  }
  if (n > max_output - out->size()) return TooLarge(kCodecSnappy, max_output);
  // Checked before the output is allocated: a few bytes can claim 64 MiB.
  if (!snappy::IsValidCompressedBuffer(block.data(), block.size())) return Damaged(kCodecSnappy, "invalid block");
  const size_t start = out->size();
  out->resize(start + n);
  if (!snappy::RawUncompress(block.data(), block.size(), out->data() + start)) {
    return Damaged(kCodecSnappy, "invalid block");
  }
  return Status::Ok();
}

Result<std::string> UnsnappyRecords(std::string_view in, size_t max_output) {
  std::string out;
  if (!in.starts_with(kSnappyJavaMagic)) {
    WEIR_RETURN_IF_ERROR(UnsnappyBlock(in, max_output, &out));
    return out;
  }
  // snappy-java: the versions are not checked (every release writes 1 and 1).
  if (in.size() < kSnappyJavaHeaderSize) {
    return Damaged(kCodecSnappy, fmt::format("snappy-java header truncated ({} bytes)", in.size()));
  }
  size_t pos = kSnappyJavaHeaderSize;
  size_t index = 0;
  while (pos < in.size()) {
    if (in.size() - pos < 4) {
      return Damaged(kCodecSnappy, fmt::format("snappy-java block {} length truncated at byte {}", index, pos));
    }
    const uint32_t len = LoadBE32(in.data() + pos);
    pos += 4;
    if (len > in.size() - pos) {
      return Damaged(kCodecSnappy,
                     fmt::format("snappy-java block {} of {} bytes runs past the {} bytes left", index, len,
                                 in.size() - pos));
    }
    Status st = UnsnappyBlock(in.substr(pos, len), max_output, &out);
    if (!st.ok()) {
      return st.code() == Code::kCorruption ? st.WithContext(fmt::format("snappy-java block {}", index)) : st;
    }
    pos += len;
    ++index;
  }
  return out;
}

std::string SnappyBlock(std::string_view raw) {
  std::string out;
  snappy::Compress(raw.data(), raw.size(), &out);
  return out;
}

// ---- lz4 ----------------------------------------------------------------------

// What Kafka's Java reader takes of an LZ4 frame header: the frame magic
// (not a skippable frame), version 01, independent blocks, and neither a
// dictionary id nor the reserved bit.
Status CheckKafkaLz4Header(std::string_view in) {
  constexpr uint32_t kLz4FrameMagic = 0x184D2204;
  if (in.size() < 5) return Damaged(kCodecLz4, "input shorter than a frame header");
  const uint32_t magic = static_cast<uint32_t>(static_cast<uint8_t>(in[0])) |
                         static_cast<uint32_t>(static_cast<uint8_t>(in[1])) << 8 |
                         static_cast<uint32_t>(static_cast<uint8_t>(in[2])) << 16 |
                         static_cast<uint32_t>(static_cast<uint8_t>(in[3])) << 24;
  if (magic != kLz4FrameMagic) {
    return Damaged(kCodecLz4, fmt::format("frame magic {:#010x} is not 0x184d2204 (Kafka's readers take no other)",
                                          magic));
  }
  const auto flg = static_cast<uint8_t>(in[4]);
  if ((flg >> 6) != 1) return Damaged(kCodecLz4, fmt::format("frame version {} is not 1", flg >> 6));
  if ((flg & 0x20) == 0) {
    return Damaged(kCodecLz4, "a frame of linked blocks, which Kafka's readers do not take (use independent blocks)");
  }
  if ((flg & 0x03) != 0) {
    return Damaged(kCodecLz4, "a frame with a dictionary id or the reserved bit set, which Kafka's readers refuse");
  }
  return Status::Ok();
}

Result<std::string> Unlz4Records(std::string_view in, size_t max_output, bool as_ingested) {
  if (as_ingested) WEIR_RETURN_IF_ERROR(CheckKafkaLz4Header(in));
  LZ4F_dctx* raw_ctx = nullptr;
  if (LZ4F_isError(LZ4F_createDecompressionContext(&raw_ctx, LZ4F_VERSION))) {
    return ResourceExhausted("lz4: cannot create a decompression context");
  }
  std::unique_ptr<LZ4F_dctx, LZ4F_errorCode_t (*)(LZ4F_dctx*)> ctx(raw_ctx, LZ4F_freeDecompressionContext);
  if (in.empty()) return Damaged(kCodecLz4, "empty input (no frame)");
  BoundedOutput out(kCodecLz4, max_output);
  size_t consumed = 0;
  size_t hint = 1;  // 0 once a frame is complete
  while (consumed < in.size() || (hint != 0 && out.full())) {
    WEIR_RETURN_IF_ERROR(out.MakeRoom());
    size_t dst = out.room();
    size_t src = in.size() - consumed;
    hint = LZ4F_decompress(ctx.get(), out.next(), &dst, in.data() + consumed, &src, nullptr);
    if (LZ4F_isError(hint)) return Damaged(kCodecLz4, LZ4F_getErrorName(hint));
    consumed += src;
    WEIR_RETURN_IF_ERROR(out.Advance(dst));
    if (src == 0 && dst == 0 && !out.full()) break;  // no progress: the input ended inside a frame
    if (as_ingested && hint == 0 && consumed < in.size()) {
      // Kafka's reader stops at the first frame's end: it would never see the rest.
      return Damaged(kCodecLz4, fmt::format("{} bytes after the first frame (Kafka's readers take one frame)",
                                            in.size() - consumed));
    }
  }
  // After a complete frame the context starts the next one, so sequences work.
  if (hint != 0) return Damaged(kCodecLz4, fmt::format("truncated ({} input bytes end inside a frame)", in.size()));
  return std::move(out).Take();
}

Result<std::string> Lz4Records(std::string_view raw) {
  LZ4F_preferences_t prefs{};
  prefs.frameInfo.blockSizeID = LZ4F_max64KB;  // what the Java client uses
  prefs.frameInfo.blockMode = LZ4F_blockIndependent;
  prefs.frameInfo.contentSize = raw.size();
  std::string out(LZ4F_compressFrameBound(raw.size(), &prefs), '\0');
  const size_t n = LZ4F_compressFrame(out.data(), out.size(), raw.data(), raw.size(), &prefs);
  if (LZ4F_isError(n)) return Internal("lz4: compressing failed: {}", LZ4F_getErrorName(n));
  out.resize(n);
  return out;
}

// ---- zstd ---------------------------------------------------------------------

Result<std::string> UnzstdRecords(std::string_view in, size_t max_output) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx) return ResourceExhausted("zstd: cannot create a decompression context");
  if (in.empty()) return Damaged(kCodecZstd, "empty input (no frame)");
  BoundedOutput out(kCodecZstd, max_output);
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  size_t hint = 1;  // 0 once a frame is complete and flushed
  while (input.pos < input.size || (hint != 0 && out.full())) {
    WEIR_RETURN_IF_ERROR(out.MakeRoom());
    ZSTD_outBuffer output{out.next(), out.room(), 0};
    const size_t in_before = input.pos;
    hint = ZSTD_decompressStream(ctx.get(), &output, &input);
    if (ZSTD_isError(hint)) {
      if (ZSTD_getErrorCode(hint) == ZSTD_error_memory_allocation) return ResourceExhausted("zstd: out of memory");
      return Damaged(kCodecZstd, ZSTD_getErrorName(hint));
    }
    WEIR_RETURN_IF_ERROR(out.Advance(output.pos));
    if (input.pos == in_before && output.pos == 0 && !out.full()) break;  // no progress
  }
  if (hint != 0) return Damaged(kCodecZstd, fmt::format("truncated ({} input bytes end inside a frame)", in.size()));
  return std::move(out).Take();
}

Result<std::string> ZstdRecords(std::string_view raw) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3);
  if (ZSTD_isError(n)) return Internal("zstd: compressing failed: {}", ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

// Runs body, turning exceptions (bad_alloc from a huge resize) into a Status.
template <typename F>
Result<std::string> Guarded(std::string_view what, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("{}: out of memory", what);
  } catch (const std::exception& e) {
    return Internal("{}: unexpected exception: {}", what, e.what());
  }
}

}  // namespace

std::string_view CodecName(int codec) {
  switch (codec) {
    case kCodecNone:
      return "none";
    case kCodecGzip:
      return "gzip";
    case kCodecSnappy:
      return "snappy";
    case kCodecLz4:
      return "lz4";
    case kCodecZstd:
      return "zstd";
    default:
      return "unknown";
  }
}

bool DecompressedPastLimit(const Status& st) {
  return st.code() == Code::kCorruption && st.message().find(kPastLimit) != std::string::npos;
}

Result<std::string> DecompressRecords(int codec, std::string_view compressed, size_t max_output, bool as_ingested) {
  return Guarded("decompress records", [&]() -> Result<std::string> {
    switch (codec) {
      case kCodecNone:
        if (compressed.size() > max_output) return TooLarge(codec, max_output);
        return std::string(compressed);
      case kCodecGzip:
        return GunzipRecords(compressed, max_output);
      case kCodecSnappy:
        return UnsnappyRecords(compressed, max_output);
      case kCodecLz4:
        return Unlz4Records(compressed, max_output, as_ingested);
      case kCodecZstd:
        return UnzstdRecords(compressed, max_output);
      default:
        return NotSupported("unknown compression codec {} (known: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)", codec);
    }
  });
}

Result<std::string> CompressRecords(int codec, std::string_view raw) {
  return Guarded("compress records", [&]() -> Result<std::string> {
    switch (codec) {
      case kCodecNone:
        return std::string(raw);
      case kCodecGzip:
        return GzipRecords(raw);
      case kCodecSnappy:
        return SnappyBlock(raw);
      case kCodecLz4:
        return Lz4Records(raw);
      case kCodecZstd:
        return ZstdRecords(raw);
      default:
        return InvalidArgument("unknown compression codec {} (known: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)", codec);
    }
  });
}

Result<std::string> CompressSnappyJavaFramed(std::string_view raw, size_t block_size) {
  if (block_size == 0 || block_size > (1u << 30)) {
    return InvalidArgument("snappy-java block size {} is out of range (1..2^30)", block_size);
  }
  return Guarded("compress records (snappy-java)", [&]() -> Result<std::string> {
    std::string out(kSnappyJavaMagic);
    PutBE32(&out, kSnappyJavaVersion);
    PutBE32(&out, kSnappyJavaVersion);  // compatible version
    for (size_t pos = 0; pos < raw.size(); pos += block_size) {
      const std::string block = SnappyBlock(raw.substr(pos, block_size));
      PutBE32(&out, static_cast<uint32_t>(block.size()));
      out.append(block);
    }
    return out;
  });
}

}  // namespace weir::wal
