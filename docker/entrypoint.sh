#!/usr/bin/env bash
# ptcfs-worker: runs one worker of a ptcfs job (docs/cluster.md) from environment variables,
# in the foreground; `exec` makes ptcfs the process signals reach (SIGTERM unmounts and leaves
# the job at once; SIGKILL leaves it when the lease expires).
#
# Required:
#   PTCFS_WORKER        this worker's id (0, 1, ...)
#   PTCFS_ETCD          etcd://HOST:PORT[,HOST:PORT...]/JOB
#   PTCFS_LISTEN        HOST:PORT the other workers reach this one at (a name they resolve, not
#                       a wildcard: in compose, the service name)
# Optional:
#   PTCFS_TOKEN_FILE    the job's token (default /run/secrets/ptcfs_token); copied to a private
#                       file of mode 0600, as ptcfs requires, whatever the mode of the mounted one
#   PTCFS_STORE         this worker's store (default /var/lib/ptcfs/store; an empty directory
#                       takes the job's committed generation from a live worker)
#   PTCFS_MOUNT         the mountpoint (default /mnt/ptcfs; made when absent)
#   PTCFS_LEASE         seconds after which a silent worker has left the job (default 10)
#   PTCFS_CHANGE_TIMEOUT  seconds a reconfigure may take across the workers
#   PTCFS_MOUNT_ARGS    more `ptcfs mount` options, split on spaces (e.g. --threads 16)
# Any arguments replace all this: `docker run IMAGE ptcfs inspect /var/lib/ptcfs/store`.
set -euo pipefail

if [ "$#" -gt 0 ]; then exec "$@"; fi

die() {
  echo "ptcfs-worker: $*" >&2
  exit 2
}

missing=()
for v in PTCFS_WORKER PTCFS_ETCD PTCFS_LISTEN; do
  [ -n "${!v:-}" ] || missing+=("$v")
done
if [ "${#missing[@]}" -gt 0 ]; then
  die "missing ${missing[*]} (set PTCFS_WORKER=0, PTCFS_ETCD=etcd://HOST:PORT/JOB, PTCFS_LISTEN=HOST:PORT; see docker/entrypoint.sh)"
fi
[[ "$PTCFS_WORKER" =~ ^[0-9]+$ ]] || die "PTCFS_WORKER='$PTCFS_WORKER': expected a worker id (0, 1, ...)"
[[ "$PTCFS_ETCD" == etcd://*/* ]] || die "PTCFS_ETCD='$PTCFS_ETCD': expected etcd://HOST:PORT/JOB"
[[ "$PTCFS_LISTEN" =~ ^.+:[0-9]+$ ]] || die "PTCFS_LISTEN='$PTCFS_LISTEN': expected HOST:PORT"

token_file="${PTCFS_TOKEN_FILE:-/run/secrets/ptcfs_token}"
store="${PTCFS_STORE:-/var/lib/ptcfs/store}"
mnt="${PTCFS_MOUNT:-/mnt/ptcfs}"
lease="${PTCFS_LEASE:-10}"
[ -r "$token_file" ] || die "no token file at $token_file (PTCFS_TOKEN_FILE; compose: the ptcfs_token secret)"
[ -c /dev/fuse ] || die "no /dev/fuse (run with --device /dev/fuse --cap-add SYS_ADMIN)"

# A worker killed with its mount shared to the host (docker/compose.host.yaml) leaves a dead mount
# there ("Transport endpoint is not connected"), which the restarted container sees at $mnt again;
# it is cleared first (mkdir below fails on it).
if ! stat "$mnt" > /dev/null 2>&1 && grep -qF " $mnt " /proc/self/mountinfo; then
  echo "ptcfs-worker: $mnt is a dead mount of an earlier run: unmounting it"
  fusermount3 -u -z "$mnt" || umount -l "$mnt"
fi

# ptcfs takes a token file of mode 0600 or tighter; a bind-mounted secret keeps the host's mode.
private="${PTCFS_RUN_DIR:-/run/ptcfs}"
mkdir -p "$private" "$store" "$mnt"
chmod 700 "$private"
install -m 600 "$token_file" "$private/token"

args=(mount -f "$store" "$mnt" --worker "$PTCFS_WORKER" --cluster "$PTCFS_ETCD"
      --listen "$PTCFS_LISTEN" --token-file "$private/token" --lease "$lease")
[ -z "${PTCFS_CHANGE_TIMEOUT:-}" ] || args+=(--change-timeout "$PTCFS_CHANGE_TIMEOUT")
# shellcheck disable=SC2206  # split on purpose: a list of options
[ -z "${PTCFS_MOUNT_ARGS:-}" ] || args+=($PTCFS_MOUNT_ARGS)
echo "ptcfs-worker: ptcfs ${args[*]}"
exec "${PTCFS_BIN:-ptcfs}" "${args[@]}"
