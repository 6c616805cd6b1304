"""ptcfs worker mounts for the cluster tests and bench/cluster.py: a worker's
store, a mount's status, waiting on the mounts, stopping them.

Stdlib only.
"""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

ZYGOTE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients", "zygote.py")


def client_python(python):
    """The argv prefix that runs a client script with PYTHON in a fork of a server that imported
    torch (and the rest of the clients' libraries) once: tests/clients/zygote.py. The run takes
    the caller's network namespace, environment and working directory."""
    return ["/usr/bin/python3", "-S", ZYGOTE, python]


class Model:
    """The model a cluster test runs (`ptcfs synth` of `schema` and `dims`,
    with adam state, seed 7) and the check that a job's ranks equal it."""

    def __init__(self, ptcfs, schema, dims):
        self.ptcfs, self.schema, self.dims = ptcfs, schema, dims

    def run(self, *args, **kw):
        """`ptcfs ARGS`, checked (a failure says what it printed): its CompletedProcess, output as text."""
        r = subprocess.run([self.ptcfs, *args], capture_output=True, text=True, **kw)
        if r.returncode != 0:
            raise AssertionError("ptcfs %s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r

    def expect_ranks(self, tmp, mnts, config, placement, tag):
        """Rank r's files, on the mount of worker placement[r // 2] (two
        ranks per worker), equal `ptcfs synth` of `config` tensor by tensor
        (`ptcfs diff`); the reference goes to TMP/ref-TAG."""
        ref = os.path.join(tmp, "ref-" + tag)
        if not os.path.exists(ref):
            self.run("synth", "--schema", self.schema, "--dims", self.dims, "--config", config, "--optimizer", "adam",
                     "--seed", "7", ref)
        joined = os.path.join(tmp, "joined-" + tag)
        shutil.rmtree(joined, ignore_errors=True)
        os.makedirs(joined)
        for r in range(2 * len(placement)):
            src = os.path.join(mnts[placement[r // 2]], "model", "rank-%05d" % r)
            assert os.path.isdir(src), src + " missing"
            os.symlink(src, os.path.join(joined, "rank-%05d" % r))
        self.run("diff", "--schema", self.schema, "--dims", self.dims, "--config-a", config, "--config-b", config, ref,
                 joined)
        print("ok   ranks 0-%d on workers %s equal synth of %s" % (2 * len(placement) - 1, list(placement), config))

    def cluster_json(self, url, token):
        """`ptcfs cluster status --json` of the job at `url`, parsed."""
        return json.loads(self.run("cluster", "status", "--cluster", url, "--token-file", token, "--json").stdout)


def job_token(path, text):
    """Writes the job's shared token to `path`, mode 0600 (as ptcfs requires)."""
    with open(path, "w") as f:
        f.write(text + "\n")
    os.chmod(path, 0o600)
    return path


def job_url(etcd, job):
    """--cluster's etcd://HOST:PORT/JOB for the netns.Etcd `etcd`."""
    return "etcd://%s/%s" % (etcd.endpoint.split("//")[1], job)


def start_worker(ns, ptcfs, w, store, mnt, url, token, port, log, options=(), wrap=()):
    """`ptcfs mount -f` of worker w in its namespace (listening on its
    address at `port`), with extra mount `options`, its output appended to
    the file `log`; `wrap` is put before the command (a debugger)."""
    out = open(log, "a")
    return ns.popen(w, [*wrap, ptcfs, "mount", "-f", store, mnt, "--worker", str(w), *options, "--cluster", url,
                        "--listen", "%s:%d" % (ns.addr(w), port), "--token-file", token],
                    stdout=out, stderr=subprocess.STDOUT)


def start_workers(ns, ptcfs, daemons, stores, mnts, url, token, port, tmp, options=()):
    """Mounts worker w's store stores[w] at mnts[w] (made here) for every w,
    each with start_worker (its log TMP/workerW.log), appending each daemon to
    `daemons` as it starts (so that stop() cleans up after a failure), then
    waits until every mount serves."""
    for w, (store, mnt) in enumerate(zip(stores, mnts)):
        os.makedirs(mnt)
        daemons.append(start_worker(ns, ptcfs, w, store, mnt, url, token, port, os.path.join(tmp, "worker%d.log" % w),
                                    options))
    for w, mnt in enumerate(mnts):
        wait_for("worker %d's mount" % w, lambda: status(mnt)["state"] == "serving", mnts=mnts)


def worker_store(whole, dst, worker):
    """Copies the store `whole` to `dst` without the other workers' shard
    directories (gen-*/worker-WW): a worker's store holds the job's manifests
    and its own files only."""
    shutil.copytree(whole, dst, symlinks=True)
    mine = "worker-%02d" % worker
    for gen in os.listdir(dst):
        if gen.startswith("gen-"):
            for d in os.listdir(os.path.join(dst, gen)):
                if d.startswith("worker-") and d != mine:
                    shutil.rmtree(os.path.join(dst, gen, d))
    return dst


def fill(path):
    """Writes `path` until its file system is full."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    with open(path, "ab", buffering=0) as f:  # the last partial chunk's room
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def joined_megatron_tree(root, mnts, iteration, tp, pp, worker_of):
    """A Megatron tree at ROOT (latest file, iter_N/) whose every rank
    directory mp_rank_TT[_PPP] is a link to that directory on the mount of
    worker worker_of(tp_rank, pp_rank): the job's checkpoint, one tree."""
    it = os.path.join(root, "iter_%07d" % iteration)
    os.makedirs(it)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    for p in range(pp):
        for t in range(tp):
            name = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            os.symlink(os.path.join(mnts[worker_of(t, p)], "megatron", "iter_%07d" % iteration, name),
                       os.path.join(it, name))
    return root


def status(mnt):
    """MNT/.ptcfs/status, parsed."""
    with open(os.path.join(mnt, ".ptcfs", "status")) as f:
        return json.load(f)


def reconfigure(mnt, config):
    """Writes `config` to MNT/.ptcfs/config; a refusal names the mount's last_error."""
    try:
        with open(os.path.join(mnt, ".ptcfs", "config"), "w") as f:
            f.write(config + "\n")
    except OSError as e:
        raise AssertionError("%s refused %s (%s): %s" % (mnt, config, e, status(mnt)["last_error"]))


def rank_digests(mnt, timeout=30):
    """sha256 of every file under MNT/model, read in a child process (a mount
    that hangs fails the test after `timeout` s instead of hanging it), and
    the seconds the reads took."""
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(mnt, "model")) for f in fs)
    assert files, mnt + ": no rank files"
    # The kernel's cached pages dropped first: the daemon serves every read.
    code = ("import hashlib,os,sys\nfor p in sys.argv[1:]:\n with open(p,'rb') as f:\n"
            "  os.posix_fadvise(f.fileno(),0,0,os.POSIX_FADV_DONTNEED)\n"
            "  print(hashlib.sha256(f.read()).hexdigest(), p)\n")
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", code, *files], check=True, capture_output=True, text=True,
                         timeout=timeout).stdout
    return out, time.time() - t0


def describe(mnts):
    """One line per mount: state, generation, config, last error."""
    out = []
    for m in mnts:
        try:
            s = status(m)
            out.append("%s: %s gen %s %s %s" % (m, s["state"], s["generation"], s["config"], s.get("last_error")))
        except (OSError, ValueError) as e:
            out.append("%s: %s" % (m, e))
    return "\n".join(out)


def wait_for(what, fn, timeout=60, poll=0.01, mnts=()):
    """fn()'s first true value, asked every `poll` s (an OSError or a half
    written status counts as false); AssertionError naming `what` and the
    mounts' states after `timeout` s."""
    deadline = time.time() + timeout
    while True:
        try:
            v = fn()
            if v:
                return v
        except (OSError, ValueError):
            pass
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what + "\n" + describe(mnts))
        time.sleep(poll)


def at_generation(mnt, generation):
    """Whether the mount serves `generation`, its change done."""
    s = status(mnt)
    return s["generation"] == generation and s["state"] == "serving"


def kill(daemons, mnts, workers):
    """kill -9 the daemons of `workers` at once, waits for them, and lazily
    unmounts their mounts."""
    for w in workers:
        os.kill(daemons[w].pid, signal.SIGKILL)
    for w in workers:
        daemons[w].wait()
        subprocess.run(["umount", "-l", mnts[w]], capture_output=True)


def remove_tmp(tmp):
    """Removes a test's directory TMP, or keeps it and says so when KEEP_TMP is set."""
    if os.environ.get("KEEP_TMP"):
        print("kept " + tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def stop(daemons, mnts, grace=10):
    """Unmounts the mounts of the daemons still running, waits for them (kills
    those that do not end), and lazily unmounts whatever is left."""
    for d, m in zip(daemons, mnts):
        if d.poll() is None:
            subprocess.run(["umount", m], capture_output=True)
    for d in daemons:
        try:
            d.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
    for m in mnts:
        subprocess.run(["umount", "-l", m], capture_output=True)
