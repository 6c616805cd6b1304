#!/usr/bin/env python3
"""The libraries people read checkpoints and data with, from PyPI (the venv that
tools/setup-deps.sh makes: torch 2, safetensors, megatron-core, numpy), against the mount.

  safetensors DIR REF     every DIR/**/*.safetensors through safetensors.safe_open with the
                          numpy and the torch frameworks (both mmap the file), each tensor and
                          the metadata equal to the file of the same path under REF (a plain
                          directory) read the same way
  npy DIR REF             every DIR/rank-R/tensors/NAME.npy through numpy.load(mmap_mode='r'),
                          equal to tensor NAME of REF/rank-R/*.safetensors (safe_open, numpy)
  torchload DIR           every DIR/**/*.pt through torch.load as torch 2 defaults to
                          (weights_only=True; megatron.core imported, which allows the globals
                          Megatron's files hold: argparse.Namespace, numpy arrays), and with
                          mmap=True: the same values both ways, and as a weights_only=False load
                          of a plain copy of the file
  indexed DATA SRC        megatron.core's IndexedDataset over every DATA/rank-RRRRR/samples
                          prefix: sample k equals the sample of SRC (a Megatron .idx/.bin
                          prefix, read by IndexedDataset too) whose id is line k of ids.txt

Prints "<CMD> OK <count>" and exits 0 when everything matches; 3 when a library is missing.
"""
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import warnings

# megatron.core warns on import about Transformer Engine / Apex (absent, and not needed here).
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

try:
    import numpy as np
    import torch
    from safetensors import safe_open
except ImportError as e:
    print(f"{e}: run tools/setup-deps.sh (it makes .venv/ with the clients from PyPI)")
    sys.exit(3)


def files(root, suffix):
    out = sorted(p for p in pathlib.Path(root).rglob("*" + suffix) if p.is_file())
    assert out, f"no {suffix} file under {root}"
    return out


def same_array(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_tensor(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def cmd_safetensors(root, ref):
    n = 0
    for path in files(root, ".safetensors"):
        want_path = pathlib.Path(ref) / path.relative_to(root)
        for framework, same in (("numpy", same_array), ("pt", same_tensor)):
            with safe_open(str(path), framework=framework) as got, safe_open(str(want_path), framework=framework) as want:
                assert got.metadata() == want.metadata(), f"{path}: metadata {got.metadata()} != {want.metadata()}"
                assert sorted(got.keys()) == sorted(want.keys()), f"{path}: keys differ"
                for key in want.keys():
                    a, b = got.get_tensor(key), want.get_tensor(key)
                    assert same(a, b), f"{path} ({framework}): {key} differs"
                    n += 1
    print("SAFETENSORS OK", n)


def cmd_npy(root, ref):
    """rank-R/tensors/NAME.npy against tensor NAME of REF/rank-R/{model,optim}.safetensors
    (safe_open, numpy framework; f16/f32/int tensors, whose .npy dtype is the true one)."""
    n = 0
    for rank in sorted(pathlib.Path(ref).glob("rank-*")):
        want = {}
        for name in ("model.safetensors", "optim.safetensors"):
            if (rank / name).exists():
                with safe_open(str(rank / name), framework="numpy") as f:
                    want.update({k: f.get_tensor(k) for k in f.keys()})
        got = {p.name[:-len(".npy")]: p for p in (pathlib.Path(root) / rank.name / "tensors").glob("*.npy")}
        assert sorted(got) == sorted(want), f"{rank.name}: npy files {sorted(got)} != tensors {sorted(want)}"
        for key, path in got.items():
            a = np.load(path, mmap_mode="r")
            assert isinstance(a, np.memmap), f"{path}: not memory-mapped"
            assert same_array(np.asarray(a), want[key]), f"{path}: differs"
            n += 1
    assert n, f"no .npy under {root}"
    print("NPY OK", n)


def equal(path, a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(b)} != {list(a)}"
        for k in a:
            equal(f"{path}/{k}", a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {type(b)} of {len(b)} != {type(a)} of {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            equal(f"{path}/{i}", x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and same_tensor(a, b), f"{path}: tensor differs"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and same_array(a, b), f"{path}: array differs"
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        equal(path, vars(a), vars(b))
    else:
        assert a == b, f"{path}: {b!r} != {a!r}"


def cmd_torchload(root):
    assert int(torch.__version__.split(".")[0]) >= 2, f"torch {torch.__version__}: torch 2 expected"
    import megatron.core  # noqa: F401  (registers Megatron's safe globals, as a Megatron run does)
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files(root, ".pt"):
            default = torch.load(path)  # weights_only=True, torch's default since 2.6
            mapped = torch.load(path, mmap=True)
            copy = os.path.join(tmp, "copy.pt")
            shutil.copyfile(path, copy)
            plain = torch.load(copy, weights_only=False)
            equal(f"{path} (mmap)", plain, mapped)
            equal(f"{path} (weights_only)", plain, default)
            n += 1
    print("TORCHLOAD OK", n, "torch", torch.__version__)


def cmd_indexed(data, src):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    source = IndexedDataset(src)
    n = 0
    for rank in sorted(pathlib.Path(data).glob("rank-*")):
        ids = [int(line) for line in (rank / "ids.txt").read_text().split()]
        ds = IndexedDataset(str(rank / "samples"))
        assert len(ds) == len(ids), f"{rank}: {len(ds)} samples, ids.txt has {len(ids)}"
        for k, i in enumerate(ids):
            a, b = ds[k], source[i]
            assert same_array(a, b), f"{rank}: sample {k} differs from source sample {i}"
            n += 1
    assert n, f"no rank under {data}"
    print("INDEXED OK", n)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"safetensors": cmd_safetensors, "npy": cmd_npy, "torchload": cmd_torchload, "indexed": cmd_indexed}[cmd](*args)


main()
