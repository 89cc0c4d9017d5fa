// Standard base64 (RFC 4648, with padding). Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace weir {

std::string Base64Encode(std::string_view data);
// Accepts padded or unpadded input; kInvalidArgument on any other character.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace weir
