"""Layout switching for PyTorch jobs: ctypes bindings of libptcfs_switch.so.

A job holds its parameters' working copies and gradients in one parallel
layout (tp, pp, dp) and wants them in another (HotSPa's hot switching: each
sequence-length group of a mini-batch in the layout that suits it). ptcfs plans
the switch from the model's schema (which tensor is split how), and every rank
runs its part with its tensors' data pointers:

    plan = ptcfs_switch.Plan("llama", "layers=4,hidden=64,...", "dp=4", "tp=2,dp=2")
    src = plan.empty(rank, "from")      # or the job's own tensors, in plan.buffers(rank, "from") order
    dst = plan.empty(rank, "to")
    plan.run(rank, src, dst, ptcfs_switch.torch_exchange())   # CPU, messages over torch.distributed
    plan.run_cuda(rank, src, dst, stream=torch.cuda.current_stream().cuda_stream, comm=comm)  # GPU, NCCL

Buffers may be torch tensors, numpy arrays or raw addresses; tensors must be
contiguous and exactly as large as the plan says. Plans are cached in the
library per (layout A, layout B). The library is found through
$PTCFS_SWITCH_LIB, else next to this file's repository in build*/transform/device/.
"""

import ctypes
import glob
import json
import os

__all__ = ["Plan", "SwitchError", "torch_exchange", "nccl_comm", "load_library"]

_EXCHANGE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int,
                             ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p),
                             ctypes.POINTER(ctypes.c_uint64))


class SwitchError(RuntimeError):
    """A failure reported by libptcfs_switch (the message names what is at fault)."""


_lib = None


