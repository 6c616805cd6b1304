#!/usr/bin/env python3
"""Megatron-Core's GPTModel with mixture-of-experts layers, on CPU, against a mount's megatron/ tree.

The built-in llama schema with experts (every layer an MoELayer: router, 4 routed experts
(SequentialMLP: local_experts.K.linear_fc1/linear_fc2), a shared expert), rendered in the
local spec's names (`--names local`). Each rank reads the file Megatron names for it,
iter_N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt (_EEE: its expert-parallel rank, when ep > 1).

  run DIR TP EP PP OUT [--expert-bias]
                          TP*EP*PP gloo processes (dp = EP: Megatron-Core's expert grid puts ep
                          rank r at dp rank r); each builds GPTModel (local MoE spec, float64,
                          the allgather token dispatcher, top-2 routing), loads its rank file's
                          model strict=True (missing _extra_state entries filled from the model),
                          checks the file's parameters are named_parameters() in order, checks the
                          optimizer state against Megatron-Core's own parameter groups
                          (_get_param_groups: with ep > 1 the experts' parameters are expert-parallel
                          and the state is ChainedOptimizer's list [dense, experts], each numbered
                          from 0; at ep = 1 one optimizer), loads it into torch Adam (one per
                          optimizer), writes the logits of a fixed batch (gathered over tp, float64)
                          to OUT/logits.pt, takes an Adam step (finite; the dense gradients averaged
                          over the data-parallel group, as Megatron's DDP), and with --save ITER saves
                          as Megatron does: the expert-data-parallel rank 0 of each (tp, pp, ep)
                          torch.saves model and optimizer state into DIR/iter_ITER/ (args naming
                          the grid), a copy to OUT/saved-TP-PP-EP.pt, then DIR/latest_checkpointed_iteration.txt;
                          --expert-bias: the router with moe_router_enable_expert_bias (sigmoid scores), whose
                          TopKRouter.expert_bias is a persistent buffer: in the file's model dict (loaded strict),
                          in no optimizer (its state numbers exactly _get_param_groups' parameters, key for key)
  compare A B             two logits files equal within 1e-12 (the experts' outputs are summed
                          in another order when the tokens travel between ep ranks)
  dist-load DIR TP EP PP LEGACY [--te-norm-keys]
                          TP*EP*PP gloo processes build the model and load its sharded state dict with
                          megatron.core.dist_checkpointing.load from DIR (torch_dist, the iteration the
                          tracker names: the experts under decoder.layers.mlp.experts.experts.*, stacked
                          over layers and global experts); every parameter must equal, bit for bit, the
                          one the legacy tree LEGACY (the same tp, ep, pp) holds under the same name;
                          --te-norm-keys: the MoE layers' norm keyed as the TE spec keys it
                          (decoder.layers.pre_mlp_layernorm.weight, te_norm_keys)
  dist-save DIR TP EP PP LEGACY ITER [--te-norm-keys]
                          TP*EP*PP gloo processes build the model, load LEGACY's rank files (the same
                          grid) into it and save it with dist_checkpointing.save into DIR/iter_ITER/
                          (torch_dist), then rank 0 writes DIR/latest_checkpointed_iteration.txt
  merged DIR EP OUT       DIR's rank files at ep=1 (the latest iteration, tp=1, pp=1) hold what the
                          save at ep=EP wrote (OUT/saved-0-0-R.pt): every parameter bit for bit,
                          local expert K of ep rank R as expert R*E/EP+K, and every parameter's
                          Adam moments and fp32 master (found by Megatron's numbering in each file)

  optim-load DIR TP EP PP LEGACY [tweaked]
                          as dist-load with Megatron-Core's own optimizer (bf16, mcore_dist.py's:
                          a ChainedOptimizer of the dense and the expert-parallel optimizer at ep > 1,
                          their torch_dist keys chained_0. / chained_1.), loaded as Megatron-LM loads
                          torch_dist (dist_checkpointing.load of the model's and the optimizer's sharded
                          state dicts, then load_state_dict): every parameter, Adam state, step, fp32
                          master and group setting equals the same grid's legacy tree LEGACY loaded by
                          Megatron's legacy path (tweaked: changed by mcore_dist.tweak), and again after
                          one optimizer step of both with the same gradients
  optim-save DIR TP EP PP LEGACY ITER
                          LEGACY's model and optimizer (the same grid) loaded by the legacy path, tweaked,
                          saved as Megatron-LM saves torch_dist into DIR/iter_ITER/, then the tracker

Shims as mcore_gpt.py's (CPU RNG tracker, current_device "cpu"), and megatron-core's router
checks Transformer Engine's te_general_gemm, absent here: None.
Prints "<CMD> OK" and exits 0 on success.
"""
import argparse
import os
import pathlib
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist

