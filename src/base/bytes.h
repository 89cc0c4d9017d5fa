// Fixed-width and variable-length integer encoding into std::string buffers,
// and bounds-checked decoding from byte views. Header-only, stateless.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace weir {

inline void PutLE16(std::string* out, uint16_t v) {
  char b[2] = {static_cast<char>(v), static_cast<char>(v >> 8)};
  out->append(b, 2);
}
inline void PutLE32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 4);
}
inline void PutLE64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}
inline void PutBE16(std::string* out, uint16_t v) {
  char b[2] = {static_cast<char>(v >> 8), static_cast<char>(v)};
  out->append(b, 2);
}
inline void PutBE32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * (3 - i)));
  out->append(b, 4);
}
inline void PutBE64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * (7 - i)));
  out->append(b, 8);
}

inline void StoreBE32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * (3 - i)));
}
inline void StoreLE32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

inline uint16_t LoadLE16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
inline uint32_t LoadLE32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t LoadLE64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint16_t LoadBE16(const char* p) {
  return static_cast<uint16_t>((static_cast<uint8_t>(p[0]) << 8) | static_cast<uint8_t>(p[1]));
}
inline uint32_t LoadBE32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t LoadBE64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Protobuf-style unsigned varint and zigzag signed varint (Kafka record fields).
inline void PutUVarint(std::string* out, uint64_t v) {
  char b[10];
  int n = 0;
  while (v >= 0x80) {
    b[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  b[n++] = static_cast<char>(v);
  out->append(b, static_cast<size_t>(n));
}
inline void PutVarint(std::string* out, int64_t v) {
  PutUVarint(out, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}
inline size_t UVarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
inline size_t VarintSize(int64_t v) {
  return UVarintSize((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

// Sequential bounds-checked reader over a byte view, a local of one parse
// (one thread). Every getter returns false (and leaves the reader failed)
// when the input is too short.
class ByteReader {
 public:
  explicit ByteReader(std::string_view data) : data_(data) {}

  size_t position() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  bool failed() const { return failed_; }

  bool Skip(size_t n) {
    if (!Need(n)) return false;
    pos_ += n;
    return true;
  }
  bool GetBytes(size_t n, std::string_view* out) {
    if (!Need(n)) return false;
    *out = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool GetU8(uint8_t* v) {
    if (!Need(1)) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool GetLE16(uint16_t* v) { return Fixed(v, 2, LoadLE16); }
  bool GetLE32(uint32_t* v) { return Fixed(v, 4, LoadLE32); }
  bool GetLE64(uint64_t* v) { return Fixed(v, 8, LoadLE64); }
  bool GetBE16(uint16_t* v) { return Fixed(v, 2, LoadBE16); }
  bool GetBE32(uint32_t* v) { return Fixed(v, 4, LoadBE32); }
  bool GetBE64(uint64_t* v) { return Fixed(v, 8, LoadBE64); }
  bool GetUVarint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
      uint8_t b;
      if (!GetU8(&b)) return false;
      result |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    failed_ = true;  // more than 10 bytes: malformed
    return false;
  }
  bool GetVarint(int64_t* v) {
    uint64_t u;
    if (!GetUVarint(&u)) return false;
    *v = static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
    return true;
  }
  // Kafka's zigzag varint for an int32: at most 5 bytes (more is malformed);
  // bits past 32 are dropped, as Kafka's reader drops them.
  bool GetVarint32(int32_t* v) {
    uint32_t result = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
      uint8_t b;
      if (!GetU8(&b)) return false;
      result |= static_cast<uint32_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *v = static_cast<int32_t>((result >> 1) ^ (~(result & 1) + 1));
        return true;
      }
    }
    failed_ = true;
    return false;
  }

 private:
  bool Need(size_t n) {
    if (failed_ || data_.size() - pos_ < n) {
      failed_ = true;
      return false;
    }
    return true;
  }
  template <typename T, typename F>
  bool Fixed(T* v, size_t n, F load) {
    if (!Need(n)) return false;
    *v = static_cast<T>(load(data_.data() + pos_));
    pos_ += n;
    return true;
  }

  std::string_view data_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace weir
