"""Reads files with 1 MiB reads from N parallel reader processes; prints GB/s.

usage: mount_read.py READERS FILE...   (files are dealt round-robin to readers)"""
import os
import sys
import time
from multiprocessing import Process


def read_all(files):
    buf = bytearray(1 << 20)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            while os.readv(fd, [buf]) > 0:
                pass
        finally:
            os.close(fd)


def main():
    readers, files = int(sys.argv[1]), sys.argv[2:]
    total = sum(os.path.getsize(f) for f in files)
    parts = [files[i::readers] for i in range(readers)]
    start = time.perf_counter()
    procs = [Process(target=read_all, args=(p,)) for p in parts]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    secs = time.perf_counter() - start
    print(f"{total / secs / 1e9:.3f}")


main()
