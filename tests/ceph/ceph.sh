#!/usr/bin/env bash
# A single-node Ceph with an S3 gateway for the durable tier's tests (issue 44):
# Debian's ceph-mon, ceph-osd (BlueStore on a sparse file) and radosgw, all in
# one temporary directory, on free loopback ports, no authentication between
# the daemons (cephx off: one host, one test), an S3 user and a bucket.
#
#   ceph.sh start DIR      starts it; DIR/env then holds the exports a test
#                          sources: AWS_ENDPOINT_URL, AWS_REGION,
#                          AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
#                          PTCFS_S3_BUCKET, PTCFS_CEPH_DIR
#   ceph.sh stop DIR       stops every daemon it started (by their pid files) and removes DIR
#   ceph.sh stop-rgw DIR   stops the gateway alone (a server gone mid-upload)
#   ceph.sh start-rgw DIR  starts it again on the same port
#
# Exit 77 when the packages are missing (tools/setup-deps.sh installs them).
# About 15 s to start on an idle machine.
set -euo pipefail

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop|stop-rgw|start-rgw DIR" >&2; exit 2; }
conf=$dir/ceph.conf

cephc() { ceph -c "$conf" --connect-timeout 10 "$@"; }  # never the CLI's 300 s wait for a monitor

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

stop_pid() {  # stop_pid FILE: TERM, then KILL after 10 s
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null || true)
  rm -f "$f"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "ceph.sh: $what did not come up in $secs s; logs in $dir/log:" >&2
  tail -n 20 "$dir"/log/*.log >&2 || true
  return 1
}

start_rgw() {
  local port; port=$(cat "$dir/rgw.port")
  radosgw -c "$conf" -n client.rgw --pid-file "$dir/run/rgw.pid"
  wait_for "radosgw on port $port" 60 curl -sf "http://127.0.0.1:$port/"
}

case $cmd in
start)
  for b in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph curl; do
    command -v $b >/dev/null || { echo "SKIP: $b is missing (apt-get install ceph-mon ceph-osd radosgw ceph-common)"; exit 77; }
  done
  mkdir -p "$dir"/{mon,osd,run,log}
  fsid=$(cat /proc/sys/kernel/random/uuid)
  mon_port=$(free_port); rgw_port=$(free_port)
  echo "$rgw_port" > "$dir/rgw.port"
  cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms bind ipv6 = false
ms mon client mode = crc
ms client mode = crc
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
keyring = $dir/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
[mon]
mon data = $dir/mon
[osd]
osd data = $dir/osd
osd objectstore = bluestore
bluestore block path = $dir/osd.block
bluestore block create = true
bluestore block size = 42949672960
bluestore fsck on mkfs = false
osd memory target = 1073741824
bluestore cache autotune = false
bluestore cache size = 268435456
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $dir/rgw
rgw enable usage log = false
rgw thread pool size = 64
# deleted objects' space back at once (the default waits 2 h), or repeated runs fill the OSD
rgw gc obj min wait = 0
rgw gc processor period = 10
rgw gc processor max time = 10
CONF
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --add a "v2:127.0.0.1:$mon_port" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" -i a --pid-file "$dir/run/mon.pid"
  wait_for "ceph-mon" 30 cephc mon stat
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(cephc osd new "$uuid")
  ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1
  cephc osd crush add-bucket localhost host >/dev/null 2>&1
  cephc osd crush move localhost root=default >/dev/null 2>&1
  cephc osd crush add "osd.$id" 1.0 host=localhost >/dev/null 2>&1
  ceph-osd -c "$conf" -i "$id" --pid-file "$dir/run/osd.pid"
  wait_for "ceph-osd" 60 bash -c "ceph -c '$conf' --connect-timeout 10 osd stat | grep -q '1 up'"
  start_rgw
  key=ptcfs$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n'); secret=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
  radosgw-admin -c "$conf" user create --uid ptcfs --display-name ptcfs --access-key "$key" --secret "$secret" >/dev/null
  bucket=ptcfs-test
  curl -sf -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" --user "$key:$secret" "http://127.0.0.1:$rgw_port/$bucket" >/dev/null
  cat > "$dir/env" <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$rgw_port
export AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export PTCFS_S3_BUCKET=$bucket
export PTCFS_CEPH_DIR=$dir
ENV
  chmod 600 "$dir/env"
  ;;
stop)
  stop_pid "$dir/run/rgw.pid"; stop_pid "$dir/run/osd.pid"; stop_pid "$dir/run/mon.pid"
  rm -rf "$dir"
  ;;
stop-rgw) stop_pid "$dir/run/rgw.pid" ;;
start-rgw) start_rgw ;;
*) echo "usage: $0 start|stop|stop-rgw|start-rgw DIR" >&2; exit 2 ;;
esac
