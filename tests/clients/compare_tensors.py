"""Independent readers used by the mount tests: safetensors parsed here from
its JSON header with numpy.frombuffer, npy through numpy.load.

usage: compare_tensors.py MOUNT_DIR REFERENCE_DIR
Compares every rank-*/model.safetensors, optim.safetensors and
tensors/*.npy under MOUNT_DIR with the same file under REFERENCE_DIR, tensor
by tensor (names, dtypes, shapes, bytes). Prints a summary; exit 1 on any
difference."""
import json
import pathlib
import struct
import sys

import numpy as np

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "u1", "F8_E4M3": "u1", "F8_E5M2": "u1"}


def read_safetensors(path):
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + e], dtype=DTYPES[t["dtype"]])
        out[name] = (t["dtype"], tuple(t["shape"]), arr.reshape(t["shape"]))
    return out


def main():
    mount, ref = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    files = tensors = 0
    for r in sorted(ref.glob("rank-*")):
        for name in ("model.safetensors", "optim.safetensors"):
            if not (r / name).exists():
                continue
            a, b = read_safetensors(mount / r.name / name), read_safetensors(r / name)
            if a.keys() != b.keys():
                sys.exit(f"{r.name}/{name}: tensor names differ")
            for k in b:
                if a[k][:2] != b[k][:2] or not np.array_equal(a[k][2], b[k][2]):
                    sys.exit(f"{r.name}/{name}: tensor {k} differs")
                tensors += 1
            files += 1
        for npy in sorted((r / "tensors").glob("*.npy")):
            x, y = np.load(mount / r.name / "tensors" / npy.name), np.load(npy)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                sys.exit(f"{r.name}/tensors/{npy.name} differs")
            files += 1
    if files == 0:
        sys.exit("nothing compared")
    print(f"equal: {files} files, {tensors} safetensors tensors")


main()
