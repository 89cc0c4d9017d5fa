#include "http/s2_proto.h"

#include <algorithm>

#include "base/bytes.h"
#include "base/utf8.h"

namespace weir::http {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

// A protobuf wire-format cursor over one message: a local of one decode, on
// its thread. Bounds-checked: a truncated or overlong field is InvalidArgument.
class Reader {
 public:
  explicit Reader(std::string_view d) : d_(d) {}
  bool done() const { return pos_ == d_.size(); }

  Result<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= d_.size()) return InvalidArgument("protobuf: truncated varint");
      auto b = static_cast<uint8_t>(d_[pos_++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
    return InvalidArgument("protobuf: varint longer than 10 bytes");
  }
  Result<std::string_view> Bytes() {
    WEIR_ASSIGN_OR_RETURN(uint64_t n, Varint());
    if (n > d_.size() - pos_) return InvalidArgument("protobuf: length {} past the end of the message", n);
    auto s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  Status Skip(uint32_t wire) {
    switch (wire) {
      case kVarint: return Varint().status();
      case kLen: return Bytes().status();
      case kFixed64: return Advance(8);
      case kFixed32: return Advance(4);
      default: return InvalidArgument("protobuf: unsupported wire type {}", wire);
    }
  }

 private:
  Status Advance(size_t n) {
    if (n > d_.size() - pos_) return InvalidArgument("protobuf: truncated fixed-width field");
    pos_ += n;
    return Status::Ok();
  }
  std::string_view d_;
  size_t pos_ = 0;
};

// Calls field(number, wire, reader) for each field of a message.
template <typename F>
Status ForEachField(std::string_view msg, F&& field) {
  Reader r(msg);
  while (!r.done()) {
    WEIR_ASSIGN_OR_RETURN(uint64_t tag, r.Varint());
    // Field numbers go up to 2^29 - 1: a larger tag is not a field.
    if (tag >> 3 > (uint64_t{1} << 29) - 1) return InvalidArgument("protobuf: field number {} is too large", tag >> 3);
    auto number = static_cast<uint32_t>(tag >> 3);
    auto wire = static_cast<uint32_t>(tag & 7);
    if (number == 0) return InvalidArgument("protobuf: field number 0");
    WEIR_RETURN_IF_ERROR(field(number, wire, r));
  }
  return Status::Ok();
}

Status Expect(uint32_t wire, uint32_t want, const char* what) {
  if (wire != want) return InvalidArgument("protobuf: field {} has wire type {}, expected {}", what, wire, want);
  return Status::Ok();
}

Result<wal::RecordHeader> DecodeHeader(std::string_view msg) {
  wal::RecordHeader h;
  h.value = std::string();
  WEIR_RETURN_IF_ERROR(ForEachField(msg, [&](uint32_t n, uint32_t wire, Reader& r) -> Status {
    if (n == 1 || n == 2) {
      WEIR_RETURN_IF_ERROR(Expect(wire, kLen, "Header.name/value"));
      WEIR_ASSIGN_OR_RETURN(auto b, r.Bytes());
      (n == 1 ? h.key : *h.value) = std::string(b);
      return Status::Ok();
    }
    return r.Skip(wire);
  }));
  return h;
}

// `metered` counts the input's metered bytes so far, up to `limits`.
Result<log::AppendRecord> DecodeRecord(std::string_view msg, const AppendLimits& limits, size_t* metered) {
  auto meter = [&](size_t n) -> Status {
    *metered += n;
    if (*metered > limits.max_metered_bytes) {
      return OutOfRange("an append holds at most {} metered bytes", limits.max_metered_bytes);
    }
    return Status::Ok();
  };
  WEIR_RETURN_IF_ERROR(meter(log::kMeteredRecordBytes));
  log::AppendRecord rec;
  WEIR_RETURN_IF_ERROR(ForEachField(msg, [&](uint32_t n, uint32_t wire, Reader& r) -> Status {
    switch (n) {
      case 1: {
        WEIR_RETURN_IF_ERROR(Expect(wire, kVarint, "AppendRecord.timestamp"));
        WEIR_ASSIGN_OR_RETURN(uint64_t ts, r.Varint());
        rec.timestamp_ms = static_cast<int64_t>(std::min<uint64_t>(ts, INT64_MAX));  // as the JSON path
        return Status::Ok();
      }
      case 2: {
        WEIR_RETURN_IF_ERROR(Expect(wire, kLen, "AppendRecord.headers"));
        WEIR_ASSIGN_OR_RETURN(auto b, r.Bytes());
        WEIR_ASSIGN_OR_RETURN(auto h, DecodeHeader(b));
        WEIR_RETURN_IF_ERROR(meter(log::MeteredBytes(h)));
        rec.headers.push_back(std::move(h));
        return Status::Ok();
      }
      case 3: {
        WEIR_RETURN_IF_ERROR(Expect(wire, kLen, "AppendRecord.body"));
        WEIR_ASSIGN_OR_RETURN(auto b, r.Bytes());
        WEIR_RETURN_IF_ERROR(meter(b.size()));
        rec.body = std::string(b);
        return Status::Ok();
      }
      default: return r.Skip(wire);
    }
  }));
  return rec;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutTag(std::string* out, uint32_t number, uint32_t wire) { PutVarint(out, (uint64_t{number} << 3) | wire); }
void PutBytes(std::string* out, uint32_t number, std::string_view b) {
  PutTag(out, number, kLen);
  PutVarint(out, b.size());
  out->append(b);
}
void PutUint(std::string* out, uint32_t number, uint64_t v) {
  if (v == 0) return;  // proto3 default
  PutTag(out, number, kVarint);
  PutVarint(out, v);
}
std::string Position(const StreamPosition& p) {
  std::string s;
  PutUint(&s, 1, p.seq_num);
  PutUint(&s, 2, p.timestamp);
  return s;
}

}  // namespace

Result<AppendInput> DecodeProtoAppendInput(std::string_view data, const AppendLimits& limits) {
  AppendInput in;
  size_t metered = 0;
  WEIR_RETURN_IF_ERROR(ForEachField(data, [&](uint32_t n, uint32_t wire, Reader& r) -> Status {
    switch (n) {
      case 1: {
        WEIR_RETURN_IF_ERROR(Expect(wire, kLen, "AppendInput.records"));
        WEIR_ASSIGN_OR_RETURN(auto b, r.Bytes());
        if (in.records.size() >= limits.max_records) {
          return OutOfRange("an append holds at most {} records", limits.max_records);
        }
        WEIR_ASSIGN_OR_RETURN(auto rec, DecodeRecord(b, limits, &metered));
        in.records.push_back(std::move(rec));
        return Status::Ok();
      }
      case 2: {
        WEIR_RETURN_IF_ERROR(Expect(wire, kVarint, "AppendInput.match_seq_num"));
        WEIR_ASSIGN_OR_RETURN(uint64_t v, r.Varint());
        in.options.match_seq_num = v;
        return Status::Ok();
      }
      case 3: {
        WEIR_RETURN_IF_ERROR(Expect(wire, kLen, "AppendInput.fencing_token"));
        WEIR_ASSIGN_OR_RETURN(auto b, r.Bytes());
        // A proto3 string: UTF-8, as the JSON path's tokens are.
        if (!IsValidUtf8(b)) return InvalidArgument("AppendInput.fencing_token is not UTF-8");
        in.options.fencing_token = std::string(b);
        return Status::Ok();
      }
      default: return r.Skip(wire);
    }
  }));
  return in;
}

std::string EncodeProtoAppendAck(const StreamPosition& start, const StreamPosition& end, const StreamPosition& tail) {
  std::string out;
  PutBytes(&out, 1, Position(start));
  PutBytes(&out, 2, Position(end));
  PutBytes(&out, 3, Position(tail));
  return out;
}

std::string EncodeProtoReadBatch(const std::vector<log::ReadRecord>& records, const std::optional<StreamPosition>& tail,
                                 size_t max_bytes, size_t* encoded) {
  std::string out, rec, hdr;
  const std::string tail_position = tail ? Position(*tail) : std::string();
  const size_t tail_bytes = tail ? 1 + UVarintSize(tail_position.size()) + tail_position.size() : 0;
  if (encoded != nullptr) *encoded = 0;
  for (const auto& r : records) {
    rec.clear();
    PutUint(&rec, 1, r.offset);
    PutUint(&rec, 2, static_cast<uint64_t>(std::max<int64_t>(r.record.timestamp, 0)));
    for (const auto& h : r.record.headers) {
      hdr.clear();
      if (!h.key.empty()) PutBytes(&hdr, 1, h.key);
      if (h.value && !h.value->empty()) PutBytes(&hdr, 2, *h.value);
      PutBytes(&rec, 3, hdr);
    }
    if (r.record.value && !r.record.value->empty()) PutBytes(&rec, 4, *r.record.value);
    if (out.size() + 1 + UVarintSize(rec.size()) + rec.size() + tail_bytes > max_bytes) break;
    PutBytes(&out, 1, rec);
    if (encoded != nullptr) ++*encoded;
  }
  if (tail) PutBytes(&out, 2, tail_position);
  return out;
}

namespace {
std::string FrameHeader(size_t length, uint8_t flag) {
  std::string out;
  out.push_back(static_cast<char>((length >> 16) & 0xff));
  out.push_back(static_cast<char>((length >> 8) & 0xff));
  out.push_back(static_cast<char>(length & 0xff));
  out.push_back(static_cast<char>(flag));
  return out;
}
}  // namespace

std::string EncodeS2sFrame(std::string_view payload, int compression) {
  std::string out = FrameHeader(1 + payload.size(), static_cast<uint8_t>((compression & 3) << 5));
  out.append(payload);
  return out;
}

std::string EncodeS2sTerminal(int status, std::string_view json) {
  std::string out = FrameHeader(3 + json.size(), 0x80);
  out.push_back(static_cast<char>((status >> 8) & 0xff));
  out.push_back(static_cast<char>(status & 0xff));
  out.append(json);
  return out;
}

Result<size_t> DecodeS2sFrame(std::string_view buf, S2sFrame* frame) {
  if (buf.size() < 3) return size_t{0};
  size_t length = (static_cast<size_t>(static_cast<uint8_t>(buf[0])) << 16) |
                  (static_cast<size_t>(static_cast<uint8_t>(buf[1])) << 8) | static_cast<uint8_t>(buf[2]);
  if (length == 0) return InvalidArgument("S2S frame of length 0 (the flag byte is required)");
  if (length > kS2sMaxFrameBytes) {
    return InvalidArgument("S2S frame of {} bytes is over the limit of {}", length, kS2sMaxFrameBytes);
  }
  if (buf.size() < 3 + length) return size_t{0};
  auto flag = static_cast<uint8_t>(buf[3]);
  int compression = (flag & 0x60) >> 5;
  if (compression == 3) return InvalidArgument("S2S frame with an unknown compression (3)");
  frame->terminal = (flag & 0x80) != 0;
  frame->compression = compression;
  frame->payload = buf.substr(4, length - 1);
  return 3 + length;
}

}  // namespace weir::http
