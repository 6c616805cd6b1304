#!/usr/bin/env python3
"""The durable tier in an S3 bucket (docs/cluster.md, "Durable tier", issue
44): three ptcfs workers, each in a network namespace of its own, one job in a
real etcd, `--durable s3://BUCKET/PREFIX` on radosgw of a single-node Ceph
(tests/ceph/ceph.sh; tools/test.sh starts it and exports AWS_ENDPOINT_URL,
the keys and PTCFS_S3_BUCKET). The workers reach radosgw through a TCP relay
on the bridge's host address (radosgw listens on the root namespace's
loopback).

  radosgw stopped before the workers mount: every worker's copy fails (named
     in its status), the job keeps serving and reconfigures as usual
  radosgw back: the copy is made again and completes; the bucket holds one
     copy (durable.json and one gen-*/), every mount says "complete"
  a relayout: the same contents, the copy stays the one
  kill -9 of workers 1 and 2 (replicas=1): worker 0 recovers their stages
     from the bucket (ranged GETs), its ranks equal synth bit for bit

Phase 2, a Megatron job (tests/clients/megatron_ckpt.py's GPT, torch.save in
each worker's namespace through its mount, `--format megatron`), its own prefix:
  a save through the mounts: its copy complete in the bucket, and `ptcfs
     import s3://` of it exported as Megatron equals torch's own files
  radosgw stopped: two more saves commit, every mount's durable copy says
     "behind" with the reason; the bucket (the workers kept away from it by
     the relay) still names the older complete copy alone
  radosgw back: the newest save's copy completes, the older one is removed
  a relayout (the tier's job record names it); then every worker stopped, its
     store wiped, etcd's data wiped: the three start on empty disks, restore
     the bucket's copy by themselves and go back to the last layout (equal to
     torch's files), and save again

Usage: s3_durable_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
       PTCFS_S3_ONLY_MEGATRON=1 runs phase 2 alone (a developer's shortcut)
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, free_port, require, skip_or_fail, start_etcd  # noqa: E402
from workers import (Model, at_generation, job_token, job_url, joined_megatron_tree, kill,  # noqa: E402
                     reconfigure, remove_tmp, start_workers, status, stop, wait_for, worker_store)

PTCFS = os.path.abspath(sys.argv[1])
SCHEMA, DIMS = "llama", "layers=12,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96"
MODEL = Model(PTCFS, SCHEMA, DIMS)
ptcfs = MODEL.run
WORKERS, PORT, JOB = 3, 7441, "s3job"
CEPH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ceph", "ceph.sh")


class Relay:
    """TCP relay from (host, port) to `target`, a thread per connection."""

    def __init__(self, host, target):
        self.target = target
        self.paused = False  # new connections closed at once: the workers cannot reach the server
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if self.paused:
                c.close()
                continue
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            s = socket.create_connection(self.target)
        except OSError:
            c.close()
            return

        def pump(a, b):
            try:
                while True:
                    data = a.recv(1 << 20)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        threading.Thread(target=pump, args=(s, c), daemon=True).start()
        pump(c, s)

    def close(self):
        self.sock.close()


def bucket_get(path):
    """GET of PATH (a key, or ?query) in the bucket, with curl's SigV4: the body as text."""
    e = os.environ
    r = subprocess.run(["curl", "-sf", "--aws-sigv4", "aws:amz:%s:s3" % e["AWS_REGION"], "-H",
                        "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                        "--user", "%s:%s" % (e["AWS_ACCESS_KEY_ID"], e["AWS_SECRET_ACCESS_KEY"]),
                        "%s/%s%s" % (e.get("PTCFS_S3_DIRECT", e["AWS_ENDPOINT_URL"]), e["PTCFS_S3_BUCKET"], path)],
                       check=True, capture_output=True, text=True)
    return r.stdout


def bucket_listing(prefix):
    """(keys, common prefixes) directly under PREFIX/ in the bucket (curl's SigV4), the tier's
    job record (job.json: the job's latest generation the copy serves) left out."""
    listing = bucket_get("?delimiter=%%2F&list-type=2&prefix=%s%%2F" % prefix)
    keys = re.findall(r"<Key>([^<]*)</Key>", listing)
    prefixes = re.findall(r"<CommonPrefixes><Prefix>([^<]*)</Prefix></CommonPrefixes>", listing)
    return [k[len(prefix) + 1:] for k in keys if k != prefix + "/job.json"], [p[len(prefix) + 1:] for p in prefixes]


def copy_complete(url, token, durable):
    j = json.loads(ptcfs("cluster", "status", "--cluster", url, "--token-file", token, "--json", "--durable",
                         durable).stdout)
    return j["durable"]["copy"]


