#include "base/base64.h"

#include <array>

namespace weir {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> MakeReverse() {
  std::array<int8_t, 256> r{};
  for (auto& v : r) v = -1;
  for (int i = 0; i < 64; ++i) r[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return r;
}
constexpr auto kReverse = MakeReverse();

}  // namespace

std::string Base64Encode(std::string_view data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    uint32_t v = (uint32_t{static_cast<unsigned char>(data[i])} << 16) |
                 (uint32_t{static_cast<unsigned char>(data[i + 1])} << 8) | static_cast<unsigned char>(data[i + 2]);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  size_t rest = data.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<unsigned char>(data[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<unsigned char>(data[i + 1])} << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  size_t pad = 0;
  while (!text.empty() && text.back() == '=') {
    text.remove_suffix(1);
    ++pad;
  }
  if (text.size() % 4 == 1) return InvalidArgument("base64 text has a bad length");
  // Padding, when present, makes whole groups of four: "xx==" or "xxx=".
  if (pad > 0 && (text.size() % 4 < 2 || pad != 4 - text.size() % 4)) {
    return InvalidArgument("base64 text has bad padding");
  }
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    int8_t v = kReverse[static_cast<unsigned char>(c)];
    if (v < 0) return InvalidArgument("base64 text holds an invalid character");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  // The bits after the last byte are zero in canonical base64 ("Zg==", not "Zh==").
  if ((acc & ((1u << bits) - 1)) != 0) return InvalidArgument("base64 text has non-zero bits after its last byte");
  return out;
}

}  // namespace weir
