// Key validation and URI dispatch for the ObjectStore interface.
#include "objstore/object_store.h"

#include <algorithm>
#include <cctype>

#include "objstore/file_store.h"
#include "objstore/internal.h"
#include "objstore/mem_store.h"
#include "objstore/s3_store.h"

namespace weir::objstore {

namespace internal {

std::string QuoteKey(std::string_view key) {
  constexpr size_t kMaxShown = 80;
  std::string out = "\"";
  const std::string_view shown = key.substr(0, kMaxShown);
  for (unsigned char c : shown) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  if (shown.size() < key.size()) out += fmt::format("... ({} bytes)", key.size());
  return out;
}

}  // namespace internal

namespace {
constexpr size_t kMaxKeyBytes = 1024;
}  // namespace

Status ObjectStore::PutParts(std::string_view key, std::span<const std::string_view> parts,
                             const PutOptions& options) {
  if (parts.size() == 1) return Put(key, parts[0], options);
  return internal::CatchAll("Put", [&] {
    size_t size = 0;
    for (std::string_view p : parts) size += p.size();
    std::string joined;
    joined.reserve(size);
    for (std::string_view p : parts) joined.append(p);
    return Put(key, joined, options);
  });
}

Status ValidateKey(std::string_view key) {
  auto bad = [&](std::string_view rule) {
    return InvalidArgument("invalid object key {}: {}", internal::QuoteKey(key), rule);
  };
  if (key.empty()) return bad("keys must not be empty");
  if (key.size() > kMaxKeyBytes) return bad("keys must be at most 1024 bytes");
  if (key.find('\0') != std::string_view::npos) return bad("NUL bytes are not allowed");
  if (key.front() == '/') return bad("keys must not start with '/'");
  size_t start = 0;
  while (true) {
    const size_t slash = key.find('/', start);
    const std::string_view segment =
        key.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (segment.empty()) return bad("empty path segments ('//' or a trailing '/') are not allowed");
    if (segment == ".") return bad("'.' segments are not allowed");
    if (segment == "..") return bad("'..' segments are not allowed");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::Ok();
}

namespace {
constexpr std::string_view kMem = "mem://";
constexpr std::string_view kFile = "file://";
constexpr std::string_view kS3 = "s3://";
}  // namespace

Status CheckObjectStoreScheme(std::string_view uri) {
  if (uri.starts_with(kS3) || uri.starts_with(kMem) || uri.starts_with(kFile)) return Status::Ok();
  // Only the scheme is named: the rest may hold secrets in a form no
  // redaction knows. A scheme is a letter, then letters, digits, + - .
  const size_t scheme = uri.find("://");
  const bool named = scheme != std::string_view::npos && scheme >= 1 && scheme <= 32 &&
                     std::isalpha(static_cast<unsigned char>(uri[0])) &&
                     std::all_of(uri.begin(), uri.begin() + static_cast<std::ptrdiff_t>(scheme), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
                     });
  return InvalidArgument(
      "unsupported object store URI scheme {}; supported: file://DIR, mem://, s3://BUCKET[/PREFIX]?...",
      named ? fmt::format("\"{}://\"", uri.substr(0, scheme)) : std::string("(none: the URI does not start with one)"));
}

Result<std::shared_ptr<ObjectStore>> OpenObjectStore(std::string_view uri, const OpenOptions& options) {
  return internal::CatchAll("OpenObjectStore", [&]() -> Result<std::shared_ptr<ObjectStore>> {
    WEIR_RETURN_IF_ERROR(CheckObjectStoreScheme(uri));
    if (uri.starts_with(kS3)) {
      WEIR_ASSIGN_OR_RETURN(S3Options s3, ParseS3Uri(uri));
      if (options.allow_unconditional_put) s3.allow_unconditional_put = true;
      WEIR_ASSIGN_OR_RETURN(std::shared_ptr<S3Store> store, OpenS3Store(s3));
      return std::shared_ptr<ObjectStore>(std::move(store));
    }
    if (uri.starts_with(kMem)) {
      if (uri.size() != kMem.size()) {
        return InvalidArgument("object store URI \"{}\": mem:// takes no path", uri);
      }
      return NewMemStore();
    }
    if (uri.starts_with(kFile)) {
      const std::string_view dir = uri.substr(kFile.size());
      if (dir.empty()) {
        return InvalidArgument("object store URI \"{}\": file:// needs a directory (file:///abs/dir or file://rel/dir)",
                               uri);
      }
      return OpenFileStore(std::string(dir));
    }
    return Internal("OpenObjectStore: no backend for \"{}\"", uri);  // CheckObjectStoreScheme took it
  });
}

}  // namespace weir::objstore
