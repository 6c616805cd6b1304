"""HotSPa-style training on CPU: each sequence-length group of a mini-batch trains in its own
parallel layout, and the parameters and accumulated gradients switch layouts in memory through
ptcfs's switch plans (python/ptcfs_switch.py, CPU executor, messages over gloo).

A tiny Llama (the `llama` schema's tensors: GQA attention, SwiGLU MLP, RMSNorm) trains on 4
processes. Per iteration: short sequences in dp=4, long ones in tp=2,dp=2 and the longest in
tp=4, then back to the base layout dp=4 for the update. The same loop with every group in dp=4
(no switching) gives the same losses: the script runs both and compares them.

How a group trains in layout (dp, tp): each rank holds its shard of every tensor (the layout's
view: tp splits as Megatron does); a tp group gathers its shards into the full tensors for the
forward pass (as FSDP does over the tp group: this example parallelises the data over dp and
holds the state over tp, it does not split the matmuls), and each rank keeps the gradient of its
own shard. Gradients of a layout are summed over its dp group when the group is done and added
to the accumulated gradients, which then move with the parameters. Pipeline layouts (pp > 1)
switch the same way (tests/switch_cpu_test.cc) but this example does not run a pipeline.
Float64 throughout, so that sums in another order agree to rounding (1e-9 relative).

    /usr/bin/python3 examples/hotspa_switch.py [--lib build/transform/device/libptcfs_switch.so]
"""

import argparse
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ptcfs_switch  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

DIMS = dict(layers=2, hidden=32, heads=8, kv_heads=4, vocab=64, seq=64, ffn=48)
DIMS_TEXT = ",".join("%s=%d" % kv for kv in DIMS.items())
WORLD = 4
BASE = "dp=4"
# (max length, sequences per iteration, layout)
GROUPS = [(16, 8, "dp=4"), (48, 4, "tp=2,dp=2"), (64, 2, "tp=4")]
ITERATIONS = 4
LR = 1.0


def coords(layout, rank):
    tp = int(dict(kv.split("=") for kv in layout.split(",")).get("tp", 1))
    return rank // tp, rank % tp, tp  # dp index, tp index, tp degree


