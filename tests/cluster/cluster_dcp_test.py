#!/usr/bin/env python3
"""PyTorch DCP from a cluster job's mounts (docs/dcp_format.md): two ptcfs workers, each in a
network namespace of its own, one job in a real etcd, `--format all --ckpt-format torch_dist`.

  tp=2,pp=2 (two ranks per worker): on each worker, in its namespace, torch's dcp.load in two
  gloo processes reads the whole checkpoint from that worker's own mount (plain tensors and
  DTensor shards): every tensor equals `ptcfs synth` of it bit for bit, the chunks stored on
  the other worker read through the mount over the peer data plane. Both mounts show the same
  checkpoint: `.metadata` and each worker's chunk file `cmp`-equal between them.
  Reconfigured across the workers to tp=1,pp=2 (one rank each): the same again.
  A dcp.save through the mounts: two gloo ranks, one in each worker's namespace, each saving
  its dim-0 shards (DTensors, with Adam's step and param_groups) of other tensors (another
  seed) into its own worker's mount; rank 0's .metadata commits the save as a change of the
  job, each worker's chunk file becoming its pieces: both workers serve the saved tensors bit
  for bit (dcp.load) and its Adam steps and param groups (whichever rank's file held them),
  then again after a reconfigure to tp=2,pp=2; the staged files are gone.
  A save whose chunk file reached no worker (the second rank saving into another directory)
  is refused on every worker (rank 0's rename of .metadata fails with EIO), nothing committed.
  Megatron-Core's own torch_dist save through megatron/ (`--ckpt-format torch_dist`): a bf16
  GPTModel and Megatron-Core's optimizer at tp=2, one gloo rank in each worker's namespace,
  loaded from another store's legacy render (other tensors) with an Adam step and group settings
  of their own, `dist_checkpointing.save` each rank into its own worker's mount, rank 0's
  tracker write commits it on both at its iteration: both serve its tensors bit for bit
  (dcp.load), and Megatron-Core's optimizer loads the step and settings back from worker 1's
  mount at tp=1,pp=2 (tests/clients/mcore_dist.py).

Uses the venv that tools/setup-deps.sh makes (torch 2, safetensors, megatron-core):
tests/clients/dcp_clients.py, tests/clients/mcore_dist.py.

Usage: cluster_dcp_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, skip_or_fail, start_etcd  # noqa: E402
from workers import (Model, at_generation, client_python, job_token, job_url, reconfigure, remove_tmp,  # noqa: E402
                     start_workers, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PYTHON = os.path.join(os.environ.get("PTCFS_VENV", os.path.join(ROOT, ".venv")), "bin", "python")
CLIENT_PYTHON = client_python(VENV_PYTHON)
CLIENT = os.path.join(ROOT, "tests", "clients", "dcp_clients.py")
MCORE = os.path.join(ROOT, "tests", "clients", "mcore_dist.py")
# The model of tests/clients/mcore_gpt.py (Megatron-Core's GPTModel builds it), in bf16.
SCHEMA, DIMS, DTYPE = "llama", "layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32", "bf16"
ptcfs = Model(PTCFS, SCHEMA, DIMS).run
WORKERS, PORT, JOB = 2, 7451, "dcp"


def expect_loads(ns, mnts, ref, tag):
    """dcp.load in two processes on each worker, from its own mount, equals the reference."""
    for w in range(WORKERS):
        r = ns.run(w, [*CLIENT_PYTHON, CLIENT, "load", os.path.join(mnts[w], "dcp"), ref, "--procs", "2"],
                   capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "LOAD OK" in r.stdout, "worker %d (%s): %s%s" % (w, tag, r.stdout, r.stderr)
    names = sorted(os.listdir(os.path.join(mnts[0], "dcp")))
    assert names == sorted(os.listdir(os.path.join(mnts[1], "dcp"))), names
    assert ".metadata" in names and "__0_0.distcp" in names and "__1_0.distcp" in names, names
    for name in names:
        a, b = (os.path.join(m, "dcp", name) for m in mnts)
        if os.path.isdir(a):  # the last save's own directory (dcp/step-N): its files
            assert sorted(os.listdir(a)) == sorted(os.listdir(b)), name
            for inner in os.listdir(a):
                assert filecmp.cmp(os.path.join(a, inner), os.path.join(b, inner), shallow=False), \
                    "%s/%s differs between the workers' mounts" % (name, inner)
            continue
        assert filecmp.cmp(a, b, shallow=False), "%s differs between the workers' mounts" % name
    print("ok   %s: dcp.load in 2 processes on each worker equals synth; both mounts show the same %s" %
          (tag, " ".join(names)))


def save_ranks(ns, mnts, name, ref, lose_rank_1_file=False):
    """dcp.save of `ref` by two gloo ranks, rank w in worker w's namespace into its own mount."""
    env = dict(os.environ, WORLD_SIZE=str(WORKERS), MASTER_ADDR=ns.addr(0), MASTER_PORT=str(PORT + 40),
               GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    # Losing rank 1's file: it saves into another directory of its mount, so no worker holds
    # __1_0.distcp where rank 0's .metadata says.
    dirs = [name, name + "-elsewhere" if lose_rank_1_file else name]
    argv = lambda w: [*CLIENT_PYTHON, CLIENT, "save-rank", os.path.join(mnts[w], "dcp", dirs[w]), ref]  # noqa: E731
    procs = [ns.popen(w, argv(w), env=dict(env, RANK=str(w)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      text=True) for w in range(WORKERS)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if lose_rank_1_file:
        assert procs[0].returncode != 0, "rank 0's save of %s should fail: %s" % (name, outs[0])
        return
    for w, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and "SAVE RANK OK" in out, "rank %d's save of %s: %s" % (w, name, out)


def torch_dist_save(ns, mnts, legacy, iteration):
    """Megatron-Core's dist_checkpointing.save of `iteration` by two gloo ranks (tp=2), rank w in
    worker w's namespace into its own mount's megatron/, the model and optimizer loaded from the
    legacy tree `legacy` (tweaked: a step and settings of their own); rank 0's tracker write
    commits it on both workers, or fails."""
    before = status(mnts[0])["generation"]
    env = dict(os.environ, WORLD_SIZE=str(WORKERS), MASTER_ADDR=ns.addr(0), MASTER_PORT=str(PORT + 41),
               GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    procs = [ns.popen(w, [*CLIENT_PYTHON, MCORE, "optim-save-rank", os.path.join(mnts[w], "megatron"), legacy,
                          str(iteration)], env=dict(env, RANK=str(w)), stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True) for w in range(WORKERS)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for w, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and "OPTIM-SAVE-RANK OK" in out, "rank %d's torch_dist save: %s" % (w, out)
    for w in range(WORKERS):
        wait_for("worker %d at generation %d" % (w, before + 1), lambda: at_generation(mnts[w], before + 1), mnts=mnts)
        with open(os.path.join(mnts[w], "megatron", "latest_checkpointed_iteration.txt")) as f:
            assert f.read().strip() == str(iteration), w
        assert status(mnts[w])["cluster"]["pieces"] > 0, status(mnts[w])
    print("ok   Megatron-Core's torch_dist save of iteration %d by a rank on each worker committed on both" % iteration)


def main():
    require(etcd=True)
    if subprocess.run([VENV_PYTHON, "-c", "import torch.distributed.checkpoint, safetensors"],
                      capture_output=True).returncode != 0:
        skip_or_fail("no torch 2 with safetensors in %s (bash tools/setup-deps.sh makes it)" % VENV_PYTHON)
    tmp = tempfile.mkdtemp(prefix="ptcfs-dcp-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            first = "tp=2,pp=2,per_worker=2"
            for name, config in (("saved", first), ("ref", "tp=1")):
                ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--dtype", DTYPE, "--config", config, "--optimizer",
                      "adam", "--seed", "7", os.path.join(tmp, name))
            ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", first, os.path.join(tmp, "saved"),
                  os.path.join(tmp, "whole"))
            stores = [worker_store(os.path.join(tmp, "whole"), os.path.join(tmp, "store%d" % w), w)
                      for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "secret-token-of-the-dcp-job")
            url = job_url(etcd, JOB)
            start_workers(ns, PTCFS, daemons, stores, mnts, url, token, PORT, tmp,
                          ["--lease", "2", "--format", "all", "--ckpt-format", "torch_dist"])
            ref = os.path.join(tmp, "ref")
            expect_loads(ns, mnts, ref, first)

            reconfigure(mnts[1], "tp=1,pp=2,per_worker=1")
            generation = status(mnts[0])["generation"] + 1
            for w in range(WORKERS):
                wait_for("worker %d at generation %d" % (w, generation), lambda: at_generation(mnts[w], generation),
                         mnts=mnts)
            expect_loads(ns, mnts, ref, "reconfigured to tp=1,pp=2")

            saved = os.path.join(tmp, "saved2")
            ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--dtype", DTYPE, "--config", "tp=1", "--optimizer",
                  "adam", "--seed", "8", saved)
            before = status(mnts[0])["generation"]
            save_ranks(ns, mnts, "step-200", saved)
            for w in range(WORKERS):
                wait_for("worker %d at generation %d" % (w, before + 1), lambda: at_generation(mnts[w], before + 1),
                         mnts=mnts)
                s = status(mnts[w])
                assert s["cluster"]["pieces"] > 0, s  # its chunk file's pieces
                # Committed: dcp/step-200 is the committed state, under the name it was saved as.
                with open(os.path.join(mnts[w], "dcp", "step-200", ".metadata"), "rb") as a, \
                        open(os.path.join(mnts[w], "dcp", ".metadata"), "rb") as b:
                    assert a.read() == b.read(), "worker %d: dcp/step-200 is not the committed state" % w
            print("ok   a dcp.save of 2 ranks on 2 workers committed on both as generation %d, shown as dcp/step-200"
                  % (before + 1))
            expect_loads(ns, mnts, saved, "the saved tensors")
            # Its Adam steps and param groups, from whichever rank's file held them, on both workers.
            for w in range(WORKERS):
                r = ns.run(w, [*CLIENT_PYTHON, CLIENT, "optim", os.path.join(mnts[w], "dcp"), "42", "1e-4"],
                           capture_output=True, text=True, timeout=300)
                assert r.returncode == 0 and "OPTIM OK" in r.stdout, "worker %d: %s%s" % (w, r.stdout, r.stderr)
            print("ok   the save's steps and param groups on both workers: " + r.stdout.strip())
            reconfigure(mnts[0], "tp=2,pp=2,per_worker=2")
            for w in range(WORKERS):
                wait_for("worker %d at generation %d" % (w, before + 2), lambda: at_generation(mnts[w], before + 2),
                         mnts=mnts)
            expect_loads(ns, mnts, saved, "the saved tensors reconfigured to tp=2,pp=2")

            # A chunk file on no worker: refused everywhere, nothing committed.
            generation = status(mnts[0])["generation"]
            save_ranks(ns, mnts, "step-300", ref, lose_rank_1_file=True)
            for w in range(WORKERS):
                s = status(mnts[w])
                assert s["generation"] == generation, s
                wait_for("worker %d not saving" % w, lambda: status(mnts[w])["state"] != "saving", mnts=mnts)
            err = status(mnts[0])["last_error"] or ""
            assert "__1_0.distcp" in err and "no worker" in err, status(mnts[0])
            print("ok   a save whose chunk file reached no worker is refused, named: %s" % err[err.find("chunk file"):][:160])
            # Its staged files stay for inspection; rm -r removes them.
            shutil.rmtree(os.path.join(mnts[0], "dcp", "step-300"))
            shutil.rmtree(os.path.join(mnts[1], "dcp", "step-300-elsewhere"))
            expect_loads(ns, mnts, saved, "the saved tensors after the refused save")

            # Megatron-Core's save of other state (seed 9), from that store's legacy render.
            for name, config in (("other", first), ("ref9", "tp=1")):
                ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--dtype", DTYPE, "--config", config,
                      "--optimizer", "adam", "--seed", "9", os.path.join(tmp, name))
            ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", first, os.path.join(tmp, "other"),
                  os.path.join(tmp, "other-store"))
            legacy = {}
            for config in ("tp=2", "tp=1,pp=2"):
                legacy[config] = os.path.join(tmp, "legacy9-" + config.replace(",", "-").replace("=", ""))
                ptcfs("export", "--format", "megatron", "--names", "local", "--config", config,
                      os.path.join(tmp, "other-store"), legacy[config])
            torch_dist_save(ns, mnts, legacy["tp=2"], 500)
            expect_loads(ns, mnts, os.path.join(tmp, "ref9"), "Megatron-Core's torch_dist save's tensors")
            r = ns.run(1, [*CLIENT_PYTHON, MCORE, "optim-load", os.path.join(mnts[1], "megatron"), "1", "2",
                           legacy["tp=1,pp=2"], "tweaked"], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and "OPTIM-LOAD OK" in r.stdout, "optim-load on worker 1: %s%s" % (r.stdout, r.stderr)
            print("ok   Megatron-Core's optimizer loads the saved step and settings from worker 1's mount at tp=1,pp=2")
    finally:
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS cluster_dcp_test")


if __name__ == "__main__":
    main()
