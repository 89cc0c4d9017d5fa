#include "base/crc32c.h"

#include <array>
#include <climits>

#include <isa-l/crc.h>

namespace weir {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t len) {
  // isa-l's crc32_iscsi takes the running (pre-inverted) register and returns it
  // without the final inversion; it takes an int length, so feed large buffers
  // in pieces.
  uint32_t reg = ~crc;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (len > 0) {
    int n = len > static_cast<size_t>(INT_MAX / 2) ? INT_MAX / 2 : static_cast<int>(len);
    reg = crc32_iscsi(p, n, reg);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return ~reg;
}

uint32_t Crc32c(const void* data, size_t len) { return Crc32cExtend(0, data, len); }

namespace {

// Polynomials over GF(2) modulo the Castagnoli polynomial, in the CRC's
// reflected bit order: bit 31 is the coefficient of x^0, bit 0 that of x^31.
constexpr uint32_t kReflectedPoly = 0x82F63B78;
constexpr uint32_t kOne = 1u << 31;  // x^0

constexpr uint32_t MulModPoly(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = kOne; bit != 0; bit >>= 1) {  // a's coefficients, x^0 first
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kReflectedPoly : b >> 1;  // b *= x
  }
  return product;
}

// kPow2[k] = x^(2^k) mod P.
constexpr std::array<uint32_t, 64> kPow2 = [] {
  std::array<uint32_t, 64> t{};
  t[0] = kOne >> 1;  // x^1
  for (size_t k = 1; k < t.size(); ++k) t[k] = MulModPoly(t[k - 1], t[k - 1]);
  return t;
}();

// x^(8 n) mod P: b's bytes move a's CRC up by that much.
uint32_t PowBytes(uint64_t n) {
  uint32_t result = kOne;
  for (size_t k = 3; n != 0 && k < kPow2.size(); ++k, n >>= 1) {
    if (n & 1) result = MulModPoly(result, kPow2[k]);
  }
  return result;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // With the same initial value and final xor (~0), those terms cancel:
  // crc(a + b) = crc(a) * x^(8 len_b) + crc(b).
  return MulModPoly(crc_a, PowBytes(len_b)) ^ crc_b;
}

}  // namespace weir
