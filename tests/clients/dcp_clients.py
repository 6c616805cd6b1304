"""torch.distributed.checkpoint (DCP) against a ptcfs mount's dcp/ tree.

  dcp_clients.py load DCP_DIR REF_DIR --procs N
      N gloo processes each load the whole state with dcp.load twice: into
      plain tensors (every rank all of it) and into DTensors sharded on dim 0
      over a 1-D mesh of the N ranks (each rank its shard). Every tensor must
      equal, bit for bit, the reference REF_DIR/rank-00000/{model,optim}.safetensors
      (`ptcfs synth --config tp=1`: whole global tensors under their global
      names). Prints "LOAD OK".

  dcp_clients.py save OUT_DIR REF_DIR --procs N
      N gloo processes save the reference with dcp.save into OUT_DIR, each
      rank its dim-0 shard of every tensor (DTensors), with Adam's step per
      parameter and the param_groups, as a training job's state dict holds
      them. Prints "SAVE OK".

  dcp_clients.py save-rank OUT_DIR REF_DIR
      One rank of that save (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from
      the environment; a job whose ranks run on several hosts, each saving
      into its own host's mount). Prints "SAVE RANK OK".

  dcp_clients.py optim DCP_DIR STEP LR
      The optimizer entries of DCP_DIR (dcp_to_torch_save, then torch.load):
      every parameter's Adam step equals STEP and every param group's lr LR,
      as `save` writes them (42, 1e-4). Prints "OPTIM OK".

Keys follow docs/dcp_format.md: model.P for a parameter P,
optim.state.P.{exp_avg,exp_avg_sq,fp32} for its optimizer state.
"""

import argparse
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
import ranks  # noqa: E402 (how the gloo ranks start: forked)


def reference(ref_dir):
    """{dcp key: tensor} of the synth reference."""
    out = {}
    rank_dir = os.path.join(ref_dir, "rank-00000")
    for name, t in load_file(os.path.join(rank_dir, "model.safetensors")).items():
        out["model." + name] = t
    optim = os.path.join(rank_dir, "optim.safetensors")
    if os.path.exists(optim):
        for name, t in load_file(optim).items():
            param, kind = name.rsplit(".", 1)
            out["optim.state." + param + "." + kind] = t
    return out


def nest(flat):
    """{"model": {P: t}, "optim": {"state": {P: {kind: t}}}} as torch's state dicts nest."""
    sd = {}
    for key, t in flat.items():
        if key.startswith("model."):
            sd.setdefault("model", {})[key[len("model."):]] = t
        else:
            param, kind = key[len("optim.state."):].rsplit(".", 1)
            sd.setdefault("optim", {}).setdefault("state", {}).setdefault(param, {})[kind] = t
    return sd


def flat_of(sd):
    out = {}
    for p, t in sd.get("model", {}).items():
        out["model." + p] = t
    for p, kinds in sd.get("optim", {}).get("state", {}).items():
        for kind, t in kinds.items():
            out["optim.state." + p + "." + kind] = t
    return out


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().flatten().view(torch.uint8), b.contiguous().flatten().view(torch.uint8))


CHECKED = "CHECKED"  # a rank's every check passed


def worker(rank, world, port, dcp_dir, ref_dir, errors):
    try:
        check(rank, world, port, dcp_dir, ref_dir, errors)
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")  # what failed, not only how the process ended
        raise


