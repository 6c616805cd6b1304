"""Python side of the zip / pickle / torch file tests (run with /usr/bin/python3).

usage:
  torch_roundtrip.py gen-pickles DIR        p0.pkl .. p5.pkl (the same object, protocols 0-5)
                                            and np_rng.pkl (np.random.get_state(), protocol 2)
  torch_roundtrip.py same-pickle A B        pickle.load(A) == pickle.load(B) (deep, numpy aware)
  torch_roundtrip.py torch-save DIR         DIR/model_optim_rng.pt, a Megatron-like checkpoint, and
                                            DIR/manifest.txt: path dtype shape file, one tensor a line,
                                            with the contiguous bytes of each tensor in DIR/<file>
  torch_roundtrip.py torch-same A B [KEY]   torch.load both (weights_only=False) and compare deeply,
                                            tensors bit for bit; with KEY compare A[KEY] only
  torch_roundtrip.py torch-weights-only A B KEY
                                            torch.load(B, weights_only=True) equals torch.load(A)[KEY]
                                            and B's 'iteration'
  torch_roundtrip.py zip-write-python DIR   stored archives written by Python's zipfile
Exit status 1 with a message on any difference.
"""
import argparse
import collections
import enum
import io
import os
import pickle
import random
import sys
import types
import zipfile

# Megatron pickles enums of its own; a stand-in module makes them loadable here.
_megatron = types.ModuleType("megatron")
_megatron_core = types.ModuleType("megatron.core")
_megatron_enums = types.ModuleType("megatron.core.enums")


class ModelType(enum.Enum):
    encoder_or_decoder = 1
    encoder_and_decoder = 2


ModelType.__module__ = "megatron.core.enums"
ModelType.__qualname__ = "ModelType"
_megatron_enums.ModelType = ModelType
sys.modules.update({"megatron": _megatron, "megatron.core": _megatron_core, "megatron.core.enums": _megatron_enums})


def fail(msg):
    print("DIFFERENCE:", msg)
    sys.exit(1)


def golden_object():
    shared = [1]
    return {
        "none": None, "true": True, "false": False,
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31 - 1, 2**31, 2**32 - 1, -2**63, 2**63 - 1,
                 123456789012],
        "floats": [0.0, -1.5, 3.0, 1e300, float("inf")],
        "str": "h\u00e9llo \u2713 \U0001F600 back\\slash\nnewline",
        "empty": "",
        "bytes": b"\x00\x01\xff abc",
        "ebytes": b"",
        "list": [1, [2, [3]]],
        "tuple0": (), "tuple1": (1,), "tuple2": (1, 2), "tuple3": (1, 2, 3), "tuple5": (1, 2, 3, 4, 5),
        "od": collections.OrderedDict([("b", 1), ("a", 2)]),
        "intkeys": {0: "a", 1: "b"},
        "tuplekey": {(1, "x"): 2},
        "ns": argparse.Namespace(lr=0.1, name="gpt", layers=[1, 2]),
        "set": {3},
        "fset": frozenset({4}),
        "slice": slice(1, 10, 2),
        "shared": [shared, shared],
        "big": list(range(2500)),
        "enum": ModelType.encoder_and_decoder,
    }


def gen_pickles(out):
    obj = golden_object()
    for proto in range(6):
        with open(os.path.join(out, "p%d.pkl" % proto), "wb") as f:
            pickle.dump(obj, f, protocol=proto)
    import numpy as np
    np.random.seed(42)
    with open(os.path.join(out, "np_rng.pkl"), "wb") as f:
        pickle.dump({"np_rng_state": np.random.get_state(), "random_rng_state": random.getstate()}, f, protocol=2)


