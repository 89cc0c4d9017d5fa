#!/usr/bin/env bash
# The s3:// figures of docs/benchmarks.md against a throw-away local radosgw:
# `weir bench s3` (8 MiB PUTs at 1, 8, 32 in flight; ranged 64 KiB GETs), then
# `weir bench wal` on s3:// at 64 appenders (default, then 4 in flight each).
# Usage: bench/s3.sh [path/to/weir] [seconds per step]
# With S3_ENV=FILE (a tests/s3/ceph-s3-start.sh env file) it uses that server
# instead of starting one. With PIN=1 (and a server this script started) the
# S3 server runs on the last core and weir on the others, so that the two do
# not take each other's CPU: the nearest this machine comes to a remote store.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
weir=${1:-build/release/src/cli/weir}
secs=${2:-10}
env_file=${S3_ENV:-}
if [ -z "$env_file" ]; then
  dir=$(mktemp -d /tmp/weir-s3-bench.XXXXXX)
  trap '"$root/tests/s3/ceph-s3-stop.sh" "$dir"' EXIT
  "$root/tests/s3/ceph-s3-start.sh" "$dir" >&2
  env_file=$dir/env
fi
pin=()
if [ "${PIN:-0}" = 1 ] && [ -f "${dir:-}/pids" ]; then
  last=$(( $(nproc) - 1 ))
  [ "$last" -ge 1 ] || { echo "PIN=1 needs two cores" >&2; exit 2; }
  while read -r _ pid; do taskset -a -p -c "$last" "$pid" >/dev/null; done < "$dir/pids"
  pin=(taskset -c "0-$(( last - 1 ))")
fi
set -a
. "$env_file"
set +a
export WEIR_LOG_LEVEL=${WEIR_LOG_LEVEL:-warn}
"${pin[@]}" "$weir" bench s3 --object-store "s3://$S3_BUCKET/bench-s3?endpoint=$S3_ENDPOINT" --step-seconds "$secs" --range-seconds "$secs"
# 32 in flight per appender (the default), with the WAL library's linger (0)
# and with weir serve's (1 ms); then 4 in flight.
for args in "--inflight 32 --linger-ms 0" "--inflight 32 --linger-ms 1" "--inflight 4 --linger-ms 0"; do
  # shellcheck disable=SC2086
  "${pin[@]}" "$weir" bench wal --store "s3://$S3_BUCKET/bench-wal?endpoint=$S3_ENDPOINT" --appenders 64 $args \
    --record-bytes 1024 --duration "$secs"
done
