#!/usr/bin/env python3
"""A mixture-of-experts model trained with Adam through a mount whose expert-parallel layout
changes: the training client of clients_test's MoE training case, and the uninterrupted run it is
compared with (train_gpt.py's method, for a model with experts).

The model is the llama schema with experts as ptcfs renders it in Megatron-Core's local names
(`--names local`): layers=2, hidden=32, heads=4, kv_heads=2, vocab=128, seq=16, every layer an
MoE layer (router over 4 SequentialMLP experts `mlp.experts.local_experts.K.linear_fc1/fc2`,
top-2, a shared expert), bf16 parameters, fp32 masters, Adam's moments. At ep > 1 each ep rank's
file `mp_rank_00_EEE` holds its E/ep local experts (local K of ep rank r = global r*E/ep + K) and
Megatron-Core's ChainedOptimizer state `[dense, experts]`, each numbering its own parameters; at
ep = 1 one file and one optimizer. A step is a function of the global tensors and the global
batch only: every rank gathers every saving rank's file (gloo), computes the whole step
(single-threaded) and writes back its own part, so the run is bitwise one process's whatever the
layout; the parallelism under test is ptcfs's (each rank reads its own rank file and samples from
the mount and saves through it). The routing really routes: top-2 of 4 experts per token, and each
rank asserts that the experts of its own ep rank received tokens at every layer and step (the
per-expert token counts are logged and must equal the uninterrupted run's).

  reference TREE DATA_PREFIX OUT --samples N --batch B --seed S --steps T --saves T1,T2,..
      The uninterrupted run without ptcfs's mount: the Megatron tree TREE (any ep) and the
      dataset DATA_PREFIX.{idx,bin} read directly, batches in docs/dataset_format.md's order.
      Writes OUT/steps.json and OUT/state-Ti.pt (global model, masters, moments, Adam step).
  job MOUNT --steps K --samples N --batch B --log LOG
      The job at MOUNT/.ptcfs/config (tp = pp = 1, dp, ep): tp*dp*pp gloo processes, each loads
      its rank file of the latest iteration of MOUNT/megatron and its data stream
      MOUNT/data/rank-RRRRR, trains K steps (rank 0 appends each step to LOG), then the
      expert-data-parallel rank 0 of each ep rank saves its file through the mount, with
      args.consumed_train_samples the new data position and its own rng_state (the
      expert-parallel tracker seeded per ep rank, as megatron-core does), and rank 0 writes the
      latest file. --rng-from-ep E: each rank restores its file's rng_state as Megatron-LM's
      load does and it must be ep rank (its ep rank mod E)'s of the save (E = 0: none).
  check TREE REF_DIR T --batch B
      TREE (a Megatron tree at any ep) holds exactly the reference's state after T steps: every
      parameter, fp32 master, moment and Adam step bit for bit, the dense tensors the same in
      every ep rank's file, the iteration and args.consumed_train_samples; each ep rank's file
      its own rng_state.
  steps REF_DIR LOG --samples N
      Every logged step equals the reference's (loss as a hex float, the batch's sample ids, the
      routing's token counts) and the steps, in order, consume each epoch in the reference's
      order with every sample once.

Prints "<CMD> OK" on success.
"""
import argparse
import datetime
import json
import math
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt as mc  # noqa: E402
import train_gpt as tg  # noqa: E402  (the epoch order, the data streams, Adam's step)
import ranks  # noqa: E402 (how the gloo ranks start: forked)

LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB, EXPERTS, TOPK = 2, 32, 4, 2, 128, 4, 2
HEAD_DIM = HIDDEN // HEADS
SEQ = mc.SEQ  # 16: train_gpt's tokens_of cuts samples at seq + 1
DIMS = "layers=2,hidden=32,heads=4,kv_heads=2,vocab=128,seq=16,experts=4,moe_ffn=32,shared_ffn=32"
LATEST = "latest_checkpointed_iteration.txt"
EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..*)$")
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")


