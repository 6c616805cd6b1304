#!/usr/bin/env python3
# The independent reader of a rank's dataset view: parses Megatron .idx files
# with struct/numpy only and checks that VIEW_DIR/{ids.txt,samples.idx,samples.bin}
# hold exactly the source samples named in ids.txt, in that order.
# Usage: /usr/bin/python3 read_megatron_view.py SOURCE_PREFIX VIEW_DIR
# Prints "READER OK <count>"; exits 3 when numpy is missing.
import struct, sys
try:
    import numpy as np
except ImportError:
    print("numpy is missing: install python3-numpy (apt-get install python3-numpy)")
    sys.exit(3)

DT = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}

def read_idx(path):
    b = open(path, 'rb').read()
    assert b[:9] == b'MMIDIDX\x00\x00', path + ": magic"
    assert struct.unpack('<Q', b[9:17])[0] == 1, path + ": version"
    code = b[17]
    n, d = struct.unpack('<QQ', b[18:34])
    assert len(b) == 34 + 12 * n + 8 * d, path + ": size"
    sizes = np.frombuffer(b, dtype='<i4', count=n, offset=34)
    ptrs = np.frombuffer(b, dtype='<i8', count=n, offset=34 + 4 * n)
    docs = np.frombuffer(b, dtype='<i8', count=d, offset=34 + 12 * n)
    return np.dtype(DT[code]), sizes, ptrs, docs

src_prefix, view_dir = sys.argv[1], sys.argv[2]
sdt, ssizes, sptrs, _ = read_idx(src_prefix + '.idx')
sbin = np.fromfile(src_prefix + '.bin', dtype=np.uint8)
vdt, vsizes, vptrs, vdocs = read_idx(view_dir + '/samples.idx')
vbin = np.fromfile(view_dir + '/samples.bin', dtype=np.uint8)
ids = [int(line) for line in open(view_dir + '/ids.txt')]
assert vdt == sdt, "dtype"
assert len(ids) == len(vsizes), "ids.txt and samples.idx disagree on the count"
assert np.array_equal(vdocs, np.arange(len(ids) + 1)), "document index"
expect = 0
for j, i in enumerate(ids):
    assert vptrs[j] == expect, "offset of view sample %d" % j
    a = vbin[vptrs[j]:vptrs[j] + vsizes[j] * vdt.itemsize].view(vdt)
    b = sbin[sptrs[i]:sptrs[i] + ssizes[i] * sdt.itemsize].view(sdt)
    assert np.array_equal(a, b), "tokens of view sample %d (sample %d)" % (j, i)
    expect += vsizes[j] * vdt.itemsize
assert expect == len(vbin), "samples.bin size"
print("READER OK", len(ids))
