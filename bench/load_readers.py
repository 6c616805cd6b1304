#!/usr/bin/env python3
"""Readers for bench/load.sh: N threads loop over every rank file of a mount
until STOP_FILE exists, reading each file whole into one reused buffer, and
check every read against the hashes of that path in the exports of every
config the run visits (a read that matches none is torn). Prints one JSON
line: reads, bytes, torn, vanished (a file the layout switch removed between
listing and reading), errors."""
import hashlib, json, os, sys, threading

mnt, expected_path, stop_file, nthreads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(expected_path) as f:
    expected = {path: set(hashes) for path, hashes in json.load(f).items()}
lock = threading.Lock()
totals = {"reads": 0, "bytes": 0, "torn": 0, "vanished": 0, "errors": 0, "torn_files": []}


def files():
    out = []
    for root, _, names in os.walk(os.path.join(mnt, "model")):
        out += [os.path.join(root, n) for n in names if n.endswith(".safetensors")]
    return sorted(out)


def reader(k):
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    mine = {"reads": 0, "bytes": 0, "torn": 0, "vanished": 0, "errors": 0, "torn_files": []}
    while not os.path.exists(stop_file):
        listing = files()
        for i in range(len(listing)):
            path = listing[(i + k) % len(listing)]
            rel = os.path.relpath(path, mnt)
            h = hashlib.blake2b(digest_size=16)
            try:
                with open(path, "rb", buffering=0) as f:
                    while True:
                        n = f.readinto(buf)
                        if not n:
                            break
                        h.update(view[:n])
                        mine["bytes"] += n
            except FileNotFoundError:
                mine["vanished"] += 1
                continue
            except OSError:
                mine["errors"] += 1
                continue
            mine["reads"] += 1
            if h.hexdigest() not in expected.get(rel, ()):
                mine["torn"] += 1
                mine["torn_files"].append(rel)
    with lock:
        for key in ("reads", "bytes", "torn", "vanished", "errors"):
            totals[key] += mine[key]
        totals["torn_files"] += mine["torn_files"][:5]


threads = [threading.Thread(target=reader, args=(k,)) for k in range(nthreads)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(totals))
