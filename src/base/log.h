// Logging: spdlog behind one accessor so every module logs to the same sink.
// Thread-safe. Level from WEIR_LOG_LEVEL (trace|debug|info|warn|error|off; default info).
#pragma once

#include <spdlog/spdlog.h>

namespace weir {

spdlog::logger& Log();

}  // namespace weir
