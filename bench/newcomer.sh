#!/usr/bin/env bash
# A newcomer's first five minutes (issue 43): clones this repository into a
# temporary directory and runs the README's two commands there as a new user
# would, with fresh caches (a pip cache of its own, no ccache, a fresh .venv),
# printing the wall time of each phase.
#   bash bench/newcomer.sh            both commands (the tests take most of an hour here)
#   TESTS=0 bash bench/newcomer.sh    the quickstart alone, then again (the second run's time)
# Root (the quickstart mounts). Debian packages already installed stay installed (their
# download is not measured again: say so with the figures). Leaves nothing behind but
# WORK (default a new /tmp/ptcfs-newcomer.XXXXXX), removed unless KEEP=1.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK:-$(mktemp -d /tmp/ptcfs-newcomer.XXXXXX)}"
tests="${TESTS:-1}"
cleanup() { [ "${KEEP:-0}" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT
export PIP_CACHE_DIR="$work/pip-cache" CCACHE_DISABLE=1 PTCFS_QUICKSTART_DIR="$work/quickstart"
unset PTCFS_VENV PTCFS_NO_VENV PTCFS_VENV_SET PTCFS_VENV_ONLY

phase() {  # phase NAME CMD...: runs CMD, prints its wall time
  local name="$1" t=$SECONDS
  shift
  if "$@"; then
    printf 'newcomer: %-28s %4d s (%d:%02d)\n' "$name" $((SECONDS - t)) $(((SECONDS - t) / 60)) $(((SECONDS - t) % 60))
  else
    printf 'newcomer: %-28s FAILED after %d s\n' "$name" $((SECONDS - t))
    exit 1
  fi
}

echo "newcomer: $(git -C "$src" rev-parse --short HEAD), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
phase "git clone" git clone -q "$src" "$work/ptcfs"
cd "$work/ptcfs"
phase "quickstart (first)" bash tools/quickstart.sh
phase "quickstart (again)" env PTCFS_QUICKSTART_DIR="$work/quickstart-2" bash tools/quickstart.sh
if [ "$tests" = 1 ]; then
  phase "tests (tools/test.sh)" bash tools/test.sh
fi
echo "newcomer: done, load $(cut -d' ' -f1-3 /proc/loadavg)"
