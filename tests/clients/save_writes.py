#!/usr/bin/env python3
"""A save's file written the hard ways, through a mount (issue 42: saves
through the kernel): tests/mount_save_test.cc's client.

  save_writes.py SRC DST [--mmap]
      Creates DST (a new file in a save directory of the mount: megatron/iter_N/...
      or dcp/NAME/...) and writes it so that it ends byte for byte equal to SRC,
      checking on the way what a framework relies on:
        - junk larger than SRC: the size stat(2) sees while the file is open for
          writing (the kernel writes the staged file; the daemon stats it);
        - ftruncate through the open file, truncate(2) by path;
        - a reopen with O_TRUNC (size 0), then SRC in 1 MiB pieces from its end
          to its start (pwrite at offsets);
        - a tail written past the end, cut off again (a partial write undone);
        - a second open of the same file while one writes: a reader sees the
          writer's bytes at once (the same staged file);
        - with --mmap, a shared writable mapping: bytes changed through it are
          read by pread, then mended through it.
Exit 0 and "WRITES OK <bytes>" when every check held; 1 and "WRITES FAILED:
what" otherwise.
"""
import mmap
import os
import sys

STEP = 1 << 20


def expect(ok, what):
    if not ok:
        print("WRITES FAILED:", what)
        sys.exit(1)


def read_all(fd, n):
    out = bytearray()
    while len(out) < n:
        chunk = os.pread(fd, min(STEP, n - len(out)), len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def sizes(path, fd):
    return os.stat(path).st_size, os.fstat(fd).st_size


def main():
    src, dst = sys.argv[1], sys.argv[2]
    use_mmap = "--mmap" in sys.argv[3:]
    data = open(src, "rb").read()
    n = len(data)
    expect(n > 2 * 4096, "%s: too small (%d bytes)" % (src, n))

    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    junk = bytes(range(256)) * (n // 256 + 64)
    expect(os.write(fd, junk) == len(junk), "short write of the junk")
    expect(sizes(dst, fd) == (len(junk), len(junk)), "size while written: %s, wrote %d" % (sizes(dst, fd), len(junk)))
    os.ftruncate(fd, 4096)
    expect(sizes(dst, fd) == (4096, 4096), "size after ftruncate(4096): %s" % (sizes(dst, fd),))
    os.close(fd)
    os.truncate(dst, 100)
    expect(os.stat(dst).st_size == 100, "size after truncate(100): %d" % os.stat(dst).st_size)
    with open(dst, "rb") as f:
        expect(f.read() == junk[:100], "the first 100 bytes after the truncates")

    fd = os.open(dst, os.O_WRONLY | os.O_TRUNC)
    expect(sizes(dst, fd) == (0, 0), "size after an O_TRUNC open: %s" % (sizes(dst, fd),))
    for off in reversed(range(0, n, STEP)):
        piece = data[off:off + STEP]
        expect(os.pwrite(fd, piece, off) == len(piece), "short pwrite at %d" % off)
    expect(sizes(dst, fd) == (n, n), "size after the pieces: %s, SRC %d" % (sizes(dst, fd), n))
    os.pwrite(fd, b"tail" * 1000, n)
    expect(os.stat(dst).st_size == n + 4000, "size with the tail: %d" % os.stat(dst).st_size)
    os.ftruncate(fd, n)
    os.close(fd)

    writer = os.open(dst, os.O_RDWR)
    reader = os.open(dst, os.O_RDONLY)
    os.pwrite(writer, b"\0" * 4096, 0)
    expect(os.pread(reader, 4096, 0) == b"\0" * 4096, "a second open does not see the first one's write")
    os.pwrite(writer, data[:4096], 0)
    expect(read_all(reader, n) == data, "a second open reads other bytes than written")
    os.close(reader)
    if use_mmap:
        m = mmap.mmap(writer, n)  # MAP_SHARED, read and write
        mid = n // 2
        m[mid:mid + 4096] = b"\xff" * 4096
        m.flush()
        expect(os.pread(writer, 4096, mid) == b"\xff" * 4096, "a write through the mapping is not read back")
        m[mid:mid + 4096] = data[mid:mid + 4096]
        m.flush()
        m.close()
    os.close(writer)
    with open(dst, "rb") as f:
        expect(f.read() == data, "%s does not end equal to %s" % (dst, src))
    print("WRITES OK", n)


if __name__ == "__main__":
    main()
