"""Checks of python/ptcfs_switch.py on the CPU path (run by tests/switch_python_test.cc):
every rank's tensors after a switch equal the synthetic reference of the target layout,
bit for bit, with ranks as threads in the library, as Python threads over a Python
exchange, and as processes over torch.distributed (gloo); errors come back as
SwitchError naming what is at fault. Usage: test_ptcfs_switch.py [LIBRARY]"""

import os
import queue
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptcfs_switch  # noqa: E402
import torch  # noqa: E402

DIMS = "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128"
CASES = [("tp=2,pp=2,dp=2", "tp=4,pp=1,dp=2", "bf16"), ("dp=4", "tp=2,pp=2", "f32"),
         ("tp=2,pp=2", "tp=1,pp=2,dp=2,pp_layers=1+3", "f8_e4m3")]
SEED = 7


def bits(t):
    return t.contiguous().view(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def expect_switched(plan, dst):
    for r in range(plan.world):
        want = plan.empty(r, "to")
        plan.synth(r, "to", want, SEED)
        for b, got, exp in zip(plan.buffers(r, "to"), dst[r], want):
            assert torch.equal(bits(got), bits(exp)), "rank %d %s differs" % (r, b["name"])


def sources(plan):
    src = []
    for r in range(plan.world):
        bufs = plan.empty(r, "from")
        plan.synth(r, "from", bufs, SEED)
        src.append(bufs)
    return src


def test_threads_in_library():
    for a, b, dtype in CASES:
        plan = ptcfs_switch.Plan("llama", DIMS, a, b, param_dtype=dtype, budget=4096)
        src = sources(plan)
        dst = [plan.empty(r, "to") for r in range(plan.world)]
        plan.run_threads(src, dst)
        expect_switched(plan, dst)
        d = plan.describe()
        assert d["bytes_local"] + d["bytes_moved"] == d["bytes_total"], d
        if not a.startswith("dp="):  # from pure dp every rank holds everything already
            assert d["bytes_moved"] > 0 and d["buckets"] > 1, d


def test_python_exchange():
    # Python threads, one per rank, with mailboxes as the transport: the callback path.
    plan = ptcfs_switch.Plan("llama", DIMS, "tp=2,pp=2", "dp=4", param_dtype="bf16", grad_dtype="f32", budget=2048)
    boxes = {(s, r): queue.Queue() for s in range(plan.world) for r in range(plan.world)}

    def exchange_for(rank):
        def exchange(sends, recvs):
            for peer, addr, n in sends:
                boxes[(rank, peer)].put(bytes(ptcfs_switch._byte_tensor(addr, n).numpy()))
            for peer, addr, n in recvs:
                data = boxes[(peer, rank)].get(timeout=60)
                assert len(data) == n
                ptcfs_switch._byte_tensor(addr, n).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return exchange

    src = sources(plan)
    dst = [plan.empty(r, "to") for r in range(plan.world)]
    errors = []

    def run(r):
        try:
            plan.run(r, src[r], dst[r], exchange_for(r))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(plan.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expect_switched(plan, dst)


def test_errors():
    try:
        ptcfs_switch.Plan("llama", DIMS, "dp=2", "tp=3")
        raise AssertionError("tp=3 planned")
    except ptcfs_switch.SwitchError as e:
        assert "tp=3" in str(e) and "layout B" in str(e), e
    plan = ptcfs_switch.Plan("llama", DIMS, "dp=2", "tp=2")
    src = plan.empty(0, "from")
    dst = plan.empty(0, "to")
    dst[0] = torch.zeros(3)
    try:
        plan.run(0, src, dst, lambda s, r: None)
        raise AssertionError("a short buffer was accepted")
    except ptcfs_switch.SwitchError as e:
        assert "holds 12 bytes" in str(e), e
    try:
        ptcfs_switch.Plan("llama", DIMS, "dp=2", "tp=2", param_dtype="bf17")
        raise AssertionError("bf17 accepted")
    except ptcfs_switch.SwitchError as e:
        assert "bf17" in str(e), e


def gloo_worker(rank, world, init, a, b, result):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    plan = ptcfs_switch.Plan("llama", DIMS, a, b, param_dtype="bf16", budget=8192)
    src = plan.empty(rank, "from")
    plan.synth(rank, "from", src, SEED)
    dst = plan.empty(rank, "to")
    plan.run(rank, src, dst, ptcfs_switch.torch_exchange())
    want = plan.empty(rank, "to")
    plan.synth(rank, "to", want, SEED)
    ok = all(torch.equal(bits(g), bits(w)) for g, w in zip(dst, want))
    torch.save(ok, os.path.join(result, "rank-%d" % rank))
    dist.barrier()
    dist.destroy_process_group()


def test_gloo_processes():
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(gloo_worker, args=(4, init, "tp=2,pp=2", "tp=4", tmp), nprocs=4, join=True)
        for r in range(4):
            assert torch.load(os.path.join(tmp, "rank-%d" % r)) is True, "rank %d differs over gloo" % r


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["PTCFS_SWITCH_LIB"] = sys.argv[1]
    ptcfs_switch.load_library(os.environ.get("PTCFS_SWITCH_LIB"))
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("ok", name, flush=True)
    print("all passed")