def check(rank, world, port, dcp_dir, ref_dir, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ref = reference(ref_dir)
    bad = []
    # Plain tensors: every rank reads every tensor whole.
    sd = nest({k: torch.full_like(v, 7) for k, v in ref.items()})
    dcp.load(sd, checkpoint_id=dcp_dir)
    bad += [f"plain {k}" for k, t in flat_of(sd).items() if not same(t, ref[k])]
    # DTensors sharded on dim 0 over all ranks: each rank reads its shard.
    mesh = init_device_mesh("cpu", (world,))
    sd = nest({k: distribute_tensor(torch.full_like(v, 7), mesh, [Shard(0)] if v.dim() > 0 else [])
               for k, v in ref.items()})
    dcp.load(sd, checkpoint_id=dcp_dir)
    for k, t in flat_of(sd).items():
        local = t.to_local()
        want = torch.chunk(ref[k], world, dim=0) if ref[k].dim() > 0 else [ref[k]]
        want = want[rank] if rank < len(want) else ref[k][0:0]
        if not same(local, want):
            bad.append(f"dtensor shard {k} on rank {rank}")
        if not same(t.full_tensor(), ref[k]):
            bad.append(f"dtensor {k}")
    if bad:
        errors.put(f"rank {rank}: {len(bad)} of {3 * len(ref)} checks fail: {bad[:5]}")
    else:
        errors.put(f"{CHECKED} {rank}")
    dist.barrier()
    dist.destroy_process_group()


def saver(rank, world, port, out_dir, ref_dir):
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    ref = reference(ref_dir)
    sd = nest({k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in ref.items()})
    for state in sd.get("optim", {}).get("state", {}).values():
        state["step"] = torch.tensor(42.0)
    if "optim" in sd:
        sd["optim"]["param_groups"] = [{"lr": 1e-4, "params": sorted(sd["optim"]["state"])}]
    dcp.save(sd, checkpoint_id=out_dir)
    dist.barrier()
    dist.destroy_process_group()


def save(args):
    ranks.start(saver, (args.procs, ranks.free_port(), args.dcp_dir, args.ref_dir), args.procs)
    print(f"SAVE OK: {len(reference(args.ref_dir))} tensors from {args.procs} processes")
    return 0


def save_rank(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    saver(rank, world, None, args.dcp_dir, args.ref_dir)
    print(f"SAVE RANK OK: rank {rank} of {world}")
    return 0


def load(args):
    errors = ranks.queue()
    failed, checked, died = [], set(), None
    try:
        ranks.start(worker, (args.procs, ranks.free_port(), args.dcp_dir, args.ref_dir, errors), args.procs)
    except mp.ProcessExitedException as e:
        died = str(e)
    while not errors.empty():
        message = errors.get()
        if message.startswith(CHECKED + " "):
            checked.add(int(message.split()[1]))
        else:
            failed.append(message)
    if died and not failed and checked == set(range(args.procs)):
        # A process that dies once its rank's checks all passed (an abort in gloo's teardown, say:
        # "terminate called without an active exception" was seen) does not fail the load; one
        # that dies before them does, with its rank's traceback.
        print(f"note: {died}, after every rank's checks passed")
    elif died:
        failed.append(died)
    if failed or checked != set(range(args.procs)):
        print("\n".join(failed))
        return 1
    print(f"LOAD OK: {len(reference(args.ref_dir))} tensors in {args.procs} processes, plain and DTensor")
    return 0


def optim(args):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.pt")
        dcp_to_torch_save(args.dcp_dir, path)
        sd = torch.load(path, weights_only=False)
    steps = {p: float(s["step"]) for p, s in sd["optim"]["state"].items() if "step" in s}
    groups = sd["optim"]["param_groups"]
    bad = [f"{p}: step {v}" for p, v in steps.items() if v != args.step]
    bad += [f"group {i}: lr {g.get('lr')}" for i, g in enumerate(groups) if g.get("lr") != args.lr]
    if not steps or not groups or bad:
        print(f"{len(steps)} steps, {len(groups)} groups; wrong: {bad[:5]}")
        return 1
    print(f"OPTIM OK: {len(steps)} steps of {args.step}, {len(groups)} groups of lr {args.lr}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("load", "save", "save-rank"):
        p = sub.add_parser(name)
        p.add_argument("dcp_dir")
        p.add_argument("ref_dir")
        p.add_argument("--procs", type=int, default=1)
    p = sub.add_parser("optim")
    p.add_argument("dcp_dir")
    p.add_argument("step", type=float)
    p.add_argument("lr", type=float)
    args = parser.parse_args()
    return {"load": load, "save": save, "save-rank": save_rank, "optim": optim}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
