#!/usr/bin/env python3
"""Megatron-Core's GPTModel as it really runs, on CPU, against a mount's megatron/ tree.

The files are the built-in llama schema's, rendered in Megatron-Core's local names
(`--names local`: input_layernorm.weight / pre_mlp_layernorm.weight, the input norm first in
the layer, as TransformerLayer builds it); the test has no schema of its own.

  run DIR TP PP OUT       TP*PP gloo processes; each builds GPTModel (local spec, float64,
                          use_cpu_initialization) in its (tp, pp) rank, loads
                          DIR/iter_*/mp_rank_*/model_optim_rng.pt's model with strict=True
                          (its parameters in named_parameters()' names and order)
                          (missing _extra_state entries filled from the model, but with
                          --strict SAVED_TP, where the file must have every one, and each
                          linear_qkv's the bytes the save at tp SAVED_TP gave it: see --save),
                          checks that named_parameters() numbers the optimizer state
                          (every state fits its parameter, masters equal the parameters),
                          loads it into torch Adam over Megatron-Core's own parameter groups
                          (_get_param_groups), writes the logits of a fixed batch (gathered
                          over tp, float64) to OUT/logits.pt, takes an Adam step (finite),
                          and with --save ITER saves every rank's file the way Megatron does
                          (torch.save of model and optimizer state in its own order; each
                          linear_qkv._extra_state an io.BytesIO naming the saving tp rank and
                          the global key, as Transformer Engine keeps opaque bytes) into
                          DIR/iter_ITER/, then writes DIR/latest_checkpointed_iteration.txt
  compare A B             two logits files equal within 1e-12
  same DIR TP PP OUT      DIR's rank files (the latest iteration) hold what the save wrote to
                          OUT/saved-TP-PP.pt: the model dict (keys in order, tensors bit for bit,
                          each _extra_state's bytes) and the optimizer state (numbering, groups
                          and their settings, every state, the fp32 masters)

CPU shims (small): Megatron-Core's CUDA RNG tracker (get_cuda_rng_tracker) is a no-op fork
(dropout is 0, initialisation on CPU), and torch.cuda.current_device() answers "cpu" (RoPE
moves its inv_freq to the current CUDA device at the first forward).
Prints "<CMD> OK" and exits 0 on success.
"""
import contextlib
import io
import os
import pathlib
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist
import ranks  # noqa: E402 (how the gloo ranks start: forked)

DIMS = dict(layers=4, hidden=64, heads=4, kv_heads=2, vocab=256, seq=32)
FFN = 4 * DIMS["hidden"]
TOKENS = 16


class _NoFork:
    """The CPU shim for megatron.core.tensor_parallel's CUDA RNG tracker."""

    def fork(self, *a, **k):
        return contextlib.nullcontext()

    def add(self, *a, **k):
        pass

    def is_initialized(self):
        return True


def build(tp, pp):
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    import megatron.core.transformer.attention as attention_mod

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.cuda.current_device = lambda: "cpu"
    shim = _NoFork()
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: shim
    tensor_parallel.random.get_cuda_rng_tracker = lambda *a, **k: shim
    if hasattr(attention_mod, "get_cuda_rng_tracker"):
        attention_mod.get_cuda_rng_tracker = lambda *a, **k: shim
    config = TransformerConfig(
        num_layers=DIMS["layers"], hidden_size=DIMS["hidden"], num_attention_heads=DIMS["heads"],
        num_query_groups=DIMS["kv_heads"], ffn_hidden_size=FFN, kv_channels=DIMS["hidden"] // DIMS["heads"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float64,
        attention_softmax_in_fp32=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        pipeline_dtype=torch.float64)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=DIMS["vocab"], max_sequence_length=DIMS["seq"],
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=False, position_embedding_type="rope")
    return model.double()


