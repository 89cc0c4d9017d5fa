// S3 error mapping and XML bodies (see s3_protocol.h).
#include "objstore/s3_protocol.h"

#include <charconv>

#include "objstore/xml.h"

namespace weir::objstore::s3 {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Describe(const Error& e) {
  std::string out = fmt::format("HTTP {}", e.http_status);
  if (!e.code.empty()) out += " " + e.code;
  if (!e.message.empty()) out += ": " + e.message;
  if (!e.request_id.empty()) out += fmt::format(" (request id {})", e.request_id);
  return out;
}

// Why a 403 (or an auth-related 400) happened, in words an operator can act on.
std::string_view AuthHint(std::string_view code) {
  if (code == "SignatureDoesNotMatch") {
    return "S3 authentication failed: the request signature does not match; the secret access key is probably "
           "wrong (AWS_SECRET_ACCESS_KEY or secret_key=)";
  }
  if (code == "InvalidAccessKeyId") {
    return "S3 authentication failed: the service does not know this access key ID (AWS_ACCESS_KEY_ID or "
           "access_key=)";
  }
  if (code == "ExpiredToken" || code == "InvalidToken" || code == "TokenRefreshRequired") {
    return "S3 authentication failed: the session token is invalid or expired (AWS_SESSION_TOKEN)";
  }
  if (code == "RequestTimeTooSkewed") return "S3 authentication failed: this machine's clock is too far off";
  if (code == "AuthorizationHeaderMalformed") {
    return "S3 authentication failed: the signature's region or scope was refused (check region=)";
  }
  if (code == "AccessDenied") {
    return "S3 access denied: the credentials lack permission for this bucket or key (weir needs s3:GetObject, "
           "s3:PutObject, s3:DeleteObject and s3:ListBucket; without ListBucket, S3 answers 403 for a missing key)";
  }
  return "S3 authentication or permission failure (check the access key, secret key and bucket policy)";
}

}  // namespace

Error ParseError(long http_status, std::string_view body, std::string_view request_id) {
  Error e;
  e.http_status = http_status;
  e.request_id = request_id;
  if (body.empty()) return e;
  auto doc = xml::Parse(body);
  if (!doc.ok() || doc->name != "Error") return e;
  e.code = doc->TextOf("Code");
  e.message = doc->TextOf("Message");
  if (e.request_id.empty()) e.request_id = doc->TextOf("RequestId");
  return e;
}

bool IsRetryable(const Error& e) {
  // 501 Not Implemented is permanent: the service lacks the feature. 408 (a
  // proxy's timeout), IncompleteBody and the digest mismatches (the body
  // changed on the way) were not applied, and a retry sends the bytes again.
  return (e.http_status >= 500 && e.http_status != 501) || e.http_status == 429 || e.http_status == 408 ||
         e.code == "SlowDown" || e.code == "RequestTimeout" || e.code == "ConditionalRequestConflict" ||
         e.code == "OperationAborted" || e.code == "InternalError" || e.code == "IncompleteBody" ||
         e.code == "BadDigest" || e.code == "XAmzContentSHA256Mismatch";
}

bool MayHaveBeenApplied(const Error& e) {
  return e.http_status >= 500 && e.http_status != 501;  // 501: the service does not implement the request
}

Status ToStatus(const Error& e, std::string_view what) {
  const std::string detail = Describe(e);
  const long s = e.http_status;
  if (e.code == "NoSuchBucket") {
    return IOError("{}: the bucket does not exist ({}); create it first, or fix the bucket in the URI", what, detail);
  }
  if (s == 403 || e.code == "SignatureDoesNotMatch" || e.code == "InvalidAccessKeyId" || e.code == "ExpiredToken" ||
      e.code == "InvalidToken" || e.code == "AuthorizationHeaderMalformed" || e.code == "RequestTimeTooSkewed") {
    return IOError("{}: {} ({})", what, AuthHint(e.code), detail);
  }
  if (s >= 300 && s < 400) {
    return IOError("{}: the service redirected the request ({}); check region= and endpoint=", what, detail);
  }
  if (s == 404) return NotFound("{}: not found ({})", what, detail);
  if (s == 412) return PreconditionFailed("{}: the object already exists ({})", what, detail);
  if (s == 416) return OutOfRange("{}: the range starts past the end of the object ({})", what, detail);
  if (e.code == "RequestTimeout") return Timeout("{}: {}", what, detail);
  if (s == 501) return NotSupported("{}: the service does not implement this ({})", what, detail);
  if (IsRetryable(e)) return Unavailable("{}: {}", what, detail);
  // PreconditionFailed means "the key exists" to a create: only the bucket
  // calls' conflicts map to it; any other 409 (a bucket in a bad state, a
  // key that is a directory on some stores) is an error, never "exists".
  if (s == 409 && e.code.starts_with("Bucket")) return PreconditionFailed("{}: conflict ({})", what, detail);
  if (s == 409) return IOError("{}: conflict ({})", what, detail);
  if (s >= 400 && s < 500) return InvalidArgument("{}: request refused ({})", what, detail);
  return Unavailable("{}: unexpected response ({})", what, detail);
}

