#!/usr/bin/env python3
"""A training job checkpoints through its mounts while its layout and workers change
(docs/cluster.md, "Saves on many workers"): three ptcfs workers, each in a network namespace of
its own, one job in a real etcd, and a real multi-process PyTorch job (tests/clients/train_gpt.py:
a small GPT with Adam, gloo between the namespaces' addresses, Debian's python3-torch). Each rank
process runs in the namespace of the worker its rank is placed on, reads its Megatron rank file
and its samples from that worker's mount and saves through it.

  t  0 -> 4   tp=2,pp=1,dp=2 on workers 0 and 1 (4 ranks); worker 2 a member without ranks
  t  4 -> 8   tp=1,pp=2,dp=3 on workers 0-2 (6 ranks), reconfigured across the workers
  t  8 -> 12  the same with replicas=2; the last batch of epoch 0 (90 samples, batches of 8:
              12 steps, the last of 2 samples): the save moves every worker to epoch 1, step 0
  t 12 -> 14  worker 2's daemon and its ranks are killed (-9) once every rank file of the save is
              written, before the latest file: the save is committed nowhere, the latest file's
              close fails, and the survivors move on their own onto workers 0 and 1 from t = 12
  t 12 -> 15  on the survivors
  t 15 -> 18  worker 2 back (its old store brought up to date), tp=2,pp=1,dp=3 on workers 0-2

After every committed save, the rank files of the mounts together hold bit for bit the state of
the same steps run uninterrupted without ptcfs (train_gpt.py reference: the Megatron tree and the
dataset files read directly, the epoch order computed from docs/dataset_format.md): every
parameter, fp32 master and Adam moment, Adam's step, the iteration; every worker serves the
data position the save names; and the durable tier (--durable) holds one copy, of the save's new
contents (ptcfs cluster status and every mount's status say so), the copy before it removed. Every step's loss and batch (the aborted segment's too) equal the
reference's, and the committed steps consume every sample of epoch 0 exactly once and epoch 1's
first six batches in its order.

Usage: cluster_train_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, skip_or_fail, start_etcd  # noqa: E402
from workers import (Model, client_python, job_token, job_url, joined_megatron_tree, kill, reconfigure,  # noqa: E402
                     remove_tmp, start_worker, start_workers, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA, DIMS = "megatron-gpt", "layers=4,hidden=32,heads=4,vocab=128,seq=16"  # train_gpt.py's model
CLIENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients")
TORCH = "/usr/bin/python3"
CLIENT = client_python(TORCH)  # a client script's run: a fork of a Python that imported torch once
MODEL = Model(PTCFS, SCHEMA, DIMS)
ptcfs = MODEL.run
WORKERS, PORT, JOB = 3, 7431, "train"
SAMPLES, BATCH, SEED = 90, 8, 5  # 12 steps per epoch
STEPS, SAVES = 18, (4, 8, 12, 15, 18)
FIRST_ITERATION = 100  # train_gpt.py's
LATEST = "latest_checkpointed_iteration.txt"


def parse_config(text):
    c = {"tp": 1, "pp": 1, "dp": 1, "per_worker": 1}
    for item in text.strip().split(","):
        k, v = item.split("=")
        c[k] = v if k == "workers" else int(v)
    return c


def placement(cfg):
    """The worker of each rank: slot rank // per_worker, on the config's workers (0, 1, ... by default)."""
    world = cfg["tp"] * cfg["pp"] * cfg["dp"]
    slots = -(-world // cfg["per_worker"])
    workers = [int(w) for w in cfg["workers"].split("+")] if "workers" in cfg else list(range(slots))
    return [workers[r // cfg["per_worker"]] for r in range(world)]


class Job:
    """The cluster, the training job's segments and what they logged."""

    def __init__(self, ns, tmp, mnts, daemons, url, token):
        self.ns, self.tmp, self.mnts, self.daemons, self.url, self.token = ns, tmp, mnts, daemons, url, token
        self.live = list(range(WORKERS))
        self.segments = 0
        self.committed = []  # the steps of committed segments, as logged
        with open(os.path.join(tmp, "ref", "steps.json")) as f:
            self.ref = json.load(f)

    def config(self):
        cfg = status(self.mnts[self.live[0]])["config"]
        for w in self.live:
            assert status(self.mnts[w])["config"] == cfg, "workers serve different configs"
        return cfg

    def start(self, steps, hold=None):
        """Starts one process per rank of the current config, each in its worker's namespace."""
        cfg = parse_config(self.config())
        where = placement(cfg)
        self.segments += 1
        log = os.path.join(self.tmp, "steps-%d.jsonl" % self.segments)
        env = dict(os.environ, WORLD_SIZE=str(len(where)), MASTER_ADDR=self.ns.addr(where[0]),
                   MASTER_PORT=str(29500 + self.segments), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
        procs = []
        for r, w in enumerate(where):
            out = open(os.path.join(self.tmp, "rank%d-%d.log" % (r, self.segments)), "w")
            argv = [*CLIENT, os.path.join(CLIENTS, "train_gpt.py"), "rank", self.mnts[w], "--steps", str(steps),
                    "--samples", str(SAMPLES), "--batch", str(BATCH), "--log", log]
            procs.append(self.ns.popen(w, argv + (["--hold", hold] if hold else []), env=dict(env, RANK=str(r)),
                                       stdout=out, stderr=subprocess.STDOUT))
        return cfg, where, procs, log

    def rank_log(self, r):
        with open(os.path.join(self.tmp, "rank%d-%d.log" % (r, self.segments))) as f:
            return f.read()

    def train(self, steps, t):
        """Trains `steps` steps from step t and saves; checks the save on every live worker."""
        t0 = time.time()
        cfg, where, procs, log = self.start(steps)
        for r, p in enumerate(procs):
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise AssertionError("rank %d hangs:\n%s" % (r, self.rank_log(r)))
            assert p.returncode == 0, "rank %d on worker %d: exit %d\n%s" % (r, where[r], p.returncode,
                                                                             self.rank_log(r))
        logged = self.expect_steps(log, t, steps)
        self.committed += logged
        self.expect_saved(cfg, where, t + steps)
        self.expect_durable()
        print("ok   t %2d -> %2d at %s on workers %s: %d ranks trained and saved, equal to the uninterrupted run "
              "bit for bit, copied into the durable tier, in %.1f s" % (t, t + steps, self.config(),
                                                                       sorted(set(where)), len(where), time.time() - t0))

    def expect_steps(self, log, t, steps):
        """The segment's steps, each with the reference's loss and batch."""
        with open(log) as f:
            logged = [json.loads(line) for line in f]
        assert [s["t"] for s in logged] == list(range(t, t + steps)), [s["t"] for s in logged]
        for s in logged:
            want = self.ref[s["t"]]
            assert s["ids"] == want["ids"], "step %d: batch %s, want %s" % (s["t"], s["ids"], want["ids"])
            assert s["loss"] == want["loss"], "step %d: loss %s, want %s" % (s["t"], s["loss"], want["loss"])
        return logged

    def expect_saved(self, cfg, where, t):
        """Every live worker serves the save of step t; the mounts' rank files equal the reference."""
        iteration = FIRST_ITERATION + t

        def served(w):
            s = status(self.mnts[w])
            with open(os.path.join(self.mnts[w], "megatron", LATEST)) as f:
                return s["state"] == "serving" and f.read() == str(iteration)
        for w in self.live:
            wait_for("worker %d serving iteration %d" % (w, iteration), lambda: served(w), mnts=self.mnts)
            s = status(self.mnts[w])
            assert s["last_error"] is None, s
            epoch, step = divmod(t, -(-SAMPLES // BATCH))
            d = s["dataset"]
            assert (d["epoch"], d["step"]) == (epoch, step), "worker %d: %s, want epoch %d step %d" % (w, d, epoch, step)
        tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
        # Each rank file from the worker of its dp-0 rank (Megatron's rank order: tp, dp, pp).
        tree = joined_megatron_tree(os.path.join(self.tmp, "joined-%d" % t), self.mnts, iteration, tp, pp,
                                    lambda r, p: where[p * tp * dp + r])
        out = subprocess.run([*CLIENT, os.path.join(CLIENTS, "train_gpt.py"), "check", tree, str(tp), str(pp),
                              os.path.join(self.tmp, "ref"), str(t), "--batch", str(BATCH)],
                             capture_output=True, text=True)
        assert out.returncode == 0 and "CHECK OK" in out.stdout, out.stdout + out.stderr

    def expect_durable(self):
        """The durable tier holds one copy, of the save's new contents: `ptcfs cluster status`
        and every live mount say so, and the copies before it are removed."""
        durable = os.path.join(self.tmp, "durable")

        def one_copy():
            r = subprocess.run([PTCFS, "cluster", "status", "--cluster", self.url, "--token-file", self.token, "--json",
                                "--durable", durable], capture_output=True, text=True)
            if r.returncode != 0 and "no live worker serves generation" in r.stderr:
                return False  # the job committed a change (the save's replica copy) no worker applied yet
            assert r.returncode == 0, "ptcfs cluster status: exit %d\n%s" % (r.returncode, r.stderr)
            j = json.loads(r.stdout)
            with open(os.path.join(durable, "durable.json")) as f:
                files = {s["file"].split("/")[0] for s in json.load(f)["shards"]}
            gens = {d for d in os.listdir(durable) if d.startswith("gen-")}
            return j["durable"]["copy"] and gens == files
        wait_for("the durable tier's copy of the save", one_copy, mnts=self.mnts)
        for w in self.live:
            wait_for("worker %d's status of the durable copy" % w,
                     lambda: status(self.mnts[w])["cluster"]["durable"]["copy"] == "complete", mnts=self.mnts)

    def reconfigure(self, config):
        reconfigure(self.mnts[self.live[0]], config)
        for w in self.live:
            wait_for("worker %d serving %s" % (w, config),
                     lambda: status(self.mnts[w])["config"] == config and status(self.mnts[w])["state"] == "serving",
                     mnts=self.mnts)

    def replicas_whole(self):
        """Waits until the job's change is done and no single loss would lose a tensor."""
        def whole():
            j = MODEL.cluster_json(self.url, self.token)
            return j["change"] is None and all(w["live"] and w["if_lost"]["lost_tensors"] == [] for w in j["workers"])
        wait_for("the replicas made whole", whole, mnts=self.mnts)

    def kill_mid_save(self, steps, t, victim):
        """Trains `steps` from t; once every rank file is written, kills worker `victim` and its
        ranks; the save must be refused (rank 0 exits 4) and committed nowhere."""
        hold = os.path.join(self.tmp, "hold")
        os.makedirs(hold)
        cfg, where, procs, log = self.start(steps, hold)
        wait_for("every rank file of the save written", lambda: os.path.exists(os.path.join(hold, "held")) or
                 any(p.poll() is not None for p in procs), 300, mnts=self.mnts)
        assert os.path.exists(os.path.join(hold, "held")), "a rank ended early:\n" + "\n".join(
            self.rank_log(r) for r, p in enumerate(procs) if p.poll() is not None)
        kill(self.daemons, self.mnts, [victim])
        for r, p in enumerate(procs):
            if where[r] == victim:
                os.killpg(p.pid, signal.SIGKILL)
        self.live.remove(victim)
        open(os.path.join(hold, "go"), "w").close()
        try:
            rc = procs[0].wait(timeout=120)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        assert rc == 4 and "SAVE REFUSED" in self.rank_log(0), "rank 0: exit %d\n%s" % (rc, self.rank_log(0))
        self.expect_steps(log, t, steps)  # the same losses, but not committed: these steps run again
        print("ok   worker %d killed mid-save at t %d: the latest file's close failed (%s)" %
              (victim, t + steps, self.rank_log(0).strip().splitlines()[-1][:160]))

    def expect_exactly_once(self):
        """The committed steps, in order, consume each epoch in the reference's order, each sample once."""
        assert [s["t"] for s in self.committed] == list(range(STEPS)), [s["t"] for s in self.committed]
        per_epoch = {}
        for s in self.committed:
            per_epoch.setdefault(s["epoch"], []).extend(s["ids"])
        assert sorted(per_epoch[0]) == list(range(SAMPLES)), "epoch 0 does not consume every sample once"
        assert len(set(per_epoch[1])) == len(per_epoch[1]) == (STEPS - 12) * BATCH, "epoch 1 repeats a sample"
        print("ok   epoch 0 consumed every one of its %d samples once, epoch 1 its first %d once, in the "
              "uninterrupted run's order" % (SAMPLES, len(per_epoch[1])))


def main():
    require(etcd=True)
    if subprocess.run([TORCH, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                      capture_output=True).returncode != 0:
        skip_or_fail("no torch with gloo under %s (Debian's python3-torch)" % TORCH)
    tmp = tempfile.mkdtemp(prefix="ptcfs-train-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            src, ds = os.path.join(tmp, "src"), os.path.join(tmp, "ds")
            out = subprocess.run([*CLIENT, os.path.join(CLIENTS, "megatron_ckpt.py"), "make", src, "--tp", "2", "--pp",
                                  "1", "--args", "--optimizer", "--iteration", str(FIRST_ITERATION)],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            whole = os.path.join(tmp, "whole")
            ptcfs("import", "--format", "megatron", "--schema", SCHEMA, "--dims", DIMS, "--config",
                  "tp=2,pp=1,dp=2,per_worker=2", src, whole)
            ptcfs("data", "synth", "--samples", str(SAMPLES), "--min-len", "17", "--max-len", "40", "--vocab", "128",
                  "--seed", "3", ds)
            ptcfs("data", "import", ds, whole, "--global-batch", str(BATCH), "--seed", str(SEED))
            out = subprocess.run([*CLIENT, os.path.join(CLIENTS, "train_gpt.py"), "reference", src, ds,
                                  os.path.join(tmp, "ref"), "--samples", str(SAMPLES), "--batch", str(BATCH), "--seed",
                                  str(SEED), "--steps", str(STEPS), "--saves", ",".join(map(str, SAVES))],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            print("ok   the uninterrupted run: %d steps without ptcfs" % STEPS)

            stores = [worker_store(whole, os.path.join(tmp, "store%d" % w), w) for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "secret-token-of-the-training-job")
            url = job_url(etcd, JOB)

            options = ["--lease", "2", "--format", "megatron", "--durable", os.path.join(tmp, "durable")]
            start_workers(ns, PTCFS, daemons, stores, mnts, url, token, PORT, tmp, options)
            job = Job(ns, tmp, mnts, daemons, url, token)

            job.train(4, 0)
            job.reconfigure("tp=1,pp=2,dp=3,per_worker=2")
            job.train(4, 4)
            job.reconfigure("tp=1,pp=2,dp=3,per_worker=2,replicas=2")
            job.train(4, 8)
            job.replicas_whole()

            job.kill_mid_save(2, 12, victim=2)
            t0 = time.time()
            for w in job.live:
                wait_for("worker %d serving the survivors' config" % w,
                         lambda: 2 not in placement(parse_config(status(mnts[w])["config"])) and
                         status(mnts[w])["state"] == "serving", 60, mnts=mnts)
            with open(os.path.join(mnts[0], "megatron", LATEST)) as f:
                assert f.read() == str(FIRST_ITERATION + 12), "the survivors do not serve the save of t = 12"
            print("ok   the survivors serve %s from the save of t = 12 after %.1f s" % (job.config(), time.time() - t0))
            job.train(3, 12)

            daemons[2] = start_worker(ns, PTCFS, 2, stores[2], mnts[2], url, token, PORT,
                                      os.path.join(tmp, "worker2.log"), options)
            job.live = list(range(WORKERS))
            wait_for("worker 2 back at the job's generation",
                     lambda: status(mnts[2])["state"] == "serving" and
                     status(mnts[2])["generation"] == status(mnts[0])["generation"], 60, mnts=mnts)
            job.reconfigure("tp=2,pp=1,dp=3,per_worker=2,replicas=2")
            job.train(3, 15)
            job.expect_exactly_once()
    finally:
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS cluster_train_test")


if __name__ == "__main__":
    main()
