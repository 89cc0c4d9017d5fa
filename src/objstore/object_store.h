// The ObjectStore interface: the narrow, S3-shaped surface every storage
// backend implements (file://, mem://, s3://, and decorators such as the fault
// injector). Callers hold a std::shared_ptr<ObjectStore>; every method is
// thread-safe and blocking, and returns a Status/Result, never throws.
//
// Semantics every backend guarantees (checked by tests/objstore_conformance_test):
//  - Put replaces the whole object atomically: a reader sees the old bytes or the
//    new bytes, never a mix. With PutOptions::if_none_match it creates only: if
//    the key exists it fails with kPreconditionFailed and changes nothing; of
//    concurrent creators of one key exactly one succeeds.
//  - A successful Put is durable before it returns (file:// fsyncs).
//  - Get of a missing key is kNotFound. A range starting past the end is
//    kOutOfRange; a range running past the end is truncated to the object.
//  - List returns keys starting with a prefix in ascending byte order, paged.
//  - Delete of a missing key succeeds (S3 semantics).
//  - Keys are validated by ValidateKey; a bad key is kInvalidArgument.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::objstore {

struct PutOptions {
  // Create only: fail with kPreconditionFailed if the key exists (If-None-Match: *).
  bool if_none_match = false;
};

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;  // bytes wanted; the result is shorter at end of object
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

struct ListPage {
  std::vector<ObjectInfo> objects;  // ascending by key
  // Non-empty when more keys may follow: pass it back as start_after.
  std::string next_start_after;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  virtual Status Put(std::string_view key, std::string_view data, const PutOptions& options = {}) = 0;
  // Put of the concatenation of `parts`, for objects scattered in memory (a
  // segment built from cached batches). The default joins the parts and calls
  // Put; backends that can write from the pieces (file://) override it.
  virtual Status PutParts(std::string_view key, std::span<const std::string_view> parts,
                          const PutOptions& options = {});
  virtual Result<std::string> Get(std::string_view key, std::optional<ByteRange> range = std::nullopt) = 0;
  virtual Result<ObjectInfo> Head(std::string_view key) = 0;
  // Keys with `prefix`, strictly greater than `start_after`, at most max_keys (1..1000).
  virtual Result<ListPage> List(std::string_view prefix, std::string_view start_after = {},
                                size_t max_keys = 1000) = 0;
  virtual Status Delete(std::string_view key) = 0;
  // Deletes every key (missing keys are fine). Returns the first failure, after
  // attempting all keys.
  virtual Status DeleteMany(std::span<const std::string> keys) = 0;

  // A short description for logs and errors, e.g. "file:///var/lib/weir".
  virtual std::string Describe() const = 0;
  // Where the objects are, to tell two stores apart: a decorator (faults)
  // gives its inner store's.
  virtual std::string Location() const { return Describe(); }
  // Tells two stores apart on this machine: Location(), or for a local
  // directory its device and inode (one directory reached by two paths, a
  // symlink or a bind mount, is one store).
  virtual std::string Identity() const { return Location(); }
  // How many large PUTs (segments) are worth running at once: many on a
  // remote store, whose latency they hide; few on a local disk, where they
  // only queue the WAL's own writes behind them.
  virtual size_t PreferredParallelPuts() const { return 16; }
};

// Key rules shared by every backend: 1..1024 bytes; no NUL; not starting with
// '/'; no empty, "." or ".." path segments (so "a//b", "./a", "a/../b" are
// rejected). Returns kInvalidArgument naming the rule broken.
Status ValidateKey(std::string_view key);

// Options for OpenObjectStore that do not belong in a URI.
struct OpenOptions {
  // s3:// only: start even if the service ignores If-None-Match: * (create-only
  // PUTs are then emulated, racily; safe for a single node only). The URI
  // parameter allow_unconditional_put=true does the same. See s3_store.h.
  bool allow_unconditional_put = false;
};

// Opens a backend from a URI:
//   file:///abs/dir  or  file://relative/dir   durable local directory (created if missing)
//   mem://            a fresh in-memory store (each call is a new, empty store)
//   s3://BUCKET[/PREFIX]?endpoint=URL&region=R&path_style=true|false
//                     any S3-compatible service; probes create-only PUTs first
//                     (parameters and credentials: s3_store.h, docs/s3.md)
Result<std::shared_ptr<ObjectStore>> OpenObjectStore(std::string_view uri, const OpenOptions& options = {});
// Whether `uri` names one of the schemes above (kInvalidArgument naming them
// if not); opens nothing, for checking flags before anything is made.
Status CheckObjectStoreScheme(std::string_view uri);

}  // namespace weir::objstore