def same(a, b, path="root"):
    """Deep equality: types, numpy arrays, tensors (bit for bit), namespaces, OrderedDict metadata."""
    import numpy as np
    if type(a) is not type(b):
        fail("%s: type %s vs %s" % (path, type(a).__name__, type(b).__name__))
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            fail("%s: numpy arrays differ" % path)
        return
    if "torch" in sys.modules:
        import torch
        if isinstance(a, torch.Tensor):
            if (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) != \
               (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad):
                fail("%s: tensor %s vs %s" % (path, (a.dtype, a.shape, a.stride(), a.storage_offset()),
                                              (b.dtype, b.shape, b.stride(), b.storage_offset())))
            if raw(a) != raw(b):
                fail("%s: tensor bytes differ" % path)
            return
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            fail("%s: keys %s vs %s" % (path, list(a.keys())[:10], list(b.keys())[:10]))
        for k in a:
            same(a[k], b[k], "%s.%s" % (path, k))
        if hasattr(a, "__dict__") or hasattr(b, "__dict__"):  # OrderedDict attributes (a state_dict's _metadata)
            same(dict(getattr(a, "__dict__", {})), dict(getattr(b, "__dict__", {})), path + ".__dict__")
        return
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            fail("%s: length %d vs %d" % (path, len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s.%d" % (path, i))
        return
    if isinstance(a, argparse.Namespace):
        same(vars(a), vars(b), path)
        return
    if isinstance(a, float) and a != a and b != b:
        return
    if a != b:
        fail("%s: %r vs %r" % (path, a, b))


def raw(t):
    import torch
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def megatron_checkpoint():
    import numpy as np
    import torch
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    emb = torch.nn.Embedding(16, 8).half()
    big = torch.randn(6, 10)
    qkv = torch.randn(24, 8, dtype=torch.float16)
    w = torch.randn(4, 4)
    args = argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=1, num_layers=2,
                              hidden_size=8, params_dtype=torch.float16, fp16=True, bf16=False, lr=1e-4,
                              seed=1234, model_type=ModelType.encoder_or_decoder, save="/ckpt", data_path=["a", "b"])
    model = {
        "language_model": {
            "embedding": {
                "word_embeddings": emb.state_dict(),
                "position_embeddings": {"weight": torch.randn(8, 8).to(torch.bfloat16)},
            },
            "encoder": {
                "layers.0.self_attention.query_key_value.weight": qkv,
                "layers.0.mlp.dense_h_to_4h.weight": torch.randn(8, 32).t(),  # transposed
                "layers.0.mlp.sliced": big[1:5, ::2],                          # offset + strides
                "layers.0.expanded": torch.ones(1, 3).expand(4, 3),            # stride 0
                "final_layernorm.weight": torch.ones(8),
                "final_layernorm.bias": torch.zeros(8, dtype=torch.float64),
                "tied.a": w,
                "tied.b": w,            # the same tensor twice
                "row": w[2],            # a view of the same storage
                "param": torch.nn.Parameter(torch.randn(3)),
            },
        },
    }
    misc = {
        "int64": torch.arange(5, dtype=torch.int64), "int32": torch.arange(5, dtype=torch.int32),
        "int16": torch.arange(5, dtype=torch.int16), "int8": torch.arange(-2, 3, dtype=torch.int8),
        "uint8": torch.arange(5, dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3),
    }
    rng_state = [{
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.get_rng_state(),
        "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()},
    }]
    optimizer = {
        "optimizer": {
            "state": {0: {"exp_avg": torch.randn(8), "exp_avg_sq": torch.rand(8), "step": 10},
                      1: {"exp_avg": torch.randn(3), "exp_avg_sq": torch.rand(3), "step": 10}},
            "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01,
                              "params": [0, 1]}],
        },
        "fp32_from_fp16_params": [[torch.randn(8), torch.randn(3)]],
        "grad_scaler": {"scale": 65536.0, "growth_tracker": 0},
    }
    return {"iteration": 100, "checkpoint_version": 3.0, "args": args, "model": model, "misc": misc,
            "rng_state": rng_state, "optimizer": optimizer}


