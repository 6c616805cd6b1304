#!/usr/bin/env python3
"""A cut link: a worker cut off from the job while mounted rejoins by itself
when its link comes back (docs/cluster.md, "Lost workers"); four ptcfs
mounts, each worker in a network namespace of its own, one job in a real etcd.

  8 ranks, tp=2,pp=4 (one stage per worker: workers 0-3, per_worker=2)
  -> the same with replicas=2 (generation 2)
  worker 2's link cut (`ip link set <its veth> down`): its lease expires, the
     survivors move on their own to tp=2,pp=3 on workers 0, 1, 3
     (generation 3), worker 2's stage read from its replica; worker 2's mount
     still serves generation 2 meanwhile (its reads answer, bit-exact), and
     its .ptcfs/status says it cannot reach etcd
  the link restored: etcd says worker 2's lease is gone; it catches up with
     generation 3 from a peer, serves it, then joins again (`ptcfs cluster
     status` lists it live)
  asked back to tp=2,pp=4 on workers 0-3 (on worker 2's own mount): it pulls
     its stage again (generation 4)
  worker 2 cut again while the job moves to tp=2,pp=2,dp=2: the change is
     aborted (or committed with its part); either way the survivors end on a
     config without it, it rejoins at their generation once the link is back,
     and a change back to four workers uses it again
After each committed step every rank's files, on the worker its slot names,
equal `ptcfs synth` of the config, tensor by tensor (`ptcfs diff`).

Usage: cut_link_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import contextlib
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
WORKERS, PORT, JOB, CUT = 4, 7441, "cut", 2
LEASE = 2


def placement(config):
    """The workers of a config's slots, in slot order (per_worker=2: slot r // 2 holds rank r)."""
    fields = dict(kv.split("=") for kv in config.split(","))
    if "workers" in fields:
        return [int(w) for w in fields["workers"].split("+")]
    slots = int(fields["tp"]) * int(fields["pp"]) * int(fields.get("dp", 1)) // int(fields["per_worker"])
    return list(range(slots))


def settled(states):
    """The survivors' common status once they serve one generation, with no change under way, on a
    config that places nothing on the cut worker; else None."""
    first = states[0]
    if any(s["state"] != "serving" or s["generation"] != first["generation"] or s["config"] != first["config"]
           for s in states):
        return None
    return first if CUT not in placement(first["config"]) else None


def start(ns, w, store, mnt, url, token, tmp):
    return start_worker(ns, PTCFS, w, store, mnt, url, token, PORT, os.path.join(tmp, "worker%d.log" % w),
                        ["--lease", str(LEASE)])


