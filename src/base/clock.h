// Clocks and deadlines. Monotonic time for latencies and deadlines; wall time
// (Unix milliseconds) only for record timestamps.
#pragma once

#include <chrono>
#include <cstdint>

namespace weir {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
using Duration = SteadyClock::duration;

inline TimePoint Now() { return SteadyClock::now(); }
inline int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Now().time_since_epoch()).count();
}
inline int64_t WallMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
inline double ToMillis(Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace weir
