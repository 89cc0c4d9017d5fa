#!/usr/bin/env bash
# Builds the Kafka request fuzzer with clang (libFuzzer + ASan + UBSan) in
# build/fuzz and runs it for SECONDS (default 60) on a scratch copy of the seed
# corpus. Exits non-zero on a crash, leak or timeout; the input that caused it
# is left in build/fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS]        (FUZZ_JOBS=N sets ninja's -j, default nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
dir=$root/build/fuzz

CC=clang CXX=clang++ cmake -G Ninja -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWEIR_FUZZ=ON -DWEIR_TESTS=OFF >/dev/null
ninja -C "$dir" -j"${FUZZ_JOBS:-$(nproc)}" kafka_request_fuzz kafka_corpus_gen

corpus=$dir/corpus/kafka_request
rm -rf "$corpus"
mkdir -p "$corpus" "$dir/artifacts"
cp "$root"/tests/fuzz/corpus/kafka_request/* "$corpus"/
"$dir/tests/fuzz/kafka_corpus_gen" "$corpus"

echo "== fuzzing the Kafka request decoder for ${seconds}s"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/tests/fuzz/kafka_request_fuzz" -max_total_time="$seconds" -timeout=10 \
  -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$corpus"
