#include "base/thread.h"

#include <pthread.h>

#include <algorithm>
#include <string>

namespace weir {

void SetThreadName(std::string_view name) {
  const std::string truncated(name.substr(0, std::min<size_t>(name.size(), 15)));
  ::pthread_setname_np(::pthread_self(), truncated.c_str());
}

}  // namespace weir