# Names and optimizer slots.
def global_name(name, ep_rank, ep):
    """The ep = 1 name of a rank file's parameter (its local expert K as global ep_rank*E/ep + K)."""
    m = EXPERT.match(name)
    return name if m is None else "%s%d%s" % (m.group(1), ep_rank * EXPERTS // ep + int(m.group(2)), m.group(3))


def slots(sd, ep):
    """{parameter name: (optimizer, state key, group, position)} of a rank file: with ep > 1
    ChainedOptimizer's [dense, experts], else one; each optimizer numbers its parameters in its
    groups' order, Megatron's rule putting 1-D parameters in the group without weight decay (the
    group with wd_mult 0), the model dict giving named_parameters()' order."""
    params = {k: v for k, v in sd["model"].items() if not k.endswith("._extra_state")}
    opts = sd["optimizer"] if isinstance(sd["optimizer"], list) else [sd["optimizer"]]
    assert len(opts) == (2 if ep > 1 else 1), "%d optimizers at ep=%d" % (len(opts), ep)
    out = {}
    for c, opt in enumerate(opts):
        mine = [k for k in params if ep == 1 or (EXPERT.match(k) is not None) == (c == 1)]
        groups = opt["optimizer"]["param_groups"]
        decay, none = [k for k in mine if params[k].dim() > 1], [k for k in mine if params[k].dim() == 1]
        members = [decay + none] if len(groups) == 1 else [none, decay] if groups[0].get("wd_mult") == 0.0 else [
            decay, none]
        assert [len(g["params"]) for g in groups] == [len(m) for m in members], (c, [len(m) for m in members])
        for g, (group, names) in enumerate(zip(groups, members)):
            for j, (key, name) in enumerate(zip(group["params"], names)):
                out[name] = (c, key, g, j)
    return out, opts


# The model: Megatron-Core's GPT with MoE layers (RMSNorm, RoPE, grouped-query attention, SwiGLU).
def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x):
    """Rotary embedding of x [b, s, heads, d] (Megatron's non-interleaved halves)."""
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    f = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    cos, sin = torch.cat([f, f], -1).cos()[None, :, None], torch.cat([f, f], -1).sin()[None, :, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def swiglu(x, fc1, fc2):
    gate, up = F.linear(x, fc1).chunk(2, -1)
    return F.linear(F.silu(gate) * up, fc2)


def moe(p, pre, x, counts):
    """Router top-2 of the experts (softmax over the two chosen logits), the chosen experts'
    outputs weighted and added to the shared expert's; counts gets each expert's tokens."""
    top, chosen = F.linear(x, p[pre + "router.weight"]).topk(TOPK, dim=-1)
    weights = top.softmax(-1)
    out = swiglu(x, p[pre + "shared_experts.linear_fc1.weight"], p[pre + "shared_experts.linear_fc2.weight"])
    for e in range(EXPERTS):
        tokens, slot = (chosen == e).nonzero(as_tuple=True)
        counts.append(len(tokens))
        e_pre = "%sexperts.local_experts.%d." % (pre, e)
        y = swiglu(x[tokens], p[e_pre + "linear_fc1.weight"], p[e_pre + "linear_fc2.weight"])
        out = out.index_add(0, tokens, y * weights[tokens, slot].unsqueeze(-1))
    return out


def forward(p, tokens, counts):
    x, y = tokens[:, :-1], tokens[:, 1:]
    b, s = x.shape
    h = p["embedding.word_embeddings.weight"][x]
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    group = HEADS // KV_HEADS
    for i in range(LAYERS):
        pre = "decoder.layers.%d." % i
        a = rms(h, p[pre + "input_layernorm.weight"])
        # Megatron's qkv rows: per query group, its heads' q, then k, then v.
        qkv = F.linear(a, p[pre + "self_attention.linear_qkv.weight"]).view(b, s, KV_HEADS, group + 2, HEAD_DIM)
        q = rope(qkv[:, :, :, :group].reshape(b, s, HEADS, HEAD_DIM)).transpose(1, 2)
        k = rope(qkv[:, :, :, group]).repeat_interleave(group, 2).transpose(1, 2)
        v = qkv[:, :, :, group + 1].repeat_interleave(group, 2).transpose(1, 2)
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)).masked_fill(causal, float("-inf")).softmax(-1)
        h = h + F.linear((att @ v).transpose(1, 2).reshape(b, s, HIDDEN), p[pre + "self_attention.linear_proj.weight"])
        m = rms(h, p[pre + "pre_mlp_layernorm.weight"]).reshape(b * s, HIDDEN)
        h = h + moe(p, pre + "mlp.", m, counts).view(b, s, HIDDEN)
    logits = F.linear(rms(h, p["decoder.final_layernorm.weight"]), p["output_layer.weight"])
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


