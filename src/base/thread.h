// Names the calling thread, so top, perf and gdb tell weir's threads apart.
#pragma once

#include <string_view>

namespace weir {

// Sets the calling thread's name (Linux keeps the first 15 bytes). Best effort.
void SetThreadName(std::string_view name);

}  // namespace weir
