// mem://: an in-memory ObjectStore for tests and benchmarks. Owned by whoever
// holds the shared_ptr; thread-safe (one mutex); nothing survives the process.
#pragma once

#include "objstore/object_store.h"

namespace weir::objstore {

std::shared_ptr<ObjectStore> NewMemStore();

}  // namespace weir::objstore
