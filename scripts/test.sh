#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, runs every test,
# then runs the unit tests (and the integration tests labelled sanitize) again under
# AddressSanitizer + UndefinedBehaviorSanitizer,
# then the WAL and engine unit tests under ThreadSanitizer,
# then fuzzes the Kafka request decoder for WEIR_FUZZ_SECONDS (default 60), and the
# S2S input decoders, the record batch checks and the Arrow IPC reader for a
# third of that each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" --tests
jobs=$(nproc)
export WEIR_LOG_LEVEL=${WEIR_LOG_LEVEL:-warn}
# The Kafka client suites fail, not skip, when their client is missing.
export WEIR_REQUIRE_CLIENTS=1

echo "== build (warnings are errors)"
"$root/scripts/build.sh" "$root/build/ci" -DWEIR_WERROR=ON
echo "== all tests"
ctest --test-dir "$root/build/ci" --output-on-failure -j"$jobs" --timeout 600

echo "== build with ASan + UBSan"
"$root/scripts/build.sh" "$root/build/asan" -DWEIR_WERROR=ON -DWEIR_SANITIZE=ON
echo "== unit tests, and the integration tests labelled sanitize, under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build/asan" --output-on-failure -j"$jobs" -L 'unit|sanitize' --timeout 900

echo "== the WAL and engine unit tests under ThreadSanitizer"
"$root/scripts/tsan.sh"

echo "== fuzz the Kafka request, S2S input, record batch and Arrow IPC decoders (bounded)"
"$root/scripts/fuzz.sh" "${WEIR_FUZZ_SECONDS:-60}"
