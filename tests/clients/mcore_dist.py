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

  optim-load DIR TP PP LEGACY [tweaked]
                          as load, with Megatron-Core's own optimizer: GPTModel in bf16 and
                          get_megatron_optimizer (Adam, bf16: Float16OptimizerWithFloat16Params
                          over torch AdamW, fp32 masters), loaded the way Megatron-LM loads a
                          torch_dist checkpoint: dist_checkpointing.load of {"model": model's,
                          "optimizer": optimizer.sharded_state_dict(model's, is_loading=True)},
                          then model.load_state_dict and optimizer.load_state_dict. The
                          reference is the same model and optimizer loaded from LEGACY's rank
                          file by Megatron-LM's legacy path (model.load_state_dict(sd["model"]),
                          optimizer.load_state_dict(sd["optimizer"])): every parameter, every
                          optimizer state (exp_avg, exp_avg_sq, step), fp32 master and group
                          setting must be equal, bit for bit; with "tweaked", to the reference
                          as tweak() changed it. Prints "OPTIM-LOAD OK".
  optim-save DIR TP PP LEGACY ITER
                          model and optimizer loaded from LEGACY by the legacy path and changed
                          by tweak() (an Adam step and group settings no default has), saved as
                          Megatron-LM saves torch_dist ({"model", "optimizer", "iteration",
                          "checkpoint_version"}) into DIR/iter_ITER/, then the tracker.
                          Prints "OPTIM-SAVE OK".
  optim-save-rank DIR LEGACY ITER
                          one rank of that save at tp=WORLD_SIZE (RANK, WORLD_SIZE, MASTER_ADDR,
                          MASTER_PORT from the environment: a job whose ranks run on several
                          hosts, each saving into its own host's mount, each making DIR/iter_ITER/
                          there; rank 0 writes the tracker). Prints "OPTIM-SAVE-RANK OK".

  distopt-load DIR TP PP DP LEGACY [--ep EP] [--save ITER DUMP]
  distopt-load-moe DIR TP PP DP LEGACY [--ep EP] [--save ITER DUMP]
                          Megatron-Core's DistributedOptimizer (--use-distributed-optimizer: the bf16
                          model in DDP with fp32 gradient buffers, one bucket) of TP*PP*DP gloo ranks
                          loads DIR's dp_reshardable form as Megatron-LM does (its metadata:
                          distrib_optim_sharding_type dp_reshardable); each rank's fp32 masters and
                          moments (its shard of the buffer), steps and group settings must equal, bit
                          for bit, the matching range of the state the legacy path loads from LEGACY
                          (zero=0 rank files of the same tp and pp) into the non-distributed optimizer,
                          and the model its parameters; then the optimizer steps (finite). Prints
                          "DISTOPT-LOAD OK". With --save: then saves model and optimizer as Megatron-LM
                          does (dp_reshardable) into DIR/iter_ITER/ and writes the tracker, whose close
                          must succeed (ptcfs commits the save), and each rank writes what it saved
                          (distopt_dump) to DUMP/rank-R.pt: prints "DISTOPT-SAVE OK".
                          distopt-load-moe: the same with mcore_moe.py's model at ep EP (default 1: its
                          routed experts ordinary parameters of the one buffer; at ep > 1 Megatron-Core's
                          ChainedOptimizer of the dense and the expert-parallel DistributedOptimizer, the
                          experts' buffers cut over edp, compared optimizer by optimizer).
  distopt-check DIR TP PP DP DUMP [--moe] [--ep EP]
                          the DistributedOptimizer of TP*PP*DP ranks (mcore_moe.py's model with --moe)
                          loads DIR's dp_reshardable form as distopt-load does; every range of every
                          parameter's master and moments it holds must equal, bit for bit, what the
                          saving ranks of DUMP held there (the same tp, any pp, dp and ep: parameters
                          matched by their global names), every element of it saved once, and its groups'
                          step and settings theirs. Prints "DISTOPT-CHECK OK".

CPU shims as mcore_gpt.py's, torch.cuda.synchronize is a no-op, and the save's results queue
is in-process (below, saver). Megatron-Core's mixed-precision optimizer is CUDA-only in two
places, shimmed while it is built (cpu_optimizer): a `torch.tensor(..., device="cuda")` is made
on the CPU, and a parameter's `type()` reads as its CUDA type (`torch.cuda.BFloat16Tensor`).
"""
import contextlib
import os
import pathlib
import queue
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import mcore_gpt  # noqa: E402
import ranks  # noqa: E402 (how the gloo ranks start: forked)


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


def init(rank, world, port):
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None


@contextlib.contextmanager
def optimizer_shims():
    """The two CUDA-only places of Megatron-Core's optimizers, on the CPU while they are built (above)."""
    tensor, type_ = torch.tensor, torch.Tensor.type
    torch.tensor = lambda *a, device=None, **k: tensor(*a, device="cpu" if device == "cuda" else device, **k)
    torch.Tensor.type = lambda self, *a, **k: type_(self, *a, **k) if a or k else type_(self).replace("torch.", "torch.cuda.", 1)
    try:
        yield
    finally:
        torch.tensor, torch.Tensor.type = tensor, type_


def cpu_optimizer(model):
    """Megatron-Core's optimizer for `model` (bf16, Adam), built on the CPU (the shims above)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    with optimizer_shims():
        model.ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=False)
        config = OptimizerConfig(optimizer="adam", lr=1e-3, min_lr=0.0, weight_decay=0.1, bf16=True,
                                 params_dtype=torch.bfloat16)
        return get_megatron_optimizer(config, [model])


def bf16_model(tp, pp):
    model = mcore_gpt.build(tp, pp).to(torch.bfloat16)
    model.config.bf16 = True
    return model, cpu_optimizer(model)


def legacy_load(model, optimizer, legacy, tp_rank, pp_rank, pp):
    """Megatron-LM's load of a legacy rank file: the model's, then the optimizer's state dict."""
    sd = torch.load(mcore_gpt.rank_file(legacy, latest(legacy), tp_rank, pp_rank, pp), weights_only=False)
    model.load_state_dict({k: v for k, v in sd["model"].items() if not k.endswith("_extra_state")}, strict=False)
    optimizer.load_state_dict(sd["optimizer"])


def same(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    return a == b


def tweak(optimizer):
    """A step and settings that neither torch's defaults nor a render from the iteration give
    (in every optimizer of a chain: the expert-parallel groups with an lr of their own)."""
    for chained in optimizer.chained_optimizers:
        inner = chained.optimizer
        for state in inner.state.values():
            state["step"] = torch.tensor(1234.0)
        for group in inner.param_groups:
            group["lr"] = 1.5e-4 if group.get("is_expert_parallel") else 2.5e-4
            group["betas"] = (0.85, 0.97)
            group["weight_decay"] = 0.05 if group.get("wd_mult", 1.0) != 0.0 else 0.0


def optim_differences(model, optimizer, ref_model, ref_optimizer):
    """What differs between two (model, Megatron optimizer) pairs: parameters, Adam states, masters, groups
    (of every optimizer of a ChainedOptimizer: Megatron-Core's dense and expert-parallel ones)."""
    bad = [f"parameter {n}" for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters())
           if not same(p.detach(), q.detach())]
    chains, refs = optimizer.chained_optimizers, ref_optimizer.chained_optimizers
    if len(chains) != len(refs):
        return bad + [f"{len(chains)} chained optimizers, want {len(refs)}"]
    for c, (inner, ref) in enumerate(zip(chains, refs)):
        at = f"optimizer {c} " if len(chains) > 1 else ""
        got, want = inner.optimizer.state_dict(), ref.optimizer.state_dict()
        if sorted(got["state"]) != sorted(want["state"]) or not want["state"]:
            bad.append(f"{at}state numbering {sorted(got['state'])[:4]} != {sorted(want['state'])[:4]}")
        for k in want["state"]:
            for kind in ("exp_avg", "exp_avg_sq", "step"):
                if not same(got["state"].get(k, {}).get(kind), want["state"][k].get(kind)):
                    bad.append(f"{at}state {k} {kind}")
        for g, (x, y) in enumerate(zip(got["param_groups"], want["param_groups"])):
            for key in sorted(set(x) | set(y)):
                if x.get(key) != y.get(key):
                    bad.append(f"{at}group {g} {key}: {x.get(key)} != {y.get(key)}")
        for i, (x, y) in enumerate(zip([m for g in inner.fp32_from_float16_groups for m in g],
                                       [m for g in ref.fp32_from_float16_groups for m in g])):
            if not same(x.detach(), y.detach()):
                bad.append(f"{at}fp32 master {i}")
    return bad


def optim_loader(rank, world, port, tp, pp, root, legacy, errors, tweaked):
    init(rank, world, port)
    from megatron.core import dist_checkpointing, parallel_state
    model, optimizer = bf16_model(tp, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ckpt = pathlib.Path(root) / f"iter_{latest(root):07d}"
    model_sd = model.sharded_state_dict()
    sharded = {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True)}
    loaded = dist_checkpointing.load(sharded, str(ckpt))
    model.load_state_dict({k: v for k, v in loaded["model"].items() if not k.endswith("_extra_state")}, strict=False)
    optimizer.load_state_dict(loaded["optimizer"])
    parallel_state.destroy_model_parallel()
    ref_model, ref_optimizer = bf16_model(tp, pp)
    legacy_load(ref_model, ref_optimizer, legacy, tp_rank, pp_rank, pp)
    if tweaked:
        tweak(ref_optimizer)
    bad = optim_differences(model, optimizer, ref_model, ref_optimizer)
    if bad:
        errors.put(f"rank {rank} (tp {tp_rank}, pp {pp_rank}): {len(bad)} differ: {bad[:6]}")
    dist.barrier()
    dist.destroy_process_group()


def save_with_optimizer(rank, model, optimizer, root, iteration, make_dir):
    """Model and optimizer saved as Megatron-LM saves torch_dist: ROOT/iter_ITER/ (made by this
    rank when make_dir), every rank's shards, then rank 0's tracker."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    filesystem_async._results_queue = queue.Queue()  # as in saver
    ckpt = pathlib.Path(root) / f"iter_{iteration:07d}"
    if make_dir:
        ckpt.mkdir()
    dist.barrier()
    model_sd = model.sharded_state_dict()
    state = {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd), "iteration": iteration,
             "checkpoint_version": 3.0}
    dist_checkpointing.save(state, str(ckpt))
    dist.barrier()
    if rank == 0:
        (pathlib.Path(root) / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    dist.barrier()


def optim_saver(rank, world, port, tp, pp, root, legacy, iteration):
    init(rank, world, port)
    from megatron.core import parallel_state
    model, optimizer = bf16_model(tp, pp)
    legacy_load(model, optimizer, legacy, parallel_state.get_tensor_model_parallel_rank(),
                parallel_state.get_pipeline_model_parallel_rank(), pp)
    tweak(optimizer)
    # port None: each rank on its own host's mount
    save_with_optimizer(rank, model, optimizer, root, iteration, make_dir=rank == 0 or port is None)
    dist.destroy_process_group()


def dist_optimizer(model):
    """Megatron-Core's DistributedOptimizer over `model` wrapped in its DDP (bf16 parameters, fp32
    gradient buffers, one bucket: Megatron-LM's defaults), built on the CPU (cpu_optimizer's shims)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    with optimizer_shims():
        ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(
            use_distributed_optimizer=True, grad_reduce_in_fp32=True), model)
        config = OptimizerConfig(optimizer="adam", lr=1e-3, min_lr=0.0, weight_decay=0.1, bf16=True,
                                 params_dtype=torch.bfloat16, use_distributed_optimizer=True)
        return ddp, get_megatron_optimizer(config, [ddp])


