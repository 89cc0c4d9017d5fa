#!/usr/bin/env bash
# Measures weir against Redis 7 XADD side by side, on this machine, in one run.
# Issue #4's targets: 64 clients appending 1 KiB records one per request go at
# least 2x Redis XADD with appendonly yes + appendfsync always (both fsync each
# acknowledged write), weir's p99 stays under 10 ms, and 64 clients sending
# batches of 100 x 1 KiB reach 400 MB/s acknowledged.
#
# Needs Redis (server and redis-benchmark), used only by this script:
#   sudo apt-get install -y redis-server redis-tools
# (the package starts a system redis on port 6379; this script starts its own
# throw-away server on a free loopback port and does not touch that one).
#
# Usage: bench/compare-redis.sh
# Environment (all optional):
#   WEIR=path/to/weir  the weir binary (default: build/release, built if missing)
#   CLIENTS=64         concurrent clients for both
#   REQUESTS=200000    XADD requests redis-benchmark sends
#   DURATION=10        seconds each weir run is measured (after WARMUP=2)
#   SERVE_ARGS="..."   extra `weir serve` flags, e.g. "--inject-put-latency-ms 50,120"
#   KEEP=1             keep the temp dir (data, logs) and print its path
#   TMPDIR=DIR         where the temp dir goes (default /tmp; on ext4 without a
#                      journal, a directory no recent run deleted files in: see
#                      "Running the benchmarks" in docs/benchmarks.md)
# Prints a table, then one JSON line with every figure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
CLIENTS=${CLIENTS:-64}
REQUESTS=${REQUESTS:-200000}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}

for tool in redis-server redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || { echo "compare-redis: $tool not found; sudo apt-get install -y redis-server redis-tools" >&2; exit 2; }
done
if [ -z "${WEIR:-}" ]; then
  WEIR=$root/build/release/src/cli/weir
  [ -x "$WEIR" ] || "$root/scripts/build.sh" "$root/build/release" -DWEIR_TESTS=OFF
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weir-compare-redis-XXXXXX")
redis_pid=""
weir_pid=""
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  [ -n "$weir_pid" ] && kill -TERM "$weir_pid" 2>/dev/null && wait "$weir_pid" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "compare-redis: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- Redis: XADD of one 1 KiB field, every write fsynced before the reply.
redis_port=$(free_port)
mkdir -p "$tmp/redis"
redis-server --port "$redis_port" --bind 127.0.0.1 --protected-mode no --dir "$tmp/redis" \
  --appendonly yes --appendfsync always --save '' --daemonize no --logfile "$tmp/redis/log" &
redis_pid=$!
for _ in $(seq 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
value=$(head -c 1024 /dev/zero | tr '\0' 'x')
echo "== redis $(redis-server --version | grep -o 'v=[^ ]*'): XADD 1 KiB, -c $CLIENTS -n $REQUESTS (appendfsync always)" >&2
redis_csv=$(redis-benchmark -p "$redis_port" -c "$CLIENTS" -n "$REQUESTS" --csv XADD s '*' f "$value" | tail -1)
kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=""
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
IFS=, read -r _ redis_rps _ _ redis_p50 _ redis_p99 _ <<<"$(tr -d '"' <<<"$redis_csv")"

# --- weir: weir serve on file:// in a temp dir, then weir bench http.
weir_port=$(free_port)
# shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
WEIR_LOG_LEVEL=info "$WEIR" serve --data-dir "$tmp/weir" --http-addr "127.0.0.1:$weir_port" --kafka-addr "" ${SERVE_ARGS:-} \
  2>"$tmp/weir.log" &
weir_pid=$!
for _ in $(seq 300); do
  grep -q "listening on" "$tmp/weir.log" && break
  kill -0 "$weir_pid" 2>/dev/null || { cat "$tmp/weir.log" >&2; exit 1; }
  sleep 0.1
done
grep -q "listening on" "$tmp/weir.log" || { echo "compare-redis: weir serve did not start" >&2; cat "$tmp/weir.log" >&2; exit 1; }
server=http://127.0.0.1:$weir_port
run_weir() {  # BATCH
  echo "== weir: bench http --clients $CLIENTS --record-bytes 1024 --batch $1 --duration $DURATION" >&2
  "$WEIR" bench http --server "$server" --clients "$CLIENTS" --record-bytes 1024 --batch "$1" \
    --duration "$DURATION" --warmup "$WARMUP" --stream-prefix "b$1-" | tail -1
}
weir1=$(run_weir 1)
weir100=$(run_weir 100)
kill -TERM "$weir_pid"; wait "$weir_pid" || echo "compare-redis: weir serve exited $? on SIGTERM" >&2; weir_pid=""

/usr/bin/python3 - "$redis_rps" "$redis_p50" "$redis_p99" "$weir1" "$weir100" "$CLIENTS" <<'EOF'
import json, sys
redis = {"appends_per_s": float(sys.argv[1]), "p50_ms": float(sys.argv[2]), "p99_ms": float(sys.argv[3])}
redis["mb_per_s"] = redis["appends_per_s"] * 1024 / 1e6
w1, w100 = json.loads(sys.argv[4]), json.loads(sys.argv[5])
clients = sys.argv[6]
rows = [(f"redis XADD 1x1KiB  c={clients}", redis, 1), (f"weir append 1x1KiB c={clients}", w1, 1),
        (f"weir append 100x1KiB c={clients}", w100, 100)]
print(f"{'':28} {'requests/s':>11} {'records/s':>11} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
for name, r, batch in rows:
    print(f"{name:28} {r['appends_per_s']:11.0f} {r['appends_per_s'] * batch:11.0f} {r['mb_per_s']:8.1f} "
          f"{r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r.get('errors', 0):7}")
ratio = w1["appends_per_s"] / redis["appends_per_s"] if redis["appends_per_s"] else 0
print(f"weir / redis at 1x1KiB: {ratio:.2f}x (target >= 2x, weir p99 <= 10 ms); "
      f"100x1KiB: {w100['mb_per_s']:.0f} MB/s (target >= 400)")
print(json.dumps({"redis_xadd": redis, "weir_1x1k": w1, "weir_100x1k": w100, "weir_over_redis": ratio}))
EOF