class State(tg.State):
    """train_gpt.py's Adam over the global tensors, by name, with the MoE forward; `counts` holds
    the last step's tokens per (layer, expert)."""

    def loss(self, params, tokens):
        self.counts = []
        return forward(params, tokens, self.counts)

    @staticmethod
    def from_files(files, ep):
        """From the rank files {ep_rank: state dict} of a tree (tp = pp = 1) at `ep`."""
        fp32, exp_avg, exp_avg_sq, steps = {}, {}, {}, set()
        for r, sd in sorted(files.items()):
            where, opts = slots(sd, ep)
            for name in where:
                c, key, g, j = where[name]
                state = opts[c]["optimizer"]["state"][key]
                got = {"fp32": opts[c]["fp32_from_fp16_params"][g][j], "exp_avg": state["exp_avg"],
                       "exp_avg_sq": state["exp_avg_sq"]}
                glob = global_name(name, r, ep)
                for kind, into in (("fp32", fp32), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                    if glob in into:  # a dense tensor: every ep rank's file holds the same
                        assert mc.same(into[glob], got[kind]), "ep rank %d: %s %s differs from ep rank 0's" % (
                            r, name, kind)
                    into[glob] = got[kind].clone()
                assert mc.same(sd["model"][name], got["fp32"].to(sd["model"][name].dtype)), name + ": not its master"
                steps.add(float(state["step"]))
        assert len(steps) == 1, "Adam's step differs between parameters: %s" % steps
        return State(fp32, exp_avg, exp_avg_sq, steps.pop())

    def write_into(self, sd, ep_rank, ep):
        """sd (the rank's loaded file) with this state's values for its parameters."""
        where, opts = slots(sd, ep)
        for name, (c, key, g, j) in where.items():
            glob = global_name(name, ep_rank, ep)
            sd["model"][name] = self.fp32[glob].to(sd["model"][name].dtype)
            state = opts[c]["optimizer"]["state"][key]
            state["exp_avg"], state["exp_avg_sq"] = self.exp_avg[glob].clone(), self.exp_avg_sq[glob].clone()
            state["step"] = torch.tensor(float(self.step), dtype=state["step"].dtype)
            opts[c]["fp32_from_fp16_params"][g][j] = self.fp32[glob].clone()


def rank_dir(ep_rank, ep):
    return "mp_rank_00" + ("_%03d" % ep_rank if ep > 1 else "")


def load_tree(root):
    """(iteration, ep, {ep_rank: state dict}) of a Megatron tree at tp = pp = 1."""
    with open(os.path.join(root, LATEST)) as f:
        iteration = int(f.read())
    it_dir = os.path.join(root, "iter_%07d" % iteration)
    files = {}
    for name in sorted(os.listdir(it_dir)):
        m = RANK_DIR.match(name)
        assert m is not None and m.group(1) == "00", "%s: not a rank directory of tp=1, pp=1" % name
        files[int(m.group(2) or 0)] = torch.load(os.path.join(it_dir, name, "model_optim_rng.pt"), weights_only=False)
    ep = len(files)
    assert sorted(files) == list(range(ep)) and os.path.isdir(os.path.join(it_dir, rank_dir(0, ep))), sorted(files)
    return iteration, ep, files


# Each ep rank's rng state, as Megatron-LM's legacy save holds it (get_rng_state: one entry without
# --data-parallel-random-init) and its load restores it (random.setstate, np.random.set_state,
# torch.set_rng_state, then get_cuda_rng_tracker().set_states(rng_tracker_states); a CPU job has no
# cuda_rng_state). The trackers' states are CPU generators seeded as megatron-core's
# model_parallel_cuda_manual_seed seeds them: the expert-parallel one per ep rank.
RNG_SEED = 1234


def tracker(seed):
    return torch.Generator().manual_seed(seed).get_state()


def rng_state(ep_rank):
    import random
    import numpy as np
    random.seed(RNG_SEED + ep_rank)
    np.random.seed(RNG_SEED + ep_rank)
    return [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": tracker(RNG_SEED + ep_rank),
             "rng_tracker_states": {"data-parallel-rng": tracker(RNG_SEED),
                                    "model-parallel-rng": tracker(RNG_SEED + 2718),
                                    "expert-parallel-rng": tracker(RNG_SEED + 1024 + 100 * ep_rank)}}]


