#!/usr/bin/env bash
# Quick check of the tp=2,pp=2 -> tp=4,pp=1 transform against `cp -r && sync` of the same
# store: 3 interleaved runs, sync + 8 s settle before each. Prints /usr/bin/time lines.
# The full comparison (with plain cp -r and the torch script) is bench/transform.sh.
set -e
cd "$(dirname "$0")/.."; B=$PWD/build/tools/ptcfs; T=/tmp/qb; rm -rf $T; mkdir -p $T; D=layers=24,hidden=1024,heads=16,vocab=32768,seq=2048
PTCFS_PROGRESS=0 $B synth --schema megatron-gpt --dims $D --config tp=2,pp=2 $T/a
PTCFS_PROGRESS=0 $B import --schema megatron-gpt --dims $D --config tp=2,pp=2 $T/a $T/s >/dev/null; rm -rf $T/a
for i in 1 2 3; do
  rm -rf $T/c $T/x; cp -r $T/s $T/x; sync; sleep 8
  /usr/bin/time -f "cp %e" -a -o $T/times sh -c "cp -r $T/s $T/c && sync"
  rm -rf $T/c; sync; sleep 8
  /usr/bin/time -f "ptcfs %e %M" -a -o $T/times $B transform $T/x --to tp=4,pp=1 --keep-old >/dev/null
done
cat $T/times; rm -rf $T/s $T/x $T/c
