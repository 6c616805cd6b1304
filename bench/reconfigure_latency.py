"""Time from writing a new config into MOUNT/.ptcfs/config to the first byte
of a file of the new layout, in milliseconds.

usage: reconfigure_latency.py MOUNT CONFIG RANK_FILE"""
import os
import sys
import time

mount, config, rank_file = sys.argv[1:4]
start = time.perf_counter()
with open(os.path.join(mount, ".ptcfs/config"), "w") as f:
    f.write(config + "\n")
with open(os.path.join(mount, rank_file), "rb") as f:
    first = f.read(1)
ms = (time.perf_counter() - start) * 1e3
assert len(first) == 1
print(f"{ms:.2f}")
