// System-call errors as Status, and durable directory creation on a local
// file system. Any thread; no state.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace weir {

// The Status for a failed system call on `path`: a full disk or quota
// (ENOSPC, EDQUOT) is ResourceExhausted, retryable since settle and
// retention free space; anything else is IOError.
Status ErrnoStatus(int err, std::string_view what, std::string_view path);

// fsync(2) of a directory, so entries made or removed in it survive a crash.
Status FsyncDir(const std::string& dir);

// mkdir -p of `path`; each directory on it has its entry synced in its
// parent (also one that was there already: its maker may not have), so the
// whole path survives a crash. A component that is not a
// directory is InvalidArgument; a full disk is ResourceExhausted.
Status MakeDirsSynced(const std::string& path);

}  // namespace weir
