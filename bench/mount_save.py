#!/usr/bin/env python3
"""bench/mount_save.py: issue 42's save through one mount, before and after a
change, against torch.save to local disk + sync.

The model: megatron-gpt (DIMS, default ~2.2 GB saved), bf16 with Adam state,
tp=2,pp=2: four rank files. One process (Debian's python3-torch) holds the
four rank state dicts (read once through the first mount, untimed) and, per
round, after `sync; sleep SETTLE` before each side:
  - local: torch.saves them into a directory on the same disk, then os.sync();
  - mount (each binary given): torch.saves them into MNT/megatron/iter_N/,
    then writes latest_checkpointed_iteration.txt: timed to its close (the
    save committed, durable: the commit syncs the store).
The sides interleave (local, mount A, local, mount B, ...); each mount's
ratio is against the local save just before it; REPS rounds, medians. The
load average is recorded before each side (others build on this machine).

Environment: PTCFS (build/tools/ptcfs; more binaries as PTCFS=a:b, each its
own store and mount, labelled by LABELS=before:after), WORK
(/tmp/ptcfs-mount-save; removed unless KEEP=1), DIMS, REPS (3), SETTLE (8),
PASSTHROUGH (auto). Root and /dev/fuse. Prints a Markdown table.
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARIES = os.environ.get("PTCFS", os.path.join(ROOT, "build/tools/ptcfs")).split(":")
LABELS = os.environ.get("LABELS", ":".join("mount%d" % i for i in range(len(BINARIES)))).split(":")
WORK = os.environ.get("WORK", "/tmp/ptcfs-mount-save")
SCHEMA = "megatron-gpt"
DIMS = os.environ.get("DIMS", "layers=18,hidden=768,heads=12,vocab=16384,seq=512")
REPS = int(os.environ.get("REPS", "3"))
SETTLE = float(os.environ.get("SETTLE", "8"))
PASSTHROUGH = os.environ.get("PASSTHROUGH", "auto")
LATEST = "latest_checkpointed_iteration.txt"


def sh(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(" ".join(args) + ": " + r.stdout + r.stderr)
    return r.stdout


def settle():
    subprocess.run(["sync"])
    time.sleep(SETTLE)


def load():
    return float(open("/proc/loadavg").read().split()[0])


def save(state, root, it, local):
    """torch.saves every rank file as iteration `it` under `root`; then os.sync() (local) or
    the latest file (mount: its close commits). Returns (seconds, bytes, seconds of the sync or commit)."""
    import torch
    for sd in state.values():
        sd["iteration"] = it
    t0 = time.time()
    written = 0
    for name, sd in state.items():
        d = os.path.join(root, "iter_%07d" % it, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model_optim_rng.pt")
        torch.save(sd, path)
        written += os.path.getsize(path)
    t1 = time.time()
    if local:
        os.sync()
    else:
        with open(os.path.join(root, LATEST), "w") as f:
            f.write(str(it))
    return time.time() - t0, written, time.time() - t1


def main():
    import torch
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    mnts = []
    try:
        src = os.path.join(WORK, "synth")
        sh(BINARIES[0], "synth", "--schema", SCHEMA, "--dims", DIMS, "--config", "tp=2,pp=2", "--dtype", "bf16",
           "--optimizer", "adam", "--seed", "7", src)
        for i, binary in enumerate(BINARIES):
            store, mnt = os.path.join(WORK, "store%d" % i), os.path.join(WORK, "mnt%d" % i)
            sh(binary, "import", "--schema", SCHEMA, "--dims", DIMS, "--config", "tp=2,pp=2", src, store)
            os.makedirs(mnt)
            sh(binary, "mount", "--format", "megatron", "--passthrough", PASSTHROUGH, store, mnt)
            mnts.append((binary, mnt))
        shutil.rmtree(src)  # the disk holds the stores, the local save and the saves staged only
        megatron = os.path.join(mnts[0][1], "megatron")
        it_dir = os.path.join(megatron, "iter_%07d" % int(open(os.path.join(megatron, LATEST)).read()))
        state = {name: torch.load(os.path.join(it_dir, name, "model_optim_rng.pt"), weights_only=False)
                 for name in sorted(os.listdir(it_dir))}
        local, loads, nbytes = [], [], 0
        mount, ratio, commits = ({l: [] for l in LABELS} for _ in range(3))
        for rep in range(REPS):
            for label, (binary, mnt) in zip(LABELS, mnts):
                it = 1000 + rep
                target = os.path.join(WORK, "local")
                settle()
                loads.append(load())
                seconds, nbytes, _ = save(state, target, it, local=True)
                local.append(seconds)
                shutil.rmtree(target)
                settle()
                loads.append(load())
                m, _, commit = save(state, os.path.join(mnt, "megatron"), it, local=False)
                mount[label].append(m)
                commits[label].append(commit)
                ratio[label].append(seconds / m)
                print("  round %d %s: local %.2f s, mount %.2f s (commit %.2f s), %.2fx (%d bytes, load %.1f)" %
                      (rep, label, seconds, m, commit, seconds / m, nbytes, loads[-1]), flush=True)
    finally:
        for binary, mnt in mnts:
            subprocess.run([binary, "umount", mnt])
        if not os.environ.get("KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)
    print("\n`%s` (megatron-gpt %s, bf16 with Adam, tp=2,pp=2: four rank files, %.2f GB; %d rounds; `sync; "
          "sleep %g` before each side; passthrough %s; load average %.1f-%.1f on 2 cores)\n" %
          (" ".join("%s=%s" % (k, os.environ[k]) for k in ("PTCFS", "LABELS", "DIMS", "REPS") if k in os.environ) +
           " python3 bench/mount_save.py", DIMS, nbytes / 1e9, REPS, SETTLE, PASSTHROUGH, min(loads), max(loads)))
    print("| binary | torch.save to local disk + sync (median) | torch.save through the mount + commit (median) | "
          "of which the commit | ratio local / mount (median of rounds) | rounds |")
    print("|---|---|---|---|---|---|")
    for label in LABELS:
        print("| %s | %.2f s | %.2f s (%.0f MB/s) | %.2f s | %.2fx | %s |" %
              (label, statistics.median(local), statistics.median(mount[label]),
               nbytes / statistics.median(mount[label]) / 1e6, statistics.median(commits[label]),
               statistics.median(ratio[label]), ", ".join("%.2f" % r for r in ratio[label])))


if __name__ == "__main__":
    main()
