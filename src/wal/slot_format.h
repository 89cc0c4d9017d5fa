// The WAL slot format (docs/format/wal.md): slot keys, the 60-byte envelope,
// the bundle of per-stream chunks and its footer, and a verifying reader.
// Stateless functions and value types; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace weir::wal {

inline constexpr size_t kEnvelopeSize = 60;
inline constexpr char kEnvelopeMagic[4] = {'W', 'S', 'L', 'T'};
inline constexpr uint16_t kFormatVersion = 1;
inline constexpr size_t kFooterEntrySize = 32;
// Footer bytes besides its entries: chunk count (4) + footer CRC (4).
inline constexpr size_t kFooterFixedSize = 8;

enum class SlotKind : uint8_t { kFlight = 1, kPoison = 2 };

struct Envelope {
  SlotKind kind = SlotKind::kFlight;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  uint64_t nonce = 0;  // the writer's random id; settles ambiguous PUTs
  uint64_t total_size = 0;
  uint64_t footer_offset = 0;
  uint32_t footer_length = 0;
};

// One stream's contiguous run of record batches inside a slot.
struct ChunkInfo {
  uint64_t stream_id = 0;
  uint64_t offset = 0;  // object-absolute byte position
  uint32_t length = 0;
  uint32_t batch_count = 0;
  uint32_t record_count = 0;
  uint32_t crc = 0;  // CRC-32C of the chunk bytes
};

struct SlotIndex {
  Envelope envelope;
  std::vector<ChunkInfo> chunks;  // in bundle order
};

// Node ids: 1..64 characters of [A-Za-z0-9._-], not "." or "..".
Status ValidateNodeId(std::string_view node);

// "wal/<node>/<epoch:020>/<seq:020>" and its per-epoch prefix "wal/<node>/<epoch:020>/".
std::string SlotKey(std::string_view node, uint64_t epoch, uint64_t seq);
std::string SlotPrefix(std::string_view node, uint64_t epoch);

// Writes the 60-byte envelope (with its CRC) at out[0..60).
void EncodeEnvelope(const Envelope& env, char* out);
// Decodes and verifies the envelope at the start of `data` (at least 60 bytes).
Result<Envelope> DecodeEnvelope(std::string_view data);

// A poison slot: envelope only, kind poison.
std::string EncodePoison(uint64_t epoch, uint64_t seq, uint64_t nonce);

// Assembles a flight slot. Add batches in arrival order; batches of one stream
// are grouped into one chunk in first-arrival order of streams, keeping each
// stream's arrival order. Owned and used by one thread.
class SlotBuilder {
 public:
  // `batches`: one or more whole record batches of `stream_id`.
  // Returns the index used by position() after Finish.
  size_t Add(uint64_t stream_id, std::string_view batches, uint32_t batch_count, uint32_t record_count);
  // Serializes the slot. position(i) is then the object-absolute offset of the
  // i-th added piece.
  std::string Finish(uint64_t epoch, uint64_t seq, uint64_t nonce);
  // Same, into *out (its old contents are discarded, its capacity reused).
  void FinishInto(uint64_t epoch, uint64_t seq, uint64_t nonce, std::string* out);
  uint64_t position(size_t i) const { return positions_[i]; }
  size_t piece_count() const { return pieces_.size(); }

  // Size Finish will produce for the pieces added so far.
  size_t EncodedSize() const;

 private:
  struct Piece {
    std::string_view bytes;
    uint32_t batch_count;
    uint32_t record_count;
  };
  struct Chunk {
    uint64_t stream_id;
    std::vector<size_t> pieces;
  };
  std::vector<Piece> pieces_;
  std::vector<Chunk> chunks_;
  std::unordered_map<uint64_t, size_t> chunk_of_;
  std::vector<uint64_t> positions_;
  size_t payload_bytes_ = 0;
};

// Verifies a whole slot object: envelope, sizes, footer CRC, every chunk's
// CRC and every record batch's CRC. `key` only names the object in errors.
// kCorruption says which part failed and at which byte.
Result<SlotIndex> DecodeSlot(std::string_view key, std::string_view data);

}  // namespace weir::wal
