// Private helpers shared by the objstore backends; not part of the module's
// interface (include only from src/objstore/*.cc).
#pragma once

#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "base/status.h"

namespace weir::objstore::internal {

// A key made printable for an error message: non-printable bytes as \xNN,
// quotes and backslashes escaped, long keys cut to their first 80 bytes.
std::string QuoteKey(std::string_view key);

// Runs f() and turns any std exception (in practice std::bad_alloc) into a
// Status, so no exception leaves a backend method.
template <typename F>
auto CatchAll(std::string_view op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("{}: out of memory", op);
  } catch (const std::exception& e) {
    return Internal("{}: unexpected exception: {}", op, e.what());
  }
}

}  // namespace weir::objstore::internal
