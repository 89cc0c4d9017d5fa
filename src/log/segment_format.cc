#include "log/segment_format.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <utility>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "wal/record_batch.h"

namespace weir::log {
namespace {

constexpr char kSegmentMagic[4] = {'W', 'S', 'E', 'G'};
constexpr uint16_t kSegmentVersion = 1;

// Footer layout (little-endian):
//   0 magic | 4 version u16 | 6 reserved u16 | 8 stream_id u64 | 16 start_offset u64
//   | 24 end_offset u64 | 32 first_ts i64 | 40 last_ts i64 | 48 data_end u64
//   | 56 index_count u32 | 60 data_crc u32 | 64 footer CRC-32C of [0, 64)
//   | 68 index CRC-32C of the object's bytes [data_end, size - 4)
constexpr size_t kFooterCrcPos = 64;
constexpr size_t kIndexCrcPos = 68;
static_assert(kIndexCrcPos + 4 == kSegmentFooterSize);

constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
// Batches at least this long get their share of the data CRC by Crc32cCombine
// (under a microsecond); shorter ones are cheaper to read again.
constexpr size_t kCombineMinBytes = 16 << 10;

// Appends footer bytes [0, 68): everything but the index CRC.
void AppendFooter(const SegmentFooter& f, std::string* out) {
  const size_t start = out->size();
  out->append(kSegmentMagic, 4);
  PutLE16(out, kSegmentVersion);
  PutLE16(out, 0);
  PutLE64(out, f.stream_id);
  PutLE64(out, f.start_offset);
  PutLE64(out, f.end_offset);
  PutLE64(out, static_cast<uint64_t>(f.first_timestamp_ms));
  PutLE64(out, static_cast<uint64_t>(f.last_timestamp_ms));
  PutLE64(out, f.data_end);
  PutLE32(out, f.index_count);
  PutLE32(out, f.data_crc);
  PutLE32(out, Crc32c(out->data() + start, kFooterCrcPos));
}

// Checks the CRC in the last 4 bytes of `index_and_footer` (data_end to the end).
Status CheckIndexCrc(std::string_view index_and_footer) {
  const size_t n = index_and_footer.size() - 4;
  const uint32_t stored = LoadLE32(index_and_footer.data() + n);
  const uint32_t computed = Crc32c(index_and_footer.data(), n);
  if (stored != computed) {
    return Corruption("segment index CRC mismatch: stored {:#010x}, computed {:#010x}", stored, computed);
  }
  return Status::Ok();
}

// Whether base_offset + last_offset_delta fits an int64.
bool LastOffsetFits(const wal::BatchHeader& h) {
  return h.base_offset >= 0 && static_cast<uint64_t>(h.base_offset) <= kMaxInt64 - static_cast<uint64_t>(h.last_offset_delta);
}

}  // namespace

SegmentBuilder::SegmentBuilder(uint64_t stream_id, size_t index_interval_bytes)
    : index_interval_bytes_(index_interval_bytes) {
  footer_.stream_id = stream_id;
}

bool SegmentBuilder::empty() const { return data_bytes_ == 0; }
uint64_t SegmentBuilder::start_offset() const { return start_offset_; }
uint64_t SegmentBuilder::end_offset() const { return end_offset_; }
size_t SegmentBuilder::data_bytes() const { return data_bytes_; }
const SegmentFooter& SegmentBuilder::footer() const { return footer_; }

Status SegmentBuilder::Add(std::string_view batches) { return Append(batches, true); }

Status SegmentBuilder::AddView(std::string_view batches) { return Append(batches, false); }

Status SegmentBuilder::Append(std::string_view batches, bool copy) {
  if (finished_) return InvalidArgument("segment builder: Add after Finish");
  if (batches.empty()) return InvalidArgument("segment builder: no batches to add");
  if (!empty() && copy != views_.empty()) {
    return InvalidArgument("segment builder: Add and AddView cannot be mixed in one segment");
  }

  // Walk into copies of the state and commit only if every batch is good, so
  // a failed Add leaves the builder unchanged.
  bool started = !empty();
  uint64_t start = start_offset_;
  uint64_t end = end_offset_;
  int64_t first_ts = first_timestamp_ms_;
  int64_t max_ts = max_timestamp_ms_;
  uint64_t last_indexed = last_indexed_position_;
  std::vector<SegmentIndexEntry> entries;
  size_t pos = 0;  // in `batches`
  size_t n = 0;
  uint32_t data_crc = data_crc_;
  Status st = wal::ForEachBatch(batches, [&](const wal::BatchHeader& h, std::string_view bytes) -> Status {
    if (!LastOffsetFits(h)) {
      return InvalidArgument("batch {} at byte {}: offsets [{}, +{}] are outside [0, 2^63)", n, pos, h.base_offset,
                             h.last_offset_delta);
    }
    const auto base = static_cast<uint64_t>(h.base_offset);
    if (!started) {
      start = end = base;
      first_ts = h.base_timestamp;
      max_ts = h.max_timestamp;
    } else if (base != end) {
      return InvalidArgument("batch {} at byte {}: baseOffset {} is not the segment's end offset {}", n, pos, base,
                             end);
    }
    max_ts = std::max(max_ts, h.max_timestamp);
    const uint64_t position = data_bytes_ + pos;
    if (!started || position - last_indexed >= index_interval_bytes_) {
      entries.push_back(SegmentIndexEntry{base, max_ts, position});
      last_indexed = position;
    }
    started = true;
    end = static_cast<uint64_t>(h.last_offset()) + 1;
    // ForEachBatch verified the batch's CRC: a long batch's whole CRC comes
    // from it rather than from a second pass over its bytes.
    data_crc = bytes.size() >= kCombineMinBytes ? wal::Crc32cExtendVerifiedBatch(data_crc, h, bytes)
                                                : Crc32cExtend(data_crc, bytes.data(), bytes.size());
    pos += bytes.size();
    ++n;
    return Status::Ok();
  });
  if (!st.ok()) {
    // A batch that fails verification is the caller's bad input here.
    return Status(Code::kInvalidArgument, st.message()).WithContext("segment builder");
  }

  if (copy) {
    data_.append(batches);
  } else {
    views_.push_back(batches);
  }
  data_crc_ = data_crc;
  data_bytes_ += batches.size();
  start_offset_ = start;
  end_offset_ = end;
  first_timestamp_ms_ = first_ts;
  max_timestamp_ms_ = max_ts;
  last_indexed_position_ = last_indexed;
  index_.insert(index_.end(), entries.begin(), entries.end());
  return Status::Ok();
}

Result<std::string> SegmentBuilder::Finish() {
  if (!views_.empty()) return InvalidArgument("segment builder: built with AddView; use FinishTail");
  WEIR_ASSIGN_OR_RETURN(std::string tail, FinishTail());
  std::string out = std::move(data_);
  data_ = std::string();
  out.append(tail);
  return out;
}

Result<std::string> SegmentBuilder::FinishTail() {
  if (finished_) return InvalidArgument("segment builder: Finish called twice");
  if (empty()) return InvalidArgument("segment builder: cannot finish an empty segment");
  if (index_.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("segment builder: {} index entries exceed the u32 count", index_.size());
  }
  finished_ = true;
  footer_.start_offset = start_offset_;
  footer_.end_offset = end_offset_;
  footer_.first_timestamp_ms = first_timestamp_ms_;
  footer_.last_timestamp_ms = max_timestamp_ms_;
  footer_.data_end = data_bytes_;
  footer_.index_count = static_cast<uint32_t>(index_.size());
  footer_.data_crc = data_crc_;

  std::string out;
  out.reserve(index_.size() * kSegmentIndexEntrySize + kSegmentFooterSize);
  for (const SegmentIndexEntry& e : index_) {
    PutLE64(&out, e.base_offset);
    PutLE64(&out, static_cast<uint64_t>(e.max_timestamp_ms));
    PutLE64(&out, e.position);
  }
  AppendFooter(footer_, &out);
  PutLE32(&out, Crc32c(out.data(), out.size()));
  return out;
}

Result<SegmentFooter> DecodeSegmentFooter(std::string_view tail, uint64_t object_size) {
  if (tail.size() > object_size) {
    return InvalidArgument("segment tail of {} bytes is longer than the {}-byte object", tail.size(), object_size);
  }
  if (tail.size() < kSegmentFooterSize) {
    return Corruption("segment footer truncated: {} bytes, need {}", tail.size(), kSegmentFooterSize);
  }
  const char* p = tail.data() + tail.size() - kSegmentFooterSize;
  if (std::memcmp(p, kSegmentMagic, 4) != 0) return Corruption("segment footer: bad magic");
  // The version before the CRC: a later version may lay the footer out otherwise.
  const uint16_t version = LoadLE16(p + 4);
  if (version != kSegmentVersion) {
    return Corruption("segment footer: unknown version {} (this build reads version {}; written by a newer weir?)",
                      version, kSegmentVersion);
  }
  const uint32_t stored = LoadLE32(p + kFooterCrcPos);
  const uint32_t computed = Crc32c(p, kFooterCrcPos);
  if (stored != computed) {
    return Corruption("segment footer CRC mismatch: stored {:#010x}, computed {:#010x}", stored, computed);
  }
  const uint16_t reserved = LoadLE16(p + 6);
  if (reserved != 0) return Corruption("segment footer: reserved field is {:#06x}, not 0", reserved);

  SegmentFooter f;
  f.stream_id = LoadLE64(p + 8);
  f.start_offset = LoadLE64(p + 16);
  f.end_offset = LoadLE64(p + 24);
  f.first_timestamp_ms = static_cast<int64_t>(LoadLE64(p + 32));
  f.last_timestamp_ms = static_cast<int64_t>(LoadLE64(p + 40));
  f.data_end = LoadLE64(p + 48);
  f.index_count = LoadLE32(p + 56);
  f.data_crc = LoadLE32(p + 60);

  if (f.index_count == 0) return Corruption("segment footer: no index entries");
  const uint64_t index_bytes = uint64_t{f.index_count} * kSegmentIndexEntrySize;
  if (object_size < kSegmentFooterSize + index_bytes ||
      f.data_end != object_size - kSegmentFooterSize - index_bytes || f.data_end < wal::kRecordBatchHeaderSize) {
    return Corruption("segment footer: data_end {} and {} index entries do not fill the {}-byte object", f.data_end,
                      f.index_count, object_size);
  }
  if (f.start_offset >= f.end_offset || f.end_offset > kMaxInt64 + 1) {
    return Corruption("segment footer: offset range [{}, {}) is invalid", f.start_offset, f.end_offset);
  }
  const uint64_t index_and_footer = object_size - f.data_end;
  if (tail.size() >= index_and_footer) WEIR_RETURN_IF_ERROR(CheckIndexCrc(tail.substr(tail.size() - index_and_footer)));
  return f;
}

Result<std::vector<SegmentIndexEntry>> DecodeSegmentIndex(const SegmentFooter& footer,
                                                          std::string_view index_and_footer) {
  const uint64_t want = uint64_t{footer.index_count} * kSegmentIndexEntrySize + kSegmentFooterSize;
  if (index_and_footer.size() != want) {
    return Corruption("segment index: {} entries and the footer need {} bytes, have {}", footer.index_count, want,
                      index_and_footer.size());
  }
  WEIR_RETURN_IF_ERROR(CheckIndexCrc(index_and_footer));
  std::string encoded;
  AppendFooter(footer, &encoded);
  if (std::memcmp(encoded.data(), index_and_footer.data() + want - kSegmentFooterSize, kIndexCrcPos) != 0) {
    return InvalidArgument("segment index: the footer given is not the one stored with this index");
  }

  std::vector<SegmentIndexEntry> index(footer.index_count);
  const char* p = index_and_footer.data();
  for (size_t i = 0; i < index.size(); ++i, p += kSegmentIndexEntrySize) {
    SegmentIndexEntry& e = index[i];
    e.base_offset = LoadLE64(p);
    e.max_timestamp_ms = static_cast<int64_t>(LoadLE64(p + 8));
    e.position = LoadLE64(p + 16);
    if (i == 0) {
      if (e.position != 0) return Corruption("segment index entry 0: position {} is not 0", e.position);
      if (e.base_offset != footer.start_offset) {
        return Corruption("segment index entry 0: base offset {} is not the start offset {}", e.base_offset,
                          footer.start_offset);
      }
    } else {
      const SegmentIndexEntry& prev = index[i - 1];
      if (e.base_offset <= prev.base_offset) {
        return Corruption("segment index entry {}: base offset {} not after {}", i, e.base_offset, prev.base_offset);
      }
      if (e.position <= prev.position) {
        return Corruption("segment index entry {}: position {} not after {}", i, e.position, prev.position);
      }
      if (e.max_timestamp_ms < prev.max_timestamp_ms) {
        return Corruption("segment index entry {}: max timestamp {} below the previous {}", i, e.max_timestamp_ms,
                          prev.max_timestamp_ms);
      }
    }
    if (e.base_offset >= footer.end_offset) {
      return Corruption("segment index entry {}: base offset {} not below the end offset {}", i, e.base_offset,
                        footer.end_offset);
    }
    if (e.position >= footer.data_end || footer.data_end - e.position < wal::kRecordBatchHeaderSize) {
      return Corruption("segment index entry {}: position {} leaves no room for a batch before data_end {}", i,
                        e.position, footer.data_end);
    }
    if (e.max_timestamp_ms > footer.last_timestamp_ms) {
      return Corruption("segment index entry {}: max timestamp {} above the last timestamp {}", i,
                        e.max_timestamp_ms, footer.last_timestamp_ms);
    }
  }
  return index;
}

uint64_t SeekOffset(const std::vector<SegmentIndexEntry>& index, uint64_t offset) {
  auto it = std::upper_bound(index.begin(), index.end(), offset,
                             [](uint64_t o, const SegmentIndexEntry& e) { return o < e.base_offset; });
  return it == index.begin() ? 0 : std::prev(it)->position;
}

// max_timestamp_ms is a running maximum, so the entries below the target form a prefix.
uint64_t SeekTimestamp(const std::vector<SegmentIndexEntry>& index, int64_t timestamp_ms) {
  auto it = std::partition_point(index.begin(), index.end(),
                                 [&](const SegmentIndexEntry& e) { return e.max_timestamp_ms < timestamp_ms; });
  return it == index.begin() ? 0 : std::prev(it)->position;
}

Result<SegmentFooter> VerifySegment(std::string_view object) {
  WEIR_ASSIGN_OR_RETURN(SegmentFooter f, DecodeSegmentFooter(object, object.size()));
  WEIR_ASSIGN_OR_RETURN(std::vector<SegmentIndexEntry> index, DecodeSegmentIndex(f, object.substr(f.data_end)));
  const std::string_view data = object.substr(0, f.data_end);
  const uint32_t crc = Crc32c(data);
  if (crc != f.data_crc) {
    return Corruption("segment data CRC mismatch: stored {:#010x}, computed {:#010x}", f.data_crc, crc);
  }

  // Every batch verified and dense from start_offset; every index entry on a
  // batch boundary with the right offset and running max timestamp.
  uint64_t expect = f.start_offset;
  int64_t max_ts = 0;
  size_t next = 0;  // next index entry
  size_t pos = 0;
  size_t n = 0;
  Status st = wal::ForEachBatch(data, [&](const wal::BatchHeader& h, std::string_view bytes) -> Status {
    if (h.base_offset < 0 || static_cast<uint64_t>(h.base_offset) != expect) {
      return Corruption("batch {} at byte {}: baseOffset {}, expected {}", n, pos, h.base_offset, expect);
    }
    if (!LastOffsetFits(h)) {
      return Corruption("batch {} at byte {}: last offset overflows int64", n, pos);
    }
    if (n == 0) {
      if (h.base_timestamp != f.first_timestamp_ms) {
        return Corruption("batch 0: baseTimestamp {} is not the footer's first timestamp {}", h.base_timestamp,
                          f.first_timestamp_ms);
      }
      max_ts = h.max_timestamp;
    }
    max_ts = std::max(max_ts, h.max_timestamp);
    if (next < index.size() && index[next].position < pos) {
      return Corruption("segment index entry {}: position {} is not a batch boundary", next, index[next].position);
    }
    if (next < index.size() && index[next].position == pos) {
      const SegmentIndexEntry& e = index[next];
      if (e.base_offset != expect || e.max_timestamp_ms != max_ts) {
        return Corruption("segment index entry {}: says offset {} max timestamp {}, batch {} at byte {} has {} and {}",
                          next, e.base_offset, e.max_timestamp_ms, n, pos, expect, max_ts);
      }
      ++next;
    }
    expect = static_cast<uint64_t>(h.last_offset()) + 1;
    pos += bytes.size();
    ++n;
    return Status::Ok();
  });
  if (!st.ok()) return st.WithContext("segment data");
  if (next < index.size()) {
    return Corruption("segment index entry {}: position {} is not a batch boundary", next, index[next].position);
  }
  if (expect != f.end_offset) {
    return Corruption("segment data ends at offset {}, the footer says {}", expect, f.end_offset);
  }
  if (max_ts != f.last_timestamp_ms) {
    return Corruption("segment data's max timestamp is {}, the footer says {}", max_ts, f.last_timestamp_ms);
  }
  return f;
}

}  // namespace weir::log
