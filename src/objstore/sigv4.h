// AWS Signature Version 4 for S3 requests (header signing), plus the hashes
// S3 needs (SHA-256 payload hashes, HMAC-SHA256, Content-MD5). Pure functions:
// no state, no I/O, callable from any thread. OpenSSL stays inside sigv4.cc.
//
// The canonical URI is taken as given: S3 encodes the path once and never
// normalizes it, so the caller passes the same encoded path it sends.
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weir::objstore::sigv4 {

using Pairs = std::vector<std::pair<std::string, std::string>>;

struct Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty unless temporary credentials
};

struct Request {
  std::string method;         // "GET", "PUT", ...
  std::string canonical_uri;  // encoded path, e.g. "/bucket/a%20b"
  Pairs query;                // decoded names and values, any order
  Pairs headers;              // every header to sign, as sent (any case, any order)
  std::string payload_sha256;  // hex SHA-256 of the body
};

struct Signed {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;x-amz-date"
  std::string signature;       // hex
  std::string authorization;   // the Authorization header value
};

// Signs `request` for `service` in `region` at `amz_date` (YYYYMMDDTHHMMSSZ,
// which must also be the request's x-amz-date header).
Signed Sign(const Request& request, const Credentials& credentials, std::string_view region,
            std::string_view service, std::string_view amz_date);

// RFC 3986 percent-encoding as SigV4 wants it: unreserved bytes
// (A-Z a-z 0-9 - . _ ~) stay, everything else becomes %XX (uppercase);
// '/' stays unless encode_slash.
std::string UriEncode(std::string_view s, bool encode_slash);

// "a=1&b=2": names and values encoded, sorted by encoded name then value.
std::string CanonicalQuery(const Pairs& query);

// "20150830T123600Z" for a point in time (UTC).
std::string AmzDate(std::chrono::system_clock::time_point t);

std::string Sha256Hex(std::string_view data);
// SHA-256 of the concatenation of `parts`, hex.
std::string Sha256Hex(std::span<const std::string_view> parts);
std::string HmacSha256(std::string_view key, std::string_view data);  // raw 32 bytes
std::string Md5Base64(std::string_view data);                        // Content-MD5 value
std::string Hex(std::string_view bytes);

inline constexpr std::string_view kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

}  // namespace weir::objstore::sigv4
