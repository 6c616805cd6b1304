#!/usr/bin/env bash
# The compose job for real (ctest docker_job_test, label docker): docker/compose.yaml in a Docker
# engine on this machine, as the README's "Workers in containers" runs it (docker/env.sh).
#
#   engine: Debian's docker.io and docker-compose installed when missing, a daemon started when
#           none answers (no iptables rules, no default bridge), a debian:12 base image (pulled,
#           or made by debootstrap); project ptcfstest, images tagged :test
#   images: ptcfs-etcd from Debian's etcd-server; ptcfs-worker from the binary under test
#           (docker/Dockerfile.prebuilt: no compiler in the container)
#   job:    up -d: etcd, init (tp=2,pp=3,per_worker=2: 6 ranks, 2 a worker), worker0..2
#     -> `docker exec worker2 ptcfs reconfigure` to tp=2,pp=2 (4 ranks on workers 0 and 1)
#     -> `docker exec worker0 ptcfs reconfigure` to tp=2,pp=3,replicas=2
#     -> `docker kill` worker1: workers 0 and 2 move on their own to tp=2,pp=2,workers=0+2
#     -> `compose down -v`: no container, volume, ptcfs process or mount left
#   After each step every rank's two safetensors files, read inside the container of the worker
#   that serves it (docker exec ... tar), equal `ptcfs synth` of the step's config (`ptcfs diff`),
#   and each worker lists only its own ranks.
# A daemon started here is stopped at the end, and the job taken down, whatever happened (trap).
# Needs root and /dev/fuse: exits 77 (skipped) when the engine cannot be had, or fails under CI=true.
#
#   tests/docker/job_test.sh PTCFS      (a Release build's binary: it goes into the image)
set -euo pipefail
ptcfs="$(realpath "${1:?usage: job_test.sh PTCFS}")"
root="$(cd "$(dirname "$0")/../.." && pwd)"

skip_or_fail() {
  case "${CI:-}" in
    true | 1 | yes) echo "FAIL (CI=true, would skip): $*" >&2; exit 1 ;;
  esac
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "docker_job_test: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || skip_or_fail "the Docker engine and FUSE in containers need root"
[ -c /dev/fuse ] || skip_or_fail "no /dev/fuse"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ptcfs-docker-test.XXXXXX")"
export PTCFS_DOCKER_PROJECT=ptcfstest PTCFS_DOCKER_TAG=test PTCFS_DOCKER_TOKEN="$tmp/token"
export PTCFS_DOCKER_FILES=""  # the mounts are read inside the containers: no host propagation needed
# shellcheck source=docker/env.sh
source "$root/docker/env.sh"
schema=llama dims=layers=6,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96  # docker/init-job.sh's defaults

