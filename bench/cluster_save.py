#!/usr/bin/env python3
"""bench/cluster_save.py: issue 27's measurement of a Megatron save through
the mounts, on one worker and on two, against the same rank files written
with torch.save to local disk and synced.

The model: megatron-gpt (DIMS), bf16 with Adam state, tp=2,pp=2: four rank
files. Each worker runs one process in its network namespace (Debian's
python3-torch) that loads its ranks' files from its own mount (untimed),
sets their iteration to the next one, then, on a signal given to all at
once, torch.saves them:
  - local: into a directory on the worker's disk, then os.sync(): durable;
  - mount: into the mount's megatron/iter_N/, after which the driver writes
    latest_checkpointed_iteration.txt on worker 0's mount: committed on every
    worker (the parts synced, etcd's transaction, each local commit).
Timed from the signal to the last process done (local) or to the latest
file's close (mount); `sync; sleep SETTLE` before each timed write, the two
sides interleaved, REPS rounds each, medians. Also the daemons' peak RSS.
The section goes into bench/RESULTS.md between <!-- cluster-save:begin -->
and <!-- cluster-save:end -->.

Environment: PTCFS (build/tools/ptcfs), WORK (/tmp/ptcfs-save-bench; removed
unless KEEP=1), DIMS, REPS (3), SETTLE (8), RESULTS. Root; /dev/fuse; etcd.
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
from workers import at_generation, job_token, job_url, start_worker, status, stop, wait_for, worker_store  # noqa: E402
from results_section import write_section  # noqa: E402

PTCFS = os.environ.get("PTCFS", os.path.join(ROOT, "build/tools/ptcfs"))
WORK = os.environ.get("WORK", "/tmp/ptcfs-save-bench")
SCHEMA = "megatron-gpt"
DIMS = os.environ.get("DIMS", "layers=4,hidden=768,heads=12,vocab=16384,seq=512")
REPS = int(os.environ.get("REPS", "3"))
SETTLE = float(os.environ.get("SETTLE", "8"))
RESULTS = os.environ.get("RESULTS", os.path.join(ROOT, "bench/RESULTS.md"))
TORCH = "/usr/bin/python3"
PORT = 7440
LATEST = "latest_checkpointed_iteration.txt"

# One worker's rank process: loads its rank files from MOUNT/megatron (the
# current iteration), says READY, waits for GO, saves them as iteration IT
# into TARGET (MOUNT/megatron, or a local directory: then synced), prints the
# seconds it took from GO and the bytes written.
SAVER = r"""
import os, sys, time, torch
megatron, target, it, ready, go = sys.argv[1:6]
latest = open(os.path.join(megatron, "latest_checkpointed_iteration.txt")).read().strip()
src = os.path.join(megatron, "iter_%07d" % int(latest))
files = {}
for name in sorted(os.listdir(src)):
    sd = torch.load(os.path.join(src, name, "model_optim_rng.pt"), weights_only=False)
    sd["iteration"] = int(it)
    files[name] = sd
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
t0 = time.time()
written = 0
for name, sd in files.items():
    d = os.path.join(target, "iter_%07d" % int(it), name)
    os.makedirs(d, exist_ok=True)
    torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
    written += os.path.getsize(os.path.join(d, "model_optim_rng.pt"))
if not target.endswith("megatron"):
    os.sync()
