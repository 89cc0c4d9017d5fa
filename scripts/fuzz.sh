#!/usr/bin/env bash
# Builds the fuzzers with clang (libFuzzer + ASan + UBSan) in build/fuzz and
# runs the Kafka request fuzzer for SECONDS (default 60), then the S2S input
# fuzzer, the record batch fuzzer and the Arrow IPC fuzzer for a third of
# that each, each on a scratch copy of its seed corpus.
# Exits non-zero on a crash, leak or timeout; the input that caused it is left
# in build/fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS]        (FUZZ_JOBS=N sets ninja's -j, default nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
dir=$root/build/fuzz

CC=clang CXX=clang++ cmake -G Ninja -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWEIR_FUZZ=ON -DWEIR_TESTS=OFF >/dev/null
ninja -C "$dir" -j"${FUZZ_JOBS:-$(nproc)}" kafka_request_fuzz kafka_corpus_gen s2s_input_fuzz \
  record_batch_fuzz record_batch_corpus_gen arrow_ipc_fuzz

corpus=$dir/corpus/kafka_request
rm -rf "$corpus"
mkdir -p "$corpus" "$dir/artifacts"
cp "$root"/tests/fuzz/corpus/kafka_request/* "$corpus"/
"$dir/tests/fuzz/kafka_corpus_gen" "$corpus"

echo "== fuzzing the Kafka request decoder for ${seconds}s"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/tests/fuzz/kafka_request_fuzz" -max_total_time="$seconds" -timeout=10 \
  -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$corpus"

s2s_corpus=$dir/corpus/s2s_input
rm -rf "$s2s_corpus"
mkdir -p "$s2s_corpus"
cp "$root"/tests/fuzz/corpus/s2s_input/* "$s2s_corpus"/
echo "== fuzzing the S2S frame and AppendInput decoders for $((seconds / 3))s"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/tests/fuzz/s2s_input_fuzz" -max_total_time="$((seconds / 3 > 0 ? seconds / 3 : 1))" -timeout=10 \
  -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$s2s_corpus"

batch_corpus=$dir/corpus/record_batch
rm -rf "$batch_corpus"
mkdir -p "$batch_corpus"
cp "$root"/tests/fuzz/corpus/record_batch/* "$batch_corpus"/
"$dir/tests/fuzz/record_batch_corpus_gen" "$batch_corpus"
echo "== fuzzing the record batch checks and decoder for $((seconds / 3))s"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/tests/fuzz/record_batch_fuzz" -max_total_time="$((seconds / 3 > 0 ? seconds / 3 : 1))" -timeout=10 \
  -rss_limit_mb=4096 -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$batch_corpus"

ipc_corpus=$dir/corpus/arrow_ipc
rm -rf "$ipc_corpus"
mkdir -p "$ipc_corpus"
cp "$root"/tests/flight/fixtures/*.arrows "$ipc_corpus"/
echo "== fuzzing the Arrow IPC reader and the log-row mapping for $((seconds / 3))s"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/tests/fuzz/arrow_ipc_fuzz" -max_total_time="$((seconds / 3 > 0 ? seconds / 3 : 1))" -timeout=10 \
  -rss_limit_mb=4096 -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$ipc_corpus"
