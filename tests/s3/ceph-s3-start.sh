#!/usr/bin/env bash
# Starts a disposable S3 server for the tests: one Ceph monitor, one OSD on
# memstore (RAM, at most 4 GiB) and radosgw, all on 127.0.0.1 with free ports,
# everything under DIR. Creates an S3 user and the bucket "weir-test".
#
#   tests/s3/ceph-s3-start.sh DIR      (DIR is wiped first; a stale server in it is stopped)
#
# Writes DIR/env (KEY=VALUE lines: S3_ENDPOINT, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, S3_BUCKET) and DIR/pids (what
# tests/s3/ceph-s3-stop.sh DIR kills). Needs the Debian packages radosgw,
# ceph-mon and ceph-osd (scripts/deps.sh installs them). Takes about 2 s.
set -euo pipefail

dir=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
t0=$(date +%s%N)
say() { echo "[$(( ($(date +%s%N) - t0) / 1000000 )) ms] $*"; }

for tool in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph curl python3; do
  command -v "$tool" >/dev/null || { echo "ceph-s3-start: $tool is missing; run scripts/deps.sh (Debian: radosgw ceph-mon ceph-osd)" >&2; exit 1; }
done

[ -f "$dir/pids" ] && "$here/ceph-s3-stop.sh" "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
mkdir -p "$dir"/{run,log,crash,mon.a,osd.0,rgw}
dir=$(cd "$dir" && pwd)
export CEPH_CONF=$dir/ceph.conf  # read by every ceph tool below
: > "$dir/pids"

# On failure, stop whatever started and keep the logs for a look.
trap 'rc=$?; if [ $rc -ne 0 ]; then echo "ceph-s3-start failed ($rc); logs in $dir/log" >&2; "$here/ceph-s3-stop.sh" "$dir" --keep >/dev/null 2>&1 || true; fi' EXIT

# Two distinct free loopback ports: the monitor's and radosgw's.
read -r mon_port rgw_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')

random_string() { LC_ALL=C tr -dc "$1" </dev/urandom 2>/dev/null | head -c "$2" || true; }
access_key=$(random_string 'A-Z0-9' 20)
secret_key=$(random_string 'A-Za-z0-9' 40)
fsid=$(cat /proc/sys/kernel/random/uuid)
osd_uuid=$(cat /proc/sys/kernel/random/uuid)

cat > "$CEPH_CONF" <<CONF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$mon_port]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
# radosgw would ask for "secure" mode, which needs auth
ms mon client mode = crc
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
crash dir = $dir/crash
mon cluster log file = $dir/log/cluster.log
mon data = $dir/\$name
osd data = $dir/\$name
mon data avail crit = 0
mon data avail warn = 1
mon warn on insecure global id reclaim allowed = false
# commit map changes at once rather than batching them for a second
paxos propose interval = 0.01
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 4294967296

[client.rgw.a]
rgw data = $dir/rgw
# tcp_nodelay: without it beast holds the body behind the headers until our
# delayed ACK (40 ms per small response on a kept-alive connection)
rgw frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
rgw thread pool size = 64
# reclaim deleted and overwritten objects' data within seconds, not hours
# (everything lives in RAM)
rgw gc obj min wait = 5
rgw gc processor period = 5
CONF

# Daemons run in the foreground (-f) of their own session, output to files,
# so nothing holds the caller's stdout (CTest waits for it to close).
daemon() {
  local name=$1; shift
  setsid "$@" -f </dev/null >"$dir/log/$name.out" 2>&1 &
  echo "$name $!" >> "$dir/pids"
}

monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
ceph-mon --mkfs -i a --monmap "$dir/monmap" >"$dir/log/mon-mkfs.out" 2>&1
daemon mon.a ceph-mon -i a
say "monitor on 127.0.0.1:$mon_port"

osd_id=$(timeout 60 ceph --connect-timeout 60 osd new "$osd_uuid" 2>>"$dir/log/ceph.err")
ceph-osd -i "$osd_id" --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd-mkfs.out" 2>&1
daemon "osd.$osd_id" ceph-osd -i "$osd_id"
say "osd.$osd_id (memstore)"

# Creating the user also creates the default zone and radosgw's pools.
timeout 120 radosgw-admin user create --uid=weir-test --display-name="weir tests" \
  --access-key="$access_key" --secret-key="$secret_key" >"$dir/log/user.json" 2>"$dir/log/radosgw-admin.err"
daemon rgw.a radosgw -n client.rgw.a
say "radosgw on 127.0.0.1:$rgw_port"

endpoint=http://127.0.0.1:$rgw_port
empty_sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
# A SigV4-signed request with curl; radosgw wants x-amz-content-sha256 signed.
signed() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X "$1" --aws-sigv4 "aws:amz:us-east-1:s3" \
    --user "$access_key:$secret_key" -H "x-amz-content-sha256: $empty_sha256" "$endpoint$2" || true
}
code=000
for _ in $(seq 1 600); do
  code=$(signed GET /)
  [ "$code" = 200 ] && break
  sleep 0.1
done
[ "$code" = 200 ] || { echo "radosgw never answered a signed request with 200 (last: $code)" >&2; exit 1; }
code=$(signed PUT /weir-test)
[ "$code" = 200 ] || { echo "creating bucket weir-test failed: HTTP $code" >&2; exit 1; }

cat > "$dir/env" <<ENV
S3_ENDPOINT=$endpoint
AWS_ACCESS_KEY_ID=$access_key
AWS_SECRET_ACCESS_KEY=$secret_key
AWS_DEFAULT_REGION=us-east-1
S3_BUCKET=weir-test
CEPH_S3_DIR=$dir
ENV
say "ready: $endpoint, bucket weir-test ($dir/env)"
