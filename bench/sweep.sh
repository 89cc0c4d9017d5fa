#!/usr/bin/env bash
# Runs the WAL benchmark sweep of docs/benchmarks.md and prints a Markdown table.
# Usage: bench/sweep.sh [path/to/weir] [seconds per run]
set -euo pipefail
weir=${1:-build/release/src/cli/weir}
dur=${2:-10}
printf '| store | appenders | record | appends/s | MB/s | p50 ms | p99 ms | p99.9 ms | PUTs/s | bytes/PUT |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for store in mem file; do
  for appenders in 1 16 64 256; do
    for bytes in 100 1024 65536; do
      args=(bench wal --appenders "$appenders" --record-bytes "$bytes" --duration "$dur")
      label=$store
      if [ "$store" = mem ]; then args+=(--store mem --put-latency-ms 20); label="mem, L=20 ms"; else args+=(--store file); fi
      # One appender is the idle case: one append at a time.
      [ "$appenders" = 1 ] && args+=(--inflight 1)
      "$weir" "${args[@]}" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
print("| %s | %d | %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f |" % (sys.argv[1], d["appenders"], d["record_bytes"],
      d["appends_per_s"], d["mb_per_s"], d["p50_ms"], d["p99_ms"], d["p999_ms"], d["puts_per_s"], d["bytes_per_put"]))' "$label"
    done
  done
done