def tensors(obj, path, out):
    """(path, tensor) pairs in the order ptc::pickle::ForEachTensor visits them."""
    import numpy as np
    import torch
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            tensors(v, k if not path else "%s.%s" % (path, k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            tensors(v, str(i) if not path else "%s.%d" % (path, i), out)
    elif isinstance(obj, argparse.Namespace):
        tensors(vars(obj), path, out)
    return out


def torch_save(out):
    import torch
    ckpt = megatron_checkpoint()
    torch.save(ckpt, os.path.join(out, "model_optim_rng.pt"))
    with open(os.path.join(out, "manifest.txt"), "w") as m:
        for i, (path, t) in enumerate(tensors(ckpt, "", [])):
            name = "t%d.bin" % i
            with open(os.path.join(out, name), "wb") as f:
                f.write(raw(t))
            m.write("%s %s %s %s\n" % (path, str(t.dtype).replace("torch.", ""),
                                       ",".join(map(str, t.shape)) or "-", name))


def torch_same(a, b, key=None):
    import torch
    x = torch.load(a, weights_only=False)
    y = torch.load(b, weights_only=False)
    if key:
        x = x[key]
    same(x, y)
    # Views of one storage in A stay views of one storage in B.
    if key is None:
        enc_x, enc_y = x["model"]["language_model"]["encoder"], y["model"]["language_model"]["encoder"]
        for e in (enc_x, enc_y):
            if e["tied.a"].storage().data_ptr() != e["row"].storage().data_ptr():
                fail("tied.a and row do not share a storage")


def torch_weights_only(a, b, key):
    import torch
    x = torch.load(a, weights_only=False)
    y = torch.load(b, weights_only=True)
    same(x[key], y[key])
    if y["iteration"] != x["iteration"]:
        fail("iteration")


def zip_write_python(out):
    data = {"a.txt": b"hello", "dir/b.bin": bytes(range(256)) * 5, "empty": b""}
    with zipfile.ZipFile(os.path.join(out, "plain.zip"), "w", zipfile.ZIP_STORED) as z:
        for k, v in data.items():
            z.writestr(k, v)
        z.comment = b"a comment"
    # Streamed to an unseekable file: data descriptors (flag bit 3).
    class Unseekable(io.RawIOBase):
        def __init__(self, f):
            self.f = f
        def writable(self):
            return True
        def write(self, b):
            return self.f.write(b)
    with open(os.path.join(out, "stream.zip"), "wb") as raw_file:
        with zipfile.ZipFile(Unseekable(raw_file), "w", zipfile.ZIP_STORED) as z:
            for k, v in data.items():
                with z.open(k, "w") as w:
                    w.write(v)
    with zipfile.ZipFile(os.path.join(out, "zip64.zip"), "w", zipfile.ZIP_STORED) as z:
        for k, v in data.items():
            with z.open(k, "w", force_zip64=True) as w:
                w.write(v)
    with zipfile.ZipFile(os.path.join(out, "deflated.zip"), "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", b"hello" * 100)
    for k, v in data.items():
        os.makedirs(os.path.dirname(os.path.join(out, "expect", k)), exist_ok=True)
        with open(os.path.join(out, "expect", k), "wb") as f:
            f.write(v)


def main():
    cmd = sys.argv[1]
    if cmd == "gen-pickles":
        gen_pickles(sys.argv[2])
    elif cmd == "same-pickle":
        with open(sys.argv[2], "rb") as f:
            a = pickle.load(f)
        with open(sys.argv[3], "rb") as f:
            b = pickle.load(f)
        same(a, b)
    elif cmd == "torch-save":
        torch_save(sys.argv[2])
    elif cmd == "torch-same":
        torch_same(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    elif cmd == "torch-weights-only":
        torch_weights_only(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "zip-write-python":
        zip_write_python(sys.argv[2])
    else:
        fail("unknown command " + cmd)
    print("OK")


if __name__ == "__main__":
    main()
