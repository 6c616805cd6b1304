#!/usr/bin/env python3
"""A small GPT trained with Adam by a job whose layout and workers change: the training client
of tests/cluster/cluster_train_test.py, and the uninterrupted run it is compared with.

The model is megatron_ckpt.py's legacy Megatron GPT (layers=4, hidden=32, heads=4, vocab=128,
seq=16; bf16 parameters, fp32 masters, Adam's moments), its checkpoint a Megatron tree of
`torch.save` files. A training step is a function of the global tensors and the global batch
only: each rank gathers every rank's tensors (gloo), every rank computes the step on the whole
model and the whole batch (single-threaded), and each writes back its own part. So the job's
losses and state are bitwise those of one process running the same steps, whatever tp, pp and dp
it runs at and however often it moves; the parallelism under test is ptcfs's: each rank reads
its own rank file and its own samples from the mount of the worker it runs on, and saves through
that mount.

  reference SRC DATA_PREFIX --samples N --batch B --seed S --steps T --saves T1,T2,.. OUT
      The uninterrupted run, without ptcfs: the Megatron tree SRC (megatron_ckpt.py make) and the
      Megatron dataset DATA_PREFIX.{idx,bin} read directly, batches in the order
      docs/dataset_format.md defines (its permutation, written again here), T steps. Writes
      OUT/steps.json (per step: epoch, loss as a hex float, the batch's sample ids) and
      OUT/state-Ti.pt (the global model, fp32 masters, moments and Adam step after Ti steps).
  rank MOUNT --steps K --samples N --batch B --log LOG [--hold DIR]
      One rank of the job (env RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; gloo). The layout is
      MOUNT/.ptcfs/config. Loads the latest iteration of MOUNT/megatron (its (tp, pp) file) and
      its data stream from MOUNT/data/rank-RRRRR, trains K steps (rank 0 appends each step to
      LOG as JSON), then saves: each dp-0 rank writes its file through MOUNT, rank 0 then writes
      the latest file. --hold: rank 0 makes DIR/held once every rank file is written and waits
      for DIR/go before it writes the latest file. Exit 4 when the latest file's close fails (the
      save was refused).
  check TREE TP PP REF_DIR T
      TREE (a Megatron tree of the job's grid) holds exactly the reference's state after T
      steps: every parameter, fp32 master and moment bit for bit, Adam's step, the iteration and
      the data position (args.consumed_train_samples).

Needs torch (Debian's python3-torch); prints "<CMD> OK" on success.
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt as mc  # noqa: E402

HEAD_DIM = mc.HIDDEN // mc.HEADS
FIRST_ITERATION = 100  # megatron_ckpt.py make's; the job's iteration is this plus its steps
# Adam without weight decay, the same for every parameter (the groups' settings in the files
# are carried, not used).
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.95, 1e-8
LATEST = "latest_checkpointed_iteration.txt"

torch.set_num_threads(1)  # one summation order, whatever the machine


# The order of an epoch (docs/dataset_format.md, "The order of an epoch").
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(x):
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def permutation(n, seed, epoch):
    bits = max(2, (n - 1).bit_length())
    h = (bits + 1) // 2
    mask = (1 << h) - 1
    s = mix(seed ^ 0x70746366735F6461) ^ mix(epoch + GOLDEN)
    keys = []
    for _ in range(4):
        s = (s + GOLDEN) & M64
        keys.append(mix(s))

    def network(x):
        left, right = x >> h, x & mask
        for k in keys:
            left, right = right, left ^ (mix(right ^ k) & mask)
        return (left << h) | right

    def at(p):
        x = network(p)
        while x >= n:
            x = network(x)
        return x

    return [at(p) for p in range(n)]


def batch_positions(samples, batch, step):
    return range(step * batch, min((step + 1) * batch, samples))


def part(length, dp, d):
    """(start, count) of dp rank d's part of a batch of `length` samples."""
    q, extra = divmod(length, dp)
    return d * q + min(d, extra), q + (1 if d < extra else 0)


# Megatron .idx/.bin (docs/dataset_format.md, "Source formats").
IDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
              8: np.uint16}


