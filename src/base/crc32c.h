// CRC-32C (Castagnoli), the checksum of Kafka RecordBatch v2 and of every weir
// format. Hardware-accelerated through isa-l. Thread-safe, stateless.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weir {

// Standard CRC-32C of data (init ~0, final xor ~0): "123456789" -> 0xE3069283.
uint32_t Crc32c(const void* data, size_t len);
inline uint32_t Crc32c(std::string_view s) { return Crc32c(s.data(), s.size()); }

// Continues a CRC: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t len);

// The CRC of a + b from the CRCs of a and b and b's length, without the
// bytes: Crc32cCombine(Crc32c(a), Crc32c(b), b.size()) == Crc32c(a + b).
// Under a microsecond (it grows with log len_b): worth it only for long b.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace weir