print(time.time() - t0, written)
"""


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw).stdout


def settle():
    subprocess.run(["sync"])
    time.sleep(SETTLE)


def peak_rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def timed_save(ns, mnts, targets, it, tag):
    """Every worker's process saves its ranks as iteration `it` into its
    target at once; the mount side is committed by the latest file on worker
    0. Returns (seconds, bytes written, the start time)."""
    sync_dir = os.path.join(WORK, "sync-%d-%s-%d" % (len(mnts), tag, it))
    os.makedirs(sync_dir)
    go = os.path.join(sync_dir, "go")
    procs = []
    for w, mnt in enumerate(mnts):
        ready = os.path.join(sync_dir, "ready%d" % w)
        procs.append((ready, ns.popen(w, [TORCH, "-c", SAVER, os.path.join(mnt, "megatron"), targets[w], str(it),
                                          ready, go], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    while not all(os.path.exists(r) for r, _ in procs):
        for _, p in procs:
            if p.poll() is not None:
                raise RuntimeError("saver exited early: " + p.stderr.read())
        time.sleep(0.01)
    settle()
    t0 = time.time()
    open(go, "w").close()
    written = 0
    for _, p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err
        written += int(out.split()[1])
    if targets[0].endswith("megatron"):
        with open(os.path.join(targets[0], LATEST), "w") as f:
            f.write(str(it))
    return time.time() - t0, written, t0


def run(ns, etcd, workers, per_worker):
    """The model on `workers` workers (per_worker ranks each; with more than
    one, replicas=2): medians of the local and the mount save, of the save to
    committed on every worker and, with replicas, to its pieces copied to
    their keepers, bytes, the daemons' peak RSS."""
    base = os.path.join(WORK, "w%d" % workers)
    os.makedirs(base)
    replicas = 2 if workers > 1 else 1
    config = "tp=2,pp=2,per_worker=%d" % per_worker + (",replicas=2" if replicas > 1 else "")
    src = os.path.join(WORK, "synth")
    if not os.path.exists(src):
        sh(PTCFS, "synth", "--schema", SCHEMA, "--dims", DIMS, "--config", "tp=2,pp=2", "--dtype", "bf16",
           "--optimizer", "adam", "--seed", "7", src)
    sh(PTCFS, "import", "--schema", SCHEMA, "--dims", DIMS, "--config", config, src, os.path.join(base, "whole"))
    mnts, daemons = [], []
    try:
        token = job_token(os.path.join(base, "token"), "secret-token-of-the-save-bench")
        url = job_url(etcd, "save%d" % workers)
        for w in range(workers):
            store = worker_store(os.path.join(base, "whole"), os.path.join(base, "store%d" % w), w)
            mnts.append(os.path.join(base, "mnt%d" % w))
            os.makedirs(mnts[-1])
            daemons.append(start_worker(ns, PTCFS, w, store, mnts[w], url, token, PORT + workers,
                                        os.path.join(base, "worker%d.log" % w), ["--format", "megatron"]))
        for w in range(workers):
            wait_for("worker %d's mount" % w, lambda: status(mnts[w])["state"] == "serving", mnts=mnts)
        local, mount, everywhere, whole, nbytes = [], [], [], [], 0
        generation = status(mnts[0])["generation"]
        for rep in range(REPS):
            it = 1000 + rep
            locals_ = [os.path.join(base, "local%d" % w) for w in range(workers)]
            seconds, nbytes, _ = timed_save(ns, mnts, locals_, it, "local")
            local.append(seconds)
            for d in locals_:
                shutil.rmtree(d)
            seconds, _, t0 = timed_save(ns, mnts, [os.path.join(m, "megatron") for m in mnts], it, "mount")
            generation += 1
            for w in range(workers):
                wait_for("worker %d at generation %d" % (w, generation), lambda: at_generation(mnts[w], generation),
                         timeout=300, poll=0.005, mnts=mnts)
            everywhere.append(time.time() - t0)
            if replicas > 1:  # the copy change right after the save
                generation += 1
                for w in range(workers):
                    wait_for("worker %d at generation %d" % (w, generation), lambda: at_generation(mnts[w], generation),
                             timeout=300, poll=0.005, mnts=mnts)
                whole.append(time.time() - t0)
            mount.append(seconds)
            print("  %d worker(s), round %d: local %.2f s, mount %.2f s, committed everywhere %.2f s%s (%d bytes)" %
                  (workers, rep, local[-1], mount[-1], everywhere[-1],
                   ", replicas whole %.2f s" % whole[-1] if whole else "", nbytes), flush=True)
        rss = max(peak_rss(d.pid) for d in daemons)
        return (statistics.median(local), statistics.median(mount), statistics.median(everywhere),
                statistics.median(whole) if whole else None, nbytes, rss)
    finally:
        stop(daemons, mnts)


def main():
    require(etcd=True)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    rows = []
    try:
        with Netns(2) as ns, start_etcd(os.path.join(WORK, "etcd"), ns.host_addr) as etcd:
            for workers, per_worker in ((1, 4), (2, 2)):
                rows.append((workers, *run(ns, etcd, workers, per_worker)))
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)
    lines = [
        "## Saves through the mounts, one worker and two (issue 27)",
        "",
        "`sudo python3 bench/cluster_save.py` (megatron-gpt %s, bf16 with Adam, tp=2,pp=2: four rank files; "
        "%d rounds, medians; `sync; sleep %g` before each timed write, the two sides interleaved). The mount side "
        "is timed to the latest file's close (committed by the job; the staged files linked into the store as the "
        "pieces' storage, no tensor byte written twice); then to the new generation served on every worker and, with "
        "`replicas=2`, to the copy change after it (every piece on two workers)." % (DIMS, REPS, SETTLE),
        "",
        "| workers | bytes saved | torch.save to local disk + sync | torch.save through the mounts + commit | ratio "
        "(local / mount) | committed on every worker | replicas whole | daemon peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workers, local, mount, everywhere, whole, nbytes, rss in rows:
        lines.append("| %d | %.0f MB | %.2f s (%.0f MB/s) | %.2f s (%.0f MB/s) | %.2fx | %.2f s | %s | %.0f MB |" %
                     (workers, nbytes / 1e6, local, nbytes / local / 1e6, mount, nbytes / mount / 1e6,
                      local / mount, everywhere, "%.2f s (replicas=2)" % whole if whole else "-", rss / 1e6))
    print(write_section(RESULTS, "cluster-save", "\n".join(lines)))


if __name__ == "__main__":
    main()