def ranks_of(config):
    n = 1
    for k in ("tp", "pp", "dp"):
        n *= int(re.search(k + r"=(\d+)", config).group(1))
    return n


MEGA_SCHEMA, MEGA_DIMS = "megatron-gpt", "layers=4,hidden=32,heads=4,vocab=128,seq=16"  # megatron_ckpt.py's model
CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients", "megatron_ckpt.py")
TORCH = "/usr/bin/python3"
MEGA_JOB, MEGA_PORT = "s3mega", 7442


def client(ns, w, *args):
    """megatron_ckpt.py ARGS in worker w's namespace (a rank process of the job)."""
    r = ns.run(w, [TORCH, CLIENT, *args], capture_output=True, text=True)
    assert r.returncode == 0, "megatron_ckpt.py %s on worker %d: %s%s" % (args[0], w, r.stdout, r.stderr)
    return r.stdout


class MegatronJob:
    """The job of phase 2: megatron_ckpt.py's GPT on three workers, saved through their mounts."""

    def __init__(self, ns, etcd, tmp, durable, token):
        self.ns, self.etcd, self.tmp, self.durable, self.token = ns, etcd, tmp, durable, token
        self.url = job_url(etcd, MEGA_JOB)
        self.mnts = [os.path.join(tmp, "mega-mnt%d" % w) for w in range(WORKERS)]
        self.stores = [os.path.join(tmp, "mega-store%d" % w) for w in range(WORKERS)]
        self.daemons = []

    def start(self):
        for m in self.mnts:
            if os.path.isdir(m):
                os.rmdir(m)
        self.daemons = []
        start_workers(self.ns, PTCFS, self.daemons, self.stores, self.mnts, self.url, self.token, MEGA_PORT, self.tmp,
                      ["--lease", "2", "--format", "megatron", "--durable", self.durable])

    def save(self, iteration, workers, commit_on):
        """A training step's save: each worker of `workers` loads its ranks from its mount, doubles every
        float and torch.saves them through it (and into the mirror, the framework's own copy); the
        latest file on `commit_on`'s mount commits it. The mirror's path."""
        mirror = os.path.join(self.tmp, "mega-mirror-%d" % iteration)
        for w in workers:
            client(self.ns, w, "save", os.path.join(self.mnts[w], "megatron"), mirror, "--iteration", str(iteration),
                   "--no-latest")
        with open(os.path.join(self.mnts[commit_on], "megatron", "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
        return mirror

    def expect(self, generation, mirror, iteration, grid, served, worker_of, tag):
        """Every worker serves `generation`; the rank files of the mounts (in the `served` grid, rank
        (t, p) on worker worker_of(t, p)) equal the mirror tree (saved in `grid`) bit for bit."""
        for w in range(WORKERS):
            wait_for("worker %d at generation %d" % (w, generation), lambda: at_generation(self.mnts[w], generation),
                     90, mnts=self.mnts)
        joined = joined_megatron_tree(os.path.join(self.tmp, "mega-joined-" + tag), self.mnts, iteration, *served,
                                      worker_of)
        out = subprocess.run([TORCH, CLIENT, "check", mirror, *map(str, grid), joined, *map(str, served)],
                             capture_output=True, text=True)
        assert out.returncode == 0 and "CHECK OK" in out.stdout, out.stdout + out.stderr

    def durable_states(self):
        return [status(m)["cluster"]["durable"] for m in self.mnts]

    def copy_in_bucket(self, prefix):
        """(durable.json's extra.durable.contents, the one gen-* prefix) once the bucket holds one copy."""
        keys, prefixes = bucket_listing(prefix)
        if keys != ["durable.json"] or len(prefixes) != 1:
            return None
        return json.loads(bucket_get("/%s/durable.json" % prefix))["extra"]["durable"]["contents"], prefixes[0]


def megatron_phase(ns, etcd, tmp, ceph_dir, relay, token):
    """Phase 2: a Megatron job saves through its mounts; the server stopped mid-copy; every worker lost."""
    prefix = "mega-%d-%d" % (os.getpid(), int(time.time()))
    durable = "s3://%s/%s" % (os.environ["PTCFS_S3_BUCKET"], prefix)
    src, whole = os.path.join(tmp, "mega-src"), os.path.join(tmp, "mega-whole")
    out = subprocess.run([TORCH, CLIENT, "make", src, "--tp", "2", "--pp", "2", "--args", "--optimizer"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    first, later = "tp=2,pp=2,per_worker=2", "tp=1,pp=2,per_worker=1,workers=1+2"
    on_first = lambda t, p: (p * 2 + t) // 2  # noqa: E731
    on_later = lambda t, p: 1 + p  # noqa: E731
    subprocess.run([PTCFS, "import", "--format", "megatron", "--schema", MEGA_SCHEMA, "--dims", MEGA_DIMS, "--config",
                    first, src, whole], check=True, capture_output=True)
    job = MegatronJob(ns, etcd, tmp, durable, token)
    for w in range(WORKERS):
        worker_store(whole, job.stores[w], w)
    job.start()
    try:
        # 3. A Megatron save through the mounts leaves a complete copy that import reads back bit for bit.
        mirror = job.save(200, [0, 1], 0)
        job.expect(2, mirror, 200, (2, 2), (2, 2), on_first, "200")
        contents, gen_dir = wait_for("the save's copy in the bucket", lambda: (lambda c: c and c[1] == "gen-000002/" and c)(
            job.copy_in_bucket(prefix)), 90, poll=1, mnts=job.mnts)
        for w in range(WORKERS):
            wait_for("worker %d's copy complete" % w, lambda: job.durable_states()[w]["copy"] == "complete", 30,
                     mnts=job.mnts)
        back = os.path.join(tmp, "mega-back")
        subprocess.run([PTCFS, "import", durable, back], check=True, capture_output=True,
                       env=dict(os.environ, AWS_ENDPOINT_URL=os.environ["PTCFS_S3_DIRECT"]))
        exported = os.path.join(tmp, "mega-exported")
        subprocess.run([PTCFS, "export", "--format", "megatron", "--config", first, back, exported], check=True,
                       capture_output=True)
        out = subprocess.run([TORCH, CLIENT, "check", mirror, "2", "2", exported, "2", "2"], capture_output=True,
                             text=True)
        assert out.returncode == 0 and "CHECK OK" in out.stdout, out.stdout + out.stderr
        print("ok   a Megatron save through the mounts: its copy in the bucket (%s), imported back from s3:// "
              "equal to torch's own files" % gen_dir)

        # 2. radosgw stopped: the save's copy fails, the job saves on, the status says the copy is behind.
        subprocess.run(["bash", CEPH, "stop-rgw", ceph_dir], check=True)
        try:
            mirror = job.save(300, [0, 1], 1)
            job.expect(3, mirror, 300, (2, 2), (2, 2), on_first, "300")
            for w in (0, 1):
                wait_for("worker %d's copy behind" % w, lambda: job.durable_states()[w]["copy"] == "behind", 60,
                         mnts=job.mnts)
            d = job.durable_states()[0]
            assert d["complete_generation"] == 2 and "durable tier " + durable in d["error"], d
            mirror = job.save(400, [0, 1], 0)
            job.expect(4, mirror, 400, (2, 2), (2, 2), on_first, "400")
            print("ok   radosgw stopped: two more saves committed, the copy behind: %s" % d["error"][:160])
            relay.paused = True  # the workers see no server while the bucket is looked at
            subprocess.run(["bash", CEPH, "start-rgw", ceph_dir], check=True)
            assert job.copy_in_bucket(prefix) == (contents, gen_dir), bucket_listing(prefix)
            print("ok   the bucket still names the older complete copy only (%s)" % gen_dir)
        finally:
            relay.paused = False
            subprocess.run(["bash", CEPH, "start-rgw", ceph_dir], capture_output=True)
        t0 = time.time()
        newer = wait_for("the newest save's copy", lambda: (lambda c: c and c[0] != contents and c)(
            job.copy_in_bucket(prefix)), 90, poll=1, mnts=job.mnts)
        for w in range(WORKERS):
            wait_for("worker %d's copy complete" % w, lambda: job.durable_states()[w]["copy"] == "complete", 30,
                     mnts=job.mnts)
        print("ok   radosgw back: the copy of generation 4 complete after %.1f s, the older one removed (%s)" %
              (time.time() - t0, newer[1]))

        # 1. A relayout keeps the copy; then every worker lost, its disk and etcd too.
        before = status(job.mnts[0])["config"]  # the layout of the copy's day
        reconfigure(job.mnts[0], later)
        job.expect(5, mirror, 400, (2, 2), (1, 2), on_later, "400-later")
        status_config = status(job.mnts[0])["config"]
        wait_for("the tier's job record of generation 5", lambda: json.loads(bucket_get("/%s/job.json" % prefix)) == {
            "job": MEGA_JOB, "generation": 5, "config": status_config, "contents": newer[0]}, 30, poll=0.5,
            mnts=job.mnts)
        for w in range(WORKERS):
            wait_for("worker %d's copy complete" % w, lambda: job.durable_states()[w]["copy"] == "complete", 30,
                     mnts=job.mnts)
        stop(job.daemons, job.mnts)
        etcd.kill()
        shutil.rmtree(os.path.join(tmp, "etcd", "data"))
        etcd.restart()
        for store in job.stores:
            shutil.rmtree(store)
            os.makedirs(store)
        t0 = time.time()
        job.start()
        for w in range(WORKERS):  # each restored the copy's generation 4 as 5, in its layout
            with open(os.path.join(tmp, "worker%d.log" % w)) as f:
                assert re.search(r"worker %d: restored generation 5 of job %s from the durable tier %s \(%s, the copy "
                                 r"of generation 4" % (w, MEGA_JOB, re.escape(durable), re.escape(before)),
                                 f.read()), "worker %d's log" % w
        # The job goes back to the layout it had (the tier's job record) on its own: generation 6.
        job.expect(6, mirror, 400, (2, 2), (1, 2), on_later, "restored-later")
        assert status(job.mnts[0])["config"] == status_config, status(job.mnts[0])
        print("ok   every worker back on an empty disk, etcd empty: restored from the bucket alone and back in "
              "its last layout %s after %.1f s, equal to torch's own files" % (status_config, time.time() - t0))
        for w in range(WORKERS):
            wait_for("worker %d's copy complete" % w, lambda: job.durable_states()[w]["copy"] == "complete", 30,
                     mnts=job.mnts)
        mirror = job.save(500, [1, 2], 2)
        job.expect(7, mirror, 500, (1, 2), (1, 2), on_later, "500")
        wait_for("the restored job's save in the bucket", lambda: (lambda c: c and c[0] != newer[0] and c)(
            job.copy_in_bucket(prefix)), 90, poll=1, mnts=job.mnts)
        print("ok   the restored job saved again; its copy complete in the bucket")
    finally:
        stop(job.daemons, job.mnts)


def main():
    require(etcd=True)
    if subprocess.run([TORCH, "-c", "import torch"], capture_output=True).returncode != 0:
        skip_or_fail("no torch under %s (Debian's python3-torch)" % TORCH)
    if os.geteuid() != 0:
        skip_or_fail("needs root")
    for v in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PTCFS_S3_BUCKET", "PTCFS_CEPH_DIR"):
        if not os.environ.get(v):
            skip_or_fail("no S3 server (%s unset): tests/ceph/ceph.sh start DIR, then source DIR/env" % v)
    ceph_dir = os.environ["PTCFS_CEPH_DIR"]
    rgw = re.match(r"http://([^:/]+):(\d+)", os.environ["AWS_ENDPOINT_URL"])
    tmp = tempfile.mkdtemp(prefix="ptcfs-s3-")
    prefix = "job-%d-%d" % (os.getpid(), int(time.time()))
    durable = "s3://%s/%s" % (os.environ["PTCFS_S3_BUCKET"], prefix)
    mnts = [os.path.join(tmp, "mnt%d" % w) for w in range(WORKERS)]
    daemons = []
    rgw_stopped = False
    try:
        with Netns(WORKERS) as ns, start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            relay = Relay(ns.host_addr, (rgw.group(1), int(rgw.group(2))))
            direct = os.environ["AWS_ENDPOINT_URL"]
            os.environ["PTCFS_S3_DIRECT"] = direct  # the test's own look at the bucket
            os.environ["AWS_ENDPOINT_URL"] = "http://%s:%d" % (ns.host_addr, relay.port)  # the workers' way in
            first = "tp=2,pp=3,dp=1,per_worker=2"
            ptcfs("synth", "--schema", SCHEMA, "--dims", DIMS, "--config", first, "--optimizer", "adam", "--seed", "7",
                  os.path.join(tmp, "saved"))
            ptcfs("import", "--schema", SCHEMA, "--dims", DIMS, "--config", first, os.path.join(tmp, "saved"),
                  os.path.join(tmp, "whole"))
            stores = [worker_store(os.path.join(tmp, "whole"), os.path.join(tmp, "store%d" % w), w)
                      for w in range(WORKERS)]
            token = job_token(os.path.join(tmp, "token"), "token-of-the-s3-durable-test")
            url = job_url(etcd, JOB)

            if os.environ.get("PTCFS_S3_ONLY_MEGATRON"):  # a developer's shortcut to phase 2
                megatron_phase(ns, etcd, tmp, ceph_dir, relay, token)
                return
            # The server away while the workers copy: each copy fails, named; the job goes on.
            subprocess.run(["bash", CEPH, "stop-rgw", ceph_dir], check=True)
            rgw_stopped = True
            start_workers(ns, PTCFS, daemons, stores, mnts, url, token, PORT, tmp,
                          ["--lease", "2", "--durable", durable])
            print("ok   3 workers mounted, radosgw stopped")
            for w in range(WORKERS):
                wait_for("worker %d's failed copy" % w,
                         lambda: "durable tier " + durable in (status(mnts[w])["last_error"] or ""), 60, mnts=mnts)
                wait_for("worker %d's copy behind" % w,
                         lambda: status(mnts[w])["cluster"]["durable"]["copy"] == "behind", 30, mnts=mnts)
                d = status(mnts[w])["cluster"]["durable"]
                assert d["dir"] == durable and d["complete_generation"] is None and durable in d["error"], d
            print("ok   the server away: every worker's copy failed, named in its status: " +
                  status(mnts[0])["last_error"][:160])
            second = "tp=1,pp=6,dp=1,per_worker=2"
            with open(os.path.join(mnts[0], ".ptcfs", "config"), "w") as f:
                f.write(second + "\n")
            for w in range(WORKERS):
                wait_for("worker %d at generation 2" % w, lambda: at_generation(mnts[w], 2), 60, mnts=mnts)
            MODEL.expect_ranks(tmp, mnts, second, [0, 1, 2], "second")
            print("ok   the job reconfigured meanwhile")

            # The server back: the copy is made again and completes.
            subprocess.run(["bash", CEPH, "start-rgw", ceph_dir], check=True)
            rgw_stopped = False
            t0 = time.time()
            wait_for("the bucket's copy", lambda: copy_complete(url, token, durable), 90, poll=1, mnts=mnts)
            print("ok   radosgw back: the copy completed after %.1f s" % (time.time() - t0))
            os.environ["AWS_ENDPOINT_URL"] = direct

            def one_copy():  # the completing worker's temporary manifest is deleted right after its copy
                keys, prefixes = bucket_listing(prefix)
                return (keys, prefixes) if keys == ["durable.json"] and len(prefixes) == 1 else None
            keys, prefixes = wait_for("one copy in the bucket", one_copy, 10, poll=0.5, mnts=mnts)
            assert prefixes[0].startswith("gen-"), prefixes
            os.environ["AWS_ENDPOINT_URL"] = "http://%s:%d" % (ns.host_addr, relay.port)
            for w in range(WORKERS):
                wait_for("worker %d's status to say complete" % w,
                         lambda: status(mnts[w])["cluster"]["durable"]["copy"] == "complete", 30, mnts=mnts)
            print("ok   one copy in the bucket (%s, %s), every mount says complete" % (keys[0], prefixes[0]))

            # A relayout keeps the contents: the copy stays the one.
            with open(os.path.join(mnts[1], ".ptcfs", "config"), "w") as f:
                f.write(first + "\n")
            for w in range(WORKERS):
                wait_for("worker %d at generation 3" % w, lambda: at_generation(mnts[w], 3), 60, mnts=mnts)
            for w in range(WORKERS):
                wait_for("worker %d's status to say complete" % w,
                         lambda: status(mnts[w])["cluster"]["durable"]["copy"] == "complete", 30, mnts=mnts)
            os.environ["AWS_ENDPOINT_URL"] = direct
            assert bucket_listing(prefix) == (keys, prefixes), bucket_listing(prefix)
            os.environ["AWS_ENDPOINT_URL"] = "http://%s:%d" % (ns.host_addr, relay.port)
            print("ok   relayout to %s: the bucket's copy is still the one" % first)

            # Workers 1 and 2 die (no replicas): worker 0 reads their stages from the bucket.
            t0 = time.time()
            kill(daemons, mnts, [1, 2])
            wait_for("worker 0 at generation 4", lambda: at_generation(mnts[0], 4), 90, mnts=mnts[:1])
            alone = status(mnts[0])["config"]
            print("ok   workers 1 and 2 killed: worker 0 serves %s after %.1f s" % (alone, time.time() - t0))
            MODEL.expect_ranks(tmp, mnts, alone, [0] * (ranks_of(alone) // 2), "alone")
            print("ok   the stages only workers 1 and 2 held came back from the bucket, bit for bit")
            stop(daemons, mnts)

            megatron_phase(ns, etcd, tmp, ceph_dir, relay, token)
            relay.close()
    finally:
        if rgw_stopped:
            subprocess.run(["bash", CEPH, "start-rgw", ceph_dir])
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS s3_durable_test")


if __name__ == "__main__":
    main()
