"""Network namespaces for running several ptcfs workers on one machine.

Each worker gets a Linux network namespace of its own, joined to one bridge in
the root namespace by a veth pair, with its own IPv4 address in a private /24.
The root namespace has an address on the bridge too (``host_addr``), so a
process there (etcd, a test driver) is reachable from every namespace, and the
namespaces reach one another directly across the bridge. Nothing is forwarded
or NATed beyond that.

    from netns import Netns, start_etcd, skip_or_fail, require

    require(etcd=True)                    # skip (exit 77), or fail under CI=true
    with Netns(3) as ns, start_etcd(tmp, ns.host_addr) as etcd:
        worker = ns.popen(0, ["ptcfs", "serve", "--etcd", etcd.endpoint, ...])
        ns.run(2, ["ping", "-c1", ns.addr(0)], check=True)
        ns.set_link(1, False)             # worker 1 cut off; set_link(1, True) restores it
    # every namespace, veth and the bridge is gone here, processes killed

Cleanup always runs: on leaving the ``with`` block (also when the body raises),
when creation fails halfway, at interpreter exit (atexit) and on SIGTERM (the
handler cleans up, then raises SystemExit(143) so finally blocks still run).
Only SIGKILL escapes; the next Netns() sweeps what such a run left behind
(names with the default prefix whose owner pid is gone and that hold no
process).

Names: the default prefix is ``pt<pid hex>g<k>`` (k counts the instances made
by this process), so names are unique per process and per instance. The
bridge is PREFIX+"b", namespace i is PREFIX+"n"+i, the host end of its veth is
PREFIX+"h"+i (all within the kernel's 15-character interface-name limit); the
namespace end is "eth0" inside the namespace. The subnet is 10.213.X.0/24 with
X chosen, under a lock file shared by all users of this module, among the X
that no interface or route on the host uses yet (starting from one derived from
the pid), so parallel runs do not collide.

Stdlib only; needs root and iproute2's ``ip``. The tests register with CTest's
SKIP_RETURN_CODE 77: see skip_or_fail().
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Optional, Sequence

__all__ = ["Netns", "NetnsError", "Etcd", "start_etcd", "free_port", "skip_or_fail", "require", "sweep_stale"]

IP = shutil.which("ip") or "/usr/sbin/ip"
ETCD = os.environ.get("PTCFS_ETCD") or "/usr/bin/etcd"
SKIP = 77  # CTest SKIP_RETURN_CODE

_SUBNET = "10.213"  # 10.213.X.0/24
_LOCK_PATHS = ("/run/lock/ptcfs-netns.lock", "/tmp/ptcfs-netns.lock")
_DEFAULT_NAME = re.compile(r"^pt([0-9a-f]+)g(\d+)[bnh]\d*$")
_counter = itertools.count()
_live: list = []  # Netns and Etcd objects not yet cleaned up
_live_lock = threading.RLock()


class NetnsError(RuntimeError):
    """A command that sets up or tears down the namespaces failed."""


# ---------------------------------------------------------------------------
# Helpers


def skip_or_fail(reason: str) -> None:
    """Ends the test: exit 77 ("SKIP: reason"), or exit 1 when CI=true.

    A cluster test that cannot run where it should (CI) must fail, not skip.
    Raises SystemExit, so with-blocks and atexit handlers still clean up.
    """
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        print(f"FAIL (CI=true, would skip): {reason}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    print(f"SKIP: {reason}", flush=True)
    raise SystemExit(SKIP)


def require(etcd: bool = False) -> None:
    """Skips (or fails under CI) unless this machine can run cluster tests.

    Checks: running as root, `ip` present, a namespace can be created and
    deleted, and (etcd=True) the etcd binary ($PTCFS_ETCD or /usr/bin/etcd).
    """
    if os.geteuid() != 0:
        skip_or_fail("network namespaces need root")
    if not os.access(IP, os.X_OK):
        skip_or_fail("iproute2's `ip` is missing")
    if etcd and not os.access(ETCD, os.X_OK):
        skip_or_fail(f"no etcd at {ETCD} (install etcd-server or set PTCFS_ETCD)")
    probe = f"pt{os.getpid():x}probe"
    r = subprocess.run([IP, "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        skip_or_fail(f"cannot create a network namespace: {r.stderr.strip()}")
    subprocess.run([IP, "netns", "del", probe], capture_output=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (bind to port 0).

    Racy by nature: callers that start a server on it should retry with a new
    port when the server reports the address in use (start_etcd does).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([IP, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip() or 'exit ' + str(r.returncode)}")
    return r


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when this process dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop_process(p: subprocess.Popen, grace: float, group: bool) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; reaps it."""
    if p.poll() is not None:
        return

    def send(sig):
        try:
            if group:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        p.wait()
    if group:  # the leader is gone; take anything it left in its group with it
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@contextlib.contextmanager
def _subnet_lock():
    """An exclusive lock shared by every process that picks a subnet."""
    for path in _LOCK_PATHS:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            break
        except OSError:
            continue
    else:
        raise NetnsError(f"cannot open a lock file ({', '.join(_LOCK_PATHS)})")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> None:
    """Deletes namespaces and links with the default prefix left by runs that
    were SIGKILLed: their owner pid is gone and no process is inside them."""
    stale = set()
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _DEFAULT_NAME.match(name)
        if m and int(m.group(1), 16) != os.getpid() and not _pid_alive(int(m.group(1), 16)):
            if not _ip("netns", "pids", name, check=False).stdout.strip():
                _ip("netns", "del", name, check=False)
                stale.add(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _DEFAULT_NAME.match(name)
        if m and int(m.group(1), 16) != os.getpid() and not _pid_alive(int(m.group(1), 16)):
            _ip("link", "del", name, check=False)
            stale.add(name)
    if stale:
        print(f"netns: swept stale {' '.join(sorted(stale))}", file=sys.stderr)


def _used_subnets() -> set:
    """The X of every 10.213.X.* address or route in the root namespace."""
    text = _ip("-4", "-o", "addr", "show", check=False).stdout + _ip("-4", "route", "show", "table", "all",
                                                                    check=False).stdout
    return {int(x) for x in re.findall(r"\b10\.213\.(\d+)\.", text)}


# ---------------------------------------------------------------------------
# Namespaces


class Netns:
    """n network namespaces on one bridge; a context manager.

    Attributes: names (namespace names), host_addr (the root namespace's
    address on the bridge), bridge, subnet ("10.213.X.0/24"), mtu.
    """

    def __init__(self, n: int, prefix: Optional[str] = None, mtu: Optional[int] = None, grace: float = 3.0):
        """Creates the bridge and n namespaces; on any failure undoes what it did and raises NetnsError.

        prefix: the start of every name (default pt<pid hex>g<k>); at most
        15 - 1 - len(str(n - 1)) characters. mtu: of the veths and bridge (the
        kernel default, 1500, when None). grace: seconds between SIGTERM and
        SIGKILL for the processes popen() started.
        """
        if not 1 <= n <= 250:
            raise ValueError("Netns: n must be in 1..250")
        self.n = n
        self.grace = grace
        self.mtu = mtu
        self.names: list = []
        self._host_veths: list = []
        self._procs: list = []
        self._created_ns: list = []
        self._bridge_made = False
        self._closed = False
        if prefix is None:
            sweep_stale()
            prefix = f"pt{os.getpid():x}g{next(_counter) % 100}"
        if len(prefix) + 1 + len(str(n - 1)) > 15:
            raise ValueError(f"Netns: prefix {prefix!r} too long for {n} namespaces (15-character names)")
        self.prefix = prefix
        self.bridge = prefix + "b"
        self.names = [f"{prefix}n{i}" for i in range(n)]
        self._host_veths = [f"{prefix}h{i}" for i in range(n)]
        with _live_lock:
            _live.append(self)
        _install_signal_handler()
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        existing = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.split()}
        clash = existing.intersection(self.names)
        if clash:
            raise NetnsError(f"namespaces already exist: {' '.join(sorted(clash))}")
        mtu = ["mtu", str(self.mtu)] if self.mtu else []
        with _subnet_lock():
            used = _used_subnets()
            start = os.getpid() % 250 + 1
            free = [x for x in ((start + k - 1) % 250 + 1 for k in range(250)) if x not in used]
            if not free:
                raise NetnsError("no free 10.213.X.0/24 subnet")
            self._x = free[0]
            self.subnet = f"{_SUBNET}.{self._x}.0/24"
            self.host_addr = f"{_SUBNET}.{self._x}.1"
            _ip("link", "add", self.bridge, *mtu, "type", "bridge")
            self._bridge_made = True
            _ip("addr", "add", f"{self.host_addr}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        for i, (name, veth) in enumerate(zip(self.names, self._host_veths)):
            _ip("netns", "add", name)
            self._created_ns.append(name)
            _ip("link", "add", veth, *mtu, "type", "veth", "peer", "name", "eth0", *mtu, "netns", name)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")

    def addr(self, i: int) -> str:
        """The IPv4 address of namespace i (10.213.X.(i+2))."""
        if not 0 <= i < self.n:
            raise IndexError(f"namespace {i} of {self.n}")
        return f"{_SUBNET}.{self._x}.{i + 2}"

    def set_link(self, i: int, up: bool) -> None:
        """Cuts namespace i off the bridge (up=False: the host end of its veth
        goes down, so what it sends and what is sent to it is dropped, and its
        connections hang until their own timeouts) or restores its link."""
        _ip("link", "set", self._host_veths[i], "up" if up else "down")

    def _argv(self, i: int, argv: Sequence[str]) -> list:
        # Only the network namespace: unlike `ip netns exec`, nsenter keeps the
        # mount namespace, so a FUSE mount made inside is seen by everyone.
        return ["nsenter", f"--net=/run/netns/{self.names[i]}", *argv]

    def run(self, i: int, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run(argv, **kw) inside namespace i."""
        return subprocess.run(self._argv(i, argv), **kw)

    def popen(self, i: int, argv: Sequence[str], **kw) -> subprocess.Popen:
        """subprocess.Popen(argv, **kw) inside namespace i; killed on cleanup.

        The process leads a session of its own (start_new_session=True unless
        given), so cleanup signals its whole process group, and it gets SIGKILL
        if this process dies (PR_SET_PDEATHSIG) unless preexec_fn is given.
        """
        kw.setdefault("start_new_session", True)
        kw.setdefault("preexec_fn", _die_with_parent)
        p = subprocess.Popen(self._argv(i, argv), **kw)
        p._netns_group = kw["start_new_session"]
        self._procs.append(p)
        return p

    def close(self) -> None:
        """Kills the processes popen() started (and any left in the
        namespaces), deletes the namespaces, veths and bridge. Idempotent;
        never raises for things already gone."""
        if self._closed:
            return
        self._closed = True
        try:
            for p in self._procs:
                with contextlib.suppress(Exception):
                    _stop_process(p, self.grace, getattr(p, "_netns_group", False))
            for name in self._created_ns:  # anything else still inside keeps the namespace alive
                pids = _ip("netns", "pids", name, check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(Exception):
                        os.kill(int(pid), signal.SIGKILL)
            for name in reversed(self._created_ns):
                _ip("netns", "del", name, check=False)
            for veth in self._host_veths:  # normally gone with the peer; not when `link add` half-failed
                if os.path.exists(f"/sys/class/net/{veth}"):
                    _ip("link", "del", veth, check=False)
            if self._bridge_made or os.path.exists(f"/sys/class/net/{self.bridge}"):
                _ip("link", "del", self.bridge, check=False)
        finally:
            with _live_lock:
                if self in _live:
                    _live.remove(self)

    def __enter__(self) -> "Netns":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Netns({self.n}, prefix={self.prefix!r}, subnet={getattr(self, 'subnet', None)!r})"


# ---------------------------------------------------------------------------
# etcd


class Etcd:
    """A running etcd (see start_etcd); a context manager. .endpoint is
    "http://HOST:PORT", .log_path its log, .stop() ends it (idempotent),
    .kill() kills it at once (kill -9) and .restart() starts it again on its
    data and ports."""

    def __init__(self, proc: subprocess.Popen, endpoint: str, log_path: str, argv: Sequence[str] = ()):
        self.proc = proc
        self.endpoint = endpoint
        self.log_path = log_path
        self.argv = list(argv)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def stop(self, grace: float = 5.0) -> None:
        with contextlib.suppress(Exception):
            _stop_process(self.proc, grace, group=False)
        with _live_lock:
            if self in _live:
                _live.remove(self)

    close = stop

    def kill(self) -> None:
        """kill -9, as a crash or a lost host would stop it; reaps it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()

    def restart(self, timeout: float = 20.0) -> None:
        """Starts the stopped etcd again, with its data and on its ports;
        returns once GET /health says so (RuntimeError with the log's tail
        otherwise)."""
        assert self.proc.poll() is not None, "etcd is still running"
        self.proc = _spawn_etcd(self.argv, self.log_path)
        with _live_lock:
            if self not in _live:
                _live.append(self)
        if not _wait_healthy(self, timeout):
            raise RuntimeError(f"etcd at {self.endpoint} not healthy again after {timeout:g} s; log "
                               f"{self.log_path}:\n{self.log_tail()}")

    def __enter__(self) -> "Etcd":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _healthy(endpoint: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(endpoint + "/health", timeout=1) as r:
            return json.loads(r.read()).get("health") == "true"
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _spawn_etcd(argv: Sequence[str], log_path: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)


def _wait_healthy(etcd: Etcd, timeout: float) -> bool:
    """Whether `etcd` says it is healthy within `timeout` s (False as soon as it exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and etcd.proc.poll() is None:
        if _healthy(etcd.endpoint):
            return True
        time.sleep(0.05)
    return False


def start_etcd(data_dir: str, host: str, port: int = 0, timeout: float = 20.0) -> Etcd:
    """Starts etcd serving clients on http://HOST:PORT (a free port when 0),
    its peer URL on a free port of 127.0.0.1; returns once GET /health says
    so. etcd's data goes to DATA_DIR/data, its log to DATA_DIR/etcd.log.

    Retries with new ports (up to 3 times) when etcd finds a port taken;
    raises RuntimeError with the log's tail when it does not come up within
    `timeout` seconds. The process dies with this one (PR_SET_PDEATHSIG) and
    is stopped at exit if still running.
    """
    if not os.access(ETCD, os.X_OK):
        raise RuntimeError(f"no etcd binary at {ETCD}")
    os.makedirs(data_dir, exist_ok=True)
    log_path = os.path.join(data_dir, "etcd.log")
    _install_signal_handler()
    last = ""
    for attempt in range(3 if port == 0 else 1):
        client = port or free_port(host)
        peer = free_port("127.0.0.1")
        endpoint = f"http://{host}:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        argv = [
            ETCD, "--name=ptcfs-test", f"--data-dir={os.path.join(data_dir, 'data')}",
            f"--listen-client-urls={endpoint}", f"--advertise-client-urls={endpoint}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=ptcfs-test={peer_url}", "--initial-cluster-state=new",
            "--heartbeat-interval=10", "--election-timeout=100", "--logger=zap", "--log-level=warn"
        ]
        proc = _spawn_etcd(argv, log_path)
        etcd = Etcd(proc, endpoint, log_path, argv)
        with _live_lock:
            _live.append(etcd)
        if _wait_healthy(etcd, timeout):
            return etcd
        running = proc.poll() is None
        last = etcd.log_tail()
        etcd.stop()
        if running:
            raise RuntimeError(f"etcd at {endpoint} not healthy after {timeout:g} s; log {log_path}:\n{last}")
        if "address already in use" not in last:
            break
    raise RuntimeError(f"etcd exited (status {proc.returncode}); log {log_path}:\n{last}")


# ---------------------------------------------------------------------------
# Cleanup at exit and on SIGTERM


def _cleanup_all() -> None:
    with _live_lock:
        objs = list(reversed(_live))
    for o in objs:
        with contextlib.suppress(Exception):
            o.close()


atexit.register(_cleanup_all)
_handler_installed = False


def _on_sigterm(signum, frame):
    _cleanup_all()
    raise SystemExit(128 + signum)


def _install_signal_handler() -> None:
    """SIGTERM cleans up (then SystemExit(143)), unless someone else handles SIGTERM already."""
    global _handler_installed
    if _handler_installed:
        return
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
        _handler_installed = True
    except ValueError:  # not the main thread: atexit and __exit__ still clean up
        pass
