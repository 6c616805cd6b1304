"""Runs a client script in a fork of a Python that has imported torch and friends.

    /usr/bin/python3 -S zygote.py PYTHON SCRIPT [ARGS...]

is `PYTHON SCRIPT ARGS...` (the same exit status; its stdout and stderr, as they
were written, on the caller's stdout), run in a
fork of a server process that PYTHON started once and that has already imported
what the client scripts import (torch, DCP, megatron-core, torchtitan,
transformers, safetensors, numpy: ~8 s of CPU that every client process paid
again). The client suites start about a hundred such processes. Each run is a
fresh fork: nothing of one run is seen by the next. The server is shared by
every concurrent caller of the same PYTHON and zygote.py, serves each
connection in a fork of its own, and exits after a minute without callers.

The caller's environment, working directory and network namespace are the run's
(the cluster tests run clients in namespaces of their own). Its output comes
back when the script has exited (a lingering grandchild's later output is
dropped); if the caller goes away (a ctest timeout), the run's process group is
killed. Where the server cannot start, the script runs as a plain process.

This file runs with the caller's plain Python (-S: no site-packages), so it
imports only the standard library until it serves.
"""

import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

START_TIMEOUT_S = 300
# The server's idle time before it exits, and what it imports (comma-separated): its
# own test (zygote_test.py) sets both.
IDLE_EXIT_S = float(os.environ.get("PTCFS_ZYGOTE_IDLE_S", "60"))
CLIENT_MODULES = (
    "numpy",
    "torch",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
    "safetensors.torch",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "torchtitan.models.llama3",
    "torchtitan.models.qwen3",
    "torchtitan.models.deepseek_v3",
    "torchtitan.components.checkpoint",
    "transformers.models.llama.modeling_llama",
    "transformers.models.mixtral.modeling_mixtral",
    "transformers.models.qwen2_moe.modeling_qwen2_moe",
    "transformers.models.qwen3_moe.modeling_qwen3_moe",
    "transformers.models.deepseek_v3.modeling_deepseek_v3",
    "megatron.core.datasets.indexed_dataset",
)
PRELOAD = tuple(filter(None, os.environ.get("PTCFS_ZYGOTE_PRELOAD", ",".join(CLIENT_MODULES)).split(",")))


def socket_path(python):
    # The interpreter's path as given, not its realpath: a venv's python is a link to the base
    # interpreter, and the venv is the link's directory.
    key = hashlib.sha256(f"{os.path.abspath(python)}\0{os.path.realpath(__file__)}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ptcfs-zygote-{os.getuid()}-{key}")


# --- the caller's side -------------------------------------------------------

def send_frame(sock, payload):
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def recv_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("the zygote closed the connection")
        data += chunk
    return bytes(data)


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path + ".sock")
        return s
    except OSError:
        s.close()
        return None


def start_server(python, path):
    """Starts the server under a lock (one start for concurrent callers); its connection or None."""
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = connect(path)
        if s:
            return s
        with open(path + ".log", "w") as log:
            server = subprocess.Popen([python, os.path.realpath(__file__), "--serve", path], stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=log, start_new_session=True, cwd="/")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            s = connect(path)
            if s:
                return s
            time.sleep(0.1)
        return None


def call(python, argv):
    python = os.path.abspath(python)
    path = socket_path(python)
    s = connect(path) or start_server(python, path)
    if s is None:
        os.execv(python, [python] + argv)  # no server: run it as a plain process
    with s:
        try:
            send_frame(s, json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode())
            (length,) = struct.unpack("!Q", recv_exact(s, 8))
        except ConnectionError:  # the server exited idle as this caller came: nothing ran
            os.execv(python, [python] + argv)
        output = recv_exact(s, length)
        (code,) = struct.unpack("!i", recv_exact(s, 4))
    sys.stdout.buffer.write(output)
    sys.stdout.flush()
    return code


# --- the server's side -------------------------------------------------------

def enter_net_namespace(pid):
    """Into the network namespace of process PID (a caller run by nsenter --net in a cluster test)."""
    import ctypes

    theirs, ours = f"/proc/{pid}/ns/net", "/proc/self/ns/net"
    if os.stat(theirs).st_ino == os.stat(ours).st_ino:
        return
    fd = os.open(theirs, os.O_RDONLY)
    if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns into {theirs}")
    os.close(fd)


def run_script(request, out_fd, caller_pid):
    """In the run's process: the caller's network namespace, environment, cwd and argv; the
    script as __main__."""
    import runpy
    import traceback

    os.setsid()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        enter_net_namespace(caller_pid)
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve_one(conn):
    """In a fork per connection: runs the request in a fork of its own, sends back output and status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    (length,) = struct.unpack("!Q", recv_exact(conn, 8))
    request = json.loads(recv_exact(conn, length))
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    caller_pid, _, _ = struct.unpack("3i", creds)
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:
            conn.close()
            run_script(request, out.fileno(), caller_pid)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            readable, _, _ = select.select([conn], [], [], 0.2)
            if readable and not conn.recv(1, socket.MSG_PEEK):  # the caller went away
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code
        out.seek(0)
        send_frame(conn, out.read())
        conn.sendall(struct.pack("!i", code))
    os._exit(0)


def serve(path):
    import importlib

    for name in PRELOAD:  # one that fails is imported by the script that needs it, as without the server
        try:
            importlib.import_module(name)
        except Exception as e:
            print(f"zygote: not preloaded: {name}: {e}", file=sys.stderr, flush=True)
    sock_path = path + ".sock"
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(64)
    server.settimeout(1.0)
    children, idle_since = set(), time.monotonic()
    while True:
        while children:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            children.discard(pid)
        if children:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_EXIT_S:
            break
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        pid = os.fork()
        if pid == 0:
            server.close()
            try:
                serve_one(conn)
            finally:
                os._exit(1)
        conn.close()
        children.add(pid)
        idle_since = time.monotonic()
    os.unlink(sock_path)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(call(sys.argv[1], sys.argv[2:]))
