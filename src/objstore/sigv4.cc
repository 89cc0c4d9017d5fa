// AWS Signature Version 4: canonical request, string to sign, signing key,
// signature. See sigv4.h; vectors from AWS's test suite in tests/sigv4_test.cc.
#include "objstore/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <memory>

#include <fmt/format.h>

namespace weir::objstore::sigv4 {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

bool Unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Trims surrounding whitespace and collapses inner runs of spaces to one.
std::string TrimHeaderValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  bool pending_space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += c;
  }
  return out;
}

std::string Digest(const EVP_MD* md, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out, &len, md, nullptr);
  return std::string(reinterpret_cast<const char*>(out), len);
}

}  // namespace

std::string Hex(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kHexDigits[c >> 4];
    out += kHexDigits[c & 15];
  }
  return out;
}

std::string Sha256Hex(std::string_view data) { return Hex(Digest(EVP_sha256(), data)); }

std::string Sha256Hex(std::span<const std::string_view> parts) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return "";
  for (std::string_view p : parts) {
    if (EVP_DigestUpdate(ctx.get(), p.data(), p.size()) != 1) return "";
  }
  if (EVP_DigestFinal_ex(ctx.get(), out, &len) != 1) return "";
  return Hex(std::string_view(reinterpret_cast<const char*>(out), len));
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string Md5Base64(std::string_view data) {
  const std::string md5 = Digest(EVP_md5(), data);
  unsigned char out[32];
  const int n = EVP_EncodeBlock(out, reinterpret_cast<const unsigned char*>(md5.data()), static_cast<int>(md5.size()));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string UriEncode(std::string_view s, bool encode_slash) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (Unreserved(c) || (c == '/' && !encode_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += static_cast<char>(std::toupper(kHexDigits[c >> 4]));
      out += static_cast<char>(std::toupper(kHexDigits[c & 15]));
    }
  }
  return out;
}

std::string CanonicalQuery(const Pairs& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) encoded.emplace_back(UriEncode(name, true), UriEncode(value, true));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out += '&';
    out += name;
    out += '=';
    out += value;
  }
  return out;
}

std::string AmzDate(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

Signed Sign(const Request& request, const Credentials& credentials, std::string_view region,
            std::string_view service, std::string_view amz_date) {
  // Headers: lowercase names, sorted; repeated names join their values with ','.
  std::map<std::string, std::string> headers;
  for (const auto& [name, value] : request.headers) {
    std::string& slot = headers[Lower(name)];
    if (!slot.empty()) slot += ',';
    slot += TrimHeaderValue(value);
  }
  Signed out;
  std::string canonical_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += fmt::format("{}:{}\n", name, value);
    if (!out.signed_headers.empty()) out.signed_headers += ';';
    out.signed_headers += name;
  }
  out.canonical_request = fmt::format("{}\n{}\n{}\n{}\n{}\n{}", request.method, request.canonical_uri,
                                      CanonicalQuery(request.query), canonical_headers, out.signed_headers,
                                      request.payload_sha256);
  const std::string_view date = amz_date.substr(0, 8);
  const std::string scope = fmt::format("{}/{}/{}/aws4_request", date, region, service);
  out.string_to_sign =
      fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", amz_date, scope, Sha256Hex(out.canonical_request));
  std::string key = HmacSha256("AWS4" + credentials.secret_key, date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  out.signature = Hex(HmacSha256(key, out.string_to_sign));
  out.authorization = fmt::format("AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}",
                                  credentials.access_key, scope, out.signed_headers, out.signature);
  return out;
}

}  // namespace weir::objstore::sigv4
