#include "kafka/wire.h"

#include <limits>

#include "base/bytes.h"
#include "base/utf8.h"

namespace weir::kafka {

// ---- Reader -----------------------------------------------------------------

std::string Reader::Path(const char* field) const {
  std::string out;
  for (const PathPart& part : path_) {
    if (!out.empty()) out += '.';
    out += part.name;
    if (part.index >= 0) fmt::format_to(std::back_inserter(out), "[{}]", part.index);
  }
  if (field != nullptr && *field != '\0') {
    if (!out.empty()) out += '.';
    out += field;
  }
  return out;
}

void Reader::Fail(const char* field, std::string reason) {
  if (!status_.ok()) return;
  status_ = InvalidArgument("{}: {}", Path(field), reason);
}

Status Reader::Finish() {
  if (!status_.ok()) return status_;
  if (remaining() != 0) {
    Fail("", fmt::format("{} unexpected bytes after the last field", remaining()));
  }
  return status_;
}

const char* Reader::Take(const char* field, size_t n) {
  if (!status_.ok()) return nullptr;
  if (n > remaining()) {
    Fail(field, fmt::format("needs {} bytes, {} left in frame", n, remaining()));
    return nullptr;
  }
  const char* p = data_.data() + pos_;
  pos_ += n;
  return p;
}

int8_t Reader::Int8(const char* field) {
  const char* p = Take(field, 1);
  return p ? static_cast<int8_t>(*p) : 0;
}

int16_t Reader::Int16(const char* field) {
  const char* p = Take(field, 2);
  if (!p) return 0;
  return static_cast<int16_t>((static_cast<uint8_t>(p[0]) << 8) | static_cast<uint8_t>(p[1]));
}

uint32_t Reader::UInt32(const char* field) {
  const char* p = Take(field, 4);
  if (!p) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

int32_t Reader::Int32(const char* field) { return static_cast<int32_t>(UInt32(field)); }

int64_t Reader::Int64(const char* field) {
  const char* p = Take(field, 8);
  if (!p) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return static_cast<int64_t>(v);
}

bool Reader::Bool(const char* field) { return Int8(field) != 0; }

uint64_t Reader::ReadUVarint(const char* field, int max_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < max_bytes; ++i) {
    const char* p = Take(field, 1);
    if (!p) return 0;
    auto b = static_cast<uint8_t>(*p);
    v |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
    if ((b & 0x80) == 0) {
      // The last byte may not carry bits beyond the type's width.
      if (max_bytes == 5 && i == 4 && b > 0x0F) break;
      if (max_bytes == 10 && i == 9 && b > 0x01) break;
      return v;
    }
  }
  Fail(field, fmt::format("varint longer than {} bytes or out of range", max_bytes));
  return 0;
}

uint32_t Reader::UVarint(const char* field) { return static_cast<uint32_t>(ReadUVarint(field, 5)); }

int32_t Reader::Varint(const char* field) {
  auto u = static_cast<uint32_t>(ReadUVarint(field, 5));
  return static_cast<int32_t>((u >> 1) ^ (~(u & 1) + 1));
}

int64_t Reader::Varlong(const char* field) {
  uint64_t u = ReadUVarint(field, 10);
  return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
}

std::optional<std::string> Reader::ReadString(const char* field, bool nullable, bool check_utf8) {
  int16_t len = Int16(field);
  if (!ok()) return std::nullopt;
  if (len < 0) {
    if (len == -1 && nullable) return std::nullopt;
    Fail(field, fmt::format("string length {} is negative", len));
    return std::nullopt;
  }
  if (static_cast<size_t>(len) > remaining()) {
    Fail(field, fmt::format("string length {} past end of frame ({} bytes left)", len, remaining()));
    return std::nullopt;
  }
  std::string_view s = data_.substr(pos_, static_cast<size_t>(len));
  if (check_utf8 && !IsValidUtf8(s)) {
    Fail(field, "string is not valid UTF-8");
    return std::nullopt;
  }
  pos_ += s.size();
  if (s.size() > 15) Charge(field, s.size());  // past the small-string buffer
  return std::string(s);
}

void Reader::Charge(const char* field, uint64_t bytes) {
  decoded_ += bytes;
  if (decoded_ > decoded_limit_ && ok()) {
    Fail(field, fmt::format("the decoded request would take more than {} bytes", decoded_limit_));
  }
}

std::string Reader::String(const char* field) {
  std::optional<std::string> s = ReadString(field, /*nullable=*/false, /*check_utf8=*/true);
  return s ? std::move(*s) : std::string();
}

std::optional<std::string> Reader::NullableString(const char* field) {
  return ReadString(field, /*nullable=*/true, /*check_utf8=*/true);
}

std::optional<std::string> Reader::NullableRawString(const char* field) {
  return ReadString(field, /*nullable=*/true, /*check_utf8=*/false);
}

std::optional<std::string_view> Reader::NullableBytes(const char* field) {
  int32_t len = Int32(field);
  if (!ok()) return std::nullopt;
  if (len == -1) return std::nullopt;
  if (len < 0) {
    Fail(field, fmt::format("length {} is negative", len));
    return std::nullopt;
  }
  if (static_cast<size_t>(len) > remaining()) {
    Fail(field, fmt::format("length {} past end of frame ({} bytes left)", len, remaining()));
    return std::nullopt;
  }
  std::string_view b = data_.substr(pos_, static_cast<size_t>(len));
  pos_ += b.size();
  return b;
}

std::string_view Reader::Bytes(const char* field) {
  std::optional<std::string_view> b = NullableBytes(field);
  if (b) return *b;
  if (ok()) Fail(field, "length -1 (null) in a non-nullable field");
  return {};
}

std::optional<int32_t> Reader::ReadArrayLength(const char* field, size_t min_element_size, bool nullable) {
  int32_t n = Int32(field);
  if (!ok()) return 0;
  if (n < 0) {
    if (n == -1 && nullable) return std::nullopt;
    Fail(field, n == -1 ? std::string("array is null in a non-nullable field")
                        : fmt::format("array count {} is negative", n));
    return 0;
  }
  if (min_element_size == 0) min_element_size = 1;
  // n < 2^31 and min_element_size is small, so the product cannot overflow.
  uint64_t need = static_cast<uint64_t>(n) * min_element_size;
  if (need > remaining()) {
    Fail(field, fmt::format("array count {} needs at least {} bytes, {} left in frame", n, need, remaining()));
    return 0;
  }
  elements_ += static_cast<uint64_t>(n);
  if (elements_ > kMaxArrayElements) {
    Fail(field, fmt::format("more than {} array elements in one request", kMaxArrayElements));
    return 0;
  }
  return n;
}

int32_t Reader::ArrayLength(const char* field, size_t min_element_size) {
  return ReadArrayLength(field, min_element_size, /*nullable=*/false).value_or(0);
}

std::optional<int32_t> Reader::NullableArrayLength(const char* field, size_t min_element_size) {
  return ReadArrayLength(field, min_element_size, /*nullable=*/true);
}

// ---- Writer -----------------------------------------------------------------

void Writer::Fail(std::string reason) {
  if (status_.ok()) status_ = InvalidArgument("kafka encode: {}", reason);
}

void Writer::Int8(int8_t v) { out_->push_back(static_cast<char>(v)); }
void Writer::Int16(int16_t v) { PutBE16(out_, static_cast<uint16_t>(v)); }
void Writer::Int32(int32_t v) { PutBE32(out_, static_cast<uint32_t>(v)); }
void Writer::Int64(int64_t v) { PutBE64(out_, static_cast<uint64_t>(v)); }
void Writer::UInt32(uint32_t v) { PutBE32(out_, v); }
void Writer::Bool(bool v) { Int8(v ? 1 : 0); }

void Writer::UVarint(uint32_t v) {
  while (v >= 0x80) {
    out_->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out_->push_back(static_cast<char>(v));
}

void Writer::Varint(int32_t v) {
  auto u = static_cast<uint32_t>(v);
  UVarint((u << 1) ^ (v < 0 ? ~0u : 0u));
}

void Writer::Varlong(int64_t v) {
  auto u = static_cast<uint64_t>(v);
  u = (u << 1) ^ (v < 0 ? ~uint64_t{0} : uint64_t{0});
  while (u >= 0x80) {
    out_->push_back(static_cast<char>((u & 0x7F) | 0x80));
    u >>= 7;
  }
  out_->push_back(static_cast<char>(u));
}

void Writer::String(std::string_view s) {
  if (s.size() > kMaxStringSize) {
    Fail(fmt::format("string of {} bytes is longer than {}", s.size(), kMaxStringSize));
    s = {};
  }
  Int16(static_cast<int16_t>(s.size()));
  out_->append(s);
}

void Writer::NullableString(std::optional<std::string_view> s) {
  if (!s) {
    Int16(-1);
    return;
  }
  String(*s);
}

void Writer::Bytes(std::string_view b) {
  if (b.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    Fail(fmt::format("{} bytes do not fit an int32 length", b.size()));
    b = {};
  }
  Int32(static_cast<int32_t>(b.size()));
  out_->append(b);
}

void Writer::NullableBytes(std::optional<std::string_view> b) {
  if (!b) {
    Int32(-1);
    return;
  }
  Bytes(*b);
}

void Writer::ArrayLength(size_t n) {
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    Fail(fmt::format("array of {} elements does not fit an int32 count", n));
    n = 0;
  }
  Int32(static_cast<int32_t>(n));
}

void Writer::NullArray() { Int32(-1); }

void Writer::Raw(std::string_view b) { out_->append(b); }

size_t Writer::ReserveLength() {
  size_t pos = out_->size();
  Int32(0);
  return pos;
}

void Writer::PatchLength(size_t pos) {
  size_t n = out_->size() - pos - 4;
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    Fail(fmt::format("length {} does not fit an int32", n));
    n = 0;
  }
  StoreBE32(out_->data() + pos, static_cast<uint32_t>(n));
}

}  // namespace weir::kafka
