"""zygote.py's own test: a run through the server is the plain run (status, output, environment,
working directory), a fresh fork each time, killed with its caller; the server starts once for
concurrent callers and exits idle; without a server the script runs as a plain process.

    /usr/bin/python3 tests/clients/zygote_test.py
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
PYTHON = sys.executable

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    mode = sys.argv[1]
    if mode == "echo":
        print("out", sys.argv[2:], os.getcwd(), os.environ.get("ZT_VALUE"))
        print("err", file=sys.stderr)
        json.zygote_mark = getattr(json, "zygote_mark", 0) + 1  # a module the server imported
        print("mark", json.zygote_mark)
        sys.exit(int(sys.argv[2]))
    if mode == "raise":
        raise ValueError("raised here")
    if mode == "exit-text":
        sys.exit("a message")
    if mode == "sibling":
        import zt_sibling
        print("sibling", zt_sibling.VALUE)
    if mode == "netns":
        print("netns", os.stat("/proc/self/ns/net").st_ino)
    if mode == "sleep":
        with open(sys.argv[2], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
""")


def run(tmp, *args, env=None, python=PYTHON):
    e = dict(os.environ, TMPDIR=tmp, PTCFS_ZYGOTE_PRELOAD="json", PTCFS_ZYGOTE_IDLE_S="3")
    e.update(env or {})
    return subprocess.run(["/usr/bin/python3", "-S", ZYGOTE, python, os.path.join(tmp, "s.py"), *args],
                          capture_output=True, text=True, env=e, cwd=tmp, timeout=120)


def servers(tmp):
    return [f for f in os.listdir(tmp) if f.startswith("ptcfs-zygote-") and f.endswith(".sock")]


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        sys.exit(1)


def check_network_namespace(tmp):
    """A caller in another network namespace (nsenter --net, as the cluster tests run clients)."""
    if os.geteuid() != 0:
        print("note the network namespace case needs root: not checked")
        return
    name = f"ptzy{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        enter = ["nsenter", f"--net=/run/netns/{name}"]
        want = subprocess.run(enter + ["stat", "-L", "-c", "%i", "/proc/self/ns/net"], capture_output=True,
                              text=True, check=True).stdout.strip()
        e = dict(os.environ, TMPDIR=tmp, PTCFS_ZYGOTE_PRELOAD="json", PTCFS_ZYGOTE_IDLE_S="3")
        r = subprocess.run(enter + ["/usr/bin/python3", "-S", ZYGOTE, PYTHON, os.path.join(tmp, "s.py"), "netns"],
                           capture_output=True, text=True, env=e, cwd=tmp, timeout=60)
        check(r.returncode == 0 and f"netns {want}" in r.stdout,
              f"a caller in another network namespace: the run is in it ({want}: {r.stdout!r})")
        r = run(tmp, "netns")
        check(f"netns {os.stat('/proc/self/ns/net').st_ino}" in r.stdout, "the next caller's namespace again")
    finally:
        subprocess.run(["ip", "netns", "delete", name])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "s.py"), "w") as f:
            f.write(SCRIPT)
        with open(os.path.join(tmp, "zt_sibling.py"), "w") as f:
            f.write("VALUE = 42\n")
        r = run(tmp, "echo", "3", env={"ZT_VALUE": "v1"})
        check(r.returncode == 3, f"the exit status comes back ({r.returncode})")
        check(f"out ['3'] {tmp} v1" in r.stdout and "err" in r.stdout, f"output, cwd and environment: {r.stdout!r}")
        check(len(servers(tmp)) == 1, "one server started")
        link = os.path.join(tmp, "venv-python")  # a venv's python: a link to the same interpreter
        os.symlink(PYTHON, link)
        r = run(tmp, "echo", "0", python=link)
        check(r.returncode == 0 and len(servers(tmp)) == 2, "another interpreter path (a venv's link): its own server")
        r = run(tmp, "echo", "0", env={"ZT_VALUE": "v2"})
        check(r.returncode == 0 and "v2" in r.stdout, "the next caller's environment")
        check("mark 1" in r.stdout, "each run a fresh fork: the previous run's change to a module is gone")
        r = run(tmp, "raise")
        check(r.returncode == 1 and "ValueError: raised here" in r.stdout, "an exception: status 1 and its traceback")
        r = run(tmp, "exit-text")
        check(r.returncode == 1 and "a message" in r.stdout, "sys.exit(text): status 1 and the text")
        r = run(tmp, "sibling")
        check(r.returncode == 0 and "sibling 42" in r.stdout, "the script's directory is on sys.path")

        check_network_namespace(tmp)

        before = set(servers(tmp))
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.update({i: run(tmp, "echo", str(i))}))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(all(results[i].returncode == i and f"out ['{i}']" in results[i].stdout for i in range(4)),
              "four concurrent callers, each its own status and output")
        check(not set(servers(tmp)) - before, "no server more")

        pid_file = os.path.join(tmp, "pid")
        e = dict(os.environ, TMPDIR=tmp, PTCFS_ZYGOTE_PRELOAD="json", PTCFS_ZYGOTE_IDLE_S="3")
        caller = subprocess.Popen(["/usr/bin/python3", "-S", ZYGOTE, PYTHON, os.path.join(tmp, "s.py"), "sleep",
                                   pid_file], env=e, cwd=tmp)
        deadline = time.monotonic() + 30
        while not os.path.exists(pid_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        pid = int(open(pid_file).read())
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        check(not alive(pid), "the caller killed: its run is killed")

        deadline = time.monotonic() + 20
        while servers(tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        check(not servers(tmp), "the server exits idle and removes its socket")

        refuses = os.path.join(tmp, "python-without-server")
        with open(refuses, "w") as f:
            f.write(f'#!/bin/sh\n[ "$2" = "--serve" ] && exit 3\nexec {PYTHON} "$@"\n')
        os.chmod(refuses, 0o755)
        r = run(tmp, "echo", "5", env={"ZT_VALUE": "plain"}, python=refuses)
        check(r.returncode == 5 and "plain" in r.stdout and not servers(tmp),
              "no server: the script runs as a plain process")
    print("PASS zygote_test")


if __name__ == "__main__":
    main()
