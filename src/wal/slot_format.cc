#include "wal/slot_format.h"

#include <cstring>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "wal/record_batch.h"

namespace weir::wal {

// Envelope layout (little-endian):
//   0 magic "WSLT" | 4 version u16 | 6 kind u8 | 7 reserved u8 | 8 epoch u64
//   | 16 seq u64 | 24 nonce u64 | 32 total size u64 | 40 footer offset u64
//   | 48 footer length u32 | 52 reserved u32 | 56 CRC-32C of bytes [0,56)
Status ValidateNodeId(std::string_view node) {
  if (node.empty() || node.size() > 64) {
    return InvalidArgument("invalid node id \"{}\": must be 1..64 characters", node);
  }
  if (node == "." || node == "..") return InvalidArgument("invalid node id \"{}\"", node);
  for (char c : node) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok) return InvalidArgument("invalid node id \"{}\": only [A-Za-z0-9._-] allowed", node);
  }
  return Status::Ok();
}

std::string SlotPrefix(std::string_view node, uint64_t epoch) {
  return fmt::format("wal/{}/{:020}/", node, epoch);
}

std::string SlotKey(std::string_view node, uint64_t epoch, uint64_t seq) {
  return fmt::format("wal/{}/{:020}/{:020}", node, epoch, seq);
}

void EncodeEnvelope(const Envelope& env, char* out) {
  std::string b;
  b.reserve(kEnvelopeSize);
  b.append(kEnvelopeMagic, 4);
  PutLE16(&b, kFormatVersion);
  b.push_back(static_cast<char>(env.kind));
  b.push_back(0);
  PutLE64(&b, env.epoch);
  PutLE64(&b, env.seq);
  PutLE64(&b, env.nonce);
  PutLE64(&b, env.total_size);
  PutLE64(&b, env.footer_offset);
  PutLE32(&b, env.footer_length);
  PutLE32(&b, 0);
  PutLE32(&b, Crc32c(b.data(), b.size()));
  std::memcpy(out, b.data(), kEnvelopeSize);
}

Result<Envelope> DecodeEnvelope(std::string_view data) {
  if (data.size() < kEnvelopeSize) {
    return Corruption("slot envelope truncated: {} bytes, need {}", data.size(), kEnvelopeSize);
  }
  if (std::memcmp(data.data(), kEnvelopeMagic, 4) != 0) return Corruption("slot envelope: bad magic");
  // The version before the CRC: a later version may lay the envelope out
  // otherwise, and its reader should be named, not a CRC mismatch.
  uint16_t version = LoadLE16(data.data() + 4);
  if (version != kFormatVersion) {
    return Corruption("slot envelope: unknown version {} (this build reads version {}; written by a newer weir?)",
                      version, kFormatVersion);
  }
  uint32_t stored = LoadLE32(data.data() + 56);
  uint32_t computed = Crc32c(data.data(), 56);
  if (stored != computed) {
    return Corruption("slot envelope CRC mismatch: stored {:#010x}, computed {:#010x}", stored, computed);
  }
  if (uint32_t reserved = LoadLE32(data.data() + 52); reserved != 0 || data[7] != 0) {
    return Corruption("slot envelope: reserved fields are {:#04x} and {:#010x}, not 0",
                      static_cast<uint8_t>(data[7]), reserved);
  }
  Envelope env;
  auto kind = static_cast<uint8_t>(data[6]);
  if (kind != static_cast<uint8_t>(SlotKind::kFlight) && kind != static_cast<uint8_t>(SlotKind::kPoison)) {
    return Corruption("slot envelope: unknown kind {}", kind);
  }
  env.kind = static_cast<SlotKind>(kind);
  env.epoch = LoadLE64(data.data() + 8);
  env.seq = LoadLE64(data.data() + 16);
  env.nonce = LoadLE64(data.data() + 24);
  env.total_size = LoadLE64(data.data() + 32);
  env.footer_offset = LoadLE64(data.data() + 40);
  env.footer_length = LoadLE32(data.data() + 48);
  if (env.kind == SlotKind::kPoison) {
    if (env.total_size != kEnvelopeSize || env.footer_length != 0) {
      return Corruption("poison envelope with size {} and footer length {}", env.total_size, env.footer_length);
    }
  } else if (env.footer_length < kFooterFixedSize || env.footer_offset < kEnvelopeSize ||
             env.footer_offset > env.total_size || env.footer_length != env.total_size - env.footer_offset) {
    return Corruption("slot envelope: footer [{}, +{}) does not end the {}-byte object", env.footer_offset,
                      env.footer_length, env.total_size);
  }
  return env;
}

std::string EncodePoison(uint64_t epoch, uint64_t seq, uint64_t nonce) {
  std::string out(kEnvelopeSize, '\0');
  Envelope env;
  env.kind = SlotKind::kPoison;
  env.epoch = epoch;
  env.seq = seq;
  env.nonce = nonce;
  env.total_size = kEnvelopeSize;
  env.footer_offset = kEnvelopeSize;
  env.footer_length = 0;
  EncodeEnvelope(env, out.data());
  return out;
}

size_t SlotBuilder::Add(uint64_t stream_id, std::string_view batches, uint32_t batch_count,
                        uint32_t record_count) {
  size_t index = pieces_.size();
  pieces_.push_back(Piece{batches, batch_count, record_count});
  auto [it, inserted] = chunk_of_.try_emplace(stream_id, chunks_.size());
  if (inserted) chunks_.push_back(Chunk{stream_id, {}});
  chunks_[it->second].pieces.push_back(index);
  payload_bytes_ += batches.size();
  return index;
}