Result<std::string> UrlDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+' && plus_is_space) {
      out += ' ';
    } else if (s[i] == '%') {
      if (i + 2 >= s.size()) return Corruption("truncated %-escape in \"{}\"", s);
      const int hi = HexValue(s[i + 1]);
      const int lo = HexValue(s[i + 2]);
      if (hi < 0 || lo < 0) return Corruption("bad %-escape in \"{}\"", s);
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool XmlSafe(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    // U+FFFE and U+FFFF (EF BF BE, EF BF BF) are not XML 1.0 characters.
    if (c == 0xef && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0xbf &&
        (static_cast<unsigned char>(s[i + 2]) & 0xfe) == 0xbe) {
      return false;
    }
  }
  return true;
}

Result<ListResult> ParseListObjectsV2(std::string_view body) {
  WEIR_ASSIGN_OR_RETURN(xml::Element doc, xml::Parse(body));
  if (doc.name != "ListBucketResult") return Corruption("ListObjectsV2 answered <{}>, not <ListBucketResult>", doc.name);
  ListResult out;
  const bool url_encoded = doc.TextOf("EncodingType") == "url";
  out.truncated = doc.TextOf("IsTruncated") == "true";
  out.next_continuation_token = doc.TextOf("NextContinuationToken");
  for (const xml::Element& c : doc.children) {
    if (c.name != "Contents") continue;
    ObjectInfo info;
    const std::string_view key = c.TextOf("Key");
    if (url_encoded) {
      WEIR_ASSIGN_OR_RETURN(info.key, UrlDecode(key));
    } else {
      info.key = key;
    }
    const std::string_view size = c.TextOf("Size");
    auto [p, ec] = std::from_chars(size.data(), size.data() + size.size(), info.size);
    if (ec != std::errc() || p != size.data() + size.size()) {
      return Corruption("ListObjectsV2: bad <Size> \"{}\" for key \"{}\"", size, info.key);
    }
    out.objects.push_back(std::move(info));
  }
  if (out.truncated && out.next_continuation_token.empty()) {
    return Corruption("ListObjectsV2: truncated result without a NextContinuationToken");
  }
  return out;
}

std::string DeleteObjectsBody(std::span<const std::string> full_keys) {
  std::string body =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Quiet>true</Quiet>";
  for (const std::string& key : full_keys) body += "<Object><Key>" + xml::Escape(key) + "</Key></Object>";
  body += "</Delete>";
  return body;
}

std::optional<ContentRange> ParseContentRange(std::string_view v) {
  auto number = [](std::string_view s) -> std::optional<uint64_t> {
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
    return n;
  };
  if (!v.starts_with("bytes ")) return std::nullopt;
  v.remove_prefix(6);
  const size_t dash = v.find('-'), slash = v.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || dash > slash) return std::nullopt;
  auto first = number(v.substr(0, dash));
  auto last = number(v.substr(dash + 1, slash - dash - 1));
  if (!first || !last || *last < *first) return std::nullopt;
  ContentRange r{*first, *last, std::nullopt};
  if (v.substr(slash + 1) != "*") {
    r.total = number(v.substr(slash + 1));
    if (!r.total || *r.total <= *last) return std::nullopt;
  }
  return r;
}

Result<std::vector<DeleteError>> ParseDeleteResult(std::string_view body) {
  WEIR_ASSIGN_OR_RETURN(xml::Element doc, xml::Parse(body));
  if (doc.name != "DeleteResult") return Corruption("DeleteObjects answered <{}>, not <DeleteResult>", doc.name);
  std::vector<DeleteError> errors;
  for (const xml::Element& c : doc.children) {
    if (c.name != "Error") continue;
    errors.push_back(DeleteError{std::string(c.TextOf("Key")), std::string(c.TextOf("Code")),
                                 std::string(c.TextOf("Message"))});
  }
  return errors;
}

}  // namespace weir::objstore::s3