def main():
    require(etcd=True)
    tmp = tempfile.mkdtemp(prefix="ptcfs-cut-")
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    started = time.time()
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            try:
                first = "tp=2,pp=4,dp=1,per_worker=2"
                ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--config", first, "--optimizer", "adam", "--seed",
                      "7", os.path.join(tmp, "saved"))
                ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", first, os.path.join(tmp, "saved"),
                      os.path.join(tmp, "whole"))
                stores = [worker_store(os.path.join(tmp, "whole"), os.path.join(tmp, "store%d" % w), w)
                          for w in range(WORKERS)]
                token = job_token(os.path.join(tmp, "token"), "token-of-the-cut-link-test")
                url = job_url(etcd, JOB)
                for w in range(WORKERS):
                    os.makedirs(mnts[w])
                    daemons.append(start(ns, w, stores[w], mnts[w], url, token, tmp))
                for w in range(WORKERS):
                    wait_for("worker %d's mount" % w, lambda: status(mnts[w])["state"] == "serving", mnts=mnts)
                print("ok   4 workers mounted")

                replicated = first + ",replicas=2"
                reconfigure(mnts[0], replicated)
                for w in range(WORKERS):
                    wait_for("worker %d at generation 2" % w, lambda: at_generation(mnts[w], 2), mnts=mnts)
                MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2, 3], "replicated")
                before, _ = rank_digests(mnts[CUT])

                # Worker 2's link is cut: the survivors reconfigure onto themselves.
                t0 = time.time()
                ns.set_link(CUT, False)
                live = [w for w in range(WORKERS) if w != CUT]
                survivors = "tp=2,pp=3,dp=1,per_worker=2,workers=0+1+3,replicas=2"
                for w in live:
                    wait_for("worker %d at generation 3" % w, lambda: at_generation(mnts[w], 3), 60,
                             mnts=[mnts[x] for x in live])
                    assert status(mnts[w])["config"] == survivors, status(mnts[w])
                print("ok   worker %d cut off: the survivors serve %s after %.1f s (lease %d s)" %
                      (CUT, survivors, time.time() - t0, LEASE))
                MODEL.expect_ranks(tmp, mnts, survivors, live, "survivors")

                # Cut off, worker 2 still serves what it had, and says it is away.
                away = wait_for("worker %d to note that it cannot reach etcd" % CUT,
                                lambda: "cannot reach etcd" in (status(mnts[CUT])["last_error"] or "") and
                                status(mnts[CUT]), 60, poll=0.2, mnts=mnts[CUT:CUT + 1])
                assert away["generation"] == 2 and away["config"] == replicated, away
                assert "worker %d cannot reach etcd for job %s" % (CUT, JOB) in away["last_error"], away
                assert not away["cluster"]["member"], away
                during, seconds = rank_digests(mnts[CUT])
                assert during == before, "worker %d's ranks changed while cut off" % CUT
                print("ok   cut off, worker %d serves generation 2 (its ranks read in %.2f s, bit-exact): %s" %
                      (CUT, seconds, away["last_error"][:160]))
                assert daemons[CUT].poll() is None, "worker %d's daemon ended" % CUT
                try:  # not a member: a config written to its mount is refused, not proposed
                    with open(os.path.join(mnts[CUT], ".ptcfs", "config"), "w") as f:
                        f.write(first + "\n")
                    raise AssertionError("worker %d took a config while cut off" % CUT)
                except OSError as e:
                    refused = status(mnts[CUT])["last_error"]
                    assert e.errno == errno.EBUSY and "is not a member of job" in refused, (e, refused)
                    print("ok   cut off, worker %d refuses a config (%s): %s" % (CUT, e.strerror, refused[:100]))

                # The link comes back: worker 2 catches up, then joins again.
                t1 = time.time()
                ns.set_link(CUT, True)
                back = wait_for("worker %d back at generation 3" % CUT,
                                lambda: at_generation(mnts[CUT], 3) and status(mnts[CUT])["last_error"] is None and
                                status(mnts[CUT]), 90, poll=0.05, mnts=mnts)
                rejoined = time.time() - t1
                assert back["config"] == survivors, back
                assert os.listdir(os.path.join(mnts[CUT], "model")) == [], os.listdir(
                    os.path.join(mnts[CUT], "model"))
                j = wait_for("worker %d live in ptcfs cluster status" % CUT,
                             lambda: (lambda j: CUT in [w["worker"] for w in j["workers"] if w["live"]] and j)(
                                 MODEL.cluster_json(url, token)), 30, poll=0.2)
                assert j["committed"]["generation"] == 3 and j["committed"]["config"] == survivors, j
                assert sorted(w["worker"] for w in j["workers"] if w["live"]) == [0, 1, 2, 3], j
                for w in live:
                    assert at_generation(mnts[w], 3) and status(mnts[w])["config"] == survivors, status(mnts[w])
                print("ok   link restored: worker %d serves generation 3 (%s) %.1f s later, and is live again" %
                      (CUT, survivors, rejoined))
                with open(os.path.join(tmp, "worker%d.log" % CUT)) as f:
                    log = f.read()
                assert "lost its membership" in log and "rejoined job %s at generation 3" % JOB in log, log[-2000:]
                assert "left the job" not in log, log[-2000:]  # it proposed no recovery onto itself

                # Back onto all four workers, asked on worker 2's own mount: it pulls its stage again.
                reconfigure(mnts[CUT], replicated)
                for w in range(WORKERS):
                    wait_for("worker %d at generation 4" % w, lambda: at_generation(mnts[w], 4), 60, mnts=mnts)
                    assert status(mnts[w])["config"] == replicated, status(mnts[w])
                MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2, 3], "again")
                j = MODEL.cluster_json(url, token)
                assert j["committed"]["generation"] == 4 and all(w["live"] for w in j["workers"]), j
                print("ok   back on 4 workers: worker %d holds ranks 4-5 again" % CUT)

                # Cut again, mid-change: whether the change is aborted (worker 2's lease
                # expires before its part is in) or committed with its part, the survivors
                # end on a config without it, and worker 2 rejoins at their generation.
                reconfigure(mnts[0], "tp=2,pp=2,dp=2,per_worker=2,replicas=2")
                seen = wait_for("worker %d to take the change up" % CUT,
                                lambda: (lambda s: (s["state"] != "serving" or s["generation"] != 4) and s)(
                                    status(mnts[CUT])), 30, poll=0.002, mnts=mnts)
                t2 = time.time()
                ns.set_link(CUT, False)
                final = wait_for("the survivors to settle without worker %d" % CUT,
                                 lambda: settled([status(mnts[w]) for w in live]), 120, poll=0.1,
                                 mnts=[mnts[x] for x in live])
                print("ok   cut mid-change (worker %d %s at generation %d): the survivors serve %s at generation %d "
                      "after %.1f s" % (CUT, seen["state"], seen["generation"], final["config"], final["generation"],
                                        time.time() - t2))
                time.sleep(LEASE)  # cut off for a while longer
                t3 = time.time()
                ns.set_link(CUT, True)
                back = wait_for("worker %d back at generation %d" % (CUT, final["generation"]),
                                lambda: at_generation(mnts[CUT], final["generation"]) and
                                status(mnts[CUT])["last_error"] is None and status(mnts[CUT]), 120, poll=0.05,
                                mnts=mnts)
                assert back["config"] == final["config"], back
                print("ok   link restored: worker %d serves generation %d %.1f s later" %
                      (CUT, final["generation"], time.time() - t3))
                MODEL.expect_ranks(tmp, mnts, final["config"], placement(final["config"]), "midchange")
                reconfigure(mnts[1], replicated)
                last = final["generation"] + 1
                for w in range(WORKERS):
                    wait_for("worker %d at generation %d" % (w, last), lambda: at_generation(mnts[w], last), 60,
                             mnts=mnts)
                MODEL.expect_ranks(tmp, mnts, replicated, [0, 1, 2, 3], "final")
            finally:
                with contextlib.suppress(Exception):
                    ns.set_link(CUT, True)  # so that its daemon can leave the job as it unmounts
                stop(daemons, mnts)
    finally:
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS cut_link_test (%.1f s)" % (time.time() - started))


if __name__ == "__main__":
    main()
