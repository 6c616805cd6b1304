#!/usr/bin/env bash
# Sourced (not run) by docker/up.sh, docker/down.sh and tests/docker/job_test.sh:
# what a ptcfs job in containers needs on a Debian 12 machine, each step done only when missing.
#
#   docker_packages          Debian's docker.io (and docker-compose when no compose is at hand,
#                            debootstrap unless the base image is known to be there); no service
#                            started
#   docker_daemon_start      a daemon answering `docker info`, or one started here:
#                              dockerd --iptables=false --ip6tables=false --ip-forward=false --bridge=none
#                            (no firewall rules, no sysctl, no default bridge: the host's network is
#                            left as it was; compose's own networks still join the containers).
#                            Its pidfile is $PTCFS_DOCKER_STATE/dockerd.pid, its log next to it.
#   docker_daemon_stop       stops the daemon docker_daemon_start started (none other), and the
#                            containerd it runs; waits for that containerd's processes (its
#                            shims) to exit
#   docker_base_image        $PTCFS_DOCKER_BASE (default debian:12): present, pulled, or (debian:12
#                            only) made by `debootstrap --variant=minbase bookworm` and imported
#   docker_build_images [BIN]  ptcfs-etcd and ptcfs-worker, tag $PTCFS_DOCKER_TAG (default dev),
#                            FROM the base: the worker from the sources (docker/Dockerfile), or from
#                            the host's binary BIN (docker/Dockerfile.prebuilt, no compiler)
#   docker_compose ARGS...   compose v2 (`docker compose`) or Debian's docker-compose 1.29, on
#                            docker/compose.yaml (and $PTCFS_DOCKER_FILES), project $PTCFS_DOCKER_PROJECT
#
# Every function returns non-zero with a message naming what failed.
# shellcheck shell=bash

PTCFS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PTCFS_DOCKER_BASE="${PTCFS_DOCKER_BASE:-debian:12}"
export PTCFS_DOCKER_TAG="${PTCFS_DOCKER_TAG:-dev}"
export PTCFS_DOCKER_TOKEN="${PTCFS_DOCKER_TOKEN:-$PTCFS_ROOT/docker/token}"
PTCFS_DOCKER_PROJECT="${PTCFS_DOCKER_PROJECT:-ptcfs}"
PTCFS_DOCKER_STATE="${PTCFS_DOCKER_STATE:-/run/ptcfs-docker}"
PTCFS_DOCKER_FILES="${PTCFS_DOCKER_FILES:-}"  # more compose files, space-separated

docker_say() { echo "ptcfs docker: $*"; }
docker_fail() {
  echo "ptcfs docker: FAIL: $*" >&2
  return 1
}

# apt-get install of the packages not installed yet. policy-rc.d stops their services from
# starting (docker.io's would start dockerd with iptables rules where no systemd runs).
docker_apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  docker_say "installing ${missing[*]}"
  local policy=/usr/sbin/policy-rc.d made=0 rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made=1
  fi
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } ||
    rc=$?
  [ "$made" = 0 ] || rm -f "$policy"
  [ "$rc" = 0 ] || { docker_fail "apt-get install ${missing[*]} (exit $rc)"; return 1; }
  # Nor at boot: docker.io's postinst enables docker.service and docker.socket, which would
  # start dockerd with its iptables rules at the next boot; ptcfs starts its own when asked.
  if printf '%s\n' "${missing[@]}" | grep -qx docker.io; then
    deb-systemd-helper disable docker.service docker.socket > /dev/null 2>&1 || true
    update-rc.d docker disable > /dev/null 2>&1 || true
    docker_say "docker.io installed, not enabled at boot (systemctl enable docker to have it so)"
  fi
}

docker_compose_cmd() {  # prints the compose command: v2 first, else Debian's 1.29
  if [ -n "${PTCFS_COMPOSE:-}" ]; then
    echo "$PTCFS_COMPOSE"
  elif command -v docker > /dev/null && docker compose version > /dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose > /dev/null; then
    echo "docker-compose"
  fi
}

docker_packages() {
  [ "$(id -u)" -eq 0 ] || { docker_fail "run as root: the engine, FUSE in containers and apt need it"; return 1; }
  local need=()
  command -v dockerd > /dev/null || need+=(docker.io)
  # The docker.io CLI's compose plugin is not packaged for Debian 12: its docker-compose (1.29) is.
  [ -n "$(docker_compose_cmd)" ] || need+=(docker-compose)
  if ! { command -v docker > /dev/null && docker image inspect "$PTCFS_DOCKER_BASE" > /dev/null 2>&1; }; then
    need+=(debootstrap)
  fi
  docker_apt_install "${need[@]}"
}

