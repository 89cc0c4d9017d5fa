#include "cli/strict_numbers.h"

#include <cmath>
#include <cstdlib>

#include <CLI/CLI.hpp>

namespace weir::cli {

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::string CheckNumber(const std::string& type, std::string& value) {
  // Blanks around a number (" 120" from "50, 120") are dropped, as CLI11 did.
  const size_t lo = value.find_first_not_of(" \t"), hi = value.find_last_not_of(" \t");
  value = lo == std::string::npos ? std::string() : value.substr(lo, hi - lo + 1);
  std::string_view v = value;
  std::string sign;
  if (!v.empty() && (v[0] == '-' || v[0] == '+')) {
    if (v[0] == '-') sign = "-";
    v.remove_prefix(1);
  }
  if (type == "UINT" || type == "INT") {
    if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) {
      return "must be a whole number in decimal, got \"" + value + "\"";
    }
    if (type == "UINT" && sign == "-") return "must not be negative, got \"" + value + "\"";
    size_t first = v.find_first_not_of('0');
    v.remove_prefix(first == std::string_view::npos ? v.size() - 1 : first);
    // Past 64 bits CLI11 would saturate quietly (narrower flags check their range).
    const std::string_view limit = type == "UINT" ? "18446744073709551615"
                                   : sign == "-" ? "9223372036854775808"
                                                 : "9223372036854775807";
    const bool too_large = v.size() > limit.size() || (v.size() == limit.size() && v > limit);
    value = sign + std::string(v);  // v views the old value: not used past here
    if (too_large) return "is out of range, got \"" + value + "\"";
    return "";
  }
  // FLOAT: digits, an optional fraction, an optional decimal exponent.
  size_t i = 0, digits = 0;
  while (i < v.size() && IsDigit(v[i])) ++i, ++digits;
  if (i < v.size() && v[i] == '.') {
    ++i;
    while (i < v.size() && IsDigit(v[i])) ++i, ++digits;
  }
  if (digits > 0 && i < v.size() && (v[i] == 'e' || v[i] == 'E')) {
    size_t j = i + 1;
    if (j < v.size() && (v[j] == '-' || v[j] == '+')) ++j;
    size_t exp_start = j;
    while (j < v.size() && IsDigit(v[j])) ++j;
    if (j > exp_start) i = j;
  }
  if (digits == 0 || i != v.size() || !std::isfinite(std::strtod(value.c_str(), nullptr))) {
    return "must be a finite decimal number, got \"" + value + "\"";
  }
  return "";
}

void MakeNumbersStrict(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    std::string type = opt->get_type_name();
    type = type.substr(0, type.find(':'));
    if (type != "UINT" && type != "INT" && type != "FLOAT") continue;
    opt->transform(CLI::Validator([type](std::string& value) { return CheckNumber(type, value); }, "", ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) MakeNumbersStrict(*sub);
}

}  // namespace weir::cli