def restore_rng(sd, ep_rank, saved_ep, where):
    """Megatron-LM's load of a file's rng_state (no CUDA here): the state saved by ep rank
    ep_rank mod saved_ep (0: the file has none), each generator's and tracker's bit for bit."""
    import random
    import numpy as np
    if saved_ep == 0:
        assert "rng_state" not in sd, where + ": an rng_state no save wrote"
        return
    rng = sd["rng_state"][0]
    want = rng_state(ep_rank % saved_ep)[0]
    random.setstate(rng["random_rng_state"])
    np.random.set_state(rng["np_rng_state"])
    torch.set_rng_state(rng["torch_rng_state"])
    assert random.getstate() == want["random_rng_state"], where + ": random_rng_state"
    assert repr(np.random.get_state()) == repr(want["np_rng_state"]), where + ": np_rng_state"
    assert torch.equal(torch.get_rng_state(), want["torch_rng_state"]), where + ": torch_rng_state"
    assert sorted(rng["rng_tracker_states"]) == sorted(want["rng_tracker_states"]), where
    for name, state in want["rng_tracker_states"].items():
        assert torch.equal(rng["rng_tracker_states"][name], state), "%s: tracker %s" % (where, name)


def step_record(t, epoch, loss, ids, counts):
    return {"t": t, "epoch": epoch, "loss": loss.hex(), "ids": ids, "counts": counts}


