#!/usr/bin/env bash
# Builds with ThreadSanitizer in build/tsan and runs tests under it.
#   scripts/tsan.sh          the WAL and engine unit tests (what CI runs: the
#                            threads of the write path, in about 10 minutes)
#   scripts/tsan.sh all      everything: every unit test, and the integration
#                            tests labelled sanitize (about 25 minutes)
# ThreadSanitizer sees what ASan cannot: data races, lock-order inversions,
# and a mutex unlocked after its memory was freed (ASan does not instrument
# libpthread). A report fails the test. TSAN_JOBS=N sets -j (default nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build/tsan
jobs=${TSAN_JOBS:-$(nproc)}
cmake -G Ninja -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEIR_TSAN=ON >/dev/null
export WEIR_LOG_LEVEL=${WEIR_LOG_LEVEL:-warn}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:exitcode=66}
if [[ ${1:-} == all ]]; then
  ninja -C "$dir" -j"$jobs"
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" -L 'unit|sanitize' --timeout 900
  exit
fi
core=(wal_writer_test wal_fence_test wal_quorum_test producer_window_test engine_test)
ninja -C "$dir" -j"$jobs" "${core[@]}"
for t in "${core[@]}"; do
  echo "== $t under ThreadSanitizer"
  # Bounded as CTest bounds them (a deadlock must fail CI, not stall it).
  timeout --kill-after=30 1800 "$dir/tests/$t" --gtest_brief=1
done
