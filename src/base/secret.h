// Comparing secrets (bearer tokens) and reading the credentials of an
// HTTP-style authorization header value. Header-only, stateless.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace weir {

// Equality whose time does not depend on where the first difference is
// (only on the lengths).
inline bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The credentials after `scheme` and one space in an authorization header
// value ("Bearer abc" -> "abc"), the scheme matched case-insensitively (RFC
// 9110 §11.1; `scheme` in any case); nullopt for another scheme.
inline std::optional<std::string_view> AuthCredentials(std::string_view header, std::string_view scheme) {
  if (header.size() <= scheme.size() || header[scheme.size()] != ' ') return std::nullopt;
  for (size_t i = 0; i < scheme.size(); ++i) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(header[i]) != lower(scheme[i])) return std::nullopt;
  }
  return header.substr(scheme.size() + 1);
}

}  // namespace weir
