#!/usr/bin/env bash
# Stops the server tests/s3/ceph-s3-start.sh started in DIR: signals exactly
# the PIDs it recorded (radosgw, then the OSD, then the monitor; SIGKILL after
# 5 s), then removes DIR unless --keep.
#
#   tests/s3/ceph-s3-stop.sh DIR [--keep]
set -uo pipefail
dir=${1:?usage: $0 DIR [--keep]}
keep=${2:-}
if [ ! -f "$dir/pids" ]; then
  echo "ceph-s3-stop: nothing recorded in $dir/pids" >&2
  exit 0
fi

# Alive, not a zombie, and still a ceph daemon (the PID was not reused).
is_ours() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  local rest=${stat#*(}
  local comm=${rest%%)*}
  local state=${rest#*) }
  state=${state%% *}
  [ "$state" != Z ] || return 1
  case $comm in ceph-mon|ceph-osd|radosgw) return 0 ;; *) return 1 ;; esac
}

tac "$dir/pids" | while read -r name pid; do
  is_ours "$pid" || continue
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 50); do is_ours "$pid" || break; sleep 0.1; done
  if is_ours "$pid"; then
    echo "ceph-s3-stop: $name ($pid) ignored SIGTERM; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null
  fi
done
[ "$keep" = --keep ] || rm -rf "$dir"
exit 0
