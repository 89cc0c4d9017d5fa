#!/usr/bin/env bash
# The s3:// figures of docs/benchmarks.md against a throw-away local radosgw:
# `weir bench s3` (8 MiB PUTs at 1, 8, 32 in flight; ranged 64 KiB GETs), then
# `weir bench wal` on s3:// at 64 appenders (default, then 4 in flight each).
# Usage: bench/s3.sh [path/to/weir] [seconds per step]
# With S3_ENV=FILE (a tests/s3/ceph-s3-start.sh env file) it uses that server
# instead of starting one.
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
set -a
. "$env_file"
set +a
export WEIR_LOG_LEVEL=${WEIR_LOG_LEVEL:-warn}
"$weir" bench s3 --object-store "s3://$S3_BUCKET/bench-s3?endpoint=$S3_ENDPOINT" --step-seconds "$secs" --range-seconds "$secs"
for inflight in 32 4; do
  "$weir" bench wal --store "s3://$S3_BUCKET/bench-wal?endpoint=$S3_ENDPOINT" --appenders 64 --inflight "$inflight" \
    --record-bytes 1024 --duration "$secs"
done
