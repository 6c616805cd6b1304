#!/usr/bin/env bash
# ptcfs-init-job: the job's first generation, in the stores of workers that have none yet.
# Synthesizes a model (or takes a per-rank checkpoint), imports it into one whole store, and
# gives each worker a copy holding the manifests and only its own shard directory
# (gen-NNNNNN/worker-WW), as the README's "Many workers" does. Workers then mount their stores;
# the first to join makes the store's generation the job's committed one.
#
#   PTCFS_STORES     the workers' stores, worker 0 first, space-separated
#                    (default /stores/worker0 /stores/worker1 /stores/worker2)
#   PTCFS_CHECKPOINT a per-rank checkpoint to import (rank-RRRRR/model.safetensors ...);
#                    unset: one is synthesized (ptcfs synth)
#   PTCFS_SCHEMA     default llama
#   PTCFS_DIMS       default layers=6,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96
#   PTCFS_CONFIG     the checkpoint's config (default tp=2,pp=3,per_worker=2: 6 ranks, 2 a worker)
#   PTCFS_OPTIMIZER  default adam
#
# Does nothing when any store already holds a generation (a restart of the compose file): a
# worker whose store is empty then takes the committed generation from a live peer.
set -euo pipefail

die() {
  echo "ptcfs-init-job: $*" >&2
  exit 2
}

read -r -a stores <<< "${PTCFS_STORES:-/stores/worker0 /stores/worker1 /stores/worker2}"
[ "${#stores[@]}" -gt 0 ] || die "PTCFS_STORES is empty"
schema="${PTCFS_SCHEMA:-llama}"
dims="${PTCFS_DIMS:-layers=6,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96}"
config="${PTCFS_CONFIG:-tp=2,pp=3,per_worker=2}"
ptcfs="${PTCFS_BIN:-ptcfs}"

for s in "${stores[@]}"; do
  if [ -e "$s/manifest.json" ]; then
    echo "ptcfs-init-job: $s already holds a store; nothing to do"
    exit 0
  fi
done

scratch="$(mktemp -d "${TMPDIR:-/tmp}/ptcfs-init.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
checkpoint="${PTCFS_CHECKPOINT:-}"
if [ -z "$checkpoint" ]; then
  checkpoint="$scratch/checkpoint"
  "$ptcfs" synth --schema "$schema" --dims "$dims" --config "$config" \
           --optimizer "${PTCFS_OPTIMIZER:-adam}" "$checkpoint" > /dev/null
fi
"$ptcfs" import --schema "$schema" --dims "$dims" --config "$config" "$checkpoint" "$scratch/whole" > /dev/null

for w in "${!stores[@]}"; do
  s="${stores[$w]}"
  mkdir -p "$s"
  [ -z "$(ls -A "$s")" ] || die "$s is not empty but holds no store (no manifest.json); empty it first"
  cp -a "$scratch/whole/." "$s/"
  find "$s" -mindepth 2 -maxdepth 2 -type d -name 'worker-*' ! -name "$(printf 'worker-%02d' "$w")" -exec rm -r {} +
  echo "ptcfs-init-job: worker $w's store $s: $config, its own shards only"
done