def reference(a):
    _, ep, files = load_tree(a.tree)
    state = State.from_files(files, ep)
    samples = tg.read_samples(a.data)
    steps_per_epoch = -(-a.samples // a.batch)
    saves = {int(t) for t in a.saves.split(",")}
    os.makedirs(a.out, exist_ok=True)
    out, orders = [], {}
    for t in range(a.steps):
        epoch, k = divmod(t, steps_per_epoch)
        order = orders.setdefault(epoch, tg.permutation(a.samples, a.seed, epoch))
        ids = [order[p] for p in tg.batch_positions(a.samples, a.batch, k)]
        loss = state.train(torch.tensor([tg.tokens_of(samples[i]) for i in ids]))
        out.append(step_record(t, epoch, loss, ids, state.counts))
        if t + 1 in saves:
            torch.save(state.saved(), os.path.join(a.out, "state-%d.pt" % (t + 1)))
    with open(os.path.join(a.out, "steps.json"), "w") as f:
        json.dump(out, f)
    print("REFERENCE OK", a.steps)


def rank(me, world, a, cfg, port):
    import torch.distributed as dist
    dp, ep = cfg["dp"], cfg.get("ep", 1)
    dp_rank, ep_rank = me, me % ep  # tp = pp = 1; Megatron-Core's expert grid: ep ranks consecutive
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=me, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    root = os.path.join(a.mount, "megatron")
    with open(os.path.join(root, LATEST)) as f:
        iteration = int(f.read())
    mine = torch.load(os.path.join(root, "iter_%07d" % iteration, rank_dir(ep_rank, ep), "model_optim_rng.pt"),
                      weights_only=False)
    restore_rng(mine, ep_rank, a.rng_from_ep, "rank %d (ep rank %d of %d)" % (me, ep_rank, ep))
    gathered = [None] * world
    dist.all_gather_object(gathered, (ep_rank, mine) if me < ep else None)  # one file per ep rank
    state = State.from_files(dict(x for x in gathered if x is not None), ep)
    args = mine.get("args", argparse.Namespace())
    consumed = getattr(args, "consumed_train_samples", 0)
    assert consumed % a.batch == 0, "consumed_train_samples %d" % consumed
    t = consumed // a.batch
    steps_per_epoch = -(-a.samples // a.batch)
    epoch, k = divmod(t, steps_per_epoch)
    assert k + a.steps <= steps_per_epoch, "the job would cross an epoch end without a save"
    ids, tokens = tg.read_stream(a.mount, me)
    counts = [tg.part(len(tg.batch_positions(a.samples, a.batch, s)), dp, dp_rank)[1] for s in range(k, steps_per_epoch)]
    assert len(ids) == sum(counts), "rank %d at epoch %d step %d: %d ids, want %d" % (me, epoch, k, len(ids),
                                                                                      sum(counts))
    at, per_rank = 0, EXPERTS // ep
    for s in range(a.steps):
        n = counts[s]
        parts = [None] * world
        dist.all_gather_object(parts, (ids[at:at + n], tokens[at:at + n]))
        at += n
        loss = state.train(torch.tensor([x for _, xs in parts for x in xs]))
        routed = [state.counts[layer * EXPERTS + e] for layer in range(LAYERS)
                  for e in range(ep_rank * per_rank, (ep_rank + 1) * per_rank)]
        assert min(routed) > 0, "rank %d (ep rank %d): a local expert got no token at step %d: %s" % (
            me, ep_rank, t + s, state.counts)
        if me == 0:
            with open(a.log, "a") as f:
                f.write(json.dumps(step_record(t + s, epoch, loss, [i for xs, _ in parts for i in xs],
                                               state.counts)) + "\n")
    t += a.steps
    if me < ep:  # Megatron-LM's legacy save: the expert-data-parallel rank 0 of each ep rank writes
        state.write_into(mine, ep_rank, ep)
        mine["rng_state"] = rng_state(ep_rank)
        mine["iteration"] = t
        mine["args"] = argparse.Namespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                          expert_model_parallel_size=ep, data_parallel_size=dp, world_size=world,
                                          consumed_train_samples=t * a.batch)
        d = os.path.join(root, "iter_%07d" % t, rank_dir(ep_rank, ep))
        os.makedirs(d, exist_ok=True)
        torch.save(mine, os.path.join(d, "model_optim_rng.pt"))
    dist.barrier()
    if me == 0:
        with open(os.path.join(root, LATEST), "w") as f:
            f.write(str(t))
    dist.barrier()
    dist.destroy_process_group()


def job(a):
    with open(os.path.join(a.mount, ".ptcfs", "config")) as f:
        cfg = tg.parse_config(f.read())
    assert cfg["tp"] == cfg["pp"] == 1, "train_moe.py runs tp=1, pp=1: %s" % cfg
    world = cfg["dp"]
    ranks.start(rank, (world, a, cfg, ranks.free_port()), world)
    print("JOB OK", world)


def check(a):
    iteration, ep, files = load_tree(a.tree)
    got = State.from_files(files, ep)
    want = torch.load(os.path.join(a.ref, "state-%d.pt" % a.t))
    assert iteration == a.t, "iteration %d, want %d" % (iteration, a.t)
    for r, sd in files.items():
        assert sd["iteration"] == iteration, "ep rank %d: iteration %d" % (r, sd["iteration"])
        restore_rng(sd, r, ep, "%s: ep rank %d" % (a.tree, r))  # the save's own, per ep rank
        consumed = sd["args"].consumed_train_samples
        assert consumed == a.t * a.batch, "ep rank %d: consumed_train_samples %d" % (r, consumed)
    mc.compare("model", want["model"], got.model())
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        mc.compare(kind, want[kind], getattr(got, kind))
    assert got.step == want["step"], "Adam step %s, want %s" % (got.step, want["step"])
    print("CHECK OK", iteration, "ep", ep)


def steps(a):
    with open(os.path.join(a.ref, "steps.json")) as f:
        ref = json.load(f)
    with open(a.log) as f:
        logged = [json.loads(line) for line in f]
    assert [s["t"] for s in logged] == list(range(len(logged))), [s["t"] for s in logged]
    for s in logged:
        assert s == ref[s["t"]], "step %d: %s, want %s" % (s["t"], s, ref[s["t"]])
    per_epoch = {}
    for s in logged:
        per_epoch.setdefault(s["epoch"], []).extend(s["ids"])
    for epoch, ids in per_epoch.items():
        assert len(set(ids)) == len(ids), "epoch %d repeats a sample" % epoch
    steps_per_epoch = -(-a.samples // len(ref[0]["ids"]))
    if len(logged) >= steps_per_epoch:
        assert sorted(per_epoch[0]) == list(range(a.samples)), "epoch 0 does not consume every sample once"
    print("STEPS OK", len(logged))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    for name in ("tree", "data", "out"):
        r.add_argument(name)
    for name in ("samples", "batch", "seed", "steps"):
        r.add_argument("--" + name, type=int, required=True)
    r.add_argument("--saves", required=True)
    j = sub.add_parser("job")
    j.add_argument("mount")
    for name in ("steps", "samples", "batch"):
        j.add_argument("--" + name, type=int, required=True)
    j.add_argument("--log", required=True)
    j.add_argument("--rng-from-ep", type=int, default=0,
                   help="the ep of the save the job loads (0: the files have no rng_state)")
    c = sub.add_parser("check")
    c.add_argument("tree")
    c.add_argument("ref")
    c.add_argument("t", type=int)
    c.add_argument("--batch", type=int, required=True)
    s = sub.add_parser("steps")
    s.add_argument("ref")
    s.add_argument("log")
    s.add_argument("--samples", type=int, required=True)
    a = p.parse_args()
    {"reference": reference, "job": job, "check": check, "steps": steps}[a.cmd](a)


if __name__ == "__main__":
    main()
