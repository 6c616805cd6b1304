#!/usr/bin/env python3
"""A Megatron job saves through its mounts on many workers (docs/cluster.md,
"Saves on many workers"): two ptcfs workers, each in a network namespace of
its own, one job coordinated by a real etcd, a Megatron-LM checkpoint made by
real torch (tests/clients/megatron_ckpt.py, Debian's python3-torch).

  1. tp=2,pp=2 (two ranks per worker), a dataset of 1001 samples in global
     batches of 37: each worker's process, started in its namespace, loads its
     ranks from its own mount, trains (doubles every float) and torch.saves
     iteration 200 through that mount (args.consumed_train_samples 111: three
     batches); the latest file on worker 0's mount commits the save on both
     workers, and both serve the data position it names (epoch 0, step 3).
  2. Reconfigured to tp=1,pp=2 (one rank per worker) across the workers.
  3. Saved again (iteration 300) at tp=1,pp=2, committed on worker 1's mount;
     its consumed_train_samples 1147 counts from the start of training, as
     Megatron's does: epoch 1, step 3 on both workers.
  4. A save whose rank file on worker 1 is never written: the latest file's
     close fails (EIO) naming the missing rank file, both workers keep the
     previous generation; once worker 1 writes its file, the save commits.
  5. A save that does not fit on worker 1's disk (its store on a small tmpfs,
     filled after its rank file was staged): aborted on both workers, naming
     the disk, no partial generation left; with room again, writing the
     latest file once more commits it.
After every commit the rank files of both mounts together equal the
framework's own copy of what it saved (the mirror tree), bit for bit: every
tensor, the Adam state, args, each rank's rng state (megatron_ckpt.py check).

Usage: cluster_save_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import errno
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, skip_or_fail, start_etcd  # noqa: E402
from workers import (Model, at_generation, fill, job_token, job_url, joined_megatron_tree, remove_tmp,  # noqa: E402
                     reconfigure, start_workers, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA, DIMS = "megatron-gpt", "layers=4,hidden=32,heads=4,vocab=128,seq=16"  # megatron_ckpt.py's model
CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients", "megatron_ckpt.py")
TORCH = "/usr/bin/python3"
ptcfs = Model(PTCFS, SCHEMA, DIMS).run
WORKERS, PORT, JOB = 2, 7431, "saves"
LATEST = "latest_checkpointed_iteration.txt"


def client(ns, w, *args):
    """megatron_ckpt.py ARGS in worker w's namespace (a rank process of the job)."""
    r = ns.run(w, [TORCH, CLIENT, *args], capture_output=True, text=True)
    assert r.returncode == 0, "megatron_ckpt.py %s on worker %d: %s%s" % (args[0], w, r.stdout, r.stderr)
    return r.stdout


def save_ranks(ns, mnts, w, mirror, iteration, consumed=None):
    """Worker w's ranks, loaded from its mount, trained and saved through it
    (and into `mirror`, the framework's own copy), without the latest file;
    `consumed`: the args' consumed_train_samples."""
    more = [] if consumed is None else ["--consumed", str(consumed)]
    client(ns, w, "save", os.path.join(mnts[w], "megatron"), mirror, "--iteration", str(iteration), "--no-latest",
           *more)


def expect_position(mnts, epoch, step, consumed):
    """Every worker serves the data position (epoch, step), `consumed`
    samples into the epoch."""
    for w in range(WORKERS):
        d = status(mnts[w])["dataset"]
        assert (d["epoch"], d["step"], d["consumed"]) == (epoch, step, consumed), "worker %d: %s" % (w, d)


def commit(mnt, iteration):
    """Writes the latest file on `mnt`: the job commits the save (or the close fails)."""
    with open(os.path.join(mnt, "megatron", LATEST), "w") as f:
        f.write(str(iteration))


def expect_refused(mnts, iteration, generation, needle, what):
    """The latest file naming `iteration` on worker 0's mount fails to close
    (EIO); every worker is done with the save, still at `generation`, its
    last_error holding `needle`."""
    try:
        commit(mnts[0], iteration)
        raise AssertionError("a save %s committed" % what)
    except OSError as e:
        assert e.errno == errno.EIO, e
    for w in range(WORKERS):
        wait_for("worker %d done with the refused save" % w, lambda: status(mnts[w])["state"] != "saving", mnts=mnts)
        s = status(mnts[w])
        assert s["generation"] == generation, s
        assert needle in s["last_error"], s
    print("ok   a save %s committed nowhere: %s" % (what, status(mnts[0])["last_error"][:200]))