ours=0
cleanup() {
  local rc=$?
  trap - EXIT
  if [ "$rc" != 0 ] && docker info > /dev/null 2>&1; then
    echo "-- the job's containers at the failure:" >&2
    docker ps -a --filter "label=com.docker.compose.project=$PTCFS_DOCKER_PROJECT" >&2 || true
    for c in $(docker ps -aq --filter "label=com.docker.compose.project=$PTCFS_DOCKER_PROJECT"); do
      echo "-- docker logs $(docker inspect -f '{{.Name}}' "$c")" >&2
      docker logs --tail 15 "$c" >&2 2>&1 || true
    done
  fi
  if docker info > /dev/null 2>&1; then
    docker_compose down -v --remove-orphans -t 20 > "$tmp/down.log" 2>&1 || cat "$tmp/down.log" >&2
  fi
  if [ "$ours" = 1 ]; then docker_daemon_stop || rc=1; fi
  if [ -n "${KEEP_TMP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

t_start=$(date +%s)
phase_start=$t_start
times=()
phase() {  # records how long the phase that ends here took
  local now
  now=$(date +%s)
  times+=("$1 $((now - phase_start)) s")
  echo "ok   $1 ($((now - phase_start)) s)"
  phase_start=$now
}

# --- the engine ----------------------------------------------------------------------------------
docker_packages || skip_or_fail "cannot install Debian's docker.io, docker-compose and debootstrap (above)"
containerd_before="$(pgrep -d ' ' '^containerd' || true)"  # any that ran before (a system engine's)
if ! docker info > /dev/null 2>&1; then
  docker_daemon_start || skip_or_fail "cannot start a Docker engine (above)"
  ours=1
fi
phase "engine: $(docker version -f '{{.Server.Version}}'), compose: $(docker_compose_cmd)"
docker_base_image || skip_or_fail "no $PTCFS_DOCKER_BASE base image: cannot pull one nor make one by debootstrap (above)"
phase "base image $PTCFS_DOCKER_BASE"
docker_build_images "$ptcfs" || fail "the images did not build (above)"
phase "images ptcfs-etcd:test and ptcfs-worker:test (from $ptcfs)"

# --- helpers -------------------------------------------------------------------------------------
docker_token
# A run killed by a timeout (SIGKILL: no trap) leaves its job: its stores hold later generations.
docker_compose down -v --remove-orphans -t 5 > "$tmp/down.log" 2>&1 || { cat "$tmp/down.log" >&2; fail "compose down of an earlier run"; }
docker_compose up -d --no-build > "$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; fail "compose up -d"; }
ids=()
for w in 0 1 2; do ids[w]="$(docker_container "worker$w")" || fail "no worker$w after compose up"; done

state_of() {  # "GENERATION STATE CONFIG" of worker $1's mount
  docker exec "${ids[$1]}" cat /mnt/ptcfs/.ptcfs/status 2> /dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["generation"], j["state"], j["config"])' 2> /dev/null
}
wait_config() {  # waits up to $2 s for the workers $3... to serve config $1
  local config="$1" limit="$2" w i s
  shift 2
  for w in "$@"; do
    for i in $(seq $((limit * 2))); do
      s="$(state_of "$w")" || s=""
      [[ "$s" == *" serving $config" ]] && break
      [ "$i" -lt $((limit * 2)) ] || { docker logs --tail 20 "${ids[$w]}" >&2; fail "worker $w does not serve $config after $limit s: '$s'"; }
      sleep 0.5
    done
  done
}
expect_ranks() {  # TAG CONFIG W...: rank r is on the worker listed at r/2, equal to synth of CONFIG
  local tag="$1" config="$2" i w want got
  shift 2
  local placement=("$@") ref="$tmp/ref-$tag" joined="$tmp/joined-$tag"
  [ -d "$ref" ] || "$ptcfs" synth --schema "$schema" --dims "$dims" --config "$config" --optimizer adam "$ref" > /dev/null
  rm -rf "$joined" && mkdir -p "$joined"
  for i in "${!placement[@]}"; do
    w="${placement[$i]}"
    want="$(printf 'rank-%05d rank-%05d' $((2 * i)) $((2 * i + 1)))"
    got="$(docker exec "${ids[$w]}" ls /mnt/ptcfs/model | xargs)"
    [ "$got" = "$want" ] || fail "$tag: worker $w lists '$got' under /mnt/ptcfs/model, expected '$want'"
    docker exec "${ids[$w]}" sh -c 'cd /mnt/ptcfs/model && tar -cf - rank-*/model.safetensors rank-*/optim.safetensors' |
      tar -C "$joined" -xf - || fail "$tag: reading worker $w's rank files inside its container"
  done
  "$ptcfs" diff --schema "$schema" --dims "$dims" --config-a "$config" --config-b "$config" "$ref" "$joined" ||
    fail "$tag: the ranks read through the workers' mounts differ from synth of $config"
  echo "ok   $tag: ranks 0-$((2 * ${#placement[@]} - 1)) on workers ${placement[*]} equal synth of $config"
}

# --- the job -------------------------------------------------------------------------------------
wait_config tp=2,pp=3,dp=1,per_worker=2 120 0 1 2
phase "compose up: etcd healthy, init done, worker0..2 mounted"
expect_ranks first tp=2,pp=3,dp=1,per_worker=2 0 1 2

out="$(docker exec "${ids[2]}" ptcfs reconfigure /mnt/ptcfs --to tp=2,pp=2,per_worker=2 2>&1)" ||
  fail "docker exec worker2 ptcfs reconfigure --to tp=2,pp=2,per_worker=2: $out"
wait_config tp=2,pp=2,dp=1,per_worker=2 60 0 1 2
[ -z "$(docker exec "${ids[2]}" ls /mnt/ptcfs/model)" ] || fail "worker 2 still lists ranks after the change to 4 ranks"
expect_ranks smaller tp=2,pp=2,dp=1,per_worker=2 0 1
phase "reconfigure through docker exec on worker2: tp=2,pp=3 -> tp=2,pp=2"

replicated=tp=2,pp=3,dp=1,per_worker=2,replicas=2
out="$(docker exec "${ids[0]}" ptcfs reconfigure /mnt/ptcfs --to "$replicated" 2>&1)" ||
  fail "docker exec worker0 ptcfs reconfigure --to $replicated: $out"
wait_config "$replicated" 60 0 1 2
expect_ranks replicated "$replicated" 0 1 2
phase "reconfigure through docker exec on worker0: -> $replicated"

docker kill "${ids[1]}" > /dev/null || fail "docker kill worker1"
survivors=tp=2,pp=2,dp=1,per_worker=2,workers=0+2,replicas=2
wait_config "$survivors" 90 0 2
expect_ranks survivors "$survivors" 0 2
phase "docker kill worker1: the survivors serve $survivors"

docker_compose down -v --remove-orphans -t 20 > "$tmp/down.log" 2>&1 || { cat "$tmp/down.log" >&2; fail "compose down"; }
label="label=com.docker.compose.project=$PTCFS_DOCKER_PROJECT"
[ -z "$(docker ps -aq --filter "$label")" ] || fail "containers left after compose down: $(docker ps -a --filter "$label")"
[ -z "$(docker volume ls -q --filter "$label")" ] || fail "volumes left after compose down -v: $(docker volume ls -q --filter "$label")"
# The workers' daemons (`ptcfs mount -f /var/lib/ptcfs/store ...` in their containers) are gone,
# and so is any FUSE mount of theirs that the host could see.
left="$(ps -eo pid=,comm=,args= | awk '$2 == "ptcfs" && /\/var\/lib\/ptcfs\/store/')"
[ -z "$left" ] || fail "ptcfs daemons of the job left after compose down: $left"
! grep -q ' /mnt/ptcfs .* fuse' /proc/self/mountinfo || fail "a FUSE mount at /mnt/ptcfs is left on the host"
phase "compose down: no container, volume, ptcfs daemon or mount left"

if [ "$ours" = 1 ]; then
  pid="$(cat "$PTCFS_DOCKER_STATE/dockerd.pid")"
  ours=0
  docker_daemon_stop || fail "stopping the daemon this test started"
  ! kill -0 "$pid" 2> /dev/null || fail "dockerd (pid $pid) still runs"
  for p in $(pgrep '^containerd' || true); do
    [[ " $containerd_before " == *" $p "* ]] || fail "containerd process $p ($(cat "/proc/$p/comm" 2> /dev/null)) left after dockerd stopped"
  done
  phase "the daemon this test started is stopped, its containerd too"
fi
echo "docker_job_test: PASS in $(($(date +%s) - t_start)) s:"
printf '  %s\n' "${times[@]}"
