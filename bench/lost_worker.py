#!/usr/bin/env python3
"""bench/lost_worker.py: issue 15's measurements of a job losing a worker.

Four workers, each in a network namespace of its own (tests/cluster/netns.py),
each mount's store holding only its own shard files, one job in etcd on the
bridge, every mount with --lease LEASE. The model (Llama, bf16, no optimizer
state; DIMS) is kept as tp=2,pp=4,dp=1,per_worker=2,replicas=2: one pipeline
stage per worker, each stage also on the next worker.

Per round (REPS rounds, a different worker each time, `sync; sleep SETTLE`
before each): kill -9 the worker, then measure from the kill
  - lease expired: its member key gone from etcd (polled every 10 ms);
  - first byte: the first MiB of a rank file of the survivors' layout read
    through a survivor's mount (served at once, from the old pieces);
  - whole again: every survivor serving the committed new generation, each
    stage again on two workers (the change's parts durable, etcd commit);
  - bytes moved: the sum of the survivors' parts vs `ptcfs cluster status`'s
    plan for that loss, taken before the kill (bytes_moved, lower_bound).
Then the worker comes back with its old store (it catches up from a peer) and
the job goes back to four workers for the next round.
Every mount has --durable WORK/durable (the job's durable tier): the time
from the mounts serving to the workers' copy in it being complete is
measured; after the rounds, two neighbours (1 and 2) are killed at once, so
that the stage both kept (1's) is on no survivor: the time from the kill to
both leases expired and to the survivors (0, 3) serving the committed new
generation, its lost stage read from the tier, and the bytes only the lost
workers held.
The section goes into bench/RESULTS.md between <!-- lost_worker:begin --> and
<!-- lost_worker:end -->.

Environment: PTCFS (build/tools/ptcfs), WORK (/tmp/ptcfs-lost-bench; removed
unless KEEP=1), DIMS, REPS (3), LEASE (2), SETTLE (4), RESULTS. Root; /dev/fuse; etcd.
"""
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from netns import Netns, require, start_etcd  # noqa: E402
from workers import (at_generation, job_token, job_url, kill, start_worker, status, stop, wait_for,  # noqa: E402
                     worker_store)
from results_section import write_section  # noqa: E402

PTCFS = os.environ.get("PTCFS", os.path.join(ROOT, "build/tools/ptcfs"))
WORK = os.environ.get("WORK", "/tmp/ptcfs-lost-bench")
DIMS = os.environ.get("DIMS", "layers=12,hidden=2048,heads=16,kv_heads=8,vocab=32000,seq=1024,ffn=5504")
REPS = int(os.environ.get("REPS", "3"))
LEASE = os.environ.get("LEASE", "2")
SETTLE = float(os.environ.get("SETTLE", "4"))
RESULTS = os.environ.get("RESULTS", os.path.join(ROOT, "bench/RESULTS.md"))
FIRST = "tp=2,pp=4,dp=1,per_worker=2"
KEPT = FIRST + ",replicas=2"
WORKERS, PORT, JOB = 4, 7440, "bench"


def sh(*args):
    return subprocess.run(list(args), check=True, capture_output=True, text=True).stdout


def member_live(endpoint, worker):
    key = base64.b64encode(("/ptcfs/%s/members/%d" % (JOB, worker)).encode()).decode()
    req = urllib.request.Request(endpoint + "/v3/kv/range", data=json.dumps({"key": key}).encode(),
                                 headers={"Content-Type": "application/json"})
    return bool(json.load(urllib.request.urlopen(req, timeout=5)).get("kvs"))


def start(ns, w, store, mnt, url, token):
    return start_worker(ns, PTCFS, w, store, mnt, url, token, PORT, os.path.join(WORK, "worker%d.log" % w),
                        ["--format", "safetensors", "--lease", LEASE, "--durable", os.path.join(WORK, "durable")])