def extra_tag(key, tp_rank, pp_rank, pp):
    """The bytes a save puts in linear_qkv._extra_state: the saving tp rank and the global key."""
    parts = key.split(".")
    parts[2] = str(int(parts[2]) + pp_rank * DIMS["layers"] // pp)  # decoder.layers.N.
    return f"tp{tp_rank} {'.'.join(parts)}".encode()


def rank_file(root, iteration, tp_rank, pp_rank, pp):
    d = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
    return pathlib.Path(root) / f"iter_{iteration:07d}" / d / "model_optim_rng.pt"


def worker(rank, world, tp, pp, root, out, save, strict):
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import megatron.core  # noqa: F401 (its safe globals for a weights_only load)
    from megatron.core import parallel_state
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups

    torch.manual_seed(0)
    model = build(tp, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    iteration = int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())
    sd = torch.load(rank_file(root, iteration, tp_rank, pp_rank, pp), weights_only=False)
    # A store that never had Megatron-Core's _extra_state entries (synth) renders none: with
    # --strict (a store imported from the model's own save) none may be missing; else only they
    # are added (None on CPU), so strict=True still checks every parameter's name and shape.
    extra = {k: v for k, v in model.state_dict().items() if k.endswith("._extra_state") and k not in sd["model"]}
    assert not (strict and extra), f"{len(extra)} _extra_state entries missing, e.g. {sorted(extra)[:3]}"
    for key, value in sd["model"].items():
        if strict and key.endswith("linear_qkv._extra_state"):  # the saved rank's own bytes
            want = extra_tag(key, tp_rank % strict, pp_rank, pp)
            assert isinstance(value, io.BytesIO) and value.getvalue() == want, f"{key}: {value!r}, saved {want!r}"
    model.load_state_dict({**sd["model"], **extra}, strict=True)
    names = [n for n, _ in model.named_parameters()]
    # The file's parameters: the model's names, in its registration order.
    in_file = [k for k in sd["model"] if not k.endswith("._extra_state")]
    assert in_file == names, f"file order {in_file[:4]}... != named_parameters() {names[:4]}..."
    # The optimizer state numbers named_parameters() split into Megatron-Core's groups.
    groups = _get_param_groups([model], OptimizerConfig(lr=1e-3, min_lr=0.0, weight_decay=0.1), None)
    params = dict(model.named_parameters())
    index = {id(p): n for n, p in params.items()}
    numbered = [index[id(p)] for g in groups for p in g["params"]]
    saved = sd["optimizer"]["optimizer"]
    assert [len(g["params"]) for g in saved["param_groups"]] == [len(g["params"]) for g in groups]
    masters = [m for group in sd["optimizer"]["fp32_from_fp16_params"] for m in group]
    for k, name in enumerate(numbered):
        state, p = saved["state"][k], params[name]
        for kind in ("exp_avg", "exp_avg_sq"):
            assert state[kind].shape == p.shape, f"state {k} {kind} {tuple(state[kind].shape)} != {name} {tuple(p.shape)}"
        assert bool((state["exp_avg_sq"] >= 0).all()), f"{name}: exp_avg_sq < 0"
        assert torch.equal(masters[k], p.detach().float()), f"{name}: master copy differs from the parameter"
    adam = torch.optim.Adam(groups, lr=1e-3)
    adam.load_state_dict(saved)
    # A fixed batch: logits of the last stage, gathered over tp.
    model.eval()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, DIMS["vocab"], (2, TOKENS), generator=g)
    positions = torch.arange(TOKENS).unsqueeze(0).expand(2, -1)
    mask = torch.triu(torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool), diagonal=1)
    hidden_shape = (TOKENS, 2, DIMS["hidden"])
    if not parallel_state.is_pipeline_first_stage():
        recv = torch.empty(hidden_shape, dtype=torch.float64)
        dist.recv(recv, src=parallel_state.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(recv)
    output = model(tokens, positions, mask)
    if not parallel_state.is_pipeline_last_stage():
        dist.send(output.detach().contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
    else:
        parts = [torch.empty_like(output) for _ in range(tp)]
        dist.all_gather(parts, output.detach().contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        if tp_rank == 0:
            torch.save(torch.cat(parts, dim=-1), pathlib.Path(out) / "logits.pt")
    # An Adam step from the loaded state (a surrogate loss per stage: the step, not the
    # gradient, is under test) must be finite.
    model.train()
    output.float().pow(2).mean().backward()
    adam.step()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), f"{name}: not finite after an Adam step from the rendered state"
    if save is not None:
        # Megatron's non-distributed save: the model's state dict, Adam's in named_parameters()
        # order through Megatron-Core's groups, the fp32 masters per group.
        sd["iteration"] = save
        sd["model"] = model.state_dict()
        for key in sd["model"]:  # as Transformer Engine saves its extra state: opaque bytes
            if key.endswith("linear_qkv._extra_state"):
                sd["model"][key] = io.BytesIO(extra_tag(key, tp_rank, pp_rank, pp))
        state = adam.state_dict()
        for moments in state["state"].values():  # Megatron's Adam runs over the fp32 masters
            for kind in ("exp_avg", "exp_avg_sq"):
                moments[kind] = moments[kind].float()
        sd["optimizer"] = {"optimizer": state,
                           "fp32_from_fp16_params": [[p.detach().float().clone() for p in g["params"]]
                                                     for g in adam.param_groups]}
        path = rank_file(root, save, tp_rank, pp_rank, pp)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(sd, path)
        torch.save({"model": sd["model"], "optimizer": sd["optimizer"]}, pathlib.Path(out) / f"saved-{tp_rank}-{pp_rank}.pt")
        dist.barrier()
        if rank == 0:
            (pathlib.Path(root) / "latest_checkpointed_iteration.txt").write_text(str(save))
    dist.barrier()
    dist.destroy_process_group()


def same_value(a, b, where):
    """a equals b: dicts with the same keys in the same order, tensors bit for bit, BytesIO bytes."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, io.BytesIO):
        assert isinstance(b, io.BytesIO) and a.getvalue() == b.getvalue(), f"{where}: {a.getvalue()!r}, {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)[:6]} != {list(b)[:6]}"
        for k in a:
            same_value(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same_value(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def main():
    cmd = sys.argv[1]
    if cmd == "run":
        root, tp, pp, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        flags = sys.argv[6:]
        save = int(flags[flags.index("--save") + 1]) if "--save" in flags else None
        strict = int(flags[flags.index("--strict") + 1]) if "--strict" in flags else 0
        ranks.run(worker, tp * pp, tp, pp, root, out, save, strict, preload=ranks.MEGATRON)
    elif cmd == "compare":
        a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
        assert a.dtype == torch.float64 and a.shape == b.shape, (a.dtype, a.shape, b.shape)
        diff = (a - b).abs().max().item()
        assert diff <= 1e-12, f"logits differ by {diff}"
        print("max diff", diff)
    elif cmd == "same":
        root, tp, pp, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        iteration = int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())
        import megatron.core  # noqa: F401
        for pp_rank in range(pp):
            for tp_rank in range(tp):
                got = torch.load(rank_file(root, iteration, tp_rank, pp_rank, pp), weights_only=False)
                want = torch.load(pathlib.Path(out) / f"saved-{tp_rank}-{pp_rank}.pt", weights_only=False)
                for key in ("model", "optimizer"):
                    same_value(got[key], want[key], f"rank tp {tp_rank} pp {pp_rank}: {key}")
    print(cmd.upper(), "OK")


if __name__ == "__main__":
    main()
