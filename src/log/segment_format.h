// The settled segment format (docs/format/segment.md): one stream's record
// batches for a contiguous offset range, followed by a sparse index for seeks
// by offset and by timestamp, and a fixed footer. Written once by the settle
// task, read by range GETs. Stateless functions and value types; thread-safe.
//
// Layout:
//   [0, data_end)            Kafka RecordBatch v2 batches, baseOffsets absolute
//                            and dense: each batch starts at the previous end
//   [data_end, footer_off)   index entries, 24 bytes each, little-endian:
//                            base_offset u64 | max_timestamp_so_far i64 | position u64
//   last kSegmentFooterSize  footer (little-endian): magic "WSEG" | version u16
//                            | reserved u16 | stream_id u64 | start_offset u64
//                            | end_offset u64 | first_ts i64 | last_ts i64
//                            | data_end u64 | index_count u32 | data_crc u32
//                            | footer CRC-32C u32 (of the footer's first 64 bytes)
//                            | index CRC-32C u32 (of the index and footer before it)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::log {

inline constexpr size_t kSegmentFooterSize = 72;
inline constexpr size_t kSegmentIndexEntrySize = 24;

struct SegmentIndexEntry {
  uint64_t base_offset = 0;         // first offset of the batch at `position`
  int64_t max_timestamp_ms = 0;     // largest timestamp in all batches before and including this one
  uint64_t position = 0;            // byte position of the batch
};

struct SegmentFooter {
  uint64_t stream_id = 0;
  uint64_t start_offset = 0;
  uint64_t end_offset = 0;  // exclusive
  int64_t first_timestamp_ms = 0;  // baseTimestamp of the first batch
  int64_t last_timestamp_ms = 0;   // largest maxTimestamp of any batch
  uint64_t data_end = 0;
  uint32_t index_count = 0;
  uint32_t data_crc = 0;  // CRC-32C of bytes [0, data_end)
};

// Builds a segment. Add batches in offset order; Add (or AddView) refuses
// (kInvalidArgument, nothing changed) a malformed batch or one that does not
// start exactly at the previous batch's end offset. Owned by its caller (a
// settle or merge cycle), on that one thread.
class SegmentBuilder {
 public:
  // `index_interval_bytes`: an index entry is written for the first batch and
  // then for the first batch starting at least this many bytes after the last
  // indexed one.
  SegmentBuilder(uint64_t stream_id, size_t index_interval_bytes = 64 << 10);

  // Appends one or more whole, verified batches (copied). kInvalidArgument if
  // a batch is malformed or its offsets are not contiguous with what came
  // before; a failed Add changes nothing.
  Status Add(std::string_view batches);
  // Like Add, but keeps only a view: `batches` must stay alive and unchanged
  // until the object is written. Settle builds segments from cached batches
  // this way and writes them with ObjectStore::PutParts, copying nothing.
  // A builder takes either Add or AddView calls, not both.
  Status AddView(std::string_view batches);

  bool empty() const;
  uint64_t start_offset() const;
  uint64_t end_offset() const;  // exclusive; == start_offset() when empty
  size_t data_bytes() const;

  // Appends index and footer and returns the whole object; the builder is
  // then spent. kInvalidArgument if empty or built with AddView.
  Result<std::string> Finish();
  // Returns the index and footer: the object is views() in order, then this
  // tail. The builder is then spent. kInvalidArgument if empty.
  Result<std::string> FinishTail();
  const std::vector<std::string_view>& views() const { return views_; }
  const SegmentFooter& footer() const;  // valid after Finish

 private:
  Status Append(std::string_view batches, bool copy);

  size_t index_interval_bytes_;
  std::string data_;                      // Add: the batches so far
  std::vector<std::string_view> views_;   // AddView: the batches so far
  size_t data_bytes_ = 0;
  uint32_t data_crc_ = 0;
  uint64_t start_offset_ = 0;
  uint64_t end_offset_ = 0;
  int64_t first_timestamp_ms_ = 0;
  int64_t max_timestamp_ms_ = 0;  // over all batches so far
  uint64_t last_indexed_position_ = 0;
  std::vector<SegmentIndexEntry> index_;
  bool finished_ = false;
  SegmentFooter footer_;
};

// Parses and verifies the footer at the end of `tail` (the last bytes of a
// segment object of `object_size` bytes; at least kSegmentFooterSize). The
// index CRC is checked too when `tail` reaches back to data_end.
Result<SegmentFooter> DecodeSegmentFooter(std::string_view tail, uint64_t object_size);

// Parses and verifies the index: `index_and_footer` is the object's bytes from
// footer.data_end to the end.
Result<std::vector<SegmentIndexEntry>> DecodeSegmentIndex(const SegmentFooter& footer,
                                                          std::string_view index_and_footer);

// Byte position at which to start reading to find `offset` (the last indexed
// batch with base_offset <= offset; 0 if none), and likewise for the first
// record with timestamp >= `timestamp_ms` (the last indexed batch whose
// max_timestamp_ms is < timestamp_ms, so no earlier record qualifies; 0 if none).
uint64_t SeekOffset(const std::vector<SegmentIndexEntry>& index, uint64_t offset);
uint64_t SeekTimestamp(const std::vector<SegmentIndexEntry>& index, int64_t timestamp_ms);

// Verifies a whole segment object (footer, index, data CRC, every batch, dense
// offsets matching the footer). kCorruption names the part and byte.
Result<SegmentFooter> VerifySegment(std::string_view object);

}  // namespace weir::log
