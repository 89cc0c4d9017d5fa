// Durable directory creation on a local file system. Any thread; no state.
#pragma once

#include <string>

#include "base/status.h"

namespace weir {

// fsync(2) of a directory, so entries made or removed in it survive a crash.
Status FsyncDir(const std::string& dir);

// mkdir -p of `path`; each directory it creates has its entry synced in its
// parent, so the whole path survives a crash. A component that is not a
// directory is InvalidArgument; a full disk is ResourceExhausted.
Status MakeDirsSynced(const std::string& path);

}  // namespace weir
