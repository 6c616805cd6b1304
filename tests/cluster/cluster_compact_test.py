#!/usr/bin/env python3
"""Compaction on a cluster (docs/cluster.md, "Compaction"): three ptcfs mounts,
each worker in a network namespace of its own, one job coordinated by a real
etcd, every mount with `--compact-pieces 1` and `--passthrough auto`.

  6 ranks (tp=2,pp=3, two per worker: workers 0-2)
  -> tp=1,pp=6 (asked on worker 1's mount): a covering, its shards read from
     two pieces each; the lowest live worker then proposes a compaction of
     the job, every worker writes its own ranks' rank files, and all commit
     the same generation.
After it every mount serves generation 5 with its compaction done, the
kernel reads the worker's own ranks' files itself (FUSE passthrough: the
status's "passthrough" names them "kernel", the other workers' "daemon"), and
the rank files of all mounts together, each read from its own worker's mount,
equal `ptcfs synth` of the config (`ptcfs diff`). `ptcfs cluster status`
shows the job at generation 5 with no change under way.

Before that, the same reconfigure's compaction is overtaken: while it runs
(worker 2 stopped for a moment, SIGSTOP, so that it cannot finish its part),
a reconfigure back to tp=2,pp=3 is written to worker 1's mount; it withdraws
the compaction, which says "cancelled" on every worker, and commits instead
(generation 3, equal to synth); the reconfigure to tp=1,pp=6 is then asked
again and compacted (generation 5). The model is large enough (about 350 MB
with its Adam state) that a compaction runs for a moment.

Usage: cluster_compact_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, start_etcd  # noqa: E402
from workers import (Model, at_generation, job_token, job_url, reconfigure, remove_tmp,  # noqa: E402
                     start_workers, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA = "llama"
# PTCFS_COMPACT_DIMS: a larger model to measure the compaction with (its time and bytes are printed).
DIMS = os.environ.get("PTCFS_COMPACT_DIMS", "layers=6,hidden=512,heads=8,kv_heads=4,vocab=4096,seq=64,ffn=1408")
MODEL = Model(PTCFS, SCHEMA, DIMS)
ptcfs = MODEL.run
WORKERS, PORT, JOB = 3, 7431, "compact1"
START, TO = "tp=2,pp=3,dp=1,per_worker=2", "tp=1,pp=6,dp=1,per_worker=2"


def compacted(mnt, generation):
    """Whether the mount serves `generation`, its compaction done."""
    s = status(mnt)
    return s["generation"] == generation and s["state"] == "serving" and s["compaction"]["state"] == "done"


def main():
    require(etcd=True)
    tmp = tempfile.mkdtemp(prefix="ptcfs-compact-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--config", START, "--optimizer", "adam", "--seed", "7",
                  os.path.join(tmp, "saved"))
            ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", START, os.path.join(tmp, "saved"),
                  os.path.join(tmp, "whole"))
            stores = [worker_store(os.path.join(tmp, "whole"), os.path.join(tmp, "store%d" % w), w)
                      for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "secret-token-of-the-compact-job")
            url = job_url(etcd, JOB)
            start_workers(ns, PTCFS, daemons, stores, mnts, url, token, PORT, tmp,
                          ["--lease", "2", "--compact-pieces", "1", "--passthrough", "auto"])
            print("ok   %d workers mounted" % WORKERS)
            s = status(mnts[0])
            assert s["generation"] == 1 and s["compaction"]["state"] == "none", s  # a compact import: nothing due

            # A reconfigure asked while the job compacts goes first.
            reconfigure(mnts[1], TO)
            wait_for("the job's compaction of generation 2",
                     lambda: status(mnts[0])["generation"] == 2 and status(mnts[0])["compaction"]["state"] == "running",
                     90, poll=0.005, mnts=mnts)
            os.kill(daemons[2].pid, signal.SIGSTOP)  # its part cannot be finished meanwhile
            try:
                job = MODEL.cluster_json(url, token)
                assert job["change"] is not None and job["change"]["request"] == "compact rank-files", job
                reconfigure(mnts[1], START)
            finally:
                os.kill(daemons[2].pid, signal.SIGCONT)  # well within its lease (2 s)
            for w in range(WORKERS):
                wait_for("worker %d at generation 3" % w, lambda: at_generation(mnts[w], 3), 90, mnts=mnts)
                s = status(mnts[w])
                # Worker 0 was seen compacting, so it cancelled; a worker stopped before it took its part
                # up never started one (none), but none may finish or fail it.
                expected = ("cancelled",) if w == 0 else ("cancelled", "none")
                assert s["config"].startswith("tp=2,pp=3") and s["compaction"]["state"] in expected, s
                assert s["last_error"] is None, s
            print("ok   a reconfigure asked during the job's compaction went first; the compaction cancelled "
                  "everywhere: " + status(mnts[0])["compaction"]["why"][:160])
            MODEL.expect_ranks(tmp, mnts, START, list(range(WORKERS)), "6-back")

            t0 = time.time()
            reconfigure(mnts[1], TO)
            t1 = wait_for("the reconfigure's commit", lambda: status(mnts[0])["generation"] >= 4 and time.time(),
                          90, poll=0.005, mnts=mnts)
            for w in range(WORKERS):
                wait_for("worker %d's compaction at generation 5" % w, lambda: compacted(mnts[w], 5), 90, mnts=mnts)
            print("ok   %s committed in %.2f s, then compacted by the job on every worker in %.2f s more" %
                  (TO, t1 - t0, time.time() - t1))
            job = MODEL.cluster_json(url, token)
            assert job["committed"]["generation"] == 5 and job["change"] is None, job
            assert job["committed"]["config"].startswith("tp=1,pp=6"), job

            for w in range(WORKERS):
                s = status(mnts[w])
                c = s["compaction"]
                assert c["pieces"] == c["shards"] and c["bytes_done"] == c["bytes_total"] > 0, s
                assert s["last_error"] is None, s
                # Its own ranks' rank files, in its store only.
                own = "gen-%06d/worker-%02d" % (5, w)
                files = sorted(os.listdir(os.path.join(stores[w], own)))
                assert any(f.endswith(".safetensors") for f in files), (w, files)
                for other in range(WORKERS):
                    if other != w:
                        assert not os.path.exists(os.path.join(stores[w], "gen-%06d/worker-%02d" % (5, other)))
                p = s["passthrough"]
                assert p["state"] == "on", "passthrough is %s on worker %d (root, Linux >= 6.9 needed)" % (
                    p["state"], w)
                for path, route in p["files"].items():
                    rank = int(path.split("/")[1].split("-")[1])
                    want = "kernel" if rank // 2 == w else "daemon"
                    assert route == want, (w, path, route, p)
                assert p["kernel"] == 4, p
            print("ok   each worker's own ranks' files (4 per worker) are read by the kernel (passthrough); "
                  "bytes each worker compacted: %s" % [status(m)["compaction"]["bytes_done"] for m in mnts])
            # An open file of the worker's own rank has its backing file registered with the kernel.
            with open(os.path.join(mnts[0], "model", "rank-00000", "model.safetensors"), "rb") as f:
                head = f.read(8)
                assert status(mnts[0])["passthrough"]["open_backing_files"] == 1, status(mnts[0])["passthrough"]
            assert len(head) == 8
            MODEL.expect_ranks(tmp, mnts, TO, list(range(WORKERS)), "6")
            with open(os.path.join(tmp, "worker0.log")) as f:
                log = f.read()
            assert "every worker compacts its pieces (compact rank-files)" in log, log
    finally:
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS cluster_compact_test")


if __name__ == "__main__":
    main()