def read_samples(prefix):
    """Every sample's tokens of PREFIX.idx/.bin, as numpy arrays."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\0\0", prefix + ".idx: magic"
    dtype = np.dtype(IDX_DTYPES[idx[17]])
    n = int.from_bytes(idx[18:26], "little")
    lengths = np.frombuffer(idx, np.int32, n, 34)
    offsets = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    data = open(prefix + ".bin", "rb").read()
    return [np.frombuffer(data, dtype, int(lengths[i]), int(offsets[i])) for i in range(n)]


def tokens_of(sample):
    assert len(sample) > mc.SEQ, "a sample shorter than seq + 1 tokens"
    return [int(x) for x in sample[:mc.SEQ + 1]]


# The model and a step.
def forward(p, tokens):
    """Mean cross entropy of next-token prediction over the batch (Megatron's qkv layout:
    per head q, k, v rows together)."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    b, s = x.shape
    h = p[("emb",)][x] + p[("pos",)][:s]
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    for i in range(mc.LAYERS):
        w = lambda name: p[("layer", i, name)]  # noqa: E731
        a = F.layer_norm(h, (mc.HIDDEN,), w("input_layernorm.weight"), w("input_layernorm.bias"))
        qkv = F.linear(a, w("self_attention.query_key_value.weight"), w("self_attention.query_key_value.bias"))
        q, k, v = qkv.view(b, s, mc.HEADS, 3, HEAD_DIM).unbind(3)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        att = att.masked_fill(causal, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, mc.HIDDEN)
        h = h + F.linear(o, w("self_attention.dense.weight"), w("self_attention.dense.bias"))
        m = F.layer_norm(h, (mc.HIDDEN,), w("post_attention_layernorm.weight"), w("post_attention_layernorm.bias"))
        m = F.gelu(F.linear(m, w("mlp.dense_h_to_4h.weight"), w("mlp.dense_h_to_4h.bias")))
        h = h + F.linear(m, w("mlp.dense_4h_to_h.weight"), w("mlp.dense_4h_to_h.bias"))
    h = F.layer_norm(h, (mc.HIDDEN,), p[("final", "weight")], p[("final", "bias")])
    logits = h @ p[("emb",)].t()
    return F.cross_entropy(logits.reshape(-1, mc.VOCAB), y.reshape(-1))


class State:
    """The global training state: fp32 masters, Adam's moments and step."""

    def __init__(self, fp32, exp_avg, exp_avg_sq, step):
        self.fp32, self.exp_avg, self.exp_avg_sq, self.step = fp32, exp_avg, exp_avg_sq, step

    @staticmethod
    def from_tree(files, tp, pp):
        """From a Megatron tree's rank files ((tp_rank, pp_rank) -> state dict) of grid tp x pp."""
        gopt = {k: mc.gather(f, tp, pp) for k, f in mc.optimizer_as_models(files).items()}
        steps = {float(s) for f in files.values() for s in mc.optimizer_by_param(f)["step"]}
        assert len(steps) == 1, "Adam's step differs between parameters: %s" % steps
        return State(gopt["fp32"], gopt["exp_avg"], gopt["exp_avg_sq"], steps.pop())

    def model(self):
        return {k: v.to(torch.bfloat16) for k, v in self.fp32.items()}

    def loss(self, params, tokens):
        """The loss of the batch under `params` (the model's forward; train_moe.py's is another)."""
        return forward(params, tokens)

    def train(self, tokens):
        """One step on the batch `tokens` ([b, seq + 1]); returns the loss."""
        params = {k: v.clone().requires_grad_() for k, v in self.fp32.items()}
        loss = self.loss(params, tokens)
        loss.backward()
        self.step += 1
        bc1, bc2 = 1 - BETA1 ** self.step, 1 - BETA2 ** self.step
        for k, p in self.fp32.items():
            g = params[k].grad
            self.exp_avg[k].mul_(BETA1).add_(g, alpha=1 - BETA1)
            self.exp_avg_sq[k].mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
            p.addcdiv_(self.exp_avg[k], (self.exp_avg_sq[k] / bc2).sqrt().add_(EPS), value=-LR / bc1)
        return loss.item()

    def saved(self):
        return {"model": self.model(), "fp32": self.fp32, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq,
                "step": self.step}