DIST_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
                 "chained_optim_avoid_prefix": True}  # Megatron-LM 0.16's get_sharded_sd_metadata


def dist_shard_differences(model, ref_model, dist_opt, ref):
    """What differs between one DistributedOptimizer's shard of the state and the same range of the
    matching non-distributed optimizer's (masters, moments, steps, group settings)."""
    bad = []
    ref_index = {p: (g, i) for g, group in enumerate(ref.float16_groups) for i, p in enumerate(group)}
    names = {p: n for n, p in model.named_parameters()}
    ref_params = dict(ref_model.named_parameters())
    checked = 0
    for gbuf in dist_opt.gbuf_ranges:
        for ranges in gbuf.values():
            for bucket in ranges:
                for param, where in bucket["param_map"].items():
                    lo, hi = where["param"].start, where["param"].end
                    g, i = ref_index[ref_params[names[param]]]
                    master = ref.fp32_from_float16_groups[g][i]
                    want = {"param": master, **ref.optimizer.state[master]}
                    got = dist_opt._get_main_param_and_optimizer_states(param)
                    for kind in ("param", "exp_avg", "exp_avg_sq"):
                        if not same(got[kind].detach(), want[kind].detach().reshape(-1)[lo:hi]):
                            bad.append(f"{names[param]} {kind} [{lo}:{hi}]")
                    checked += 1
    if checked == 0:
        bad.append("no parameter range on this rank")
    # The step: each group's, as the load read it from the checkpoint's groups. (With torch's AdamW,
    # megatron-core 0.16.1's dp_reshardable load then copies each parameter's pre-load step over
    # the state's: Megatron-LM's GPU optimizers, TE's and Apex's FusedAdam, keep it in the groups.)
    steps = {float(st["step"]) for st in ref.optimizer.state.values()}
    for g, (x, y) in enumerate(zip(dist_opt.optimizer.param_groups, ref.optimizer.param_groups)):
        if steps != {float(x.get("step", "nan"))}:
            bad.append(f"group {g} step {x.get('step')} != {steps}")
        for key in sorted((set(x) | set(y)) - {"params", "step"}):
            if x.get(key) != y.get(key):
                bad.append(f"group {g} {key}: {x.get(key)} != {y.get(key)}")
    return bad