from mcore_gpt import _NoFork, same_value  # noqa: E402 (the shim and the comparison, shared)
import ranks  # noqa: E402 (how the gloo ranks start: forked)

DIMS = dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=256, seq=32, experts=4, moe_ffn=32, shared_ffn=32)
TOKENS = 16


EXPERT_BIAS = False  # --expert-bias: the router's aux-loss-free load-balancing bias (a buffer)


def build(tp, ep, pp):
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    import megatron.core.transformer.attention as attention_mod
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not parallel_state.model_parallel_is_initialized():  # a second model of the same grid: its groups
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                 expert_model_parallel_size=ep)
    torch.cuda.current_device = lambda: "cpu"
    shim = _NoFork()
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: shim
    tensor_parallel.random.get_cuda_rng_tracker = lambda *a, **k: shim
    if hasattr(attention_mod, "get_cuda_rng_tracker"):
        attention_mod.get_cuda_rng_tracker = lambda *a, **k: shim
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    config = TransformerConfig(
        num_layers=DIMS["layers"], hidden_size=DIMS["hidden"], num_attention_heads=DIMS["heads"],
        num_query_groups=DIMS["kv_heads"], ffn_hidden_size=4 * DIMS["hidden"], kv_channels=DIMS["hidden"] // DIMS["heads"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float64,
        attention_softmax_in_fp32=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        pipeline_dtype=torch.float64, num_moe_experts=DIMS["experts"], moe_ffn_hidden_size=DIMS["moe_ffn"],
        moe_shared_expert_intermediate_size=DIMS["shared_ffn"], moe_router_topk=2, moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_permute_fusion=False,
        moe_grouped_gemm=False, moe_router_enable_expert_bias=EXPERT_BIAS,
        moe_router_score_function="sigmoid" if EXPERT_BIAS else "softmax")
    spec = get_gpt_layer_local_spec(num_experts=DIMS["experts"], moe_grouped_gemm=False, normalization="RMSNorm")
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=DIMS["vocab"],
                     max_sequence_length=DIMS["seq"], pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(), share_embeddings_and_output_weights=False,
                     position_embedding_type="rope")
    return model.double()


def rank_file(root, iteration, tp_rank, pp_rank, ep_rank, pp, ep):
    """Megatron-LM's get_checkpoint_name."""
    d = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "") + (f"_{ep_rank:03d}" if ep > 1 else "")
    return pathlib.Path(root) / f"iter_{iteration:07d}" / d / "model_optim_rng.pt"


def numbered(model_keys, optimizer_dicts, is_expert):
    """{parameter name: (exp_avg, exp_avg_sq, fp32 master)} of a Megatron state: each optimizer
    numbers its parameters (those `is_expert` gives it, in the model dict's order) in its groups'
    order, Megatron's rule putting 1-D parameters in the group without weight decay."""
    out = {}
    for c, opt in enumerate(optimizer_dicts):
        mine = [k for k in model_keys if is_expert(k, c)]
        groups = opt["optimizer"]["param_groups"]
        decay = [k for k in mine if model_keys[k].dim() > 1]
        none = [k for k in mine if model_keys[k].dim() == 1]
        by_group = [decay, none] if len(groups) == 2 else [decay + none] if len(groups) == 1 else None
        assert by_group is not None, f"optimizer {c}: {len(groups)} groups"
        if len(groups) == 2 and groups[0].get("wd_mult", 1.0) == 0.0:
            by_group.reverse()
        for g, names in zip(groups, by_group):
            assert len(g["params"]) == len(names), (c, len(g["params"]), len(names))
        for gi, (g, names) in enumerate(zip(groups, by_group)):
            for j, (k, name) in enumerate(zip(g["params"], names)):
                state = opt["optimizer"]["state"][k]
                out[name] = (state["exp_avg"], state["exp_avg_sq"], opt["fp32_from_fp16_params"][gi][j])
    return out


def optimizer_dicts(sd):
    o = sd["optimizer"]
    return list(o) if isinstance(o, list) else [o]


def expert_split(ep):
    """is_expert(name, c): with ep > 1 the experts go to optimizer 1, the rest to 0; else all to 0."""
    return (lambda k, c: (".local_experts." in k) == (c == 1)) if ep > 1 else (lambda k, c: c == 0)


