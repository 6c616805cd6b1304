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

Usage: s3_durable_test.py PTCFS   (root; exit 77 = skipped, never under CI=true)
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Netns, free_port, require, skip_or_fail, start_etcd  # noqa: E402
from workers import (Model, at_generation, job_token, job_url, kill, remove_tmp, start_workers,  # noqa: E402
                     status, stop, wait_for, worker_store)

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


def bucket_listing(prefix):
    """(keys, common prefixes) directly under PREFIX/ in the bucket (curl's SigV4)."""
    e = os.environ
    r = subprocess.run(["curl", "-sf", "--aws-sigv4", "aws:amz:%s:s3" % e["AWS_REGION"], "-H",
                        "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                        "--user", "%s:%s" % (e["AWS_ACCESS_KEY_ID"], e["AWS_SECRET_ACCESS_KEY"]),
                        "%s/%s?delimiter=%%2F&list-type=2&prefix=%s%%2F" % (e["AWS_ENDPOINT_URL"], e["PTCFS_S3_BUCKET"],
                                                                          prefix)],
                       check=True, capture_output=True, text=True)
    keys = re.findall(r"<Key>([^<]*)</Key>", r.stdout)
    prefixes = re.findall(r"<CommonPrefixes><Prefix>([^<]*)</Prefix></CommonPrefixes>", r.stdout)
    return [k[len(prefix) + 1:] for k in keys], [p[len(prefix) + 1:] for p in prefixes]


def copy_complete(url, token, durable):
    j = json.loads(ptcfs("cluster", "status", "--cluster", url, "--token-file", token, "--json", "--durable",
                         durable).stdout)
    return j["durable"]["copy"]


def ranks_of(config):
    n = 1
    for k in ("tp", "pp", "dp"):
        n *= int(re.search(k + r"=(\d+)", config).group(1))
    return n


def main():
    require(etcd=True)
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

            # The server away while the workers copy: each copy fails, named; the job goes on.
            subprocess.run(["bash", CEPH, "stop-rgw", ceph_dir], check=True)
            rgw_stopped = True
            start_workers(ns, PTCFS, daemons, stores, mnts, url, token, PORT, tmp,
                          ["--lease", "2", "--durable", durable])
            print("ok   3 workers mounted, radosgw stopped")
            for w in range(WORKERS):
                wait_for("worker %d's failed copy" % w,
                         lambda: "durable tier " + durable in (status(mnts[w])["last_error"] or ""), 60, mnts=mnts)
                assert status(mnts[w])["cluster"]["durable"] == {"dir": durable, "copy": "incomplete"}, status(mnts[w])
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
            relay.close()
    finally:
        if rgw_stopped:
            subprocess.run(["bash", CEPH, "start-rgw", ceph_dir])
        stop(daemons, mnts)
        remove_tmp(tmp)
    print("PASS s3_durable_test")


if __name__ == "__main__":
    main()