docker_daemon_start() {
  if docker info > /dev/null 2>&1; then
    return 0
  fi
  command -v dockerd > /dev/null || { docker_fail "no dockerd (docker_packages installs docker.io)"; return 1; }
  mkdir -p "$PTCFS_DOCKER_STATE"
  local log="$PTCFS_DOCKER_STATE/dockerd.log"
  docker_say "starting dockerd (no iptables, no default bridge; log $log)"
  # In the background of a script SIGINT does not reach it; its output goes to the log, so
  # nothing of the caller's (a ctest pipe) stays open. It writes its pid to the pidfile itself.
  rm -f "$PTCFS_DOCKER_STATE/dockerd.pid"
  pgrep '^containerd' > "$PTCFS_DOCKER_STATE/containerd.before" || true
  dockerd --iptables=false --ip6tables=false --ip-forward=false --bridge=none \
    --pidfile "$PTCFS_DOCKER_STATE/dockerd.pid" < /dev/null > "$log" 2>&1 &
  local pid=$! _
  for _ in $(seq 60); do
    docker info > /dev/null 2>&1 && return 0
    kill -0 "$pid" 2> /dev/null || break
    sleep 1
  done
  tail -n 20 "$log" >&2
  docker_daemon_stop
  docker_fail "dockerd did not answer within 60 s (its log above: $log)"
}

docker_daemon_stop() {
  local pidfile="$PTCFS_DOCKER_STATE/dockerd.pid" pid _
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = dockerd ]; then
    docker_say "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 60); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2> /dev/null; then
      kill -KILL "$pid"
      rm -f "$pidfile"
      docker_fail "dockerd (pid $pid) did not stop within 30 s of SIGTERM: killed"
      return 1
    fi
  fi
  rm -f "$pidfile"
  # A container's shim (containerd-shim-runc-v2, and its short-lived "delete" runs) is a child of
  # init, not of dockerd; it exits on its own once its container is deleted, which may be a moment
  # after dockerd itself. Wait for every containerd process that was not there when the daemon
  # started.
  local left
  for _ in $(seq 60); do
    left="$(docker_new_containerd)"
    [ -z "$left" ] && return 0
    sleep 0.5
  done
  docker_fail "containerd processes of the stopped dockerd still run 30 s later: $left"
  return 1
}

# The containerd processes (containerd, its shims) that were not running when docker_daemon_start
# started dockerd, with their command lines.
docker_new_containerd() {
  local before="$PTCFS_DOCKER_STATE/containerd.before" p
  for p in $(pgrep '^containerd' || true); do
    grep -qx "$p" "$before" 2> /dev/null && continue
    printf '%s (%s) ' "$p" "$(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null)"
  done
}

docker_base_image() {
  local base="$PTCFS_DOCKER_BASE"
  docker image inspect "$base" > /dev/null 2>&1 && return 0
  # Where no registry answers (this project's machines reach Debian's mirrors, not Docker Hub)
  # the pull fails: expected, and said so; its own error is printed only when no fallback follows.
  docker_say "no $base here: pulling it (where no registry answers, debian:12 is made with debootstrap instead)"
  local pull_log
  pull_log="$(mktemp "${TMPDIR:-/tmp}/ptcfs-pull.XXXXXX")"
  if timeout 120 docker pull "$base" > "$pull_log" 2>&1; then
    rm -f "$pull_log"
    return 0
  fi
  if [ "$base" != debian:12 ]; then
    cat "$pull_log" >&2
    rm -f "$pull_log"
    docker_fail "cannot pull $base (PTCFS_DOCKER_BASE); only debian:12 is made here when no registry answers"
    return 1
  fi
  docker_say "no registry answered ($(tail -n 1 "$pull_log" | cut -c1-120)): as expected without one"
  rm -f "$pull_log"
  command -v debootstrap > /dev/null || { docker_fail "no debootstrap (docker_packages installs it)"; return 1; }
  local dir rc=0
  dir="$(mktemp -d "${TMPDIR:-/tmp}/ptcfs-debootstrap.XXXXXX")"
  docker_say "no registry: making $base with debootstrap --variant=minbase bookworm (about 30 s)"
  # As Docker's Debian images: no services started by packages, no apt cache kept.
  if debootstrap --variant=minbase bookworm "$dir/root" http://deb.debian.org/debian > "$dir/log" 2>&1; then
    printf '#!/bin/sh\nexit 101\n' > "$dir/root/usr/sbin/policy-rc.d"
    chmod 755 "$dir/root/usr/sbin/policy-rc.d"
    rm -rf "$dir/root/var/cache/apt/"*.bin "$dir/root/var/cache/apt/archives/"*.deb "$dir/root/var/lib/apt/lists/"*
    tar -C "$dir/root" -c . | docker import -c 'CMD ["bash"]' - "$base" > /dev/null || rc=$?
  else
    rc=$?
    tail -n 20 "$dir/log" >&2
  fi
  rm -rf "$dir"
  [ "$rc" = 0 ] || docker_fail "making $base by debootstrap and docker import (exit $rc)"
}

