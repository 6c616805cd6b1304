"""Self-test of tests/cluster/netns.py: exit 0 on pass, 77 to skip (1 under CI=true).

    /usr/bin/python3 tests/cluster/netns_selftest.py

Checks, with 3 namespaces: TCP from ns2 to ns0 and from ns1 to the host
address; etcd started on the host address answers a put and a get over its v3
JSON gateway from inside a namespace; after the `with` block (normal exit, an
exception in the body, SIGTERM of the owning process) no namespace, veth or
bridge of ours is left and the processes started in them are dead.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from netns import Netns, NetnsError, require, skip_or_fail, start_etcd  # noqa: E402

PY = sys.executable

# A TCP echo of one line, run inside a namespace: listens on ADDR:PORT, prints "ready".
ECHO_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept(); c.sendall(c.recv(100).upper()); c.close()
""")
CONNECT = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    c.sendall(sys.argv[3].encode()); print(c.recv(100).decode())
""")
# Put then get one key over etcd's v3 JSON gateway (keys and values base64).
ETCD_PUT_GET = textwrap.dedent("""
    import base64, json, sys, urllib.request
    ep, key, value = sys.argv[1:4]
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    def call(path, body):
        req = urllib.request.Request(ep + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with opener.open(req, timeout=5) as r:
            return json.loads(r.read())
    call("/v3/kv/put", {"key": b64(key), "value": b64(value)})
    kvs = call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
    print(base64.b64decode(kvs[0]["value"]).decode() if kvs else "<none>")
""")


def ours_left(names, links):
    """The given namespaces and links that still exist."""
    ns_now = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                          text=True).stdout.splitlines() if line.split()}
    link_text = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    link_now = {l.split(":")[1].strip().split("@")[0] for l in link_text.splitlines() if ":" in l}
    return sorted(ns_now.intersection(names) | link_now.intersection(links))


def snapshot(ns):
    return list(ns.names), [ns.bridge, *ns._host_veths]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok   {what}", flush=True)


def test_connectivity_and_etcd(tmp):
    with Netns(3) as ns:
        names, links = snapshot(ns)
        check(set(ours_left(names, links)) == set(names + links),
              f"created {len(names)} namespaces, bridge {ns.bridge}, subnet {ns.subnet}")
        check(len({ns.addr(i) for i in range(3)} | {ns.host_addr}) == 4, "distinct addresses")
        # lo is up inside: a namespace can talk to itself on 127.0.0.1.
        r = ns.run(0, ["ip", "-o", "link", "show", "lo"], capture_output=True, text=True, check=True)
        check("UP" in r.stdout.split("<")[1].split(">")[0], "lo up in ns0")

        # ns2 -> ns0 directly across the bridge.
        server = ns.popen(0, [PY, "-c", ECHO_SERVER, ns.addr(0), "7000"], stdout=subprocess.PIPE, text=True)
        check(server.stdout.readline().strip() == "ready", "echo server listening in ns0")
        r = ns.run(2, [PY, "-c", CONNECT, ns.addr(0), "7000", "hello"], capture_output=True, text=True, timeout=20)
        check(r.returncode == 0 and r.stdout.strip() == "HELLO", f"ns2 -> ns0 {ns.addr(0)}: {r.stdout!r} {r.stderr!r}")
        server.wait(timeout=10)

        # ns1 -> a listener of the root namespace on host_addr.
        lsock = socket.create_server((ns.host_addr, 0))
        port = lsock.getsockname()[1]
        got = []

        def serve():
            c, peer = lsock.accept()
            got.append(peer[0])
            c.sendall(c.recv(100).upper())
            c.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        r = ns.run(1, [PY, "-c", CONNECT, ns.host_addr, str(port), "host"], capture_output=True, text=True,
                   timeout=20)
        t.join(timeout=10)
        lsock.close()
        check(r.returncode == 0 and r.stdout.strip() == "HOST" and got == [ns.addr(1)],
              f"ns1 {ns.addr(1)} -> host {ns.host_addr}: {r.stdout!r} {r.stderr!r} from {got}")

        # The namespaces do not see the root namespace's loopback services (isolation).
        r = ns.run(1, ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True)
        check(ns.host_addr not in r.stdout and ns.addr(1) in r.stdout, "ns1 sees only lo and its eth0")

        # etcd on the host address, used from inside ns1.
        with start_etcd(os.path.join(tmp, "etcd"), ns.host_addr) as etcd:
            r = ns.run(1, [PY, "-c", ETCD_PUT_GET, etcd.endpoint, "/ptcfs/selftest", "v-1"], capture_output=True,
                       text=True, timeout=30)
            check(r.returncode == 0 and r.stdout.strip() == "v-1",
                  f"etcd put/get from ns1 via {etcd.endpoint}: {r.stdout!r} {r.stderr!r}")
            etcd_proc = etcd.proc
        check(etcd_proc.poll() is not None, "etcd stopped")

        sleeper = ns.popen(2, ["sleep", "1000"])
    check(sleeper.poll() is not None, "popen'd process killed on exit")
    left = ours_left(names, links)
    check(not left, f"all namespaces, veths and the bridge gone after the with block (left: {left})")
    ns.close()  # idempotent
    check(True, "close() twice")


def test_cleanup_when_body_raises():
    names = links = None
    sleeper = None
    try:
        with Netns(2) as ns:
            names, links = snapshot(ns)
            sleeper = ns.popen(1, ["sh", "-c", "trap '' TERM; sleep 1000"])  # ignores SIGTERM: SIGKILL path
            ns.grace = 0.5
            raise KeyError("boom")
    except KeyError:
        pass
    check(sleeper.poll() is not None, "SIGTERM-ignoring process killed after the grace period")
    left = ours_left(names, links)
    check(not left, f"cleanup when the body raises (left: {left})")


def test_cleanup_when_creation_fails():
    # Namespace 1's name taken by a namespace of ours made beforehand: creation fails halfway.
    prefix = f"pt{os.getpid():x}x"
    subprocess.run(["ip", "netns", "add", prefix + "n1"], check=True)
    try:
        try:
            Netns(2, prefix=prefix)
            check(False, "Netns with a taken name raises")
        except NetnsError as e:
            check("already exist" in str(e), f"taken name refused: {e}")
        left = ours_left([prefix + "n0"], [prefix + "b", prefix + "h0", prefix + "h1"])
        check(not left, f"nothing left after a failed creation (left: {left})")
    finally:
        subprocess.run(["ip", "netns", "del", prefix + "n1"])
    # A failure after the bridge, namespace 0 and namespace 1 exist: `ip link add` of veth 1 fails.
    real_ip = netns._ip

    def failing_ip(*args, check=True):
        if args[:2] == ("link", "add") and args[2] == prefix + "h1":
            raise NetnsError("injected failure")
        return real_ip(*args, check=check)

    netns._ip = failing_ip
    try:
        Netns(2, prefix=prefix)
        check(False, "Netns with an injected failure raises")
    except NetnsError as e:
        left = ours_left([prefix + "n0", prefix + "n1"], [prefix + "b", prefix + "h0", prefix + "h1"])
        check(not left, f"nothing left after a failure halfway ({e}; left: {left})")
    finally:
        netns._ip = real_ip


def test_cleanup_on_sigterm(tmp):
    here = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {here!r})
        from netns import Netns
        ns = Netns(2)
        p = ns.popen(0, ["sleep", "1000"])
        print(" ".join(ns.names + [ns.bridge] + ns._host_veths), p.pid, flush=True)
        time.sleep(1000)
    """)
    child = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline().split()
    check(len(line) == 6, f"child made its namespaces: {line}")
    names, links, sleeper = line[:2], line[2:5], int(line[5])
    check(not set(names + links) - set(ours_left(names, links)), "child's namespaces exist")
    child.send_signal(signal.SIGTERM)
    rc = child.wait(timeout=30)
    check(rc == 143, f"child exits 143 on SIGTERM (got {rc})")
    left = ours_left(names, links)
    check(not left, f"cleanup on SIGTERM (left: {left})")
    try:
        os.kill(sleeper, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    check(not alive, "child's popen'd process killed on SIGTERM")


def test_sweep_after_sigkill():
    here = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {here!r})
        from netns import Netns
        ns = Netns(2)
        ns.popen(1, ["sleep", "1000"])
        print(" ".join(ns.names + [ns.bridge] + ns._host_veths), flush=True)
        time.sleep(1000)
    """)
    child = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline().split()
    names, links = line[:2], line[2:]
    child.kill()
    child.wait()
    # Left behind (unless a parallel run's Netns() has swept them already).
    print(f"note SIGKILL left {ours_left(names, links)}", flush=True)
    time.sleep(0.2)  # the child's sleep dies of PR_SET_PDEATHSIG
    with Netns(1):
        left = ours_left(names, links)
    check(not left, f"the next Netns() sweeps them (left: {left})")


def main():
    require(etcd=True)
    try:
        probe = Netns(1)
    except NetnsError as e:
        skip_or_fail(f"cannot set up namespaces with a bridge and veths: {e}")
    probe.close()
    with tempfile.TemporaryDirectory(prefix="netns-selftest-") as tmp:
        start = time.monotonic()
        test_connectivity_and_etcd(tmp)
        test_cleanup_when_body_raises()
        test_cleanup_when_creation_fails()
        test_cleanup_on_sigterm(tmp)
        test_sweep_after_sigkill()
    print(f"PASS netns_selftest ({time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    main()