def worker(rank, world, tp, ep, pp, root, out, save):
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import megatron.core  # noqa: F401 (its safe globals for a weights_only load)
    from megatron.core import parallel_state
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups

    torch.manual_seed(0)
    model = build(tp, ep, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    iteration = int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())
    sd = torch.load(rank_file(root, iteration, tp_rank, pp_rank, ep_rank, pp, ep), weights_only=False)
    extra = {k: v for k, v in model.state_dict().items() if k.endswith("._extra_state") and k not in sd["model"]}
    model.load_state_dict({**sd["model"], **extra}, strict=True)
    names = [n for n, _ in model.named_parameters()]
    buffers = {k for k in model.state_dict() if k.endswith(".expert_bias")}  # the router's persistent buffers
    assert len(buffers) == (DIMS["layers"] // pp if EXPERT_BIAS else 0), sorted(buffers)
    for k in buffers:  # loaded as the file holds them (Megatron-Core keeps the bias float32: _maintain_float32_expert_bias)
        same_value(model.state_dict()[k], sd["model"][k].to(torch.float32), f"{k}: the loaded buffer")
    in_file = [k for k in sd["model"] if not k.endswith("._extra_state") and k not in buffers]
    assert in_file == names, f"file order {in_file[:4]}... != named_parameters() {names[:4]}..."
    # The optimizer state against Megatron-Core's own groups: with ep > 1 ChainedOptimizer's
    # [dense, expert-parallel], each numbering its parameters from 0.
    groups = _get_param_groups([model], OptimizerConfig(lr=1e-3, min_lr=0.0, weight_decay=0.1), None)
    chains = [[g for g in groups if g["is_expert_parallel"] == bool(c)] for c in range(2)]
    chains = [c for c in chains if c]
    saved = optimizer_dicts(sd)
    assert len(saved) == len(chains) == (2 if ep > 1 else 1), (len(saved), len(chains))
    params = dict(model.named_parameters())
    index = {id(p): n for n, p in params.items()}
    adams = []
    for c, (mine, state) in enumerate(zip(chains, saved)):
        assert [len(g["params"]) for g in state["optimizer"]["param_groups"]] == [len(g["params"]) for g in mine], c
        assert [g["is_expert_parallel"] for g in state["optimizer"]["param_groups"]] == [bool(c)] * len(mine)
        count = sum(len(g["params"]) for g in mine)  # Megatron-Core's parameters, key for key: no buffer among them
        assert sorted(state["optimizer"]["state"]) == list(range(count)), (c, sorted(state["optimizer"]["state"]), count)
        assert sum(len(m) for m in state["fp32_from_fp16_params"]) == count, c
        masters = [m for group in state["fp32_from_fp16_params"] for m in group]
        for k, name in enumerate(index[id(p)] for g in mine for p in g["params"]):
            moments, p = state["optimizer"]["state"][k], params[name]
            for kind in ("exp_avg", "exp_avg_sq"):
                assert moments[kind].shape == p.shape, f"optimizer {c} state {k} {kind} != {name} {tuple(p.shape)}"
            assert torch.equal(masters[k], p.detach().float()), f"{name}: master copy differs from the parameter"
        adam = torch.optim.Adam(mine, lr=1e-3)
        adam.load_state_dict(state["optimizer"])
        adams.append(adam)
    # A fixed batch (the same on every data-parallel rank): logits of the last stage, gathered over tp.
    model.eval()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, DIMS["vocab"], (2, TOKENS), generator=g)
    positions = torch.arange(TOKENS).unsqueeze(0).expand(2, -1)
    mask = torch.triu(torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool), diagonal=1)
    if not parallel_state.is_pipeline_first_stage():
        recv = torch.empty((TOKENS, 2, DIMS["hidden"]), dtype=torch.float64)
        dist.recv(recv, src=parallel_state.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(recv)
    output = model(tokens, positions, mask)
    if not parallel_state.is_pipeline_last_stage():
        dist.send(output.detach().contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
    else:
        parts = [torch.empty_like(output) for _ in range(tp)]
        dist.all_gather(parts, output.detach().contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        if tp_rank == 0 and parallel_state.get_data_parallel_rank() == 0:
            torch.save(torch.cat(parts, dim=-1), pathlib.Path(out) / "logits.pt")
    model.train()
    output.float().pow(2).mean().backward()
    # As Megatron's DDP: the dense parameters' gradients averaged over the data-parallel group
    # (the experts' over the expert-data-parallel group, one rank here), so that replicas agree.
    dp = parallel_state.get_data_parallel_world_size()
    for p in model.parameters():
        if dp > 1 and p.grad is not None and getattr(p, "allreduce", True):
            dist.all_reduce(p.grad, group=parallel_state.get_data_parallel_group())
            p.grad /= dp
    for adam in adams:
        adam.step()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), f"{name}: not finite after an Adam step from the rendered state"
    if save is not None:
        if parallel_state.get_expert_data_parallel_rank() == 0:  # Megatron-LM's legacy save: who writes
            sd["iteration"] = save
            sd["args"] = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                            expert_model_parallel_size=ep, data_parallel_size=world // (tp * pp),
                                            world_size=world)
            sd["model"] = model.state_dict()
            states = []
            for adam in adams:
                state = adam.state_dict()
                for moments in state["state"].values():  # Megatron's Adam runs over the fp32 masters
                    for kind in ("exp_avg", "exp_avg_sq"):
                        moments[kind] = moments[kind].float()
                states.append({"optimizer": state,
                               "fp32_from_fp16_params": [[p.detach().float().clone() for p in g["params"]]
                                                         for g in adam.param_groups]})
            sd["optimizer"] = states if len(states) > 1 else states[0]
            path = rank_file(root, save, tp_rank, pp_rank, ep_rank, pp, ep)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(sd, path)
            torch.save({"model": sd["model"], "optimizer": sd["optimizer"]},
                       pathlib.Path(out) / f"saved-{tp_rank}-{pp_rank}-{ep_rank}.pt")
        dist.barrier()
        if rank == 0:
            (pathlib.Path(root) / "latest_checkpointed_iteration.txt").write_text(str(save))
    dist.barrier()
    dist.destroy_process_group()


def te_norm_keys(sharded):
    """The model's sharded state dict keyed as megatron-core's TE spec keys it: an MoE layer's
    pre_mlp_layernorm is a TENorm module there, which no sharded_state_dict_keys_map renames, so
    its key is decoder.layers.pre_mlp_layernorm.weight where the local spec's map gives
    decoder.layers.mlp.linear_fc1.layer_norm_weight (get_gpt_layer_with_transformer_engine_spec;
    the attention's norm has one key in both)."""
    import dataclasses
    fused = "decoder.layers.mlp.linear_fc1.layer_norm_"
    out = {}
    for name, v in sharded.items():
        if ".pre_mlp_layernorm." in name and getattr(v, "key", "").startswith(fused):
            v = dataclasses.replace(v, key="decoder.layers.pre_mlp_layernorm." + v.key[len(fused):])
        out[name] = v
    assert any(getattr(v, "key", "").startswith("decoder.layers.pre_mlp_layernorm.") for v in out.values())
    return out


def dist_loader(rank, world, tp, ep, pp, root, legacy, te=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    from megatron.core import dist_checkpointing, parallel_state

    model = build(tp, ep, pp)
    iteration = int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())
    sharded = te_norm_keys(model.sharded_state_dict()) if te else model.sharded_state_dict()
    loaded = dist_checkpointing.load(sharded, str(pathlib.Path(root) / f"iter_{iteration:07d}"))
    model.load_state_dict({k: v for k, v in loaded.items() if not k.endswith("_extra_state")}, strict=False)
    ranks = (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank(),
             parallel_state.get_expert_model_parallel_rank())
    ref_iteration = int((pathlib.Path(legacy) / "latest_checkpointed_iteration.txt").read_text())
    ref = torch.load(rank_file(legacy, ref_iteration, *ranks, pp, ep), weights_only=False)["model"]
    def same(name, p):  # bit for bit
        return name in ref and ref[name].shape == p.shape and torch.equal(ref[name].view(torch.int64),
                                                                          p.detach().view(torch.int64))

    bad = [n for n, p in model.named_parameters() if not same(n, p)]
    assert not bad, f"rank {rank} (tp, pp, ep) {ranks}: {len(bad)} parameters differ: {bad[:4]}"
    dist.barrier()
    dist.destroy_process_group()


def dist_saver(rank, world, tp, ep, pp, root, legacy, iteration, te=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    import queue

    filesystem_async._results_queue = queue.Queue()  # the save runs synchronously (as mcore_dist.py's)
    model = build(tp, ep, pp)
    ranks = (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank(),
             parallel_state.get_expert_model_parallel_rank())
    ref_iteration = int((pathlib.Path(legacy) / "latest_checkpointed_iteration.txt").read_text())
    ref = torch.load(rank_file(legacy, ref_iteration, *ranks, pp, ep), weights_only=False)["model"]
    model.load_state_dict({k: v for k, v in ref.items() if not k.endswith("_extra_state")}, strict=False)
    ckpt = pathlib.Path(root) / f"iter_{iteration:07d}"
    if rank == 0:
        ckpt.mkdir()
    dist.barrier()
    dist_checkpointing.save(te_norm_keys(model.sharded_state_dict()) if te else model.sharded_state_dict(), str(ckpt))
    dist.barrier()
    if rank == 0:
        (pathlib.Path(root) / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    dist.barrier()
    dist.destroy_process_group()


def bf16_moe(tp, ep, pp):
    """The model in bf16 with Megatron-Core's own optimizer (mcore_dist.py's: Float16OptimizerWithFloat16Params
    over torch AdamW, fp32 masters), a ChainedOptimizer of the dense and the expert-parallel one at ep > 1."""
    import mcore_dist
    model = build(tp, ep, pp).to(torch.bfloat16)
    model.config.bf16 = True
    return model, mcore_dist.cpu_optimizer(model)


def grid_ranks():
    from megatron.core import parallel_state
    return (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_expert_model_parallel_rank())


def legacy_optim_load(model, optimizer, legacy, tp, ep, pp):
    """Megatron-LM's load of the grid's legacy rank file: the model's state dict, then the optimizer's."""
    root = pathlib.Path(legacy)
    iteration = int((root / "latest_checkpointed_iteration.txt").read_text())
    sd = torch.load(rank_file(root, iteration, *grid_ranks(), pp, ep), weights_only=False)
    model.load_state_dict({k: v for k, v in sd["model"].items() if not k.endswith("_extra_state")}, strict=False)
    optimizer.load_state_dict(sd["optimizer"])


def dist_optim_state(model, optimizer):
    """What Megatron-LM saves and loads in torch_dist: the model's and the optimizer's sharded state dicts."""
    model_sd = model.sharded_state_dict()
    return model_sd, {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True)}


def step_with_grads(model, optimizer):
    """One step of Megatron-Core's optimizer with the same gradient of every parameter (a function of its name)."""
    import zlib
    for name, p in model.named_parameters():
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
    for o in optimizer.chained_optimizers:  # no clipping (its CUDA-only assertion); the norm is still computed
        o.config.clip_grad = 0.0
    # Megatron-Core's grad norm makes its buffers on "cuda": on the CPU here.
    zeros, tensor = torch.zeros, torch.tensor
    cpu = lambda make: lambda *a, device=None, **k: make(*a, device="cpu" if device == "cuda" else device, **k)  # noqa
    torch.zeros, torch.tensor = cpu(zeros), cpu(tensor)
    try:
        ok, _, _ = optimizer.step()
    finally:
        torch.zeros, torch.tensor = zeros, tensor
    assert ok, "the optimizer step was skipped"


def optim_loader(rank, world, tp, ep, pp, root, legacy, out, tweaked):
    """Megatron-LM's torch_dist load of model and optimizer state from the mount (the iteration the
    tracker names) against the same grid's legacy tree loaded by its legacy path (tweaked: as a save
    with tweak() would hold it): equal, bit for bit, before and after one step of both."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    import mcore_dist
    from megatron.core import dist_checkpointing
    model, optimizer = bf16_moe(tp, ep, pp)
    ref_model, ref_optimizer = bf16_moe(tp, ep, pp)
    iteration = int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())
    model_sd, sharded = dist_optim_state(model, optimizer)
    loaded = dist_checkpointing.load(sharded, str(pathlib.Path(root) / f"iter_{iteration:07d}"))
    model.load_state_dict({k: v for k, v in loaded["model"].items() if not k.endswith("_extra_state")}, strict=False)
    optimizer.load_state_dict(loaded["optimizer"])
    legacy_optim_load(ref_model, ref_optimizer, legacy, tp, ep, pp)
    if tweaked:
        mcore_dist.tweak(ref_optimizer)
    assert len(optimizer.chained_optimizers) == (2 if ep > 1 else 1), len(optimizer.chained_optimizers)
    bad = mcore_dist.optim_differences(model, optimizer, ref_model, ref_optimizer)
    assert not bad, f"rank {rank} {grid_ranks()}: {len(bad)} differ after the load: {bad[:6]}"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for m, o in ((model, optimizer), (ref_model, ref_optimizer)):
        step_with_grads(m, o)
    moved = [n for n, p in model.named_parameters() if not mcore_dist.same(p.detach(), before[n])]
    assert any(".local_experts." in n for n in moved) and len(moved) > len(before) // 2, f"the step moved {moved[:4]}"
    bad = mcore_dist.optim_differences(model, optimizer, ref_model, ref_optimizer)
    assert not bad, f"rank {rank} {grid_ranks()}: {len(bad)} differ after a step: {bad[:6]}"
    dist.barrier()
    dist.destroy_process_group()


def optim_saver(rank, world, tp, ep, pp, root, legacy, iteration):
    """Model and optimizer loaded from LEGACY by the legacy path, changed by tweak() (mcore_dist.py's:
    a step and group settings no render has), saved as Megatron-LM saves torch_dist into
    DIR/iter_ITER/, then the tracker."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    import mcore_dist
    model, optimizer = bf16_moe(tp, ep, pp)
    legacy_optim_load(model, optimizer, legacy, tp, ep, pp)
    mcore_dist.tweak(optimizer)
    mcore_dist.save_with_optimizer(rank, model, optimizer, root, iteration, make_dir=rank == 0)
    dist.destroy_process_group()


def merged(root, ep, out):
    """The ep=1 tree at DIR holds the ep=EP save's tensors bit for bit."""
    iteration = int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())
    got = torch.load(rank_file(root, iteration, 0, 0, 0, 1, 1), weights_only=False)
    got_model = {k: v for k, v in got["model"].items() if not k.endswith("._extra_state")}
    got_state = numbered(got_model, optimizer_dicts(got), expert_split(1))
    per_rank = DIMS["experts"] // ep
    seen = set()
    for r in range(ep):
        want = torch.load(pathlib.Path(out) / f"saved-0-0-{r}.pt", weights_only=False)
        want_model = {k: v for k, v in want["model"].items() if not k.endswith("._extra_state")}
        want_state = numbered(want_model, optimizer_dicts(want), expert_split(ep))
        for name, tensor in want_model.items():
            glob = name
            if ".local_experts." in name:
                head, rest = name.split(".local_experts.")
                k, tail = rest.split(".", 1)
                glob = f"{head}.local_experts.{r * per_rank + int(k)}.{tail}"
            seen.add(glob)
            same_value(tensor, got_model[glob], f"ep rank {r}: {name} as {glob}")
            for kind, a, b in zip(("exp_avg", "exp_avg_sq", "fp32"), want_state[name], got_state[glob]):
                same_value(a, b, f"ep rank {r}: {name} {kind} as {glob}")
    assert seen == set(got_model), sorted(set(got_model) ^ seen)[:4]


def main():
    global EXPERT_BIAS
    EXPERT_BIAS = "--expert-bias" in sys.argv
    cmd = sys.argv[1]
    if cmd == "run":
        root, tp, ep, pp, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        flags = sys.argv[7:]
        save = int(flags[flags.index("--save") + 1]) if "--save" in flags else None
        ranks.run(worker, tp * ep * pp, tp, ep, pp, root, out, save, preload=ranks.MEGATRON)
    elif cmd == "dist-load":
        root, tp, ep, pp, legacy = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        ranks.run(dist_loader, tp * ep * pp, tp, ep, pp, root, legacy, "--te-norm-keys" in sys.argv[7:],
                  preload=ranks.MEGATRON)
    elif cmd == "dist-save":
        root, tp, ep, pp, legacy = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        ranks.run(dist_saver, tp * ep * pp, tp, ep, pp, root, legacy, int(sys.argv[7]), "--te-norm-keys" in sys.argv[8:],
                  preload=ranks.MEGATRON)
    elif cmd == "optim-load":
        root, tp, ep, pp, legacy = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        ranks.run(optim_loader, tp * ep * pp, tp, ep, pp, root, legacy, None, sys.argv[7:] == ["tweaked"],
                  preload=ranks.MEGATRON)
    elif cmd == "optim-save":
        root, tp, ep, pp, legacy = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        ranks.run(optim_saver, tp * ep * pp, tp, ep, pp, root, legacy, int(sys.argv[7]), preload=ranks.MEGATRON)
    elif cmd == "compare":
        a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
        assert a.dtype == torch.float64 and a.shape == b.shape, (a.dtype, a.shape, b.shape)
        diff = (a - b).abs().max().item()
        assert diff <= 1e-12, f"logits differ by {diff}"
        print("max diff", diff)
    elif cmd == "merged":
        merged(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    print(cmd.upper(), "OK")


if __name__ == "__main__":
    main()
