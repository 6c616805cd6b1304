#!/usr/bin/env python3
"""Megatron-Core's dist_checkpointing against a mount's megatron/ in torch_dist format.

  load DIR TP PP LEGACY   TP*PP gloo processes; each builds GPTModel (local spec, float64, as
                          mcore_gpt.py) in its (tp, pp) rank and loads its sharded state dict
                          with megatron.core.dist_checkpointing.load from DIR (the iteration
                          the tracker names); every parameter must equal, bit for bit, the
                          one the legacy tree LEGACY (mp_rank_* files of the same tp and pp)
                          holds under the same name. Prints "LOAD OK".
  save DIR TP PP LEGACY ITER
                          TP*PP gloo processes build the model, load LEGACY's rank files into
                          it (its weights) and save it with dist_checkpointing.save into
                          DIR/iter_ITER/ (torch_dist, made empty first), then rank 0 writes
                          DIR/latest_checkpointed_iteration.txt, as Megatron saves. Prints
                          "SAVE OK".

CPU shims as mcore_gpt.py's, torch.cuda.synchronize is a no-op, and the save's results queue
is in-process (below, saver).
"""
import os
import pathlib
import queue
import socket
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import mcore_gpt  # noqa: E402


def latest(root):
    root = pathlib.Path(root)
    return int((root / "latest_checkpointed_iteration.txt").read_text())


def worker(rank, world, port, tp, pp, root, legacy, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    from megatron.core import dist_checkpointing, parallel_state
    model = mcore_gpt.build(tp, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    iteration = latest(root)
    ckpt = pathlib.Path(root) / f"iter_{iteration:07d}"
    loaded = dist_checkpointing.load(model.sharded_state_dict(), str(ckpt))
    model.load_state_dict({k: v for k, v in loaded.items() if not k.endswith("_extra_state")}, strict=False)
    ref = torch.load(mcore_gpt.rank_file(legacy, latest(legacy), tp_rank, pp_rank, pp), weights_only=False)["model"]
    bad = []
    names = [n for n, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        want = ref.get(name)
        if want is None or want.shape != p.shape or not torch.equal(want.view(torch.int64), p.detach().view(torch.int64)):
            bad.append(name)
    if bad:
        errors.put(f"rank {rank} (tp {tp_rank}, pp {pp_rank}): {len(bad)} of {len(names)} parameters differ: {bad[:4]}")
    dist.barrier()
    dist.destroy_process_group()


def saver(rank, world, port, tp, pp, root, legacy, iteration):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    # Megatron-Core collects its writers' results through a queue of a spawned Manager process
    # that outlives the save (and holds the caller's stdout); the save runs synchronously here,
    # so an in-process queue serves.
    filesystem_async._results_queue = queue.Queue()
    model = mcore_gpt.build(tp, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ref = torch.load(mcore_gpt.rank_file(legacy, latest(legacy), tp_rank, pp_rank, pp), weights_only=False)["model"]
    model.load_state_dict({k: v for k, v in ref.items() if not k.endswith("_extra_state")}, strict=False)
    ckpt = pathlib.Path(root) / f"iter_{iteration:07d}"
    if rank == 0:
        ckpt.mkdir()
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(ckpt))
    dist.barrier()
    if rank == 0:
        (pathlib.Path(root) / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    cmd, root, tp, pp, legacy = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    assert cmd in ("load", "save"), __doc__
    if cmd == "save":
        mp.start_processes(saver, args=(tp * pp, free_port(), tp, pp, root, legacy, int(sys.argv[6])), nprocs=tp * pp,
                           start_method="spawn")
        print(f"SAVE OK: tp={tp} pp={pp}")
        return 0
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(worker, args=(tp * pp, free_port(), tp, pp, root, legacy, errors), nprocs=tp * pp,
                       start_method="spawn")
    failed = []
    while not errors.empty():
        failed.append(errors.get())
    if failed:
        print("\n".join(failed))
        return 1
    print(f"LOAD OK: tp={tp} pp={pp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
