#!/usr/bin/env bash
# The README's "Workers in containers": a ptcfs job of etcd, an init and three workers in Docker,
# on a Debian 12 machine, as root. Starts what is missing, each step only when needed
# (docker/env.sh): Debian's docker.io and docker-compose, a daemon (no iptables rules, no
# default bridge), a debian:12 base image (pulled, or made by debootstrap without a registry),
# the images ptcfs-etcd and ptcfs-worker, the token docker/token; then `up -d` and waits until
# every worker's mount serves.
#
#   docker/up.sh [--prebuilt BIN] [--host-mnt | --no-host-mnt]
#     --prebuilt BIN   the worker image from the binary BIN built here (tools/build.sh release:
#                      build/tools/ptcfs), with no compiler in a container; default: from the
#                      sources (docker/Dockerfile, several minutes)
#     --host-mnt       also share each worker's mount at docker/mnt/workerW (docker/compose.host.yaml;
#                      the host's / must be a shared mount); default: when / is shared
#   PTCFS_DOCKER_BASE (debian:12), PTCFS_DOCKER_TAG (dev), PTCFS_DOCKER_PROJECT (ptcfs): see
#   docker/env.sh. docker/down.sh takes it down again.
set -euo pipefail
# shellcheck source=docker/env.sh
source "$(dirname "$0")/env.sh"

bin="" host_mnt=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --prebuilt) bin="${2:?--prebuilt needs the ptcfs binary}"; shift 2 ;;
    --host-mnt) host_mnt=1; shift ;;
    --no-host-mnt) host_mnt=0; shift ;;
    *) echo "usage: $0 [--prebuilt BIN] [--host-mnt | --no-host-mnt]" >&2; exit 2 ;;
  esac
done
if [ -n "$bin" ]; then
  [ -x "$bin" ] || { echo "docker-up: $bin is not an executable (tools/build.sh release makes build/tools/ptcfs)" >&2; exit 2; }
  bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
fi
if [ -z "$host_mnt" ]; then
  host_mnt=0
  [ "$(findmnt -n -o PROPAGATION /)" = shared ] && host_mnt=1
fi

t0=$(date +%s)
docker_packages
docker_daemon_start
docker_base_image
docker_build_images "$bin"
docker_token
compose_files="docker/compose.yaml"
if [ "$host_mnt" = 1 ]; then
  mkdir -p "$PTCFS_ROOT"/docker/mnt/worker{0,1,2}
  export PTCFS_DOCKER_FILES="$PTCFS_ROOT/docker/compose.host.yaml"
  compose_files="$compose_files:docker/compose.host.yaml"
else
  docker_say "the host's / is not a shared mount: read the workers' mounts inside their containers"
fi
docker_compose up -d --no-build
for w in 0 1 2; do docker_wait_serving "$w"; done
docker_say "the job is up ($(($(date +%s) - t0)) s): etcd, init, worker0..2 serving tp=2,pp=3,per_worker=2"
echo "  export COMPOSE_PROJECT_NAME=$PTCFS_DOCKER_PROJECT COMPOSE_FILE=$compose_files   # from $PTCFS_ROOT"
echo "  $(docker_compose_cmd) exec worker0 ls /mnt/ptcfs/model"
[ "$host_mnt" = 0 ] || echo "  ls docker/mnt/worker0/ptcfs/model   # in the mount namespace of the daemon"
echo "  bash docker/down.sh [-v]"
