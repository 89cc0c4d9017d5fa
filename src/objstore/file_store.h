// file://DIR: the embedded default ObjectStore, one file per key under DIR.
// Thread-safe. Durable: Put writes a temp file under DIR/.weir-tmp, fsyncs it,
// then link(2)s it into place (create-only: EEXIST -> kPreconditionFailed,
// atomically) or rename(2)s it (overwrite), and fsyncs the parent directory
// (and any directory it had to create). Delete keeps small objects' files as
// free files in DIR/.weir-tmp that a later Put rewrites instead of creating a
// new file (docs/architecture.md). Keys whose first segment is ".weir-tmp"
// are reserved and rejected.
#pragma once

#include <functional>
#include <string>

#include "objstore/object_store.h"

namespace weir::objstore {

// Creates DIR if missing. Fails if DIR cannot be created or is not writable.
Result<std::shared_ptr<ObjectStore>> OpenFileStore(const std::string& dir);

// Tests only: every file:// Get calls `hook(path)` after opening the file and
// before reading it, so a test can stall a reader while the file is reused.
// Pass nullptr to remove it. Not for use while Gets are running.
void SetFileStoreReadHookForTest(std::function<void(const std::string& path)> hook);

// Tests only: every directory sync of a file:// store calls `hook(dir)`
// first, and fails with what it returns if that is not OK (a disk error).
// Pass nullptr to remove it. Not for use while the store is in use.
void SetFileStoreDirSyncHookForTest(std::function<Status(const std::string& dir)> hook);

}  // namespace weir::objstore
