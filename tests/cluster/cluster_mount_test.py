#!/usr/bin/env python3
"""Many workers: four ptcfs mounts, each worker in a network namespace of its
own, one job coordinated by a real etcd (docs/cluster.md).

  8 ranks (tp=2,pp=2,dp=2, two per worker: workers 0-3)
  -> 4 ranks (tp=2,pp=2: workers 0, 1), asked on worker 1's mount
  -> 6 ranks (tp=2,pp=3: workers 0-2), asked on worker 2's mount
After each step every worker serves the new generation, and the rank files of
all mounts together equal `ptcfs synth` of the new config, tensor by tensor
(`ptcfs diff`). Each worker's store holds only its own shard files: what a
worker's new ranks lack comes from the others over the peer data plane.
Then two changes that fail on one worker commit nowhere, and every worker
keeps serving the old generation: one whose part does not fit on worker 2's
disk (its store on a small tmpfs, filled), one during which a participant
stops (SIGSTOP, its lease expires). The peer
server refuses a request without the token and one for a file outside the
manifest.

Usage: cluster_mount_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, start_etcd  # noqa: E402
from workers import (Model, at_generation, fill, job_token, job_url, reconfigure, remove_tmp,  # noqa: E402
                     start_worker, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA, DIMS = "llama", "layers=6,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96"
MODEL = Model(PTCFS, SCHEMA, DIMS)
ptcfs = MODEL.run
WORKERS, PORT, JOB = 4, 7411, "job1"


def expect_old(mnts, generation, config, tag):
    """Every mount is done with the failed change and serves `generation` of `config`."""
    for w, m in enumerate(mnts):
        wait_for("worker %d to leave the change (%s)" % (w, tag),
                 lambda: status(m)["state"] in ("serving", "failed"), 90, mnts=mnts)
        s = status(m)
        assert s["generation"] == generation and s["config"].startswith(config), s


def peer_get(ns, i, url, token):
    code = (
        "import sys, urllib.request, urllib.error\n"
        "req = urllib.request.Request(sys.argv[1])\n"
        "if sys.argv[2]: req.add_header('Authorization', 'Bearer ' + sys.argv[2])\n"
        "try:\n"
        "    print(urllib.request.urlopen(req, timeout=10).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
    )
    out = ns.run(i, ["/usr/bin/python3", "-c", code, url, token], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def main():
    require(etcd=True)
    tmp = tempfile.mkdtemp(prefix="ptcfs-cluster-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    disk2 = os.path.join(tmp, "disk2")  # worker 2's store: a small tmpfs, filled to fail a change
    os.makedirs(disk2)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "ptcfs-test-disk", disk2], check=True)
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            # One store per worker, each with only its own shard files.
            ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--config", "tp=2,pp=2,dp=2,per_worker=2",
                  "--optimizer", "adam", "--seed", "7", os.path.join(tmp, "saved"))
            ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", "tp=2,pp=2,dp=2,per_worker=2",
                  os.path.join(tmp, "saved"), os.path.join(tmp, "whole"))
            stores = [worker_store(os.path.join(tmp, "whole"),
                                   os.path.join(disk2 if w == 2 else tmp, "store%d" % w), w)
                      for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "secret-token-of-the-test-job")
            url = job_url(etcd, JOB)
            wrap = os.environ.get("PTCFS_WRAP", "").split()  # e.g. "gdb -batch -ex run -ex bt --args"
            for w in range(WORKERS):
                os.makedirs(mnts[w])
                daemons.append(start_worker(ns, PTCFS, w, stores[w], mnts[w], url, token, PORT,
                                            os.path.join(tmp, "worker%d.log" % w), ["--lease", "2"], wrap))
            for w in range(WORKERS):
                wait_for("worker %d's mount" % w, lambda: status(mnts[w])["state"] == "serving", mnts=mnts)
            print("ok   4 workers mounted")
            MODEL.expect_ranks(tmp, mnts, "tp=2,pp=2,dp=2,per_worker=2", list(range(4)), "8")

            def step(asker, config, ranks, generation):
                t0 = time.time()
                reconfigure(mnts[asker], config)
                for w in range(WORKERS):
                    wait_for("worker %d at generation %d" % (w, generation),
                             lambda: at_generation(mnts[w], generation), mnts=mnts)
                print("ok   %s committed on every worker in %.2f s" % (config, time.time() - t0))
                MODEL.expect_ranks(tmp, mnts, config, list(range(ranks // 2)), str(ranks))

            step(1, "tp=2,pp=2,dp=1,per_worker=2", 4, 2)
            step(2, "tp=2,pp=3,dp=1,per_worker=2", 6, 3)

            # The data plane: no token, and a path no manifest names, are refused.
            base = "http://%s:%d/v1/shard" % (ns.addr(0), PORT)
            any_file = next(os.path.relpath(os.path.join(d, f), stores[0])
                            for d, _, fs in os.walk(stores[0]) for f in fs if f.endswith(".h5"))
            secret = open(token).read().strip()
            assert peer_get(ns, 1, base + "?file=%s&offset=0&length=1" % any_file, "") == 401
            assert peer_get(ns, 1, base + "?file=manifest.json&offset=0&length=1", secret) == 404
            assert peer_get(ns, 1, base + "?file=..%2Fetc%2Fpasswd&offset=0&length=1", secret) == 400
            print("ok   the peer server refuses requests without the token and outside the manifest")

            # Worker 2's disk is full: its part cannot be written, nothing is
            # committed anywhere, and its store keeps no partial generation.
            filler = os.path.join(disk2, "filler")
            fill(filler)
            reconfigure(mnts[0], "tp=2,pp=2,dp=2,per_worker=2")
            for w in (2, 0):
                wait_for("worker %d to give the change up" % w, lambda: status(mnts[w])["state"] == "failed", 90,
                         mnts=mnts)
            expect_old(mnts, 3, "tp=2,pp=3", "disk full")
            assert "No space left on device" in status(mnts[2])["last_error"], status(mnts[2])["last_error"]
            assert "worker 2 failed" in status(mnts[0])["last_error"], status(mnts[0])["last_error"]
            left = sorted(d for d in os.listdir(stores[2]) if d.startswith("gen-"))
            assert "gen-4" not in left, left
            os.remove(filler)
            print("ok   a change that does not fit on worker 2's disk committed nowhere: " +
                  status(mnts[0])["last_error"][:160])
            MODEL.expect_ranks(tmp, mnts, "tp=2,pp=3,dp=1,per_worker=2", list(range(3)), "6")

            # A participant stops during a change: nothing is committed anywhere.
            os.kill(daemons[3].pid, signal.SIGSTOP)
            reconfigure(mnts[0], "tp=2,pp=2,dp=2,per_worker=2")
            def gave_up(w):  # this change, not the one worker 2's disk failed
                s = status(mnts[w])
                return s["state"] == "failed" and "worker 2 failed" not in s["last_error"] and \
                    "No space" not in s["last_error"]
            for w in range(3):
                wait_for("worker %d to give the change up" % w, lambda: gave_up(w), 90, mnts=mnts)
                s = status(mnts[w])
                assert s["generation"] == 3 and s["config"].startswith("tp=2,pp=3"), s
                assert "aborted" in s["last_error"], s["last_error"]
            print("ok   a change with a stopped worker committed nowhere: " + status(mnts[0])["last_error"][:160])
            MODEL.expect_ranks(tmp, mnts, "tp=2,pp=3,dp=1,per_worker=2", list(range(3)), "6")
            os.kill(daemons[3].pid, signal.SIGKILL)
            daemons[3].wait()
            subprocess.run(["umount", "-l", mnts[3]], capture_output=True)
    finally:
        stop(daemons, mnts)
        subprocess.run(["umount", "-l", disk2], capture_output=True)
        remove_tmp(tmp)
    print("PASS cluster_mount_test")


if __name__ == "__main__":
    main()
