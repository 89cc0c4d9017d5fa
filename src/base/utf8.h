// UTF-8 validation. Pure functions; any thread.
#pragma once

#include <string_view>

namespace weir {

// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing
// above U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace weir