def main():
    require(etcd=True)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    mnts = [os.path.join(WORK, "mnt%d" % w) for w in range(WORKERS)]
    daemons, rows = [], []
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(WORK, "etcd"), ns.host_addr) as etcd:
            sh(PTCFS, "synth", "--schema", "llama", "--dims", DIMS, "--config", FIRST, "--dtype", "bf16",
               os.path.join(WORK, "saved"))
            whole = os.path.join(WORK, "whole")
            sh(PTCFS, "import", "--schema", "llama", "--dims", DIMS, "--config", FIRST,
               os.path.join(WORK, "saved"), whole)
            shutil.rmtree(os.path.join(WORK, "saved"))
            stores = [worker_store(whole, os.path.join(WORK, "store%d" % w), w) for w in range(WORKERS)]
            shutil.rmtree(whole)
            token = job_token(os.path.join(WORK, "token"), "benchmark-token-of-lost-workers")
            url = job_url(etcd, JOB)
            for w in range(WORKERS):
                os.makedirs(mnts[w])
                daemons.append(start(ns, w, stores[w], mnts[w], url, token))
            for m in mnts:
                wait_for(m, lambda: status(m)["state"] == "serving", 120, mnts=mnts)
            t0 = time.time()
            wait_for("the durable tier's copy", lambda: os.path.exists(os.path.join(WORK, "durable", "durable.json")),
                     600, mnts=mnts)
            durable = {"copy_s": time.time() - t0}

            def everyone_at(generation, config, live):
                for w in live:
                    wait_for("worker %d at %d" % (w, generation),
                             lambda: at_generation(mnts[w], generation) and status(mnts[w])["config"] == config,
                             600, mnts=[mnts[x] for x in live])

            generation = status(mnts[0])["generation"] + 1
            with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
                f.write(KEPT + "\n")
            everyone_at(generation, KEPT, range(WORKERS))
            buf = bytearray(1 << 20)
            for r in range(REPS):
                victim = 1 + r % (WORKERS - 1)
                live = [w for w in range(WORKERS) if w != victim]
                report = json.loads(sh(PTCFS, "cluster", "status", "--cluster", url, "--token-file", token, "--json"))
                lost = next(w for w in report["workers"] if w["worker"] == victim)["if_lost"]
                assert lost["lost_tensors"] == [], lost
                survivors = lost["config"]
                subprocess.run(["sync"])
                time.sleep(SETTLE)
                t0 = time.time()
                kill(daemons, mnts, [victim])
                while member_live(etcd.endpoint, victim):
                    time.sleep(0.01)
                row = {"round": r, "victim": victim, "expired_s": time.time() - t0}
                reader = live[0]
                rank0 = os.path.join(mnts[reader], "model", "rank-00000", "model.safetensors")
                wait_for("the survivors' layout on worker %d" % reader,
                         lambda: status(mnts[reader])["config"] == survivors and os.path.exists(rank0), 600,
                         poll=0.005, mnts=[mnts[x] for x in live])
                with open(rank0, "rb", buffering=0) as f:
                    got, want = 0, min(len(buf), os.path.getsize(rank0))
                    while got < want:
                        n = f.readinto(memoryview(buf)[got:want])
                        assert n > 0, (got, want)
                        got += n
                row["first_mib_s"] = time.time() - t0
                generation += 1
                everyone_at(generation, survivors, live)
                row["whole_s"] = time.time() - t0
                row["parts"] = [status(mnts[w])["bytes_total"] for w in live]
                row["plan_moved"], row["plan_lower_bound"] = lost["bytes_moved"], lost["lower_bound"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                # Back: the worker returns with its store (it catches up), then four workers again.
                daemons[victim] = start(ns, victim, stores[victim], mnts[victim], url, token)
                wait_for("worker %d back" % victim, lambda: at_generation(mnts[victim], generation), 120, mnts=mnts)
                with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
                    f.write(KEPT + "\n")
                generation += 1
                everyone_at(generation, KEPT, range(WORKERS))
            # Two neighbours at once: stage 1 (kept on workers 1 and 2) only in the durable tier.
            report = json.loads(sh(PTCFS, "cluster", "status", "--cluster", url, "--token-file", token, "--json"))
            durable["lost_bytes"] = next(w for w in report["workers"] if w["worker"] == 1)["replicas"]["2"]
            subprocess.run(["sync"])
            time.sleep(SETTLE)
            t0 = time.time()
            kill(daemons, mnts, [1, 2])
            while member_live(etcd.endpoint, 1) or member_live(etcd.endpoint, 2):
                time.sleep(0.01)
            durable["expired_s"] = time.time() - t0
            # Rank 0 of the survivors' layout holds layers of the lost stage: read whole on worker 0 as soon as
            # it is served (before the commit its lost regions come from the tier).
            survivors = "tp=2,pp=2,dp=1,per_worker=2,workers=0+3,replicas=2"
            rank0 = os.path.join(mnts[0], "model", "rank-00000", "model.safetensors")
            wait_for("the survivors' layout on worker 0", lambda: status(mnts[0])["config"] == survivors and
                     os.path.exists(rank0), 600, poll=0.005, mnts=[mnts[0], mnts[3]])
            whole = bytearray(os.path.getsize(rank0))
            with open(rank0, "rb", buffering=0) as f:
                got = 0
                while got < len(whole):
                    n = f.readinto(memoryview(whole)[got:])
                    assert n > 0, (got, len(whole))
                    got += n
            durable["rank0_read_s"] = time.time() - t0
            durable["rank0_read_before_commit"] = status(mnts[0])["generation"] == generation
            generation += 1
            for w in (0, 3):
                wait_for("worker %d at %d" % (w, generation), lambda: at_generation(mnts[w], generation), 600,
                         mnts=[mnts[0], mnts[3]])
            durable["whole_s"] = time.time() - t0
            with open(rank0, "rb") as f:
                assert f.read() == whole, "rank 0 read before the commit differs from the committed one"
            durable["config"] = status(mnts[0])["config"]
            durable["parts"] = [status(mnts[w])["bytes_total"] for w in (0, 3)]
            print(json.dumps(durable), flush=True)
    finally:
        stop(daemons, mnts, grace=30)
        if not os.environ.get("KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)
    report_section(rows, durable)


def report_section(rows, durable):
    med = statistics.median
    moved = [sum(r["parts"]) for r in rows]
    text = "\n".join([
        "## A lost worker (issue 15)",
        "",
        "`/usr/bin/python3 bench/lost_worker.py` (REPS=%d, LEASE=%s s, SETTLE=%g s), %s. Four workers in network "
        "namespaces, each store holding only its own files; Llama `%s`, bf16, `%s`: one stage per worker, each "
        "stage also on the next worker. Each round kills -9 another worker; the survivors move on their own. "
        "Medians (range)." % (REPS, LEASE, SETTLE, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), DIMS, KEPT),
        "",
        "| from the kill to | seconds |",
        "|---|---|",
        "| the lease expired (member key gone) | %.2f (%.2f-%.2f) |" % (
            med([r["expired_s"] for r in rows]), min(r["expired_s"] for r in rows),
            max(r["expired_s"] for r in rows)),
        "| first MiB of rank 0 of the survivors' layout, read on a survivor | %.2f (%.2f-%.2f) |" % (
            med([r["first_mib_s"] for r in rows]), min(r["first_mib_s"] for r in rows),
            max(r["first_mib_s"] for r in rows)),
        "| replicas whole again (the new generation committed on every survivor) | %.2f (%.2f-%.2f) |" % (
            med([r["whole_s"] for r in rows]), min(r["whole_s"] for r in rows), max(r["whole_s"] for r in rows)),
        "",
        "| bytes moved (sum of the survivors' parts) | plan's bytes moved | plan's lower bound |",
        "|---|---|---|",
    ] + ["| %d | %d | %d |" % (m, r["plan_moved"], r["plan_lower_bound"]) for m, r in zip(moved, rows)] + [
        "",
        "Beyond the replicas, with the durable tier (`--durable`, a directory on the same disk here):",
        "",
        "| measure | value |",
        "|---|---|",
        "| mounts serving -> the workers' copy in the tier complete (s) | %.2f |" % durable["copy_s"],
        "| kill -9 of workers 1 and 2 -> both leases expired (s) | %.2f |" % durable["expired_s"],
        "| kill -> rank 0 of the survivors' layout (holding layers of stage 1) read whole on worker 0 (s) | %.2f "
        "(%s the commit) |" % (durable["rank0_read_s"], "before" if durable["rank0_read_before_commit"] else "after"),
        "| kill -> the survivors serving the committed %s, stage 1 read from the tier (s) | %.2f |" % (
            durable["config"], durable["whole_s"]),
        "| bytes only workers 1 and 2 held / bytes moved (sum of the survivors' parts) | %d / %d |" % (
            durable["lost_bytes"], sum(durable["parts"])),
        "",
        "Rounds:",
        "",
        "```",
    ] + [json.dumps(r) for r in rows] + [json.dumps(durable), "```"])
    print(write_section(RESULTS, "lost_worker", text))


if __name__ == "__main__":
    main()