def reference(a):
    _, files = mc.load_tree(a.src)
    tp = max(t for t, _ in files) + 1
    pp = max(p for _, p in files) + 1
    state = State.from_tree(files, tp, pp)
    samples = read_samples(a.data)
    steps_per_epoch = -(-a.samples // a.batch)
    saves = {int(t) for t in a.saves.split(",")}
    os.makedirs(a.out, exist_ok=True)
    out, orders = [], {}
    for t in range(a.steps):
        epoch, k = divmod(t, steps_per_epoch)
        order = orders.setdefault(epoch, permutation(a.samples, a.seed, epoch))
        ids = [order[p] for p in batch_positions(a.samples, a.batch, k)]
        loss = state.train(torch.tensor([tokens_of(samples[i]) for i in ids]))
        out.append({"t": t, "epoch": epoch, "loss": loss.hex(), "ids": ids})
        if t + 1 in saves:
            torch.save(state.saved(), os.path.join(a.out, "state-%d.pt" % (t + 1)))
    with open(os.path.join(a.out, "steps.json"), "w") as f:
        json.dump(out, f)
    print("REFERENCE OK", a.steps)


def parse_config(text):
    c = {"tp": 1, "pp": 1, "dp": 1}
    for item in text.strip().split(","):
        k, v = item.split("=")
        c[k] = v if k == "workers" else int(v)
    return c


def read_stream(mount, rank):
    """The rank's data files: its sample ids to the end of the epoch and their tokens."""
    d = os.path.join(mount, "data", "rank-%05d" % rank)
    with open(os.path.join(d, "ids.txt")) as f:
        ids = [int(line) for line in f]
    samples = read_samples(os.path.join(d, "samples"))
    assert len(samples) == len(ids), "%s: %d ids, %d samples" % (d, len(ids), len(samples))
    return ids, [tokens_of(s) for s in samples]


def rank(a):
    import torch.distributed as dist
    me, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(os.path.join(a.mount, ".ptcfs", "config")) as f:
        cfg = parse_config(f.read())
    tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
    assert tp * pp * dp == world, "config %s has %d ranks, not %d" % (cfg, tp * pp * dp, world)
    tp_rank, dp_rank, pp_rank = me % tp, (me // tp) % dp, me // (tp * dp)  # Megatron's rank order
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
                            rank=me, world_size=world, timeout=datetime.timedelta(seconds=120))
    root = os.path.join(a.mount, "megatron")
    with open(os.path.join(root, LATEST)) as f:
        iteration = int(f.read())
    mine = torch.load(os.path.join(root, "iter_%07d" % iteration, mc.rank_dir(tp_rank, pp_rank, pp),
                                   "model_optim_rng.pt"))
    gathered = [None] * world
    dist.all_gather_object(gathered, ((tp_rank, pp_rank), mine) if dp_rank == 0 else None)
    files = dict(x for x in gathered if x is not None)
    state = State.from_tree(files, tp, pp)
    batch = a.batch
    consumed = getattr(mine["args"], "consumed_train_samples", 0)
    assert consumed % batch == 0, "consumed_train_samples %d" % consumed
    t = consumed // batch
    steps_per_epoch = -(-a.samples // batch)
    epoch, k = divmod(t, steps_per_epoch)
    assert k + a.steps <= steps_per_epoch, "the job would cross an epoch end without a save"
    ids, tokens = read_stream(a.mount, me)
    # The stream holds this dp rank's part of every batch to the end of the epoch.
    counts = [part(len(batch_positions(a.samples, batch, s)), dp, dp_rank)[1] for s in range(k, steps_per_epoch)]
    assert len(ids) == sum(counts), "rank %d at epoch %d step %d: %d ids, want %d" % (me, epoch, k, len(ids),
                                                                                      sum(counts))
    at = 0
    for s in range(a.steps):
        n = counts[s]
        parts = [None] * world
        dist.all_gather_object(parts, (dp_rank, ids[at:at + n], tokens[at:at + n]))
        at += n
        by_dp = {}
        for d, i, x in parts:
            assert by_dp.setdefault(d, (i, x)) == (i, x), "tp/pp peers of dp rank %d read different samples" % d
        step_ids = [i for d in range(dp) for i in by_dp[d][0]]
        loss = state.train(torch.tensor([x for d in range(dp) for x in by_dp[d][1]]))
        if me == 0:
            with open(a.log, "a") as f:
                f.write(json.dumps({"t": t + s, "epoch": epoch, "loss": loss.hex(), "ids": step_ids}) + "\n")
    t += a.steps
    iteration = FIRST_ITERATION + t
    if dp_rank == 0:  # Megatron: the first data-parallel rank of each (tp, pp) writes the file
        args = mine["args"]
        args.tensor_model_parallel_size, args.pipeline_model_parallel_size = tp, pp
        args.consumed_train_samples = t * batch
        groups = mine["optimizer"]["optimizer"]["param_groups"]
        settings = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        gopt = {"fp32": state.fp32, "exp_avg": state.exp_avg, "exp_avg_sq": state.exp_avg_sq}
        sd = {"iteration": iteration, "checkpoint_version": 3.0, "args": args, "rng_state": mine["rng_state"],
              "model": mc.rank_model(state.model(), tp, pp, tp_rank, pp_rank),
              "optimizer": mc.rank_optimizer(gopt, tp, pp, tp_rank, pp_rank, steps=torch.tensor(state.step),
                                             settings=settings, exact=True)}
        d = os.path.join(root, "iter_%07d" % iteration, mc.rank_dir(tp_rank, pp_rank, pp))
        os.makedirs(d, exist_ok=True)
        torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
    dist.barrier()
    if me == 0:
        if a.hold:
            open(os.path.join(a.hold, "held"), "w").close()
            while not os.path.exists(os.path.join(a.hold, "go")):
                time.sleep(0.05)
        try:
            with open(os.path.join(root, LATEST), "w") as f:
                f.write(str(iteration))
        except OSError as e:
            print("SAVE REFUSED:", e, flush=True)
            os._exit(4)  # the other ranks may be gone: no collective, no teardown
    dist.barrier()
    print("RANK OK", me, iteration)


def check(a):
    iteration, files = mc.load_tree(a.tree)
    assert sorted(files) == sorted((t, p) for t in range(a.tp) for p in range(a.pp)), "rank files %s" % sorted(files)
    got = State.from_tree(files, a.tp, a.pp)
    want = torch.load(os.path.join(a.ref, "state-%d.pt" % a.t))
    assert iteration == FIRST_ITERATION + a.t, "iteration %d, want %d" % (iteration, FIRST_ITERATION + a.t)
    for (tp_rank, pp_rank), sd in files.items():
        consumed = sd["args"].consumed_train_samples
        assert sd["iteration"] == iteration, "mp_rank %d %d: iteration %d" % (tp_rank, pp_rank, sd["iteration"])
        assert consumed == a.t * a.batch, "mp_rank %d %d: consumed_train_samples %d" % (tp_rank, pp_rank, consumed)
    mc.compare("model", want["model"], mc.gather(files, a.tp, a.pp))
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        mc.compare(kind, want[kind], getattr(got, kind))
    assert got.step == want["step"], "Adam step %s, want %s" % (got.step, want["step"])
    print("CHECK OK", iteration)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("src")
    r.add_argument("data")
    r.add_argument("out")
    for name in ("samples", "batch", "seed", "steps"):
        r.add_argument("--" + name, type=int, required=True)
    r.add_argument("--saves", required=True)
    k = sub.add_parser("rank")
    k.add_argument("mount")
    for name in ("steps", "samples", "batch"):
        k.add_argument("--" + name, type=int, required=True)
    k.add_argument("--log", required=True)
    k.add_argument("--hold")
    c = sub.add_parser("check")
    c.add_argument("tree")
    c.add_argument("tp", type=int)
    c.add_argument("pp", type=int)
    c.add_argument("ref")
    c.add_argument("t", type=int)
    c.add_argument("--batch", type=int, required=True)
    a = p.parse_args()
    {"reference": reference, "rank": rank, "check": check}[a.cmd](a)


if __name__ == "__main__":
    main()
