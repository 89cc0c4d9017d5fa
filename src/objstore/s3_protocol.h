// S3's wire formats, as pure functions the S3 store and its tests share: error
// bodies and their mapping to Status, ListObjectsV2 results, DeleteObjects
// requests and results. Values only; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "objstore/object_store.h"

namespace weir::objstore::s3 {

// An S3 error response: the HTTP status and the <Error> body's fields (empty
// when the body has none, as for HEAD).
struct Error {
  long http_status = 0;
  std::string code;  // "NoSuchKey", "SlowDown", ...
  std::string message;
  std::string request_id;
};

// Reads an <Error> body; a body that is not one leaves code and message empty.
Error ParseError(long http_status, std::string_view body, std::string_view request_id);

// Worth retrying: 5xx, SlowDown, RequestTimeout, ConditionalRequestConflict (409).
bool IsRetryable(const Error& e);

// Whether a failed attempt may still have been applied by the service: any
// 5xx but 501 Not Implemented (S3 can complete a request that answered
// 500), not 4xx.
bool MayHaveBeenApplied(const Error& e);

// The Status for an error response to `what` (e.g. "PUT s3://b/k").
Status ToStatus(const Error& e, std::string_view what);

struct ListResult {
  std::vector<ObjectInfo> objects;  // full keys (with the store prefix), decoded
  bool truncated = false;
  std::string next_continuation_token;
};

// Parses a ListObjectsV2 result; keys are URL-decoded when EncodingType is url.
Result<ListResult> ParseListObjectsV2(std::string_view body);

// A DeleteObjects request body (Quiet mode) for up to 1000 keys.
std::string DeleteObjectsBody(std::span<const std::string> full_keys);

// The per-key errors of a DeleteObjects result (Quiet mode lists only these).
struct DeleteError {
  std::string key, code, message;
};
Result<std::vector<DeleteError>> ParseDeleteResult(std::string_view body);

// A 206's `Content-Range: bytes FIRST-LAST/TOTAL` (TOTAL may be `*`:
// nullopt). nullopt for anything else.
struct ContentRange {
  uint64_t first = 0, last = 0;
  std::optional<uint64_t> total;
};
std::optional<ContentRange> ParseContentRange(std::string_view value);

// %XX decoding; with plus_is_space a '+' is a space (S3's url encoding-type
// for listed keys). kCorruption on a malformed escape.
Result<std::string> UrlDecode(std::string_view s, bool plus_is_space = true);

// Whether a key can travel in an XML 1.0 body unchanged (no control bytes).
bool XmlSafe(std::string_view s);

}  // namespace weir::objstore::s3
