#include "base/crc32c.h"

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

}  // namespace weir
