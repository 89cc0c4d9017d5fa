// libFuzzer target for what a produced Kafka batch goes through before it is
// stored as sent (src/wal/record_batch.h): the header, the CRC, the records
// walk (decompressing with whichever codec the attributes name) and the
// decoder. So that the fuzzer gets past the CRC, the input is also made a
// well-framed batch (batchLength, magic and CRC fixed up). Then:
// - VerifyBatch accepts it;
// - if ValidateRecords accepts it, DecodeRecords does too, with record_count
//   records at offsets base_offset + i;
// - decoded records encoded again (uncompressed) decode to the same records;
// - every refusal is kCorruption, kNotSupported or kInvalidArgument.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/crc32c.h"
#include "wal/record_batch.h"

namespace {

using weir::Code;
using weir::Status;

// Decompressed records this target lets a batch have (the server allows
// 64 MiB; a smaller bound keeps each run fast).
constexpr size_t kMaxDecompressed = 1 << 20;

[[noreturn]] void Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "record_batch_fuzz: %s: %s\n", what, st.ToString().c_str());
  std::abort();
}

void ExpectRefusal(const char* what, const Status& st) {
  if (st.code() != Code::kCorruption && st.code() != Code::kNotSupported && st.code() != Code::kInvalidArgument) {
    Fail(what, st);
  }
}

void PutBE32(std::string* s, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[pos + i] = static_cast<char>(v >> (24 - 8 * i));
}

void Check(std::string_view batch) {
  auto h = weir::wal::VerifyBatch(batch);
  if (!h.ok()) return ExpectRefusal("VerifyBatch", h.status());
  Status valid = weir::wal::ValidateRecords(*h, batch, kMaxDecompressed);
  auto decoded = weir::wal::DecodeRecords(batch, kMaxDecompressed);
  if (!decoded.ok()) ExpectRefusal("DecodeRecords", decoded.status());
  if (!valid.ok()) return ExpectRefusal("ValidateRecords", valid);
  if (!decoded.ok()) Fail("ValidateRecords accepted what DecodeRecords refused", decoded.status());
  if (decoded->size() != static_cast<size_t>(h->record_count)) Fail("record count", Status::Ok());
  std::vector<weir::wal::Record> records;
  for (size_t i = 0; i < decoded->size(); ++i) {
    // Offsets wrap past INT64_MAX as the decoder's do (two's complement).
    const auto want = static_cast<int64_t>(static_cast<uint64_t>(h->base_offset) + i);
    if ((*decoded)[i].offset != want) Fail("offsets", Status::Ok());
    records.push_back((*decoded)[i].record);
  }
  if (records.empty()) return;
  weir::wal::EncodeOptions eo;
  eo.base_offset = h->base_offset;
  std::string again;
  Status enc = weir::wal::EncodeRecordBatch(records, eo, &again);
  if (!enc.ok()) return ExpectRefusal("EncodeRecordBatch", enc);
  auto redecoded = weir::wal::DecodeRecords(again, kMaxDecompressed);
  if (!redecoded.ok()) Fail("decoding a re-encoded batch", redecoded.status());
  if (redecoded->size() != records.size()) Fail("re-encoded record count", Status::Ok());
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& a = records[i];
    const auto& b = (*redecoded)[i].record;
    bool same = a.timestamp == b.timestamp && a.key == b.key && a.value == b.value &&
                a.headers.size() == b.headers.size();
    for (size_t j = 0; same && j < a.headers.size(); ++j) {
      same = a.headers[j].key == b.headers[j].key && a.headers[j].value == b.headers[j].value;
    }
    if (!same) Fail("a re-encoded record differs", Status::Ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view raw(reinterpret_cast<const char*>(data), size);
  Check(raw);
  if (size < weir::wal::kRecordBatchHeaderSize || size > (1u << 24)) return 0;
  std::string fixed(raw);
  PutBE32(&fixed, 8, static_cast<uint32_t>(size - 12));  // batchLength
  fixed[16] = static_cast<char>(weir::wal::kRecordBatchMagic);
  PutBE32(&fixed, 17, weir::Crc32c(std::string_view(fixed).substr(21)));
  Check(fixed);
  return 0;
}