def load_library(path=None):
    """Loads libptcfs_switch.so once: `path`, $PTCFS_SWITCH_LIB, or a build directory of this repository."""
    global _lib
    if _lib is not None:
        return _lib
    candidates = [path, os.environ.get("PTCFS_SWITCH_LIB")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates += sorted(glob.glob(os.path.join(root, "build*", "transform", "device", "libptcfs_switch.so")))
    for c in candidates:
        if c and os.path.exists(c):
            lib = ctypes.CDLL(c)
            break
    else:
        raise SwitchError("libptcfs_switch.so not found: set PTCFS_SWITCH_LIB or build the target ptcfs_switch")
    vp, cp, i, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64
    pp = ctypes.POINTER(ctypes.c_void_p)
    lib.ptcfs_switch_plan_create.argtypes = [cp, cp, cp, cp, cp]
    lib.ptcfs_switch_plan_create.restype = vp
    lib.ptcfs_switch_free.argtypes = [vp]
    lib.ptcfs_switch_free.restype = None
    lib.ptcfs_switch_world.argtypes = [vp]
    lib.ptcfs_switch_describe.argtypes = [vp, i]
    lib.ptcfs_switch_describe.restype = cp
    lib.ptcfs_switch_synth.argtypes = [vp, i, i, u64, pp]
    lib.ptcfs_switch_run.argtypes = [vp, i, pp, pp, _EXCHANGE, vp]
    lib.ptcfs_switch_run_threads.argtypes = [vp, ctypes.POINTER(pp), ctypes.POINTER(pp)]
    lib.ptcfs_switch_has_cuda.argtypes = []
    lib.ptcfs_switch_run_cuda.argtypes = [vp, i, pp, pp, vp, vp]
    lib.ptcfs_switch_nccl_unique_id.argtypes = [ctypes.c_char_p]
    lib.ptcfs_switch_nccl_comm_create.argtypes = [ctypes.c_char_p, i, i, ctypes.POINTER(vp)]
    lib.ptcfs_switch_nccl_comm_destroy.argtypes = [vp]
    lib.ptcfs_switch_last_error.restype = cp
    _lib = lib
    return lib


def _check(rc):
    if rc != 0:
        raise SwitchError(_lib.ptcfs_switch_last_error().decode())


def _address(buf):
    """(address, bytes) of a contiguous torch tensor, numpy array, or (address, bytes) pair."""
    if isinstance(buf, tuple):
        return int(buf[0]), int(buf[1])
    if hasattr(buf, "data_ptr"):  # torch
        if not buf.is_contiguous():
            raise SwitchError("switch buffers must be contiguous tensors")
        return buf.data_ptr(), buf.numel() * buf.element_size()
    if hasattr(buf, "__array_interface__"):  # numpy
        if not buf.flags["C_CONTIGUOUS"]:
            raise SwitchError("switch buffers must be C-contiguous arrays")
        return buf.__array_interface__["data"][0], buf.nbytes
    raise SwitchError("a switch buffer must be a torch tensor, a numpy array or an (address, bytes) pair")


_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class Plan:
    """The switch of a model from layout `src` to layout `dst` ("tp=2,pp=2,dp=2[,pp_layers=..]").

    What moves: the parameters' working copies (param_dtype) and, with grads, their gradients
    (grad_dtype); the optimizer state only with optimizer=True. budget: staging bytes per rank.
    """

    def __init__(self, schema, dims, src, dst, *, param_dtype="bf16", grads=True, grad_dtype=None,
                 optimizer=False, ranks_per_host=8, budget=64 << 20, library=None):
        lib = load_library(library)
        options = "param_dtype=%s,grad_dtype=%s,grads=%d,optimizer=%d,ranks_per_host=%d,budget=%d" % (
            param_dtype, grad_dtype or param_dtype, int(grads), int(optimizer), ranks_per_host, budget)
        self._lib = lib
        self._handle = lib.ptcfs_switch_plan_create(schema.encode(), dims.encode(), src.encode(), dst.encode(),
                                                    options.encode())
        if not self._handle:
            raise SwitchError(lib.ptcfs_switch_last_error().decode())
        self.world = lib.ptcfs_switch_world(self._handle)
        self._described = {}

    def close(self):
        if self._handle:
            self._lib.ptcfs_switch_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def describe(self, rank=None):
        """The whole plan (rank None) or one rank's part, as a dict."""
        key = -1 if rank is None else rank
        if key not in self._described:
            text = self._lib.ptcfs_switch_describe(self._handle, key)
            if text is None:
                raise SwitchError(self._lib.ptcfs_switch_last_error().decode())
            self._described[key] = json.loads(text.decode())
        return self._described[key]

    def buffers(self, rank, side):
        """rank's buffers in layout A (side "from") or B ("to"): dicts of name, dtype, shape, bytes."""
        return self.describe(rank)[side]

    def empty(self, rank, side, device="cpu"):
        """Zeroed torch tensors for rank's buffers (uint8 for dtypes torch lacks, e.g. fp8)."""
        import torch
        out = []
        for b in self.buffers(rank, side):
            name = _TORCH_DTYPES.get(b["dtype"])
            if name is None:
                out.append(torch.zeros(b["bytes"], dtype=torch.uint8, device=device))
            else:
                out.append(torch.zeros(b["shape"], dtype=getattr(torch, name), device=device))
        return out

    def _pointers(self, rank, side, bufs):
        want = self.buffers(rank, side)
        if len(bufs) != len(want):
            raise SwitchError("rank %d: %d %s buffers given, the plan has %d" % (rank, len(bufs), side, len(want)))
        arr = (ctypes.c_void_p * max(1, len(bufs)))()
        for k, (b, w) in enumerate(zip(bufs, want)):
            addr, nbytes = _address(b)
            if nbytes != w["bytes"]:
                raise SwitchError("rank %d: buffer %s holds %d bytes, the plan needs %d" % (rank, w["name"], nbytes,
                                                                                           w["bytes"]))
            arr[k] = addr
        return arr

    def synth(self, rank, side, bufs, seed=0):
        """Fills rank's buffers with the values of `ptcfs synth` (seed): a reference for tests."""
        _check(self._lib.ptcfs_switch_synth(self._handle, rank, 0 if side == "from" else 1, seed,
                                            self._pointers(rank, side, bufs)))

    def run(self, rank, src, dst, exchange):
        """Rank's part on host memory; exchange(sends, recvs) moves one bucket's messages, each a
        (peer, address, bytes) triple, all posted before any is waited on (see torch_exchange)."""
        error = []

        def callback(ctx, nsend, send_peers, send_data, send_bytes, nrecv, recv_peers, recv_data, recv_bytes):
            try:
                sends = [(send_peers[k], send_data[k], send_bytes[k]) for k in range(nsend)]
                recvs = [(recv_peers[k], recv_data[k], recv_bytes[k]) for k in range(nrecv)]
                exchange(sends, recvs)
                return 0
            except BaseException as e:  # reported after the C call returns
                error.append(e)
                return 1

        fn = _EXCHANGE(callback)
        rc = self._lib.ptcfs_switch_run(self._handle, rank, self._pointers(rank, "from", src),
                                        self._pointers(rank, "to", dst), fn, None)
        if error:
            raise error[0]
        _check(rc)

    def run_threads(self, src, dst):
        """Every rank in this process (threads inside the library): src[r], dst[r] are rank r's buffers."""
        if len(src) != self.world or len(dst) != self.world:
            raise SwitchError("buffers for %d ranks, the plan has %d" % (len(src), self.world))
        pp = ctypes.POINTER(ctypes.c_void_p)
        keep = [self._pointers(r, "from", src[r]) for r in range(self.world)]
        keep2 = [self._pointers(r, "to", dst[r]) for r in range(self.world)]
        f = (pp * self.world)(*[ctypes.cast(a, pp) for a in keep])
        t = (pp * self.world)(*[ctypes.cast(a, pp) for a in keep2])
        _check(self._lib.ptcfs_switch_run_threads(self._handle, f, t))

    def run_cuda(self, rank, src, dst, stream=None, comm=None):
        """Rank's part on device memory, queued on `stream` (an int cudaStream_t, e.g.
        torch.cuda.current_stream().cuda_stream) with messages over `comm` (nccl_comm)."""
        _check(self._lib.ptcfs_switch_run_cuda(self._handle, rank, self._pointers(rank, "from", src),
                                               self._pointers(rank, "to", dst), stream, comm))


def has_cuda():
    return bool(load_library().ptcfs_switch_has_cuda())


def _byte_tensor(address, nbytes):
    import torch
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


def torch_exchange(group=None):
    """An exchange over torch.distributed point-to-point calls (gloo on CPU): every send and
    receive of a bucket posted (isend/irecv), then all waited on. Ranks are the plan's ranks,
    which must be the group's."""
    import torch.distributed as dist

    def exchange(sends, recvs):
        reqs = [dist.isend(_byte_tensor(a, n), peer, group=group) for peer, a, n in sends]
        reqs += [dist.irecv(_byte_tensor(a, n), peer, group=group) for peer, a, n in recvs]
        for r in reqs:
            r.wait()

    return exchange


def nccl_comm(rank, world, group=None):
    """An NCCL communicator for the plan's ranks: the unique id made on rank 0 and broadcast
    through torch.distributed. Returns an opaque address for Plan.run_cuda."""
    import torch.distributed as dist
    lib = load_library()
    uid = ctypes.create_string_buffer(128)
    if rank == 0:
        _check(lib.ptcfs_switch_nccl_unique_id(uid))
    box = [uid.raw]
    dist.broadcast_object_list(box, src=0, group=group)
    comm = ctypes.c_void_p()
    _check(lib.ptcfs_switch_nccl_comm_create(box[0], world, rank, ctypes.byref(comm)))
    return comm.value
