#!/usr/bin/env bash
# Stops the server tests/pg/pg-start.sh started in DIR (pg_ctl stop, fast
# mode, then immediate) and removes its cluster and DIR.
#
#   tests/pg/pg-stop.sh DIR
set -uo pipefail
dir=${1:?usage: $0 DIR}
if [ ! -f "$dir/cluster" ]; then
  echo "pg-stop: nothing recorded in $dir/cluster" >&2
  exit 0
fi
cluster=$(cat "$dir/cluster")
case $cluster in /tmp/weir-pg.*) ;; *) echo "pg-stop: $dir/cluster names $cluster, not a test cluster" >&2; exit 1 ;; esac
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
as_owner=()
[ "$(id -u)" -eq 0 ] && as_owner=(runuser -u postgres --)
if [ -f "$cluster/data/postmaster.pid" ]; then
  "${as_owner[@]}" "$bindir/pg_ctl" -D "$cluster/data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
    "${as_owner[@]}" "$bindir/pg_ctl" -D "$cluster/data" -m immediate -w -t 30 stop >/dev/null 2>&1
fi
rm -rf "$cluster" "$dir"
exit 0
