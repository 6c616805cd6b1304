#!/usr/bin/env bash
# Takes down what docker/up.sh brought up: `compose down` of the job (its containers stop
# with SIGTERM: each ptcfs unmounts), then the daemon, when docker/up.sh started it.
#   docker/down.sh [-v] [--keep-daemon]
#     -v             also drop the volumes: the workers' stores and etcd's data
#     --keep-daemon  leave the daemon running (images stay in it either way)
set -euo pipefail
# shellcheck source=docker/env.sh
source "$(dirname "$0")/env.sh"

down=(down --remove-orphans) keep=0
for a in "$@"; do
  case "$a" in
    -v) down+=(-v) ;;
    --keep-daemon) keep=1 ;;
    *) echo "usage: $0 [-v] [--keep-daemon]" >&2; exit 2 ;;
  esac
done
if docker info > /dev/null 2>&1; then
  docker_compose "${down[@]}"
else
  docker_say "no daemon answers: nothing to take down"
fi
# A killed worker whose mount was shared to the host (docker/compose.host.yaml) leaves it dead
# there, at docker/mnt/workerW/ptcfs (a path that stat, and so a glob, cannot see through).
shopt -s nullglob
for dir in "$PTCFS_ROOT"/docker/mnt/worker*; do
  if grep -qF " $dir/ptcfs " /proc/self/mountinfo; then
    umount -l "$dir/ptcfs" || echo "docker-down: umount -l $dir/ptcfs failed" >&2
  fi
done
[ "$keep" = 1 ] || docker_daemon_stop
