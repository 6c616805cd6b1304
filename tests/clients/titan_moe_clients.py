"""torchtitan's Qwen3 mixture of experts (torchtitan 0.3, from PyPI) against ptcfs's DCP keys in its names.

The harness is titan_clients.py's (gloo processes, torchtitan's flattening of the
model and the optimizer, its AdamW resume, train_state/lr_scheduler/dataloader
entries), over torchtitan's Qwen3Model built from a Qwen3-MoE config.json (every
layer MoE): each layer's experts one [experts, ...] tensor per weight
(GroupedExperts' w1_EFD, w3_EFD, w2_EDF), the router's gate, q/k norms and the
persistent expert_bias_E buffer. DTensors are Shard(0) over the processes: for
the stacked experts that is expert parallelism (a rank its experts, a chunk
spanning two when the count does not divide); w1_EFD's are Shard(1), rows cut
inside every expert; expert_bias_E stays a plain (replicated) tensor, as
torchtitan keeps its buffers.

  titan_moe_clients.py load DCP_DIR HF_DIR --procs N
      dcp.load in N processes, into plain tensors and Shard(0) DTensors, equals
      torchtitan's own Qwen3StateDictAdapter.from_hf of HF_DIR (the reference,
      independent of ptcfs's names) and zero expert biases; each layer's MoE
      block gives the same output with the loaded weights as with the
      reference's. Prints "LOAD OK".

  titan_moe_clients.py save OUT_DIR SEED HF_DIR --procs N
      N processes save values drawn from SEED (titan_clients.Save: parameters,
      Adam's moments, steps, group settings, train_state, ...). Prints "SAVE OK".

  titan_moe_clients.py same DCP_DIR SEED HF_DIR --procs N
      dcp.load in N processes equals those values, and torchtitan resumes from
      them (titan_clients.Load); the MoE blocks' outputs equal. Prints "SAME OK".
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file
from torch.distributed.tensor import Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import titan_clients as tc  # noqa: E402

from torchtitan.models.common import Embedding, Linear  # noqa: E402
from torchtitan.models.common.rope import CosSinRoPE  # noqa: E402
from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_moe_layers, _qwen3_norm  # noqa: E402
from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter  # noqa: E402

BIAS = ".moe.expert_bias_E"


def model_config(hf_dir):
    """torchtitan's Qwen3 MoE of a Qwen3-MoE config.json (no dense layer: torchtitan's builder has none)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    assert not c.get("mlp_only_layers") and c.get("decoder_sparse_step", 1) == 1, "every layer MoE"
    dim, hd, vocab = c["hidden_size"], c["head_dim"], c["vocab_size"]
    theta = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta")
    return Qwen3Model.Config(
        vocab_size=vocab, dim=dim, norm=_qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=_build_qwen3_moe_layers(
            fuse_qkv=True, n_layers=c["num_hidden_layers"], dim=dim, n_heads=c["num_attention_heads"],
            n_kv_heads=c["num_key_value_heads"], head_dim=hd, moe_hidden_dim=c["moe_intermediate_size"],
            num_experts=c.get("num_experts", c.get("num_local_experts")), top_k=c["num_experts_per_tok"],
            attn_backend="flex", moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=hd, max_seq_len=c["max_position_embeddings"], theta=theta)),
    ), c


def shard(flat, mesh):
    """Shard(0) DTensors (the stacked experts: expert parallel, a chunk spanning experts when
    their count does not divide), but w1's (and its moments') Shard(1): rows cut anywhere inside
    every expert's gate half; the buffers replicated."""
    def placement(key):
        return Shard(1) if "inner_experts.w1_EFD" in key else Shard(0)
    return {k: t if k.endswith(BIAS) else distribute_tensor(t, mesh, [placement(k)]) for k, t in flat.items()}


# titan_clients' harness over this model (its functions look these up when they run, in
# every rank: forked after this module patched them).
tc.model_config = model_config
tc.shard = shard


def moe_outputs(flat, hf_dir):
    """Each layer's MoE block's output on fixed inputs, with the weights of `flat`."""
    cfg, c = model_config(hf_dir)
    model = cfg.build()
    model.load_state_dict({k: tc.local(v) for k, v in flat.items() if not k.startswith("optimizer.")})
    x = torch.randn(2, 8, c["hidden_size"], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return [layer.moe(x) for layer in model.layers.values()]


class SameOutputs:
    """After loading (`load`: a titan_clients.Load), the MoE blocks' outputs of rank 0's loaded
    weights equal those of `want`'s."""

    def __init__(self, load, want, hf_dir):
        self.load, self.want, self.hf_dir = load, want, hf_dir

    def __call__(self, rank, world):
        self.load(rank, world)
        plain = {k: torch.zeros_like(t) for k, t in self.want.items()}
        tc.dcp.load(tc.nest(plain), checkpoint_id=self.load.args.dir)
        for i, (a, b) in enumerate(zip(moe_outputs(plain, self.hf_dir), moe_outputs(self.want, self.hf_dir))):
            if not torch.equal(a, b):
                raise AssertionError(f"rank {rank}: layer {i}'s MoE output differs by {(a - b).abs().max()}")


def reference(hf_dir):
    """torchtitan's model keys from HF_DIR by its own adapter, and zero expert biases."""
    cfg, c = model_config(hf_dir)
    hf = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            hf.update(load_file(os.path.join(hf_dir, name)))
    want = dict(Qwen3StateDictAdapter(cfg, None).from_hf(hf))
    experts = c.get("num_experts", c.get("num_local_experts"))
    for i in range(c["num_hidden_layers"]):
        want[f"layers.{i}{BIAS}"] = torch.zeros(experts, dtype=torch.float32)
    keys = set(tc.titan_template(hf_dir)) - {k for k in tc.titan_template(hf_dir) if k.startswith("optimizer.")}
    assert set(want) == keys, f"the adapter's keys are not the model's: {sorted(set(want) ^ keys)[:6]}"
    return want


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["load", "save", "same"])
    ap.add_argument("dir")
    ap.add_argument("rest", nargs="+")
    ap.add_argument("--procs", type=int, default=1)
    args = ap.parse_args()
    if args.mode == "load":
        hf_dir = args.rest[0]
        want = reference(hf_dir)
        tc.spawn(args.procs, SameOutputs(tc.Load(args, want), want, hf_dir))
        print("LOAD OK")
        return
    seed, hf_dir = int(args.rest[0]), args.rest[1]
    saved = tc.values(seed, tc.titan_template(hf_dir))
    if args.mode == "save":
        tc.spawn(args.procs, tc.Save(args, saved, hf_dir))
        print("SAVE OK")
    else:
        tc.spawn(args.procs, SameOutputs(tc.Load(args, saved, hf_dir), saved, hf_dir))
        print("SAME OK")


if __name__ == "__main__":
    main()
