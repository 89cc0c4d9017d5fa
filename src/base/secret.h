// Comparing secrets (bearer tokens), reading the credentials of an
// HTTP-style authorization header value, and hiding secrets in URIs.
// Header-only, stateless.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
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

// `uri` for messages and logs: the values of the query parameters
// secret_key, session_token, password and sslpassword (names
// percent-decoded; parameters split at '&' and at every '?' but inside a
// secret's value) and a password
// in its user info ("scheme://user:PASSWORD@host") become "***", in that
// order. A password may hold '/', '?' or '@', so the user info is taken to
// end at the last '@' with a ':' between it and the scheme: a query value
// holding '@' may hide more than the password.
inline std::string RedactUri(std::string_view uri) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  auto decoded = [&](std::string_view name) {
    std::string d;
    for (size_t i = 0; i < name.size(); ++i) {
      if (name[i] == '%' && i + 2 < name.size() && hex(name[i + 1]) >= 0 && hex(name[i + 2]) >= 0) {
        d += static_cast<char>(hex(name[i + 1]) * 16 + hex(name[i + 2]));
        i += 2;
      } else {
        d += name[i];
      }
    }
    return d;
  };
  std::string out;
  const size_t query = uri.find('?');
  if (query == std::string_view::npos) {
    out = uri;
  } else {
    out = uri.substr(0, query + 1);
    for (size_t pos = query + 1; pos <= uri.size();) {
      size_t end = uri.find_first_of("&?", pos);
      if (end == std::string_view::npos) end = uri.size();
      const std::string_view param = uri.substr(pos, end - pos);
      const size_t eq = param.find('=');
      const std::string name = decoded(param.substr(0, eq));
      if (eq != std::string_view::npos &&
          (name == "secret_key" || name == "session_token" || name == "password" || name == "sslpassword")) {
        out.append(param.substr(0, eq + 1)).append("***");
        end = uri.find('&', pos);  // a secret may hold '?': hidden up to the next '&'
        if (end == std::string_view::npos) end = uri.size();
      } else {
        out.append(param);
      }
      if (end < uri.size()) out += uri[end];
      pos = end + 1;
    }
  }
  const size_t scheme = out.find("://");
  if (scheme != std::string::npos) {
    const size_t user_begin = scheme + 3;
    const size_t at = out.rfind('@');
    const size_t colon = out.find(':', user_begin);
    if (at != std::string::npos && at > user_begin && colon < at) out.replace(colon + 1, at - colon - 1, "***");
  }
  return out;
}

}  // namespace weir
