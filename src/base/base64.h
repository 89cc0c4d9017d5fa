// Standard base64 (RFC 4648, with padding). Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace weir {

std::string Base64Encode(std::string_view data);
// Accepts padded or unpadded input; kInvalidArgument on any other character,
// on padding that does not complete a group of four, and on non-zero bits
// after the last byte.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace weir
