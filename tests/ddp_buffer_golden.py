#!/usr/bin/env python3
"""Writes tests/data/ddp_buffer_golden.json: megatron-core's own gradient-buffer layouts under its
distributed optimizer, against which ddp_buffer_test checks ptc::megatron::LayOutDdpBuffer and
DdpRankPieces (ptc/checkpoint/megatron/ddp_buffer.h).

For each case, `dp` gloo processes on the CPU wrap a module of parameters of SIZES (registration
order; `shared`: the index of one marked shared_embedding, -1 none) in Megatron-Core's
DistributedDataParallel (use_distributed_optimizer, bucket_size `bucket` with overlap_grad_reduce,
or one bucket), build its DistributedOptimizer (Adam, states initialised by its own
_init_optimizer_states_with_dummy_values) and record:
  params   the buffer's param_index_map in its order: [registration index, start, end, bucket]
  buckets  [offset, padded numel, numel_unpadded] of each bucket
  ranks    per dp rank, the ShardedTensors sharded_state_dict writes with
           distrib_optim_sharding_type dp_reshardable: [bucket, offset, size, padding]
           (exp_avg's; param and exp_avg_sq have the same), or the error it raises.

CPU shims, as tests/clients/mcore_dist.py's: torch.cuda.current_device() answers "cpu", a
torch.tensor(device="cuda") is made on the CPU, a parameter's type() reads as its CUDA type.

  /work/main/.venv/bin/python tests/ddp_buffer_golden.py > tests/data/ddp_buffer_golden.json
"""
import json
import os
import socket
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [(10, 7), (100,), (3, 5), (64,), (1000,), (129,), (2, 2)]
# (dp, bucket size or None, shared_embedding index or -1, pad_buckets_for_high_nccl_busbw)
CASES = [
    (1, None, -1, False),
    (2, None, -1, False),
    (3, None, -1, False),
    (4, None, -1, False),
    (2, 300, -1, False),
    (3, 200, -1, False),
    (1, 500, 2, False),
    (2, 500, 2, False),
    (2, None, -1, True),
]


def run(rank, world, port, bucket, shared, busbw, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel()
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)

    class Params(MegatronModule):
        def __init__(self):
            super().__init__(config)
            for i, shape in enumerate(SIZES):
                p = torch.nn.Parameter(torch.zeros(shape))
                if i == shared:
                    p.shared_embedding = True
                self.register_parameter(f"p{i}", p)

    module = Params()
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=bucket is not None,
                                               bucket_size=bucket, pad_buckets_for_high_nccl_busbw=busbw)
    ddp = DistributedDataParallel(config, ddp_config, module)
    index = {p: i for i, p in enumerate(module.parameters())}
    buf = ddp.buffers[0]
    layout = {"params": [[index[p], s, e, b] for p, (s, e, b) in buf.param_index_map.items()],
              "buckets": [[b.offset, b.grad_data.numel(), b.numel_unpadded] for b in buf.buckets]}
    tensor, type_ = torch.tensor, torch.Tensor.type
    torch.tensor = lambda *a, device=None, **k: tensor(*a, device="cpu" if device == "cuda" else device, **k)
    torch.Tensor.type = lambda self, *a, **k: type_(self, *a, **k) if a or k else type_(self).replace("torch.", "torch.cuda.", 1)
    try:
        optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True), [ddp])
    finally:
        torch.tensor, torch.Tensor.type = tensor, type_
    inner = optimizer.chained_optimizers[0]
    inner._init_optimizer_states_with_dummy_values()
    try:
        state = inner.sharded_state_dict({}, metadata={"distrib_optim_sharding_type": "dp_reshardable"})["param_state"]
        pieces = []
        for b, bucket_state in enumerate(next(iter(state[0].values()))):
            for t in bucket_state:
                pieces.append([b, t["exp_avg"].global_offset[0], t["exp_avg"].local_shape[0], bool(t["padding"].obj)])
    except AssertionError as e:
        pieces = f"AssertionError: {e}"
    q.put((rank, layout, pieces))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ctx = mp.get_context("spawn")
    cases = []
    for dp, bucket, shared, busbw in CASES:
        q = ctx.SimpleQueue()
        mp.start_processes(run, args=(dp, free_port(), bucket, shared, busbw, q), nprocs=dp, start_method="spawn")
        got = sorted(q.get() for _ in range(dp))
        cases.append({"sizes": [int(torch.Size(s).numel()) for s in SIZES], "dp": dp, "bucket_size": bucket or 0,
                      "shared": shared, "pad_for_high_nccl_busbw": busbw, **got[0][1],
                      "ranks": [pieces for _, _, pieces in got]})
    json.dump({"megatron_core": __import__("megatron.core").core.__version__, "cases": cases}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