class Layout:
    """One rank's view of a layout: buffer descriptions, process groups."""

    def __init__(self, layout, plan_to_here, rank):
        self.name = layout
        self.plan = plan_to_here  # any plan whose B side is this layout
        self.rank = rank
        self.dp, self.tp_index, self.tp = coords(layout, rank)
        tp_groups = [list(range(d * self.tp, (d + 1) * self.tp)) for d in range(WORLD // self.tp)]
        dp_groups = [list(range(t, WORLD, self.tp)) for t in range(self.tp)]
        # Every rank creates every group, in the same order (torch.distributed requires it).
        self.tp_group = [dist.new_group(g) for g in tp_groups][self.dp]
        self.dp_group = [dist.new_group(g) for g in dp_groups][self.tp_index]
        self.tp_ranks = tp_groups[self.dp]
        self.dp_size = WORLD // self.tp

    def buffers(self, rank):
        return self.plan.buffers(rank, "to")


def place(buf, seg):
    """The elements of a segment's box inside a flat local buffer, as a strided view."""
    shape = [e - b for b, e in zip(seg["begin"], seg["end"])]
    return torch.as_strided(buf.view(-1), shape, seg["strides"], seg["offset"])


def box(global_tensor, seg):
    return global_tensor[tuple(slice(b, e) for b, e in zip(seg["begin"], seg["end"]))]


def gather_globals(layout, state, shapes):
    """Full parameter tensors from the tp group's shards (leaf tensors that need grad)."""
    params = {}
    n = len(state) // 2
    for i, desc in enumerate(layout.buffers(layout.rank)[:n]):
        parts = [torch.empty_like(state[i]) for _ in layout.tp_ranks]
        dist.all_gather(parts, state[i], group=layout.tp_group)
        for member, part in zip(layout.tp_ranks, parts):
            for seg in layout.buffers(member)[i]["segments"]:
                t = params.setdefault(seg["tensor"], torch.zeros(shapes[seg["tensor"]], dtype=torch.float64))
                box(t, seg).copy_(place(part, seg))
    for t in params.values():
        t.requires_grad_(True)
    return params


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def forward_loss(p, tokens):
    """Sum of next-token losses of one sequence under Megatron-Core Llama's tensor layout."""
    h, heads, kv, hd, L = DIMS["hidden"], DIMS["heads"], DIMS["kv_heads"], DIMS["hidden"] // DIMS["heads"], len(tokens)
    x = p["embedding.word_embeddings.weight"][tokens[:-1]]
    s = L - 1
    mask = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(DIMS["layers"]):
        pre = "decoder.layers.%d." % i
        a = rms(x, p[pre + "self_attention.linear_qkv.layer_norm_weight"])
        qkv = (a @ p[pre + "self_attention.linear_qkv.weight"].T).view(s, kv, heads // kv + 2, hd)
        q = qkv[:, :, : heads // kv].reshape(s, heads, hd)
        k = qkv[:, :, heads // kv].repeat_interleave(heads // kv, dim=1)
        v = qkv[:, :, heads // kv + 1].repeat_interleave(heads // kv, dim=1)
        att = torch.softmax(torch.einsum("shd,thd->hst", q, k) / math.sqrt(hd) + mask, dim=-1)
        o = torch.einsum("hst,thd->shd", att, v).reshape(s, heads * hd)
        x = x + o @ p[pre + "self_attention.linear_proj.weight"].T
        m = rms(x, p[pre + "mlp.linear_fc1.layer_norm_weight"])
        gate, up = (m @ p[pre + "mlp.linear_fc1.weight"].T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ p[pre + "mlp.linear_fc2.weight"].T
    logits = rms(x, p["decoder.final_layernorm.weight"]) @ p["output_layer.weight"].T
    return torch.nn.functional.cross_entropy(logits, tokens[1:], reduction="sum")


def batch(iteration, group):
    """The group's sequences of this iteration: deterministic, the same in both runs."""
    g = torch.Generator().manual_seed(1000 * iteration + group)
    max_len, count, _ = GROUPS[group]
    lo = GROUPS[group - 1][0] + 1 if group else 4
    out = []
    for _ in range(count):
        n = int(torch.randint(lo, max_len + 1, (1,), generator=g))
        # Learnable: each token follows from the one before (t -> 5t + 3 mod vocab), from a random start.
        t = [int(torch.randint(0, DIMS["vocab"], (1,), generator=g))]
        for _ in range(n - 1):
            t.append((5 * t[-1] + 3) % DIMS["vocab"])
        out.append(torch.tensor(t))
    return out


def train_group(layout, state, shapes, seqs):
    """Forward and backward of this rank's share of `seqs` in `layout`; the group's gradients,
    summed over its dp group, added to the accumulated gradients (state's second half)."""
    n = len(state) // 2
    params = gather_globals(layout, state, shapes)
    mine = seqs[layout.dp::layout.dp_size]
    loss = sum((forward_loss(params, t) for t in mine), torch.zeros((), dtype=torch.float64))
    if mine:
        loss.backward()
    for i, desc in enumerate(layout.buffers(layout.rank)[:n]):
        partial = torch.zeros_like(state[n + i])
        for seg in desc["segments"]:
            g = params[seg["tensor"]].grad
            if g is not None:
                place(partial, seg).copy_(box(g, seg))
        dist.all_reduce(partial, group=layout.dp_group)
        state[n + i] += partial
    total = loss.detach().clone()
    dist.all_reduce(total)  # every tp member counted the same sequences
    return float(total) / layout.tp, sum(len(t) - 1 for t in seqs)


def worker(rank, lib, switch, init, out_path):
    os.environ["PTCFS_SWITCH_LIB"] = lib
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    plans, layouts = {}, {}
    names = [BASE] + [g[2] for g in GROUPS]

    def plan(a, b):
        if (a, b) not in plans:
            plans[(a, b)] = ptcfs_switch.Plan("llama", DIMS_TEXT, a, b, param_dtype="f64", budget=1 << 14)
        return plans[(a, b)]

    for name in dict.fromkeys(names):
        layouts[name] = Layout(name, plan(BASE, name), rank)
    shapes = {k: v for k, v in plan(BASE, BASE).describe()["tensors"].items()}
    # The base layout's state: parameters from ptcfs synth (seed 1), scaled down; no gradients yet.
    state = plan(BASE, BASE).empty(rank, "to")
    plan(BASE, BASE).synth(rank, "to", state, 1)
    n = len(state) // 2
    for i in range(n):
        state[i].mul_(0.2)
        state[n + i].zero_()
    exchange = ptcfs_switch.torch_exchange()
    losses = []
    for it in range(ITERATIONS):
        current = BASE
        tokens = 0
        for g in range(len(GROUPS)):
            target = GROUPS[g][2] if switch else BASE
            if target != current:  # parameters and accumulated gradients move
                p = plan(current, target)
                new = p.empty(rank, "to")
                p.run(rank, state, new, exchange)
                state, current = new, target
            loss, ntok = train_group(layouts[current], state, shapes, batch(it, g))
            losses.append(loss / ntok)
            tokens += ntok
        if current != BASE:
            p = plan(current, BASE)
            new = p.empty(rank, "to")
            p.run(rank, state, new, exchange)
            state = new
        for i in range(n):  # SGD in the base layout (where master weights and optimizer state live)
            state[i] -= LR * state[n + i] / tokens
            state[n + i].zero_()
    if rank == 0:
        torch.save(losses, out_path)
    dist.barrier()
    dist.destroy_process_group()


def run(lib, switch, tmp):
    out = os.path.join(tmp, "losses-%s.pt" % ("switch" if switch else "fixed"))
    init = "file://" + os.path.join(tmp, "rendezvous-%d" % switch)
    mp.spawn(worker, args=(lib, switch, init, out), nprocs=WORLD, join=True)
    return torch.load(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=os.environ.get("PTCFS_SWITCH_LIB", ""), help="libptcfs_switch.so")
    args = ap.parse_args()
    lib = args.lib or ptcfs_switch.load_library()._name
    with tempfile.TemporaryDirectory() as tmp:
        switched = run(lib, True, tmp)
        fixed = run(lib, False, tmp)
    print("iteration group  layout        loss (switching)  loss (dp=4 only)")
    k = 0
    worst = 0.0
    for it in range(ITERATIONS):
        for g, (max_len, _, layout) in enumerate(GROUPS):
            a, b = switched[k], fixed[k]
            worst = max(worst, abs(a - b) / abs(b))
            print("%9d %5d  %-12s  %.12f  %.12f" % (it, g, layout, a, b))
            k += 1
    print("largest relative difference %.2e" % worst)
    decreasing = switched[-len(GROUPS)] < switched[0]  # the short group, last iteration vs first
    if worst > 1e-9:
        print("losses differ")
        return 1
    print("same losses%s" % ("" if decreasing else " (but the last group's loss did not decrease)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
