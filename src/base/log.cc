#include "base/log.h"

#include <cctype>
#include <cstdlib>
#include <string>

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
    const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
    const bool known = parsed != spdlog::level::off || level == "off";
    l->set_level(known ? parsed : spdlog::level::info);
    if (!known && !level.empty()) {
      l->warn("WEIR_LOG_LEVEL \"{}\" is not one of trace, debug, info, warn, error, critical, off: using info", env);
    }
    return l;
  }();
  return *logger;
}

}  // namespace weir
