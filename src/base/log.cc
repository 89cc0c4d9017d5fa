#include "base/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace weir {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("weir");
    const char* level = std::getenv("WEIR_LOG_LEVEL");
    l->set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
    return l;
  }();
  return *logger;
}

}  // namespace weir
