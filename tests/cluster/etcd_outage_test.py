#!/usr/bin/env python3
"""etcd away: a job's workers serve on while its etcd is down, and go on as
the same job once it is back (docs/cluster.md, "etcd away"); three ptcfs
mounts, each worker in a network namespace of its own, one etcd killed and
started again on its data.

  6 ranks, tp=2,pp=3,replicas=2 (one stage per worker: workers 0-2,
     per_worker=2; each worker also keeps the stage before its own)
  etcd killed (kill -9) for three leases: every worker serves generation 2
     bit-exact from its own store and says in .ptcfs/status that it cannot
     reach etcd; a config written to a mount is refused
  etcd started again: it renews every lease as it starts, so the workers'
     renewals succeed again and all three are members as before, under
     the leases they had (no rejoin). No worker
     counts another as lost: no change onto "survivors" (with replicas it
     would succeed and shrink the job for nothing), the job stays at
     generation 2
  a change to tp=2,pp=1,dp=3 during which etcd is killed once every worker
     took it up, and started again two leases later: the change commits on
     all three or on none, and every worker ends on the same generation
  a change back to tp=2,pp=3,replicas=2 commits on all three
After each step every rank's files, on the worker its slot names, equal
`ptcfs synth` of the job's config, tensor by tensor (`ptcfs diff`).

Usage: etcd_outage_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import errno
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, require, start_etcd  # noqa: E402
from workers import (Model, at_generation, job_token, job_url, rank_digests, reconfigure, start_worker,  # noqa: E402
                     remove_tmp, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA, DIMS = "llama", "layers=12,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96"
MODEL = Model(PTCFS, SCHEMA, DIMS)
ptcfs = MODEL.run
WORKERS, PORT, JOB = 3, 7451, "away"
LEASE = 2


def members_again(mnts, aborted=False):
    """Every mount's status once all are members of the job and serve one
    generation in one config with no error (`aborted`: or with the error
    of a change that was aborted); else None."""
    states = [status(m) for m in mnts]
    ok = ("serving", "failed") if aborted else ("serving",)
    if all(s["state"] in ok and (aborted or s["last_error"] is None) and s["cluster"].get("member") and
           (s["generation"], s["config"]) == (states[0]["generation"], states[0]["config"]) for s in states):
        return states
    return None


def main():
    require(etcd=True)
    tmp = tempfile.mkdtemp(prefix="ptcfs-away-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    logs = [os.path.join(tmp, "worker%d.log" % w) for w in range(WORKERS)]
    daemons = []
    started = time.time()
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            try:
                first = "tp=2,pp=3,dp=1,per_worker=2"
                ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--config", first, "--optimizer", "adam", "--seed",
                      "7", os.path.join(tmp, "saved"))
                ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", first, os.path.join(tmp, "saved"),
                      os.path.join(tmp, "whole"))
                token = job_token(os.path.join(tmp, "token"), "token-of-the-etcd-outage-test")
                url = job_url(etcd, JOB)
                for w in range(WORKERS):
                    store = worker_store(os.path.join(tmp, "whole"), os.path.join(tmp, "store%d" % w), w)
                    os.makedirs(mnts[w])
                    daemons.append(start_worker(ns, PTCFS, w, store, mnts[w], url, token, PORT, logs[w],
                                                ["--lease", str(LEASE)]))
                for w in range(WORKERS):
                    wait_for("worker %d's mount" % w, lambda: status(mnts[w])["state"] == "serving", mnts=mnts)
                replicated = first + ",replicas=2"
                reconfigure(mnts[0], replicated)
                for w in range(WORKERS):
                    wait_for("worker %d at generation 2" % w, lambda: at_generation(mnts[w], 2), mnts=mnts)
                MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2], "replicated")
                before = [rank_digests(m)[0] for m in mnts]

                # etcd dies: every worker serves what it has from its own store.
                t0 = time.time()
                etcd.kill()
                for w in range(WORKERS):
                    away = wait_for("worker %d to note that etcd is away" % w,
                                    lambda: (lambda s: s["last_error"] and s)(status(mnts[w])), 3 * LEASE + 10,
                                    poll=0.1, mnts=mnts)
                    assert "cannot reach etcd" in away["last_error"], away
                    assert away["generation"] == 2 and away["config"] == replicated, away
                    assert not away["cluster"]["member"], away
                print("ok   etcd killed: every worker says so within %.1f s (lease %d s): %s" %
                      (time.time() - t0, LEASE, away["last_error"][:140]))
                try:
                    with open(os.path.join(mnts[1], ".ptcfs", "config"), "w") as f:
                        f.write(first + "\n")
                    raise AssertionError("worker 1 took a config while etcd was away")
                except OSError as e:
                    assert e.errno == errno.EBUSY, e
                time.sleep(max(0.0, t0 + 3 * LEASE - time.time()))  # away for three leases
                for w in range(WORKERS):
                    during, seconds = rank_digests(mnts[w])
                    assert during == before[w], "worker %d's ranks changed while etcd was away" % w
                print("ok   etcd away for %.1f s: every worker serves generation 2, bit-exact, and refuses a config" %
                      (time.time() - t0))

                # etcd back: the same members, the same generation; nobody counted as lost.
                t1 = time.time()
                etcd.restart()
                back = wait_for("the workers to be members again", lambda: members_again(mnts), 30, poll=0.05,
                                mnts=mnts)
                print("ok   etcd back: all three workers members again after %.1f s" % (time.time() - t1))
                time.sleep(2 * LEASE)  # long enough for a lease that was not renewed to expire
                j = MODEL.cluster_json(url, token)
                assert sorted(w["worker"] for w in j["workers"] if w["live"]) == [0, 1, 2], j
                assert j["committed"]["generation"] == 2 and j["committed"]["config"] == replicated, j
                assert j["change"] is None, j
                for w in range(WORKERS):
                    s = status(mnts[w])
                    assert at_generation(mnts[w], 2) and s["config"] == replicated and s["last_error"] is None, s
                    with open(logs[w]) as f:
                        log = f.read()
                    assert "left the job" not in log, log[-2000:]  # no recovery onto "survivors"
                    # Its lease was renewed, not lost: it went on as a member without rejoining.
                    assert "reaches etcd again, its lease renewed" in log, log[-2000:]
                    assert "lost its membership" not in log, log[-2000:]
                print("ok   %.0f s later still generation 2 on all three: no worker was counted as lost" %
                      (time.time() - t1))
                assert back[0]["config"] == replicated

                # etcd dies in the middle of a change: the job ends on one generation, whatever it is.
                wide = "tp=2,pp=1,dp=3,per_worker=2,replicas=2"
                reconfigure(mnts[0], wide)
                for w in range(WORKERS):
                    wait_for("worker %d to take the change up" % w,
                             lambda: (lambda s: s["state"] != "serving" or s["generation"] != 2)(status(mnts[w])),
                             30, poll=0.002, mnts=mnts)
                t2 = time.time()
                etcd.kill()
                time.sleep(2 * LEASE)
                etcd.restart()
                settled = wait_for("the workers to settle on one generation", lambda: members_again(mnts, True), 120,
                                   poll=0.1, mnts=mnts)
                final = settled[0]
                assert final["generation"] in (2, 3), settled
                assert final["config"] == (wide if final["generation"] == 3 else replicated), final
                print("ok   etcd killed mid-change and back: every worker serves generation %d (%s) %.1f s after it "
                      "died" % (final["generation"], final["config"], time.time() - t2))
                MODEL.expect_ranks(tmp, mnts, final["config"], [0, 1, 2], "midchange")

                # The job goes on: a change back commits on all three.
                reconfigure(mnts[2], replicated)
                last = final["generation"] + 1
                for w in range(WORKERS):
                    wait_for("worker %d at generation %d" % (w, last), lambda: at_generation(mnts[w], last), 60,
                             mnts=mnts)
                MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2], "after")
            finally:
                stop(daemons, mnts)
    finally:
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS etcd_outage_test (%.1f s)" % (time.time() - started))


if __name__ == "__main__":
    main()
