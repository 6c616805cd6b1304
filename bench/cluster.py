#!/usr/bin/env python3
"""bench/cluster.py: issue 14's measurements of a reconfigure across workers.

Four workers, each in a network namespace of its own (tests/cluster/netns.py:
veth pairs on one bridge), each mounting a store that holds only its own
shard files, coordinated by etcd on the bridge. The model (Llama, bf16, no
optimizer state; DIMS) starts at FROM (tp=2,pp=1, one rank per worker:
workers 0 and 1 hold a tp half of every layer each, 2 and 3 nothing) and
goes to TO (tp=2,pp=2: workers 0 and 1 keep the first stage, 2 and 3 serve
the second and pull its tp halves from 0 and 1: two senders, two receivers,
equal shares), then back (which pulls the second stage home again).

Measured per round (REPS rounds; `sync; sleep SETTLE` before each timed write):
  - bytes moved: the sum of the receiving workers' parts (each mount's status
    bytes_total) vs `ptcfs plan --json` of the whole store: lower_bound, and
    the busiest worker (plan bottleneck, and the largest part measured) vs a
    balanced share (bytes moved / receiving workers);
  - first byte: from writing TO to worker 0's .ptcfs/config to the first
    1 MiB of rank 2's model.safetensors (worker 2's; every data byte of it on
    worker 0) read through worker 2's mount;
  - pull: from the request to every worker serving the committed generation
    (parts durable, etcd commit, local commits), as GB/s of the bytes moved;
  - the floor: as many bytes sent by a plain TCP copy between the same
    namespaces at the same time (bench/tcp_copy: worker 0 -> 2 and 1 -> 3,
    each the sender's largest shard files up to half the bytes moved, in
    16 MiB chunks over CONNECTIONS connections per pair, received with
    pwrite() and fsync'd), GB/s;
  - with PTCFS_BEFORE (another build's ptcfs): a second job of four workers
    of that build beside the first (its own stores, mounts and ports), its
    pull timed in the same rounds; the sides' order rotates per round.
  - peak RSS of the receiving daemons (VmHWM).
The section goes into bench/RESULTS.md between <!-- cluster:begin --> and
<!-- cluster:end -->.

Environment: PTCFS (build/tools/ptcfs), TCP_COPY (build/bench/tcp_copy),
WORK (/tmp/ptcfs-cluster-bench; removed unless KEEP=1), DIMS, REPS (3),
THREADS (the mounts' --transform-threads, 2), PERF (a perf.data path: profile the first pull),
SETTLE (8), FLOOR_SYNC (1; 0: the floor's files not fsync'd), CONNECTIONS (the floor's
connections per pair, 4: the pull's most per receiver, --transform-threads 2 plus
PeerEnv's 2 spans ahead), PTCFS_BEFORE, RESULTS. Root; /dev/fuse; etcd.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from netns import Netns, require, start_etcd  # noqa: E402
from workers import (at_generation, job_token, job_url, start_worker, status, stop, wait_for,  # noqa: E402
                     worker_store)
from results_section import write_section  # noqa: E402

PTCFS = os.environ.get("PTCFS", os.path.join(ROOT, "build/tools/ptcfs"))
TCP_COPY = os.environ.get("TCP_COPY", os.path.join(ROOT, "build/bench/tcp_copy"))
WORK = os.environ.get("WORK", "/tmp/ptcfs-cluster-bench")
DIMS = os.environ.get("DIMS", "layers=8,hidden=2048,heads=16,kv_heads=8,vocab=32000,seq=1024,ffn=5504")
REPS = int(os.environ.get("REPS", "3"))
THREADS = os.environ.get("THREADS", "2")  # --transform-threads of every mount
SETTLE = float(os.environ.get("SETTLE", "8"))
FLOOR_SYNC = os.environ.get("FLOOR_SYNC", "1") != "0"  # 0: the floor's files not fsync'd (the network alone)
CONNECTIONS = int(os.environ.get("CONNECTIONS", "4"))  # the floor's connections per pair
PTCFS_BEFORE = os.environ.get("PTCFS_BEFORE")  # a second build's ptcfs, timed in the same rounds
RESULTS = os.environ.get("RESULTS", os.path.join(ROOT, "bench/RESULTS.md"))
FROM, TO = "tp=2,pp=1,dp=1,per_worker=1", "tp=2,pp=2,dp=1,per_worker=1"
WORKERS, PORT = 4, 7420


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw).stdout


def settle():
    subprocess.run(["sync"])
    time.sleep(SETTLE)


def shard_files(store, nbytes):
    """Shard files of the store (a sender's: only its own), largest first,
    until they hold at least `nbytes`."""
    files = sorted((os.path.getsize(p), p) for p in (os.path.join(d, f) for d, _, fs in os.walk(store)
                                                     for f in fs if f.endswith(".h5")))
    out, total = [], 0
    for size, p in reversed(files):
        if total >= nbytes:
            break
        out.append(p)
        total += size
    return out


def vm_hwm(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def reconfigure(mnts, asker, config, generation):
    with open(os.path.join(mnts[asker], ".ptcfs", "config"), "w") as f:
        f.write(config + "\n")
    for m in mnts:
        wait_for(m + " at generation %d" % generation, lambda: at_generation(m, generation), 600, mnts=mnts)


def start_job(ns, etcd, binary, name, whole, token, port, daemons):
    """Four workers of `binary` as job `name`, each over its own copy of the
    store `whole` (its own files only), serving; appends them to `daemons`."""
    work = os.path.join(WORK, name)
    os.makedirs(work)
    stores = [worker_store(whole, os.path.join(work, "store%d" % w), w) for w in range(WORKERS)]
    mnts = [os.path.join(work, "mnt%d" % w) for w in range(WORKERS)]
    mine = []
    for w in range(WORKERS):
        os.makedirs(mnts[w])
        mine.append(start_worker(ns, binary, w, stores[w], mnts[w], job_url(etcd, name), token, port,
                                 os.path.join(work, "worker%d.log" % w),
                                 ["--format", "safetensors", "--transform-threads", THREADS]))
    daemons.extend(zip(mine, mnts))
    for m in mnts:
        wait_for(m, lambda: status(m)["state"] == "serving", 60, mnts=mnts)
    return {"name": name, "stores": stores, "mnts": mnts, "daemons": mine, "generation": status(mnts[0])["generation"]}


def timed_pull(job, row, key, perf_round):
    """Reconfigures `job` to TO and times it into row[key + '_s'] (and its details)."""
    mnts, daemons = job["mnts"], job["daemons"]
    rank2 = os.path.join(mnts[2], "model", "rank-00002", "model.safetensors")
    perf = None
    if os.environ.get("PERF") and perf_round:  # a whole-system profile of the first pull
        who = ["-p", str(daemons[2].pid)] if os.environ.get("PERF_WORKER2") else ["-a"]
        perf = subprocess.Popen(["perf", "record", *who, "-g", "-o", os.environ["PERF"]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    pulled0 = [status(m)["cluster"]["pulled"] for m in mnts[2:]]
    t0 = time.time()
    with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
        f.write(TO + "\n")
    wait_for("rank 2 on worker 2", lambda: os.path.exists(rank2), 600)
    buf = bytearray(1 << 20)
    with open(rank2, "rb", buffering=0) as f:
        n = f.readinto(buf)
    first = time.time() - t0
    assert n == len(buf), n
    job["generation"] += 1
    generation = job["generation"]

    def written():  # the receivers' parts written (not yet durable nor committed)
        ss = [status(m) for m in mnts[2:]]
        return all(x["generation"] == generation or
                   (x["bytes_total"] > 0 and x["bytes_done"] == x["bytes_total"]) for x in ss)
    wait_for("the parts written", written, 600, mnts=mnts)
    written_s = time.time() - t0
    for m in mnts:
        wait_for(m + " at generation %d" % generation, lambda: at_generation(m, generation), 600, mnts=mnts)
    row[key + "_s"] = time.time() - t0
    if perf:
        perf.send_signal(2)
        perf.wait()
    row[key + "_first_mib_s"] = first
    row[key + "_written_s"] = written_s
    row[key + "_parts"] = [status(m)["bytes_total"] for m in mnts]
    row[key + "_rss"] = [vm_hwm(daemons[w].pid) for w in (2, 3)]
    pulled = [status(m)["cluster"]["pulled"] for m in mnts[2:]]
    row[key + "_pulled"] = [{k: v - p0.get(k, 0) for k, v in p.items()} for p, p0 in zip(pulled, pulled0)]


def timed_floor(ns, stores, plan, row):
    outs, procs = [], []
    t0 = time.time()
    for src, dst in ((0, 2), (1, 3)):
        out = os.path.join(stores[dst], "floor")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        outs.append(out)
        port = PORT + 10 + src
        procs.append(ns.popen(src, [TCP_COPY, "serve", "--listen", "%s:%d" % (ns.addr(src), port),
                                    "--connections", str(CONNECTIONS),
                                    *shard_files(stores[src], plan["lower_bound"] // 2)], stdout=subprocess.DEVNULL))
        procs.append(ns.popen(dst, [TCP_COPY, "fetch", "--from", "%s:%d" % (ns.addr(src), port), "--out", out,
                                    "--connections", str(CONNECTIONS), *(["--sync"] if FLOOR_SYNC else [])],
                              stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        o, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError("tcp_copy failed")
        if o:
            results.append(json.loads(o.strip().splitlines()[-1]))
    row["floor_s"] = time.time() - t0
    row["floor_bytes"] = sum(x["bytes"] for x in results)
    for out in outs:
        shutil.rmtree(out)


LOAD = ""


def main():
    global LOAD
    LOAD = "%.2f, %.2f, %.2f" % os.getloadavg()
    require(etcd=True)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    daemons, rows, notes = [], [], []
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(WORK, "etcd"), ns.host_addr) as etcd:
            sh(PTCFS, "synth", "--schema", "llama", "--dims", DIMS, "--config", FROM, "--dtype", "bf16",
               os.path.join(WORK, "saved"))
            whole = os.path.join(WORK, "whole")
            sh(PTCFS, "import", "--schema", "llama", "--dims", DIMS, "--config", FROM, os.path.join(WORK, "saved"),
               whole)
            shutil.rmtree(os.path.join(WORK, "saved"))
            plan = json.loads(sh(PTCFS, "plan", whole, "--to", TO, "--json"))
            notes.append("plan of the whole store: " + json.dumps({k: plan[k] for k in (
                "bytes_total", "bytes_kept", "bytes_moved", "lower_bound", "bottleneck")}))
            token = job_token(os.path.join(WORK, "token"), "benchmark-token-0123456789")
            jobs = {"pull": start_job(ns, etcd, PTCFS, "bench", whole, token, PORT, daemons)}
            if PTCFS_BEFORE:
                jobs["before"] = start_job(ns, etcd, PTCFS_BEFORE, "before", whole, token, PORT + 100, daemons)
            shutil.rmtree(whole)
            sides = [*jobs, "floor"]
            for r in range(REPS):
                order = sides[r % len(sides):] + sides[:r % len(sides)]
                row = {"round": r, "order": order}
                for what in order:
                    settle()
                    if what == "floor":
                        timed_floor(ns, jobs["pull"]["stores"], plan, row)
                    else:
                        timed_pull(jobs[what], row, what, r == 0 and what == "pull")
                for job in jobs.values():  # back, by reference (nothing moves), for the next round
                    job["generation"] += 1
                    reconfigure(job["mnts"], 3 if r % 2 else 1, FROM, job["generation"])
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        stop([d for d, _ in daemons], [m for _, m in daemons], grace=30)
        if not os.environ.get("KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)
    report(plan, rows, notes)


def report(plan, rows, notes):
    med = statistics.median
    moved = [sum(r["pull_parts"]) for r in rows]
    receivers = [[p for p in r["pull_parts"] if p > 0] for r in rows]
    busiest = [max(p) / (sum(p) / len(p)) for p in receivers]
    floor = [r["floor_bytes"] / r["floor_s"] / 1e9 for r in rows]
    sides = ["pull"] + (["before"] if "before_s" in rows[0] else [])
    speed = {k: [m / r[k + "_s"] / 1e9 for m, r in zip(moved, rows)] for k in sides}
    ratio = {k: [p / f for p, f in zip(speed[k], floor)] for k in sides}
    rss = max(max(r["pull_rss"]) for r in rows)
    balanced = plan["bytes_moved"] / len(receivers[0])
    connects = [sum(p["connects"] for p in r["pull_pulled"]) / len(r["pull_pulled"]) for r in rows]
    out = [
        "## Reconfigure across workers (issues 14, 42)",
        "",
        "`%s/usr/bin/python3 bench/cluster.py` (REPS=%d, SETTLE=%g s, CONNECTIONS=%d), %s, load average %s before. "
        "Four workers, each in a network namespace of its own (veths on one bridge), each mount's store holding only "
        "its own shard files; Llama `%s`, bf16, %s -> %s (workers 2 and 3 pull the second stage's tp halves from "
        "workers 0 and 1), back, pulling the second stage home between rounds. Floor: bench/tcp_copy 0 -> 2 and "
        "1 -> 3 at once, the senders' shard files in 16 MiB chunks over %d connections per pair, received with "
        "pwrite()%s.%s Sides interleaved (order rotating per round); medians; a ratio's range is over the rounds "
        "(paired)."
        % ("PTCFS_BEFORE=%s " % PTCFS_BEFORE if PTCFS_BEFORE else "", len(rows), SETTLE, CONNECTIONS,
           time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), LOAD, DIMS, FROM, TO, CONNECTIONS,
           " and fsync'd" if FLOOR_SYNC else " (not fsync'd: FLOOR_SYNC=0)",
           " `before`: a second job of four workers of PTCFS_BEFORE's build beside the first, in the same "
           "namespaces and rounds." if PTCFS_BEFORE else ""),
        "",
        "| measure | value | goal | |",
        "|---|---|---|---|",
        "| bytes moved (sum of the parts) / plan lower bound | %d / %d = %.3f | 1.0 | %s |"
        % (med(moved), plan["lower_bound"], med(moved) / plan["lower_bound"],
           "met" if med(moved) == plan["lower_bound"] else "not met"),
        "| busiest receiver / balanced share (measured) | %.3f | <= 1.1 | %s |"
        % (max(busiest), "met" if max(busiest) <= 1.1 else "not met"),
        "| plan bottleneck / balanced share | %.3f | <= 1.1 | %s |"
        % (plan["bottleneck"] / balanced, "met" if plan["bottleneck"] / balanced <= 1.1 else "not met"),
        "| plain TCP copy, same bytes, %d connections per pair, %s (GB/s) | %.3f | | |"
        % (CONNECTIONS, "durable" if FLOOR_SYNC else "not fsync'd", med(floor)),
    ]
    for k in sides:
        name = "this build" if k == "pull" else "PTCFS_BEFORE's build"
        out += [
            "| %s: pull, request to committed everywhere (GB/s) | %.3f | | |" % (name, med(speed[k])),
            "| %s: pull / TCP floor | **%.3f** (%.3f-%.3f) | >= 0.9 | %s |"
            % (name, med(ratio[k]), min(ratio[k]), max(ratio[k]), "met" if med(ratio[k]) >= 0.9 else "not met"),
            "| %s: writing the parts / then durable and committed everywhere (s) | %.3f / %.3f | | |"
            % (name, med([r[k + "_written_s"] for r in rows]), med([r[k + "_s"] - r[k + "_written_s"] for r in rows])),
            "| %s: request -> first MiB of rank 2 on worker 2 (s) | %.3f | | |"
            % (name, med([r[k + "_first_mib_s"] for r in rows])),
        ]
    if "before" in sides:
        paired = [a / b for a, b in zip(speed["pull"], speed["before"])]
        out.append("| this build / PTCFS_BEFORE's, per round | **%.3f** (%.3f-%.3f) | | |"
                   % (med(paired), min(paired), max(paired)))
    out += [
        "| connections a receiving worker opened per pull (this build) | %.1f | | |" % med(connects),
        "| peak RSS of a receiving daemon, this build (MiB) | %.0f | | |" % (rss / 2**20),
        "",
        "Rounds:",
        "",
        "```",
        *[json.dumps(r) for r in rows],
        *notes,
        "```",
    ]
    print(write_section(RESULTS, "cluster", "\n".join(out)))


if __name__ == "__main__":
    main()