size_t SlotBuilder::EncodedSize() const {
  return kEnvelopeSize + payload_bytes_ + kFooterFixedSize + kFooterEntrySize * chunks_.size();
}

// Footer: chunk count u32, then per chunk: stream id u64 | offset u64 | length u32
// | batch count u32 | record count u32 | CRC-32C u32; then CRC-32C of the footer
// bytes before it.
std::string SlotBuilder::Finish(uint64_t epoch, uint64_t seq, uint64_t nonce) {
  std::string out;
  FinishInto(epoch, seq, nonce, &out);
  return out;
}

void SlotBuilder::FinishInto(uint64_t epoch, uint64_t seq, uint64_t nonce, std::string* dst) {
  std::string& out = *dst;
  out.clear();
  out.reserve(EncodedSize());
  out.resize(kEnvelopeSize);
  positions_.assign(pieces_.size(), 0);
  std::vector<ChunkInfo> infos;
  infos.reserve(chunks_.size());
  for (const Chunk& chunk : chunks_) {
    ChunkInfo info;
    info.stream_id = chunk.stream_id;
    info.offset = out.size();
    for (size_t i : chunk.pieces) {
      positions_[i] = out.size();
      out.append(pieces_[i].bytes);
      info.batch_count += pieces_[i].batch_count;
      info.record_count += pieces_[i].record_count;
    }
    info.length = static_cast<uint32_t>(out.size() - info.offset);
    info.crc = Crc32c(out.data() + info.offset, info.length);
    infos.push_back(info);
  }
  size_t footer_offset = out.size();
  PutLE32(&out, static_cast<uint32_t>(infos.size()));
  for (const ChunkInfo& info : infos) {
    PutLE64(&out, info.stream_id);
    PutLE64(&out, info.offset);
    PutLE32(&out, info.length);
    PutLE32(&out, info.batch_count);
    PutLE32(&out, info.record_count);
    PutLE32(&out, info.crc);
  }
  PutLE32(&out, Crc32c(out.data() + footer_offset, out.size() - footer_offset));
  Envelope env;
  env.kind = SlotKind::kFlight;
  env.epoch = epoch;
  env.seq = seq;
  env.nonce = nonce;
  env.total_size = out.size();
  env.footer_offset = footer_offset;
  env.footer_length = static_cast<uint32_t>(out.size() - footer_offset);
  EncodeEnvelope(env, out.data());
}

Result<SlotIndex> DecodeSlot(std::string_view key, std::string_view data) {
  auto fail = [&](const Status& st) { return st.WithContext(fmt::format("slot {}", key)); };
  auto env = DecodeEnvelope(data);
  if (!env.ok()) return fail(env.status());
  SlotIndex index;
  index.envelope = *env;
  if (env->total_size != data.size()) {
    return fail(Corruption("envelope says {} bytes, object has {}", env->total_size, data.size()));
  }
  if (env->kind == SlotKind::kPoison) return index;
  std::string_view footer = data.substr(env->footer_offset, env->footer_length);
  uint32_t stored = LoadLE32(footer.data() + footer.size() - 4);
  uint32_t computed = Crc32c(footer.data(), footer.size() - 4);
  if (stored != computed) {
    return fail(Corruption("footer at byte {}: CRC mismatch: stored {:#010x}, computed {:#010x}",
                           env->footer_offset, stored, computed));
  }
  ByteReader r(footer.substr(0, footer.size() - 4));
  uint32_t count = 0;
  r.GetLE32(&count);
  if (r.remaining() != static_cast<size_t>(count) * kFooterEntrySize) {
    return fail(Corruption("footer at byte {}: {} chunks need {} bytes, have {}", env->footer_offset, count,
                           static_cast<size_t>(count) * kFooterEntrySize, r.remaining()));
  }
  uint64_t expect_offset = kEnvelopeSize;
  for (uint32_t i = 0; i < count; ++i) {
    ChunkInfo c;
    r.GetLE64(&c.stream_id);
    r.GetLE64(&c.offset);
    r.GetLE32(&c.length);
    r.GetLE32(&c.batch_count);
    r.GetLE32(&c.record_count);
    r.GetLE32(&c.crc);
    if (c.offset != expect_offset || c.offset + c.length > env->footer_offset) {
      return fail(Corruption("chunk {} (stream {}): range [{}, +{}) is not contiguous inside the bundle", i,
                             c.stream_id, c.offset, c.length));
    }
    expect_offset = c.offset + c.length;
    std::string_view bytes = data.substr(c.offset, c.length);
    uint32_t crc = Crc32c(bytes);
    if (crc != c.crc) {
      return fail(Corruption("chunk {} (stream {}) at byte {}: CRC mismatch: stored {:#010x}, computed {:#010x}",
                             i, c.stream_id, c.offset, c.crc, crc));
    }
    uint32_t batches = 0;
    uint64_t records = 0;
    Status st = ForEachBatch(bytes, [&](const BatchHeader& h, std::string_view) {
      ++batches;
      records += static_cast<uint64_t>(h.record_count);
      return Status::Ok();
    });
    if (!st.ok()) {
      return fail(st.WithContext(fmt::format("chunk {} (stream {}) at byte {}", i, c.stream_id, c.offset)));
    }
    if (batches != c.batch_count || records != c.record_count) {
      return fail(Corruption("chunk {} (stream {}): footer says {} batches / {} records, found {} / {}", i,
                             c.stream_id, c.batch_count, c.record_count, batches, records));
    }
    index.chunks.push_back(c);
  }
  if (expect_offset != env->footer_offset) {
    return fail(Corruption("{} unindexed bytes before the footer at byte {}", env->footer_offset - expect_offset,
                           env->footer_offset));
  }
  return index;
}

}  // namespace weir::wal
