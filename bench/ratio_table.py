"""Medians of interleaved rounds and their ratios to a base method.

usage: ratio_table.py RESULTS BASE METHOD...
RESULTS: lines "ROUND METHOD GBPS". Prints per method the median GB/s, the
ratio of the medians to BASE's, and the median (range) of the per-round
ratios (each round's figure over BASE's of the same round), then the rounds.
Used by bench/megatron_open.sh and bench/rank_loaders.sh."""
import statistics
import sys

path, base, methods = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {}
for line in open(path):
    r, m, v = line.split()
    rows.setdefault(m, {})[int(r)] = float(v)
b = rows[base]
print(f"{'method':14} {'median GB/s':>12} {'x ' + base:>9} {'per-round x: median (range)':>29}  rounds")
for m in methods:
    v = rows[m]
    ratios = [v[r] / b[r] for r in v if r in b]
    med = statistics.median(v.values())
    print(f"{m:14} {med:12.3f} {med / statistics.median(b.values()):9.2f} "
          f"{statistics.median(ratios):15.2f} ({min(ratios):.2f}-{max(ratios):.2f})  "
          + " ".join(f"{v[r]:.2f}" for r in sorted(v)))
