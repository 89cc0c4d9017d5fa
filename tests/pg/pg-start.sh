#!/usr/bin/env bash
# Starts a disposable PostgreSQL server for the tests: a new cluster in a
# fresh temporary directory, listening on 127.0.0.1 at a free port (its Unix
# socket in the cluster's directory), trust authentication for user "weir".
#
#   tests/pg/pg-start.sh DIR      (DIR is wiped first; a stale server in it is stopped)
#
# Writes DIR/env (POSTGRES_URI=postgres://weir@127.0.0.1:PORT/postgres) and
# DIR/cluster (the cluster's directory, which tests/pg/pg-stop.sh DIR stops
# and removes). As root, the server runs as the "postgres" user (PostgreSQL
# refuses root). Needs Debian's postgresql package (scripts/deps.sh --tests).
# fsync is off: the tests check the metastore's rules, not PostgreSQL's disk.
set -euo pipefail

dir=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "pg-start: no PostgreSQL server under /usr/lib/postgresql; run scripts/deps.sh --tests (Debian: postgresql)" >&2
  exit 1
fi

[ -f "$dir/cluster" ] && "$here/pg-stop.sh" "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# The cluster lives under /tmp: the postgres user may not be able to reach DIR.
cluster=$(mktemp -d /tmp/weir-pg.XXXXXX)
echo "$cluster" > "$dir/cluster"
as_owner=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres: "$cluster"
  as_owner=(runuser -u postgres --)
fi
trap 'rc=$?; if [ $rc -ne 0 ]; then echo "pg-start failed ($rc); log:" >&2; cat "$cluster/log" >&2 2>/dev/null; "$here/pg-stop.sh" "$dir" >/dev/null 2>&1 || true; fi' EXIT

"${as_owner[@]}" "$bindir/initdb" -D "$cluster/data" -U weir --auth=trust -E UTF8 --no-sync >"$cluster/initdb.log" 2>&1 ||
  { cat "$cluster/initdb.log" >&2; exit 1; }
# A free port is picked, then bound by the server: another process (tests
# run side by side) may take it in between, so a failed start tries another.
for attempt in 1 2 3 4 5; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  if "${as_owner[@]}" "$bindir/pg_ctl" -D "$cluster/data" -l "$cluster/log" -w -t 60 start \
    -o "-p $port -k $cluster -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" >/dev/null; then
    break
  fi
  [ "$attempt" -lt 5 ] || exit 1
  echo "pg-start: the server did not start on port $port (attempt $attempt); trying another port" >&2
done
echo "POSTGRES_URI=postgres://weir@127.0.0.1:$port/postgres" > "$dir/env"
echo "pg-start: PostgreSQL on 127.0.0.1:$port (cluster $cluster)"