def joined_tree(tmp, mnts, iteration, tp, pp, per_worker, tag):
    """A tree of every rank's file, each from the mount of the worker that
    serves it (rank = pp_rank * tp + tp_rank, per_worker ranks per worker)."""
    return joined_megatron_tree(os.path.join(tmp, "joined-" + tag), mnts, iteration, tp, pp,
                                lambda t, p: (p * tp + t) // per_worker)


def expect_saved(tmp, mnts, mirror, iteration, grid, served, per_worker, generation, tag):
    """Both workers serve `generation`, and the rank files of both mounts
    (in the `served` grid) equal the `mirror` tree (saved in `grid`)."""
    for w in range(WORKERS):
        wait_for("worker %d at generation %d" % (w, generation), lambda: at_generation(mnts[w], generation),
                 mnts=mnts)
        s = status(mnts[w])
        assert s["last_error"] is None, s
        with open(os.path.join(mnts[w], "megatron", LATEST)) as f:
            assert f.read() == str(iteration), "worker %d's latest file" % w
    joined = joined_tree(tmp, mnts, iteration, *served, per_worker, tag)
    out = subprocess.run([TORCH, CLIENT, "check", mirror, *map(str, grid), joined, *map(str, served)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "CHECK OK" in out.stdout, out.stdout + out.stderr


def main():
    require(etcd=True)
    if subprocess.run([TORCH, "-c", "import torch"], capture_output=True).returncode != 0:
        skip_or_fail("no torch under %s (Debian's python3-torch)" % TORCH)
    tmp = tempfile.mkdtemp(prefix="ptcfs-save-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    disk1 = os.path.join(tmp, "disk1")  # worker 1's store: a small tmpfs, filled to fail a save
    os.makedirs(disk1)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "ptcfs-test-disk", disk1], check=True)
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            src = os.path.join(tmp, "src")
            out = subprocess.run([TORCH, CLIENT, "make", src, "--tp", "2", "--pp", "2", "--args", "--optimizer"],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            ptcfs("import", "--format", "megatron", "--schema", SCHEMA, "--dims", DIMS, "--config",
                  "tp=2,pp=2,per_worker=2", src, os.path.join(tmp, "whole"))
            ptcfs("data", "synth", "--samples", "1001", "--min-len", "1", "--max-len", "50", "--vocab", "300",
                  os.path.join(tmp, "ds"))
            ptcfs("data", "import", os.path.join(tmp, "ds"), os.path.join(tmp, "whole"), "--global-batch", "37",
                  "--seed", "5")
            stores = [worker_store(os.path.join(tmp, "whole"), os.path.join(disk1 if w == 1 else tmp, "store%d" % w), w)
                      for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "secret-token-of-the-save-job")
            url = job_url(etcd, JOB)
            start_workers(ns, PTCFS, daemons, stores, mnts, url, token, PORT, tmp,
                          ["--lease", "2", "--format", "megatron"])
            print("ok   2 workers mounted, tp=2,pp=2 (two ranks each)")

            # 1. A save through both mounts, committed on worker 0's.
            mirror = os.path.join(tmp, "mirror-200")
            expect_position(mnts, 0, 0, 0)
            for w in range(WORKERS):
                save_ranks(ns, mnts, w, mirror, 200, consumed=111)
            t0 = time.time()
            commit(mnts[0], 200)
            expect_saved(tmp, mnts, mirror, 200, (2, 2), (2, 2), 2, 3, "200")
            expect_position(mnts, 0, 3, 111)
            print("ok   iteration 200 saved through both mounts, committed on both in %.2f s, at data step 3" %
                  (time.time() - t0))

            # 2. Across the workers to tp=1,pp=2: the saved state, resharded.
            reconfigure(mnts[1], "tp=1,pp=2,per_worker=1")
            expect_saved(tmp, mnts, mirror, 200, (2, 2), (1, 2), 1, 4, "200-tp1")
            print("ok   reconfigured to tp=1,pp=2: every rank equals the save resharded")

            # 3. The next save in the new layout, committed on worker 1's mount.
            mirror = os.path.join(tmp, "mirror-300")
            for w in range(WORKERS):
                save_ranks(ns, mnts, w, mirror, 300, consumed=1147)
            commit(mnts[1], 300)
            expect_saved(tmp, mnts, mirror, 300, (1, 2), (1, 2), 1, 5, "300")
            expect_position(mnts, 1, 3, 111)
            print("ok   iteration 300 saved at tp=1,pp=2 and committed on both, at epoch 1, step 3")

            # 4. Worker 1's rank file never written: refused on every worker, naming it.
            mirror = os.path.join(tmp, "mirror-400")
            save_ranks(ns, mnts, 0, mirror, 400)
            expect_refused(mnts, 400, 5, "iter_0000400/mp_rank_00_001/model_optim_rng.pt: written on no worker",
                           "missing a rank file")
            save_ranks(ns, mnts, 1, mirror, 400)
            commit(mnts[0], 400)
            expect_saved(tmp, mnts, mirror, 400, (1, 2), (1, 2), 1, 6, "400")
            print("ok   once written, the save committed on both")

            # 5. Worker 1's disk full once its rank file is staged: aborted on both, nothing left behind.
            mirror = os.path.join(tmp, "mirror-500")
            for w in range(WORKERS):
                save_ranks(ns, mnts, w, mirror, 500)
            filler = os.path.join(disk1, "filler")
            fill(filler)
            expect_refused(mnts, 500, 6, "No space left on device", "that does not fit on worker 1's disk")
            for w in range(WORKERS):
                assert not os.path.exists(os.path.join(stores[w], "gen-000007")), os.listdir(stores[w])
            os.remove(filler)
            commit(mnts[0], 500)
            expect_saved(tmp, mnts, mirror, 500, (1, 2), (1, 2), 1, 7, "500")
            print("ok   with room again, the save committed on both")
    finally:
        stop(daemons, mnts)
        subprocess.run(["umount", "-l", disk1], capture_output=True)
        remove_tmp(tmp)
    print("PASS cluster_save_test")


if __name__ == "__main__":
    main()
