#!/usr/bin/env bash
# Kafka produce benchmark (issue #6's targets): starts `weir serve` on a temp
# data dir (file:// object store, free ports), runs weir_kafka_bench
# (bench/kafka_produce.cc, librdkafka) against its Kafka listener, stops the
# server and prints the tool's JSON line.
#
# Usage: scripts/bench-kafka.sh [weir serve flags...] [-- weir_kafka_bench flags...]
#   scripts/bench-kafka.sh                                   # 1 KiB, acks=all, idempotent, linger 5 ms
#   scripts/bench-kafka.sh --inject-put-latency-ms 50,120    # the S3-like latency target
#   scripts/bench-kafka.sh -- --partitions 16 --duration 30 --compression lz4
# Environment (all optional):
#   WEIR=path/to/weir              default build/release/src/cli/weir (built if missing)
#   BENCH=path/to/weir_kafka_bench default next to it: build/release/bench/weir_kafka_bench
#   KEEP=1                         keep the temp dir (data, server log) and print its path
#   TMPDIR=DIR                     where the temp dir goes (default /tmp; on ext4 without a
#                                  journal, a directory no recent run deleted files in:
#                                  see "Running the benchmarks" in docs/benchmarks.md)
# The tool's defaults here: --record-bytes 1024 --duration 10 --linger-ms 5
# --acks all --idempotent --compression none --partitions 8 (later flags win).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

serve_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do serve_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
bench_args=("$@")

if [ -z "${WEIR:-}" ]; then
  WEIR=$root/build/release/src/cli/weir
  [ -x "$WEIR" ] || "$root/scripts/build.sh" "$root/build/release" -DWEIR_TESTS=OFF
fi
if [ -z "${BENCH:-}" ]; then
  BENCH=$root/build/release/bench/weir_kafka_bench
  if [ ! -x "$BENCH" ]; then
    [ -d "$root/build/release" ] || cmake -G Ninja -S "$root" -B "$root/build/release" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEIR_TESTS=OFF >/dev/null
    ninja -C "$root/build/release" weir_kafka_bench >&2 || true
  fi
fi
[ -x "$BENCH" ] || { echo "bench-kafka: $BENCH not built: it needs librdkafka-dev (scripts/deps.sh)" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weir-bench-kafka-XXXXXX")
weir_pid=""
cleanup() {
  if [ -n "$weir_pid" ]; then
    kill -TERM "$weir_pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$weir_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$weir_pid" 2>/dev/null || true
    wait "$weir_pid" 2>/dev/null || true
  fi
  if [ -n "${KEEP:-}" ]; then echo "bench-kafka: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

WEIR_LOG_LEVEL=${WEIR_LOG_LEVEL:-info} "$WEIR" serve --data-dir "$tmp/data" --http-addr 127.0.0.1:0 \
  --kafka-addr 127.0.0.1:0 "${serve_args[@]}" >"$tmp/weir.log" 2>&1 &
weir_pid=$!
kafka=""
for _ in $(seq 1200); do  # up to 120 s: recovery on a loaded machine
  kafka=$(grep -o 'kafka://[^ ]*' "$tmp/weir.log" | head -1 | sed 's,^kafka://,,') || true
  [ -n "$kafka" ] && break
  kill -0 "$weir_pid" 2>/dev/null || { cat "$tmp/weir.log" >&2; echo "bench-kafka: weir serve exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$kafka" ] || { cat "$tmp/weir.log" >&2; echo "bench-kafka: weir serve did not start" >&2; exit 1; }
echo "== weir serve ${serve_args[*]} (file:// in $tmp); kafka://$kafka" >&2

set +e
"$BENCH" --brokers "$kafka" --topic bench --partitions 8 --record-bytes 1024 --duration 10 \
  --linger-ms 5 --acks all --idempotent --compression none "${bench_args[@]}" >"$tmp/bench.json"
rc=$?
set -e
kill -TERM "$weir_pid"
if ! wait "$weir_pid"; then echo "bench-kafka: weir serve exited $? on SIGTERM" >&2; tail -20 "$tmp/weir.log" >&2; fi
weir_pid=""
tail -1 "$tmp/bench.json"
exit $rc
