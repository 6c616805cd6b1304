#!/usr/bin/env python3
"""Lost workers: a job with replicas reconfigures onto the survivors when a
worker dies (docs/cluster.md, "Lost workers"); four ptcfs mounts, each worker
in a network namespace of its own, one job in a real etcd.

  8 ranks, tp=2,pp=4 (one stage per worker: workers 0-3, per_worker=2)
  -> the same with replicas=2: each worker also keeps the stage before its own
  kill -9 worker 1: the survivors move on their own to tp=2,pp=3 on workers
     0, 2, 3 (6 ranks), worker 1's stage read from its replica on worker 2
  worker 1 comes back with an empty store: it takes the committed generation
     from a peer and serves; asked back to tp=2,pp=4 on workers 0-3, it pulls
     its stage and the one it keeps for worker 2
  a change to tp=2,pp=2,dp=2 during which worker 3 stops and is killed while
     the others pull from it: aborted everywhere, then the survivors move to
     tp=2,pp=3 on workers 0-2, worker 3's stage read from its replica
  kill -9 workers 1 and 2 at once (more than replicas-1) while the durable
     tier is away: the stage both kept is lost; worker 0's change names the
     tensors that cannot be recovered and commits nothing: it keeps serving
     what it has. The tier back, a change onto worker 0 alone reads that
     stage from it (the copy the workers wrote at the start, in the layout
     of its day).
After each committed step every rank's files, on the worker its slot names,
equal `ptcfs synth` of the new config, tensor by tensor (`ptcfs diff`).

Usage: lost_worker_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, start_etcd  # noqa: E402
from workers import (Model, at_generation, job_token, job_url, kill, remove_tmp, start_worker,  # noqa: E402
                     status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA, DIMS = "llama", "layers=12,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96"
MODEL = Model(PTCFS, SCHEMA, DIMS)
ptcfs = MODEL.run
WORKERS, PORT, JOB = 4, 7431, "lost"


def start(ns, w, store, mnt, url, token, tmp):
    return start_worker(ns, PTCFS, w, store, mnt, url, token, PORT, os.path.join(tmp, "worker%d.log" % w),
                        ["--lease", "2", "--durable", os.path.join(tmp, "durable")])


def cluster_status(url, token, config, durable, mnts):
    """`ptcfs cluster status`: every worker live, its pieces' copies on the
    workers before and after it, and no loss of one worker loses anything."""
    text = ptcfs("cluster", "status", "--cluster", url, "--token-file", token).stdout
    assert "committed: generation 2, " + config in text, text
    j = json.loads(ptcfs("cluster", "status", "--cluster", url, "--token-file", token, "--json", "--durable",
                         durable).stdout)
    assert j["durable"] == {"dir": durable, "copy": True}, j["durable"]
    assert j["committed"]["generation"] == 2 and j["committed"]["config"] == config and j["change"] is None, j
    assert [w["worker"] for w in j["workers"]] == [0, 1, 2, 3], j
    for w in j["workers"]:
        i = w["worker"]
        assert w["live"] and 0 <= w["lease_ttl_seconds"] <= 2 and w["pieces"] > 0, w
        assert sorted(int(x) for x in w["replicas"]) == sorted({(i + 1) % 4, (i + 3) % 4}), w
        lost = w["if_lost"]
        assert lost["holds_ranks"] and lost["lost_tensors"] == [] and lost["bytes_moved"] > 0, w
        assert "from_durable" not in lost, w  # the replicas suffice
        others = "+".join(str(x) for x in range(4) if x != i)
        placement = "" if others == "0+1+2" else ",workers=" + others  # the default placement is not written
        assert lost["config"] == "tp=2,pp=3,dp=1,per_worker=2%s,replicas=2" % placement, lost
    print("ok   ptcfs cluster status: 4 live workers, each one's pieces also on its neighbours, any one loss "
          "recoverable")
    # Each mount's .ptcfs/status says the same of its own worker.
    for w in j["workers"]:
        i = w["worker"]

        def reported():  # made again by the agent once it has seen the generation
            c = status(mnts[i])["cluster"]
            return c if c.get("if_lost", {}).get("config") == w["if_lost"]["config"] else None
        mine = wait_for("worker %d's status of generation 2" % i, reported, 10, mnts=mnts)
        assert mine["member"] and mine["members"] == [0, 1, 2, 3] and mine["job"] == JOB, mine
        assert mine["replicas"] == w["replicas"] and mine["bytes"] == w["bytes"], (mine, w)
    print("ok   each mount's .ptcfs/status shows its members, the copies of its pieces and what its loss would cost")


def main():
    require(etcd=True)
    tmp = tempfile.mkdtemp(prefix="ptcfs-lost-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            first = "tp=2,pp=4,dp=1,per_worker=2"
            ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--config", first, "--optimizer", "adam", "--seed", "7",
                  os.path.join(tmp, "saved"))
            ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", first, os.path.join(tmp, "saved"),
                  os.path.join(tmp, "whole"))
            stores = [worker_store(os.path.join(tmp, "whole"), os.path.join(tmp, "store%d" % w), w)
                      for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "token-of-the-lost-workers-test")
            url = job_url(etcd, JOB)
            for w in range(WORKERS):
                os.makedirs(mnts[w])
                daemons.append(start(ns, w, stores[w], mnts[w], url, token, tmp))
            for w in range(WORKERS):
                wait_for("worker %d's mount" % w, lambda: status(mnts[w])["state"] == "serving", mnts=mnts)
            print("ok   4 workers mounted")
            # Each worker copies its share into the durable tier; the last completes the copy.
            copy = os.path.join(tmp, "durable", "durable.json")
            wait_for("the durable tier's copy", lambda: os.path.exists(copy), 60, mnts=mnts)
            with open(copy) as f:
                assert json.load(f)["extra"]["durable"]["job"] == JOB
            # Without replicas each loss loses a stage, which the tier's copy restores: every byte of it read once.
            j = json.loads(ptcfs("cluster", "status", "--cluster", url, "--token-file", token, "--json", "--durable",
                                 os.path.dirname(copy)).stdout)
            for w in j["workers"]:
                lost = w["if_lost"]
                assert lost["lost_tensors"] and lost["from_durable"] == w["bytes"] > 0, w
            print("ok   the durable tier holds a copy of the job's tensors; each loss would read its stage from it")

            # Replicas: each worker also keeps the stage of the worker before it.
            replicated = first + ",replicas=2"
            with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
                f.write(replicated + "\n")
            for w in range(WORKERS):
                wait_for("worker %d at generation 2" % w, lambda: at_generation(mnts[w], 2), mnts=mnts)
            MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2, 3], "replicated")
            cluster_status(url, token, replicated, os.path.join(tmp, "durable"), mnts)

            # Worker 1 dies: the survivors reconfigure onto themselves, unasked.
            t0 = time.time()
            kill(daemons, mnts, [1])
            live = [0, 2, 3]
            survivors = "tp=2,pp=3,dp=1,per_worker=2,workers=0+2+3,replicas=2"
            for w in live:
                wait_for("worker %d at generation 3" % w, lambda: at_generation(mnts[w], 3), 60,
                         mnts=[mnts[x] for x in live])
                assert status(mnts[w])["config"] == survivors, status(mnts[w])
            print("ok   worker 1 killed: the survivors serve %s after %.1f s (lease 2 s)" % (survivors, time.time() - t0))
            MODEL.expect_ranks(tmp, mnts, survivors, live, "survivors")

            # Worker 1 comes back with an empty store, and is used again.
            empty = os.path.join(tmp, "store1-new")
            os.makedirs(empty)
            daemons[1] = start(ns, 1, empty, mnts[1], url, token, tmp)
            wait_for("worker 1 back at generation 3", lambda: at_generation(mnts[1], 3), 60, mnts=mnts)
            assert os.listdir(os.path.join(mnts[1], "model")) == [], os.listdir(os.path.join(mnts[1], "model"))
            print("ok   worker 1 rejoined with an empty store: it serves generation 3 (no ranks of it)")
            with open(os.path.join(mnts[2], ".ptcfs", "config"), "w") as f:
                f.write(replicated + "\n")
            for w in range(WORKERS):
                wait_for("worker %d at generation 4" % w, lambda: at_generation(mnts[w], 4), mnts=mnts)
            MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2, 3], "again")

            # Worker 3 stops while the others pull from it, then dies: the
            # change is aborted, and the survivors recover without it.
            with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
                f.write("tp=2,pp=2,dp=2,per_worker=2,replicas=2\n")
            os.kill(daemons[3].pid, signal.SIGSTOP)
            wait_for("worker 0 to apply the change", lambda: status(mnts[0])["state"] != "serving", 30, mnts=mnts)
            kill(daemons, mnts, [3])
            live = [0, 1, 2]
            survivors = "tp=2,pp=3,dp=1,per_worker=2,replicas=2"  # workers 0, 1, 2: the default placement
            for w in live:
                wait_for("worker %d at generation 5" % w, lambda: at_generation(mnts[w], 5), 90,
                         mnts=[mnts[x] for x in live])
                assert status(mnts[w])["config"] == survivors, status(mnts[w])
            print("ok   worker 3 killed mid-change: aborted, then the survivors serve " + survivors)
            MODEL.expect_ranks(tmp, mnts, survivors, live, "midpull")

            # Workers 1 and 2 die at once, the durable tier away: the stage only they kept (1's) is lost.
            durable = os.path.join(tmp, "durable")
            os.rename(durable, durable + ".away")
            kill(daemons, mnts, [1, 2])
            # The two leases expire one after the other: a first attempt with
            # the other still counted live may fail on reading from it; the
            # next, without either, names what is lost.
            def given_up():  # one read: a next attempt clears last_error as it starts
                s = status(mnts[0])
                return s["state"] == "failed" and "cannot be recovered" in (s["last_error"] or "")
            wait_for("worker 0 to give the recovery up", given_up, 60, mnts=mnts[:1])
            s = status(mnts[0])
            assert s["generation"] == 5 and s["config"] == survivors, s
            error = s["last_error"]
            assert "cannot be recovered" in error and "'decoder.layers.4." in error, error
            assert "durable tier holds no complete copy" in error, error
            for kept in ("'decoder.layers.0.", "'decoder.layers.3.", "'decoder.layers.8."):
                assert kept not in error, error
            print("ok   workers 1 and 2 killed: nothing committed; " + error[:200])
            with open(os.path.join(mnts[0], "model", "rank-00000", "model.safetensors"), "rb") as f:
                assert len(f.read(1 << 20)) > 0
            print("ok   worker 0 still serves generation 5")

            # The durable tier back: a change onto worker 0 alone reads the lost stage from it.
            os.rename(durable + ".away", durable)
            alone = "tp=2,pp=1,dp=1,per_worker=2"
            with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
                f.write(alone + "\n")
            # The new layout is served at once, the lost stage read from the tier until the commit.
            rank0 = os.path.join(mnts[0], "model", "rank-00000", "model.safetensors")
            wait_for("worker 0 serving " + alone, lambda: status(mnts[0])["config"] == alone, 60, mnts=mnts[:1])
            with open(rank0, "rb") as f:
                early = f.read()
            wait_for("worker 0 at generation 6", lambda: at_generation(mnts[0], 6), 60, mnts=mnts[:1])
            MODEL.expect_ranks(tmp, mnts, alone, [0], "durable")
            with open(rank0, "rb") as f:
                assert f.read() == early, "rank 0 read during the change differs from the committed one"
            print("ok   the durable tier restored what no live worker held")
    finally:
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS lost_worker_test")


if __name__ == "__main__":
    main()
