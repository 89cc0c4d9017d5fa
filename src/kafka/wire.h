// Kafka's primitive wire types (non-flexible versions): big-endian integers,
// int16-length strings, int32-length bytes and arrays, and the zigzag varints
// of record batches and tagged fields. docs/format/kafka-wire.md.
//
// Reader and Writer are value types owned and used by one thread at a time;
// neither allocates beyond the strings it returns or the buffer it appends to,
// and neither throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::kafka {

// Longest string an int16 length can describe.
inline constexpr size_t kMaxStringSize = 32767;
// Array elements one request may hold, over all its arrays: decoded elements
// take many times their wire size, so the frame limit alone would let one
// request of tiny elements cost gigabytes. No client needs this many.
inline constexpr uint64_t kMaxArrayElements = 1u << 20;

// A bounds-checked cursor over one frame. Errors are sticky: the first failed
// read records an InvalidArgument status naming the field by its path
// ("ProduceRequest.topic_data[0].partition_data[2].records: length 900 past
// end of frame (12 bytes left)"); every later read returns a zero value and
// consumes nothing, so a decoder may check ok() once per loop and status() at
// the end. Views returned by Bytes() point into the input, which must outlive them.
// A local of one decode, on one thread; not thread-safe.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  // Views returned would dangle: keep the input alive in a named buffer.
  explicit Reader(std::string&&) = delete;

  // `field` names the value in error messages; it must be a string literal
  // (or otherwise outlive the Reader).
  int8_t Int8(const char* field);
  int16_t Int16(const char* field);
  int32_t Int32(const char* field);
  int64_t Int64(const char* field);
  uint32_t UInt32(const char* field);
  bool Bool(const char* field);  // one byte; any non-zero value is true, as in Kafka
  int32_t Varint(const char* field);   // zigzag, at most 5 bytes
  int64_t Varlong(const char* field);  // zigzag, at most 10 bytes
  uint32_t UVarint(const char* field);  // unsigned, at most 5 bytes

  // int16 length + UTF-8 bytes. A negative length is an error.
  std::string String(const char* field);
  // Same, but length -1 is null (nullopt); other negative lengths are errors.
  std::optional<std::string> NullableString(const char* field);
  // Same as NullableString without the UTF-8 check (for the client id).
  std::optional<std::string> NullableRawString(const char* field);

  // int32 length + bytes, returned as a view into the input (zero-copy).
  std::string_view Bytes(const char* field);
  std::optional<std::string_view> NullableBytes(const char* field);

  // int32 element count of an array whose elements take at least
  // `min_element_size` bytes each (>= 1). A count that cannot fit in the
  // remaining bytes is an error, so no hostile count ever sizes an allocation;
  // so is a count that takes the request past kMaxArrayElements.
  // Returns 0 after an error; -1 (null) is an error here.
  int32_t ArrayLength(const char* field, size_t min_element_size);
  // Same, but -1 is null (nullopt).
  std::optional<int32_t> NullableArrayLength(const char* field, size_t min_element_size);

  // Names one level of the path for errors raised while it is alive: the
  // message root ("ProduceRequest", index -1) or an array element
  // ("topics", 3 → "topics[3]"). Scopes nest; they must end in reverse order.
  class Scope {
   public:
    Scope(Reader& r, const char* name, int32_t index = -1) : r_(r) { r_.path_.push_back({name, index}); }
    ~Scope() { r_.path_.pop_back(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Reader& r_;
  };

  // Records a semantic error at `field` (e.g. a value a version forbids).
  void Fail(const char* field, std::string reason);
  // Decoded requests take more memory than their frame (an empty string is 2
  // bytes on the wire, 32 decoded). Decoders charge what they build (arrays
  // sizeof(T) per element, strings their heap bytes); past the limit the
  // read fails. No limit unless set.
  void SetDecodedLimit(uint64_t bytes) { decoded_limit_ = bytes; }
  void Charge(const char* field, uint64_t bytes);

  bool ok() const { return status_.ok(); }
  // OK, or the first failure.
  const Status& status() const { return status_; }
  // status(), or an error if any bytes are left unread.
  Status Finish();

  size_t position() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }

 private:
  // Returns a pointer to the next n bytes and advances, or nullptr (and fails).
  const char* Take(const char* field, size_t n);
  std::optional<std::string> ReadString(const char* field, bool nullable, bool check_utf8);
  std::optional<int32_t> ReadArrayLength(const char* field, size_t min_element_size, bool nullable);
  uint64_t ReadUVarint(const char* field, int max_bytes);
  std::string Path(const char* field) const;

  struct PathPart {
    const char* name;
    int32_t index;
  };
  std::string_view data_;
  size_t pos_ = 0;
  uint64_t elements_ = 0;  // array elements announced so far
  uint64_t decoded_ = 0;   // bytes charged (Charge)
  uint64_t decoded_limit_ = UINT64_MAX;
  Status status_;
  std::vector<PathPart> path_;
};

// Appends Kafka wire values to a std::string it does not own. Errors are
// sticky like the Reader's: a value the wire cannot carry (a string over
// 32767 bytes, more than 2^31-1 bytes or elements) records InvalidArgument
// and writes an empty value instead. The caller checks status() once after
// encoding a whole message and discards the bytes if it is not OK.
// A local of one encode, on one thread, writing into its caller's string.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  void Int8(int8_t v);
  void Int16(int16_t v);
  void Int32(int32_t v);
  void Int64(int64_t v);
  void UInt32(uint32_t v);
  void Bool(bool v);
  void Varint(int32_t v);
  void Varlong(int64_t v);
  void UVarint(uint32_t v);

  void String(std::string_view s);
  void NullableString(std::optional<std::string_view> s);
  void Bytes(std::string_view b);
  void NullableBytes(std::optional<std::string_view> b);
  // An array's element count (the caller then writes the elements), or null.
  void ArrayLength(size_t n);
  void NullArray();
  // Bytes as they are, without a length.
  void Raw(std::string_view b);

  // Writes a 4-byte placeholder and returns its position; PatchLength(pos)
  // later stores the number of bytes written after the placeholder as an
  // int32 (a frame size, or the length of a run of record batches).
  size_t ReserveLength();
  void PatchLength(size_t pos);

  // Records an error (a value the requested version cannot express).
  void Fail(std::string reason);

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  size_t size() const { return out_->size(); }

 private:
  std::string* out_;
  Status status_;
};

}  // namespace weir::kafka
