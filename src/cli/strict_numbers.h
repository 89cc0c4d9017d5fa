// Decimal-only numeric flags for the weir command line.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace weir::cli {

// Checks one numeric flag value as written by a user. `type` is CLI11's type
// name ("UINT", "INT" or "FLOAT"). Integers must be plain decimal ("010" is
// ten, not eight; "0x10", "-1" for an unsigned flag and "1e3" are refused);
// floats must be finite decimals ("nan", "inf" and hex floats are refused).
// Rewrites `value` without leading zeros; returns an error message, or "".
std::string CheckNumber(const std::string& type, std::string& value);

// Called by main on the main thread once every flag is registered: adds
// CheckNumber to every integer and floating-point option of `app` and its
// subcommands, ahead of their other checks. CLI11 alone parses integers with
// strtoull(..., 0) (octal, hex, and "-1" as 2^64 - 1) and lets NaN past its
// range checks.
void MakeNumbersStrict(CLI::App& app);

}  // namespace weir::cli