docker_build() {  # LOG ARGS...: docker build, with the builder this CLI runs offline; LOG - streams
  local log="$1" kit=0 rc=0
  shift
  docker buildx version > /dev/null 2>&1 && kit=1
  mkdir -p "$PTCFS_DOCKER_STATE"
  set -- --network host --build-arg BASE="$PTCFS_DOCKER_BASE" "$@"
  if [ "$log" = - ]; then
    DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-$kit}" docker build "$@" || rc=$?
  else
    DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-$kit}" docker build "$@" > "$PTCFS_DOCKER_STATE/$log" 2>&1 || rc=$?
    [ "$rc" = 0 ] || tail -n 30 "$PTCFS_DOCKER_STATE/$log" >&2
  fi
  return "$rc"
}

docker_build_images() {
  local bin="${1:-}" t0 ctx rc=0 tag="$PTCFS_DOCKER_TAG"
  t0=$(date +%s)
  docker_build build-etcd.log -f "$PTCFS_ROOT/docker/Dockerfile.etcd" -t "ptcfs-etcd:$tag" "$PTCFS_ROOT/docker" ||
    { docker_fail "building ptcfs-etcd:$tag (docker/Dockerfile.etcd; log above)"; return 1; }
  docker_say "ptcfs-etcd:$tag built ($(($(date +%s) - t0)) s)"
  t0=$(date +%s)
  if [ -z "$bin" ]; then
    docker_say "building ptcfs-worker:$tag from the sources (docker/Dockerfile; minutes)"
    # PTCFS_BUILD_JOBS, when set here, limits the parallel compiles.
    docker_build - --build-arg PTCFS_BUILD_JOBS -f "$PTCFS_ROOT/docker/Dockerfile" -t "ptcfs-worker:$tag" "$PTCFS_ROOT" ||
      { docker_fail "building ptcfs-worker:$tag (docker/Dockerfile)"; return 1; }
  else
    # A context of a few files: this Dockerfile, the build steps, the binary and its scripts.
    ctx="$(mktemp -d "${TMPDIR:-/tmp}/ptcfs-image.XXXXXX")"
    { cp "$PTCFS_ROOT/docker/Dockerfile.prebuilt" "$PTCFS_ROOT/docker/build-steps.sh" "$ctx/" &&
      bash "$PTCFS_ROOT/docker/build-steps.sh" install-binary "$bin" "$ctx/out" &&
      docker_build build-worker.log -f "$ctx/Dockerfile.prebuilt" -t "ptcfs-worker:$tag" "$ctx"; } || rc=$?
    rm -rf "$ctx"
    [ "$rc" = 0 ] || { docker_fail "building ptcfs-worker:$tag from $bin (docker/Dockerfile.prebuilt; log above)"; return 1; }
  fi
  docker_say "ptcfs-worker:$tag built ($(($(date +%s) - t0)) s)"
}

docker_compose() {
  local cmd files=(-f "$PTCFS_ROOT/docker/compose.yaml") f
  cmd="$(docker_compose_cmd)"
  [ -n "$cmd" ] || { docker_fail "no compose: neither \`docker compose\` nor docker-compose"; return 1; }
  for f in $PTCFS_DOCKER_FILES; do files+=(-f "$f"); done
  # shellcheck disable=SC2086  # "docker compose" is two words
  $cmd -p "$PTCFS_DOCKER_PROJECT" "${files[@]}" "$@"
}

docker_container() {  # the container id of compose service $1 (running: v2's `ps -q` lists no other)
  local id
  id="$(docker_compose ps -q "$1" 2> /dev/null | head -n 1)"
  [ -n "$id" ] || { docker_fail "no container of service $1 in project $PTCFS_DOCKER_PROJECT"; return 1; }
  echo "$id"
}

docker_token() {  # the job's token file, made (24 random bytes, base64, mode 0600) when absent
  [ -s "$PTCFS_DOCKER_TOKEN" ] && return 0
  (umask 077 && head -c 24 /dev/urandom | base64 > "$PTCFS_DOCKER_TOKEN")
}

docker_wait_serving() {  # waits up to $2 s (default 120) for worker $1's mount to be serving
  local w="$1" limit="${2:-120}" id _ s
  id="$(docker_container "worker$w")" || return 1
  for _ in $(seq "$limit"); do
    s="$(docker exec "$id" cat /mnt/ptcfs/.ptcfs/status 2> /dev/null)" &&
      grep -q '"state": *"serving"' <<< "$s" && return 0
    sleep 1
  done
  docker logs --tail 20 "$id" >&2 || true
  docker_fail "worker $w's mount is not serving after $limit s (its log above)"
}