def dist_differences(model, optimizer, ref_model, ref_optimizer):
    """What differs between a DistributedOptimizer's shard of the state and the same range of a
    non-distributed optimizer's (masters, moments, steps, group settings), and between the models."""
    bad = [f"parameter {n}" for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters())
           if not same(p.detach(), q.detach())]
    if len(optimizer.chained_optimizers) != len(ref_optimizer.chained_optimizers):
        return bad + ["optimizers: a chain of another length"]
    for c, (dist_opt, ref) in enumerate(zip(optimizer.chained_optimizers, ref_optimizer.chained_optimizers)):
        bad += [f"optimizer {c}: {b}" for b in dist_shard_differences(model, ref_model, dist_opt, ref)]
    return bad


def distopt_save(rank, model, optimizer, root, iteration, dump, errors):
    """The step's state saved as Megatron-LM saves the distributed optimizer, then the tracker (whose
    close must succeed: ptcfs commits the save), and what this rank saved into DUMP/rank-R.pt."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    filesystem_async._results_queue = queue.Queue()  # as in saver
    ckpt = pathlib.Path(root) / f"iter_{iteration:07d}"
    if rank == 0:
        ckpt.mkdir()
    dist.barrier()
    model_sd = model.sharded_state_dict()
    dist_checkpointing.save({"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, metadata=DIST_METADATA),
                             "iteration": iteration, "checkpoint_version": 3.0}, str(ckpt))
    torch.save(distopt_dump(model, optimizer), pathlib.Path(dump) / f"rank-{rank}.pt")
    dist.barrier()
    if rank == 0:
        try:
            (pathlib.Path(root) / "latest_checkpointed_iteration.txt").write_text(str(iteration))
        except OSError as e:
            errors.put(f"the tracker's close of a distributed optimizer's save failed: {e}")
    dist.barrier()


def global_name(model, name):
    """A parameter's name in the whole model: its stage's layers and its ep rank's experts numbered globally."""
    import re
    from megatron.core import parallel_state
    config = model.config
    layers = parallel_state.get_pipeline_model_parallel_rank() * (
        config.num_layers // parallel_state.get_pipeline_model_parallel_world_size())
    experts = parallel_state.get_expert_model_parallel_rank() * (
        (config.num_moe_experts or 0) // parallel_state.get_expert_model_parallel_world_size())
    name = re.sub(r"^decoder\.layers\.(\d+)\.", lambda m: f"decoder.layers.{int(m.group(1)) + layers}.", name)
    return re.sub(r"\.local_experts\.(\d+)\.", lambda m: f".local_experts.{int(m.group(1)) + experts}.", name)


def distopt_ranges(model, optimizer):
    """(global name, tp rank, [lo, hi) of the parameter's flat elements, its master and moments there) of every
    range this rank's DistributedOptimizers hold."""
    from megatron.core import parallel_state
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    names = {p: n for n, p in model.named_parameters()}
    for dist_opt in optimizer.chained_optimizers:
        for gbuf in dist_opt.gbuf_ranges:
            for ranges in gbuf.values():
                for bucket in ranges:
                    for param, where in bucket["param_map"].items():
                        states = dist_opt._get_main_param_and_optimizer_states(param)
                        yield (global_name(model, names[param]), tp_rank, where["param"].start, where["param"].end,
                               {k: states[k].detach().clone() for k in ("param", "exp_avg", "exp_avg_sq")})


def distopt_groups(optimizer):
    """Each optimizer's groups as its state_dict saves them (without params)."""
    return [[{k: v for k, v in g.items() if k != "params"} for g in o.optimizer.param_groups]
            for o in optimizer.chained_optimizers]


def distopt_dump(model, optimizer):
    steps = {float(g["step"]) for o in optimizer.chained_optimizers
             for g in o.state_dict()["optimizer"]["param_groups"]}
    return {"ranges": list(distopt_ranges(model, optimizer)), "steps": sorted(steps),
            "groups": distopt_groups(optimizer)}


def distopt_checker(rank, world, port, tp, pp, root, dump, errors, moe, ep):
    init(rank, world, port)
    from megatron.core import parallel_state
    make_model, _ = distopt_builders(moe, ep)
    model, _ = make_model(tp, pp)
    _, optimizer = dist_optimizer(model)
    distopt_load(model, optimizer, root)
    saved = {}  # (name, tp rank) -> [(lo, hi, states)]
    steps, groups = set(), None
    for f in sorted(pathlib.Path(dump).glob("rank-*.pt")):
        d = torch.load(f, weights_only=False)
        steps.update(d["steps"])
        groups = groups or d["groups"]
        for name, tp_rank, lo, hi, states in d["ranges"]:
            saved.setdefault((name, tp_rank), []).append((lo, hi, states))
    bad = [] if len(steps) == 1 else [f"the saving ranks' steps {sorted(steps)}"]
    checked = 0
    for name, tp_rank, lo, hi, states in distopt_ranges(model, optimizer):
        held = 0
        for slo, shi, sstates in saved.get((name, tp_rank), []):
            a, b = max(lo, slo), min(hi, shi)
            if a >= b:
                continue
            held += b - a
            for kind in ("param", "exp_avg", "exp_avg_sq"):
                if not same(states[kind][a - lo:b - lo], sstates[kind][a - slo:b - slo]):
                    bad.append(f"{name} (tp {tp_rank}) {kind} [{a}:{b}]")
        if held != hi - lo:
            bad.append(f"{name} (tp {tp_rank}) [{lo}:{hi}]: the saving ranks held {held} of its {hi - lo} elements")
        checked += 1
    if checked == 0:
        bad.append("no parameter range on this rank")
    got = distopt_groups(optimizer)
    for c, (mine, theirs) in enumerate(zip(got, groups or [])):
        for g, (x, y) in enumerate(zip(mine, theirs)):
            if steps and float(x.get("step", "nan")) != min(steps):
                bad.append(f"optimizer {c} group {g} step {x.get('step')} != {sorted(steps)}")
            for key in sorted((set(x) | set(y)) - {"step"}):
                if x.get(key) != y.get(key):
                    bad.append(f"optimizer {c} group {g} {key}: {x.get(key)} != {y.get(key)}")
    if bad:
        tp_rank, pp_rank = parallel_state_ranks()
        errors.put(f"rank {rank} (tp {tp_rank}, pp {pp_rank}): {len(bad)} differ: {bad[:6]}")
    dist.barrier()
    dist.destroy_process_group()


def distopt_load(model, optimizer, root):
    """Megatron-LM's load of the dp_reshardable form in ROOT (the tracker's iteration) into the model and its
    DistributedOptimizer."""
    from megatron.core import dist_checkpointing
    # Megatron-LM's load makes the optimizer's state before asking for it (sharded_state_dict(is_loading)
    # reads the groups' steps): DistributedOptimizer's own dummy state.
    for inner in optimizer.chained_optimizers:
        inner._init_optimizer_states_with_dummy_values()
    model_sd = model.sharded_state_dict()
    sharded = {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True,
                                                                            metadata=DIST_METADATA)}
    loaded = dist_checkpointing.load(sharded, str(pathlib.Path(root) / f"iter_{latest(root):07d}"))
    model.load_state_dict({k: v for k, v in loaded["model"].items() if not k.endswith("_extra_state")}, strict=False)
    optimizer.load_state_dict(loaded["optimizer"])


def distopt_builders(moe, ep):
    """The bf16 model and optimizer of a grid, and the legacy path's load into them: mcore_gpt.py's
    model, or mcore_moe.py's at ep `ep`."""
    if not moe:
        return bf16_model, lambda m, o, legacy, tp, pp: legacy_load(
            m, o, legacy, parallel_state_ranks()[0], parallel_state_ranks()[1], pp)
    import mcore_moe
    return (lambda tp, pp: mcore_moe.bf16_moe(tp, ep, pp),
            lambda m, o, legacy, tp, pp: mcore_moe.legacy_optim_load(m, o, legacy, tp, ep, pp))


def parallel_state_ranks():
    from megatron.core import parallel_state
    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()


def distopt_loader(rank, world, port, tp, pp, root, legacy, errors, save, moe=False, ep=1):
    init(rank, world, port)
    from megatron.core import parallel_state
    make_model, load_legacy = distopt_builders(moe, ep)
    model, _ = make_model(tp, pp)
    ddp, optimizer = dist_optimizer(model)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    distopt_load(model, optimizer, root)
    parallel_state.destroy_model_parallel()
    ref_model, ref_optimizer = make_model(tp, pp)
    load_legacy(ref_model, ref_optimizer, legacy, tp, pp)
    bad = dist_differences(model, optimizer, ref_model, ref_optimizer)
    if not bad:
        import mcore_moe
        mcore_moe.step_with_grads(ddp, optimizer)
        bad = [n for n, p in model.named_parameters() if not torch.isfinite(p.float()).all()]
    if save is not None:
        # One Adam step in every state of the chain, as Megatron-Core's GPU optimizers (TE's, Apex's FusedAdam)
        # keep it in their groups: on the CPU (torch's AdamW) megatron-core 0.16.1's load leaves each parameter's
        # pre-load step, so the chain's two optimizers would save different steps, which ptcfs refuses.
        for o in optimizer.chained_optimizers:
            for state in o.optimizer.state.values():
                state["step"] = torch.tensor(float(save[0]))
        distopt_save(rank, model, optimizer, root, save[0], save[1], errors)
    if bad:
        errors.put(f"rank {rank} (tp {tp_rank}, pp {pp_rank}): {len(bad)} differ: {bad[:6]}")
    dist.barrier()
    dist.destroy_process_group()


def main():
    if sys.argv[1] == "optim-save-rank":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        optim_saver(rank, world, None, world, 1, sys.argv[2], sys.argv[3], int(sys.argv[4]))
        print(f"OPTIM-SAVE-RANK OK: rank {rank} of {world}")
        return 0
    if sys.argv[1] in ("distopt-load", "distopt-load-moe", "distopt-check"):
        return distopt_main(sys.argv[1], sys.argv[2:])
    cmd, root, tp, pp, legacy = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    assert cmd in ("load", "save", "optim-load", "optim-save"), __doc__
    if cmd in ("save", "optim-save"):
        fn = saver if cmd == "save" else optim_saver
        ranks.start(fn, (tp * pp, ranks.free_port(), tp, pp, root, legacy, int(sys.argv[6])), tp * pp,
                    preload=ranks.MEGATRON)
        print(f"{cmd.upper()} OK: tp={tp} pp={pp}")
        return 0
    extra = (sys.argv[6:] == ["tweaked"],) if cmd == "optim-load" else ()
    if ranks_failed(worker if cmd == "load" else optim_loader, tp * pp,
                    lambda errors: (tp * pp, ranks.free_port(), tp, pp, root, legacy, errors) + extra):
        return 1
    print(f"{cmd.upper()} OK: tp={tp} pp={pp}")
    return 0


def ranks_failed(fn, world, make_args):
    """fn(rank, *make_args(errors)) in WORLD forked ranks; prints and returns what they put in errors."""
    errors = ranks.queue()
    ranks.start(fn, make_args(errors), world, preload=ranks.MEGATRON)
    failed = []
    while not errors.empty():
        failed.append(errors.get())
    if failed:
        print("\n".join(failed))
    return failed


def distopt_main(cmd, argv):
    import argparse
    parser = argparse.ArgumentParser(prog=f"mcore_dist.py {cmd}")
    for name in ("root", "tp", "pp", "dp", "source"):
        parser.add_argument(name, type=int if name in ("tp", "pp", "dp") else str)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--moe", action="store_true")
    parser.add_argument("--save", nargs=2, metavar=("ITER", "DUMP"))
    a = parser.parse_args(argv)
    moe = a.moe or cmd == "distopt-load-moe"
    world = a.tp * a.pp * a.dp
    if cmd == "distopt-check":
        fn, args = distopt_checker, lambda errors: (world, ranks.free_port(), a.tp, a.pp, a.root, a.source, errors,
                                                    moe, a.ep)
    else:
        save = (int(a.save[0]), a.save[1]) if a.save else None
        if save:
            pathlib.Path(save[1]).mkdir(parents=True, exist_ok=True)
        fn, args = distopt_loader, lambda errors: (world, ranks.free_port(), a.tp, a.pp, a.root, a.source, errors,
                                                   save, moe, a.ep)
    if ranks_failed(fn, world, args):
        return 1
    grid = f"tp={a.tp} pp={a.pp} dp={a.dp} ep={a.ep}"
    print(f"DISTOPT-CHECK OK: {grid}" if cmd == "distopt-check" else f"DISTOPT-LOAD OK: {grid}")
    if a.save:
        print(f"DISTOPT-SAVE OK: iteration {a.save[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
