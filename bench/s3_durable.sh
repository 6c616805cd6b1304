#!/usr/bin/env bash
# The durable tier on S3 (issue 44) against plain curl, on a local radosgw
# (tests/ceph/ceph.sh), sides interleaved, ROUNDS rounds, medians:
#   upload:   `ptcfs export STORE s3://B/P` (one multipart object per worker's
#             share: 16 MiB parts, 4 in flight, UNSIGNED-PAYLOAD, every piece
#             checked against its checksums as it is read from the store)
#             vs `curl --aws-sigv4 -T` of the store's shard files, 4 at once
#             (the same bytes; UNSIGNED-PAYLOAD: curl hashes nothing)
#   recovery: `ptcfs import s3://B/P STORE2` (the share's object downloaded
#             whole: 64 MiB ranged GETs, 4 in flight, streamed into the store's
#             file, synced, then every byte checked against its checksum as the
#             pieces are linked into the generation; what a worker on an empty
#             disk does to restore its share)
#             vs a plain curl GET of the same object to a file, synced
#   peak RSS of each ptcfs side (/usr/bin/time -v); the load average at each round's start.
# Usage: bench/s3_durable.sh PTCFS CEPH_ENV [ROUNDS]   (CEPH_ENV: the env file ceph.sh start wrote)
set -euo pipefail
ptcfs=$(realpath "$1"); source "$2"; rounds=${3:-3}
work=$(mktemp -d /tmp/ptcfs-s3bench.XXXXXX); trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
dims="layers=4,hidden=2048,heads=16,kv_heads=16,vocab=32000,seq=2048,ffn=5632"
"$ptcfs" synth --schema llama --dims "$dims" --config tp=1 --seed 1 "$work/ckpt" >/dev/null
"$ptcfs" import --schema llama --dims "$dims" --config tp=1 "$work/ckpt" "$work/store" >/dev/null
rm -rf "$work/ckpt"
bytes=$(find "$work/store" -name '*.h5' -printf '%s\n' | awk '{s+=$1} END {printf "%d", s}')
echo "store: $(numfmt --to=iec "$bytes") in $(find "$work/store" -name '*.h5' | wc -l) shard files"
sha_empty=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
c=(curl -sf --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY")
now() { date +%s.%N; }
rss() { awk -F': ' '/Maximum resident/ {printf "%d", $2/1024}' "$1"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
for r in $(seq "$rounds"); do
  p=bench-$$-$r
  echo "round $r: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$work/loads"
  t0=$(now); /usr/bin/time -v "$ptcfs" export "$work/store" "s3://$PTCFS_S3_BUCKET/$p/ptcfs" >/dev/null 2>"$work/time.up"; t1=$(now)
  echo "$r up ptcfs $(echo "$t1 - $t0" | bc) $(rss "$work/time.up")" >> "$work/results"
  t0=$(now)
  (cd "$work/store" && find . -name '*.h5' -printf '%P\n') | xargs -P 4 -I{} "${c[@]}" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    -T "$work/store/{}" "$AWS_ENDPOINT_URL/$PTCFS_S3_BUCKET/$p/curl/{}" -o /dev/null
  t1=$(now); echo "$r up curl $(echo "$t1 - $t0" | bc) 0" >> "$work/results"
  rm -rf "$work/store2"
  t0=$(now); /usr/bin/time -v "$ptcfs" import "s3://$PTCFS_S3_BUCKET/$p/ptcfs" "$work/store2" >/dev/null 2>"$work/time.down"; t1=$(now)
  echo "$r down ptcfs $(echo "$t1 - $t0" | bc) $(rss "$work/time.down")" >> "$work/results"
  obj=$("${c[@]}" -H "x-amz-content-sha256: $sha_empty" \
        "$AWS_ENDPOINT_URL/$PTCFS_S3_BUCKET?list-type=2&prefix=$p%2Fptcfs%2Fgen-" | grep -o '<Key>[^<]*\.bin</Key>' | sed 's/<[^>]*>//g' | head -1)
  t0=$(now); "${c[@]}" -H "x-amz-content-sha256: $sha_empty" "$AWS_ENDPOINT_URL/$PTCFS_S3_BUCKET/$obj" -o "$work/plain.bin" && sync "$work/plain.bin"; t1=$(now)
  echo "$r down curl $(echo "$t1 - $t0" | bc) 0" >> "$work/results"
  rm -f "$work/plain.bin"; rm -rf "$work/store2"
  # remove the round's objects (the same way the tier removes old copies)
  "${c[@]}" -H "x-amz-content-sha256: $sha_empty" "$AWS_ENDPOINT_URL/$PTCFS_S3_BUCKET?list-type=2&prefix=$p%2F" \
    | grep -o '<Key>[^<]*</Key>' | sed 's/<[^>]*>//g' | while read -r k; do
      "${c[@]}" -X DELETE -H "x-amz-content-sha256: $sha_empty" "$AWS_ENDPOINT_URL/$PTCFS_S3_BUCKET/$k" -o /dev/null; done
done
cat "$work/loads" "$work/results"
for dir in up down; do
  p=$(awk -v d=$dir '$2==d && $3=="ptcfs" {print $4}' "$work/results" | median)
  q=$(awk -v d=$dir '$2==d && $3=="curl" {print $4}' "$work/results" | median)
  m=$(awk -v d=$dir '$2==d && $3=="ptcfs" {print $5}' "$work/results" | sort -n | tail -1)
  printf "%-4s ptcfs %.2f s (%.0f MB/s, peak RSS %s MiB)  curl %.2f s (%.0f MB/s)  ratio ptcfs/curl throughput %.2fx\n" \
    $dir "$p" "$(echo "$bytes / $p / 1000000" | bc -l)" "$m" "$q" "$(echo "$bytes / $q / 1000000" | bc -l)" "$(echo "$q / $p" | bc -l)"
done
