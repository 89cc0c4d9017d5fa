#include "base/log.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace weir {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("weir");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
    // Case-insensitive; empty is the default. spdlog reads any other word
    // as "off", which would hide every error: warned about, info used.
    const char* env = std::getenv("WEIR_LOG_LEVEL");
    std::string level = env ? env : "";
    for (char& c : level) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static constexpr std::string_view kNames[] = {"trace", "debug", "info",     "warn", "warning",
                                                  "error", "err",   "critical", "off"};
    const bool known = std::find(std::begin(kNames), std::end(kNames), level) != std::end(kNames);
    l->set_level(known ? spdlog::level::from_str(level) : spdlog::level::info);
    if (!known && !level.empty()) {
      l->warn("WEIR_LOG_LEVEL \"{}\" is not one of trace, debug, info, warn, error, critical, off: using info", env);
    }
    return l;
  }();
  return *logger;
}

}  // namespace weir
