#!/usr/bin/env bash
# Checks the images and compose files (docker/) and the scripts that run them, without a Docker
# engine (ctest: docker_check, label unit; tests/docker/job_test.sh runs them in one, label docker).
#   docker/check.sh PTCFS_BINARY
# (a) docker/compose.yaml: etcd from docker/Dockerfile.etcd (Debian's etcd-server), three workers
#     with /dev/fuse, SYS_ADMIN, AppArmor off, a store volume each, the token secret, distinct ids
#     and listen names, the init service filling every store; what Debian's docker-compose 1.29
#     refuses is absent (a top-level name); every build on the host network with BASE; every file
#     named exists (or is made by docker/up.sh). docker/compose.host.yaml: each worker's
#     /mnt bound rshared to docker/mnt/workerW. The Dockerfiles: BASE (default debian:12), no
#     BuildKit-only syntax, docker/build-steps.sh's steps; .dockerignore keeps builds out of the
#     context. `compose config` accepts both files when a compose is installed.
# (b) the scripts parse (bash -n, shellcheck when installed); the build packages are
#     tools/setup-deps.sh's; install-binary stages the binary and the scripts; the runtime package
#     list covers every library `ldd` lists for the binary (dpkg -S, with the packages'
#     dependencies); the entrypoint refuses a missing variable naming it and builds the mount
#     command; the init script gives each worker's store only its own shards.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:?usage: docker/check.sh PTCFS_BINARY}"
[ -x "$bin" ] || { echo "check-docker: $bin is not an executable" >&2; exit 1; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
d="$root/docker"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "check-docker: FAIL: $*" >&2
  exit 1
}

# --- (b) scripts parse -------------------------------------------------------------------------
scripts=("$d/build-steps.sh" "$d/entrypoint.sh" "$d/init-job.sh" "$d/check.sh"
         "$d/env.sh" "$d/up.sh" "$d/down.sh"
         "$root/tests/docker/job_test.sh")
for s in "${scripts[@]}"; do
  [ -f "$s" ] || fail "missing $s"
  bash -n "$s" || fail "$s does not parse"
done
if command -v shellcheck > /dev/null; then
  shellcheck -S warning "${scripts[@]}" || fail "shellcheck warnings above"
else
  echo "check-docker: shellcheck not installed, only bash -n"
fi

# --- (a) the compose files, the Dockerfiles, the build context ---------------------------------
/usr/bin/python3 - "$d" "$root" << 'PY' || fail "docker/compose*.yaml, docker/Dockerfile* or .dockerignore (above)"
import os, re, sys
try:
    import yaml
except ImportError:
    sys.exit("python3-yaml is not installed (tools/setup-deps.sh installs it)")
d, root = sys.argv[1], sys.argv[2]
errors = []
def err(msg): errors.append(msg)
def load(name):
    with open(os.path.join(d, name)) as f:
        return yaml.safe_load(f)  # merge keys (<<: *worker) resolved here, as compose does
def interp(v):  # compose's ${VAR:-default}, with the defaults (what docker/env.sh leaves unset)
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), str(v))
c = load("compose.yaml")
services = c.get("services") or {}
top_volumes = c.get("volumes") or {}
top_secrets = c.get("secrets") or {}
ignored = open(os.path.join(d, ".gitignore")).read().split() if os.path.exists(os.path.join(d, ".gitignore")) else []

def env(svc):
    e = svc.get("environment") or {}
    if isinstance(e, list):
        e = dict(x.split("=", 1) if "=" in x else (x, None) for x in e)
    return {k: (None if v is None else str(v)) for k, v in e.items()}

def volumes(svc):  # [(type, source, target, bind options)]
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            src, tgt = parts[0], parts[1] if len(parts) > 1 else parts[0]
            kind = "bind" if src.startswith((".", "/", "~")) else "volume"
            out.append((kind, src, tgt, {}))
        else:
            out.append((v.get("type", "volume"), v.get("source"), v.get("target"), v.get("bind") or {}))
    return out

def check_file(what, rel):
    if not os.path.exists(os.path.normpath(os.path.join(d, interp(rel)))):
        err(f"{what}: {interp(rel)} does not exist")

# Debian 12's docker-compose (1.29) refuses a top-level name; the project is given by -p.
if "name" in c:
    err("compose.yaml: a top-level `name` (Debian's docker-compose 1.29 refuses it; docker/env.sh gives -p)")

# etcd: Debian's etcd-server (3.4, the JSON gateway cluster/ speaks), healthy before the workers start.
etcd = services.get("etcd")
if not etcd:
    err("no etcd service")
else:
    if not re.fullmatch(r"ptcfs-etcd:\w+", interp(etcd.get("image", ""))):
        err(f"etcd: image {etcd.get('image')!r} is not ptcfs-etcd:TAG (docker/Dockerfile.etcd)")
    if (etcd.get("build") or {}).get("dockerfile") != "Dockerfile.etcd":
        err("etcd: not built from docker/Dockerfile.etcd")
    if "healthcheck" not in etcd:
        err("etcd: no healthcheck (the workers wait for service_healthy)")
    if "--advertise-client-urls=http://etcd:2379" not in (etcd.get("command") or []):
        err("etcd: does not advertise http://etcd:2379")

workers = {n: s for n, s in services.items() if re.fullmatch(r"worker\d+", n)}
if len(workers) != 3:
    err(f"expected three workers worker0..2, found {sorted(workers)}")
store_of = {}
for name, s in sorted(workers.items()):
    w = name[len("worker"):]
    e = env(s)
    for k in ("PTCFS_WORKER", "PTCFS_ETCD", "PTCFS_LISTEN"):
        if not e.get(k):
            err(f"{name}: no {k}")
    if e.get("PTCFS_WORKER") != w:
        err(f"{name}: PTCFS_WORKER={e.get('PTCFS_WORKER')!r}, expected {w!r}")
    if not re.fullmatch(r"etcd://etcd:2379/\w+", e.get("PTCFS_ETCD") or ""):
        err(f"{name}: PTCFS_ETCD={e.get('PTCFS_ETCD')!r} is not etcd://etcd:2379/JOB")
    if (e.get("PTCFS_LISTEN") or "").split(":")[0] != name:
        err(f"{name}: PTCFS_LISTEN={e.get('PTCFS_LISTEN')!r} is not {name}:PORT (what the others resolve)")
    devices = [str(x).split(":")[0] for x in s.get("devices") or []]
    if "/dev/fuse" not in devices:
        err(f"{name}: no /dev/fuse in devices")
    if "SYS_ADMIN" not in (s.get("cap_add") or []):
        err(f"{name}: no SYS_ADMIN in cap_add")
    if "apparmor:unconfined" not in (s.get("security_opt") or []):
        err(f"{name}: no apparmor:unconfined in security_opt")
    if s.get("init") is not True:
        err(f"{name}: init is not true (signals to ptcfs)")
    secrets = [x if isinstance(x, str) else x.get("source") for x in s.get("secrets") or []]
    if "ptcfs_token" not in secrets:
        err(f"{name}: no ptcfs_token secret")
    dep = s.get("depends_on") or {}
    if not isinstance(dep, dict) or (dep.get("etcd") or {}).get("condition") != "service_healthy" \
            or (dep.get("init") or {}).get("condition") != "service_completed_successfully":
        err(f"{name}: depends_on must wait for etcd healthy and init completed")
    stores = [src for kind, src, tgt, _ in volumes(s) if kind == "volume" and tgt == "/var/lib/ptcfs/store"]
    if len(stores) != 1:
        err(f"{name}: no named volume at /var/lib/ptcfs/store (its store)")
    else:
        store_of[w] = stores[0]
        if stores[0] not in top_volumes:
            err(f"{name}: volume {stores[0]} is not declared under volumes:")
    if any(kind == "bind" for kind, _, _, _ in volumes(s)):
        err(f"{name}: a bind in compose.yaml (host paths belong in compose.host.yaml: not every host's / is shared)")
if len(set(store_of.values())) != len(store_of):
    err(f"workers share a store volume: {store_of}")

init = services.get("init")
if not init:
    err("no init service (the first generation)")
else:
    if init.get("entrypoint") != ["ptcfs-init-job"]:
        err(f"init: entrypoint {init.get('entrypoint')!r} is not ['ptcfs-init-job']")
    listed = (env(init).get("PTCFS_STORES") or "").split()
    at = {tgt: src for kind, src, tgt, _ in volumes(init) if kind == "volume"}
    for w, vol in sorted(store_of.items()):
        if int(w) >= len(listed) or at.get(listed[int(w)]) != vol:
            err(f"init: PTCFS_STORES entry {w} is not where worker {w}'s volume {vol} is mounted")

for name, s in services.items():
    b = s.get("build")
    if b is None:
        continue
    if not isinstance(b, dict):
        err(f"{name}: build is not a mapping (it needs network: host and the BASE argument)")
        continue
    ctx = b.get("context", ".")
    check_file(f"{name}: build context", ctx)
    check_file(f"{name}: dockerfile", os.path.join(ctx, b.get("dockerfile", "Dockerfile")))
    if b.get("network") != "host":
        err(f"{name}: build.network is not host (an engine with --bridge=none gives builds no other)")
    if interp((b.get("args") or {}).get("BASE", "")) != "debian:12":
        err(f"{name}: build.args.BASE is not ${{PTCFS_DOCKER_BASE:-debian:12}}")
for name, sec in top_secrets.items():
    if "file" in sec:
        path = os.path.normpath(os.path.join(d, interp(sec["file"])))
        if not os.path.exists(path) and os.path.relpath(path, d) not in ignored:
            err(f"secret {name}: {interp(sec['file'])} neither exists nor is docker/.gitignore's (made by docker/up.sh)")

# compose.host.yaml: the mounts shared with the host, rshared, under docker/mnt (ignored by git).
host = load("compose.host.yaml")
for name, s in (host.get("services") or {}).items():
    if name not in workers:
        err(f"compose.host.yaml: {name} is not a worker of compose.yaml")
        continue
    # At /mnt, above the mountpoint /mnt/ptcfs: ptcfs refuses to mount over a mount point (the bind).
    binds = [(src, opts) for kind, src, tgt, opts in volumes(s) if kind == "bind" and tgt == "/mnt"]
    if len(binds) != 1 or binds[0][1].get("propagation") != "rshared":
        err(f"compose.host.yaml: {name}: no bind at /mnt with propagation rshared")
    elif binds[0][0] != f"./mnt/{name}" or "mnt/" not in ignored:
        err(f"compose.host.yaml: {name}: the bind is not ./mnt/{name} (docker/mnt/ in docker/.gitignore)")
if sorted((host.get("services") or {})) != sorted(workers):
    err(f"compose.host.yaml: shares {sorted(host.get('services') or {})}, expected every worker {sorted(workers)}")

# The Dockerfiles: FROM the BASE argument (default debian:12); plain syntax, which Docker's classic
# builder (no BuildKit frontend image can be pulled without a registry) builds as BuildKit does.
buildkit_only = [(r"^#\s*syntax=", "a # syntax= line"), (r"^\s*RUN\s+--mount", "RUN --mount"),
                 (r"^\s*COPY\s+--link", "COPY --link"), (r"<<\s*['\"]?[A-Z]+", "a heredoc")]
wants = {
    "Dockerfile": ["ARG BASE=debian:12", "FROM ${BASE} AS build", "build-steps.sh build ", "FROM ${BASE}\n",
                   "build-steps.sh install-runtime", "COPY --from=build /out/ /", 'ENTRYPOINT ["ptcfs-worker"]'],
    "Dockerfile.prebuilt": ["ARG BASE=debian:12", "FROM ${BASE}\n", "build-steps.sh install-runtime", "COPY out/ /",
                            'ENTRYPOINT ["ptcfs-worker"]'],
    "Dockerfile.etcd": ["ARG BASE=debian:12", "FROM ${BASE}\n", "etcd-server", "policy-rc.d", 'ENTRYPOINT ["/usr/bin/etcd"]'],
}
for name, needed in wants.items():
    text = open(os.path.join(d, name)).read()
    for n in needed:
        if n not in text:
            err(f"docker/{name}: no {n.strip()!r}")
    for pattern, what in buildkit_only:
        if re.search(pattern, text, re.M):
            err(f"docker/{name}: {what}, which only BuildKit builds")
if os.path.exists(os.path.join(d, "Dockerfile.dockerignore")):
    err("docker/Dockerfile.dockerignore: only BuildKit reads it; the context's .dockerignore is the root's")
ignore = open(os.path.join(root, ".dockerignore")).read().split() if os.path.exists(os.path.join(root, ".dockerignore")) else []
for p in (".git", ".venv", "build", "build-*", "docker/token", "docker/mnt"):
    if p not in ignore:
        err(f".dockerignore: no {p} (the from-source build would send it as context)")

steps = open(os.path.join(d, "build-steps.sh")).read()
for script in ("entrypoint.sh", "init-job.sh"):
    if f'"$here/{script}"' not in steps:
        err(f"docker/build-steps.sh does not install docker/{script}")
    check_file("build-steps.sh", script)
# The build packages are a part of tools/setup-deps.sh's list.
setup = open(os.path.join(root, "tools", "setup-deps.sh")).read()
m = re.search(r"^PACKAGES=\((.*?)^\)", setup, re.S | re.M)
m2 = re.search(r"^BUILD_PACKAGES=\((.*?)^\)", steps, re.S | re.M)
if not m or not m2:
    err("cannot read PACKAGES=( ) of tools/setup-deps.sh or BUILD_PACKAGES=( ) of docker/build-steps.sh")
else:
    extra = sorted(set(m2.group(1).split()) - set(m.group(1).split()))
    if extra:
        err(f"docker/build-steps.sh's build packages not in tools/setup-deps.sh: {' '.join(extra)}")
if errors:
    print("\n".join("  " + e for e in errors), file=sys.stderr)
    sys.exit(1)
print(f"check-docker: compose.yaml: etcd, init, {len(workers)} workers; compose.host.yaml; Dockerfiles: ok")
PY

# A compose at hand parses both files as it would run them (Debian's docker-compose 1.29 or v2).
compose="$(bash -c 'source "$1" && docker_compose_cmd' _ "$root/docker/env.sh")"
if [ -n "$compose" ]; then
  echo "0123456789abcdef0123" > "$tmp/compose-token"
  # shellcheck disable=SC2086  # "docker compose" is two words
  PTCFS_DOCKER_TOKEN="$tmp/compose-token" $compose -p ptcfscheck -f "$d/compose.yaml" -f "$d/compose.host.yaml" \
    config -q || fail "$compose config refuses docker/compose.yaml with docker/compose.host.yaml"
  echo "check-docker: $compose config: ok"
else
  echo "check-docker: no compose installed: compose.yaml not parsed by one"
fi

# --- (b) install-binary stages the binary and the worker's scripts ------------------------------
bash "$d/build-steps.sh" install-binary "$bin" "$tmp/staged" > /dev/null || fail "build-steps.sh install-binary $bin"
for f in ptcfs ptcfs-worker ptcfs-init-job; do
  [ -x "$tmp/staged/usr/local/bin/$f" ] || fail "build-steps.sh install-binary did not stage /usr/local/bin/$f"
done

# --- (b) the runtime packages cover what the binary links -----------------------------------------
mapfile -t packages < <(bash "$d/build-steps.sh" runtime-packages)
[ "${#packages[@]}" -gt 0 ] || fail "build-steps.sh runtime-packages lists nothing"
command -v dpkg > /dev/null || fail "dpkg is needed to map libraries to Debian packages"
readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' > "$tmp/needed"
[ -s "$tmp/needed" ] || fail "readelf lists no NEEDED libraries for $bin"
ldd "$bin" > "$tmp/ldd" || fail "ldd $bin failed"
! grep 'not found' "$tmp/ldd" || fail "ldd: $bin links libraries that are not found"
dpkg-query -W -f='${Package}\t${Pre-Depends}, ${Depends}\t${Provides}\n' > "$tmp/installed"
/usr/bin/python3 - "$tmp" "${packages[@]}" << 'PY' || fail "the runtime packages (docker/build-steps.sh) miss libraries above"
import os, re, subprocess, sys
tmp, listed = sys.argv[1], sys.argv[2:]
needed = set(open(f"{tmp}/needed").read().split())
libs = []  # (soname, path) of every library ldd resolved
for line in open(f"{tmp}/ldd"):
    m = re.match(r"\s*(\S+) => (/\S+)", line)
    if m:
        libs.append(m.groups())
    elif m := re.match(r"\s*(/\S*/(ld-linux[^/\s]*))\s", line):  # the loader, NEEDED where __tls_get_addr is used
        libs.append((m.group(2), m.group(1)))
if not needed <= {so for so, _ in libs}:
    sys.exit(f"ldd resolved none of {sorted(needed - {so for so, _ in libs})}")

def candidates(path):  # usrmerge: dpkg may know /lib/... or /usr/lib/..., the link or its target
    out = []
    for p in (path, os.path.realpath(path)):
        bare = p[len("/usr"):] if p.startswith("/usr/") else p
        out += [p, bare, "/usr" + bare]
    return list(dict.fromkeys(out))
owner = {}
query = sorted({c for _, p in libs for c in candidates(p)})
found = subprocess.run(["dpkg", "-S"] + query, capture_output=True, text=True).stdout  # one call: each takes ~0.5 s
for line in found.splitlines():
    pkgs, _, path = line.partition(": ")
    owner.setdefault(path, pkgs.split(",")[0].split(":")[0].strip())

deps, providers = {}, {}
for line in open(f"{tmp}/installed"):
    name, dep, prov = (line.rstrip("\n").split("\t") + ["", ""])[:3]
    deps[name] = [[re.sub(r"[\s(:].*", "", a.strip()) for a in g.split("|")] for g in dep.split(",") if g.strip()]
    for p in prov.split(","):
        if p.strip():
            providers.setdefault(re.sub(r"[\s(].*", "", p.strip()), []).append(name)
closure, todo = set(), list(listed)
while todo:  # what apt installs for the list: the first installed alternative of each dependency
    p = todo.pop()
    if p in closure:
        continue
    closure.add(p)
    for alts in deps.get(p, []):
        for a in alts:
            chosen = a if a in deps else next(iter(providers.get(a, [])), None)
            if chosen:
                todo.append(chosen)
                break
bad = []
for so, path in libs:
    pkg = next((owner[c] for c in candidates(path) if c in owner), None)
    if pkg is None:
        bad.append(f"{so}: no Debian package owns {path}")
    elif so in needed and pkg not in listed:
        bad.append(f"{so} (linked directly): its package {pkg} is not in the list")
    elif pkg not in closure:
        bad.append(f"{so}: its package {pkg} is neither listed nor a dependency of the list")
missing = [p for p in listed if p not in deps]
if missing:
    bad.append(f"listed but not a Debian package installed here: {' '.join(missing)}")
if bad:
    print("\n".join("  " + b for b in bad), file=sys.stderr)
    sys.exit(1)
print(f"check-docker: runtime packages ({len(listed)}) cover the {len(libs)} libraries ldd lists")
PY

# --- (b) the entrypoint: refusals, then the command it runs --------------------------------------
if out="$(env -i /bin/bash "$d/entrypoint.sh" 2>&1)"; then fail "the entrypoint ran with an empty environment"; fi
for v in PTCFS_WORKER PTCFS_ETCD PTCFS_LISTEN; do
  grep -q "missing.*$v" <<< "$out" || fail "the entrypoint, with an empty environment, does not name $v: $out"
done
if out="$(env -i PTCFS_WORKER=1 PTCFS_ETCD=etcd://e:2379/job PTCFS_LISTEN=w1:7400 \
          PTCFS_TOKEN_FILE="$tmp/none" /bin/bash "$d/entrypoint.sh" 2>&1)"; then
  fail "the entrypoint ran without a token file"
fi
grep -q "no token file at $tmp/none" <<< "$out" || fail "the entrypoint does not name the missing token file: $out"
if out="$(env -i PTCFS_WORKER=one PTCFS_ETCD=etcd://e:2379/job PTCFS_LISTEN=w1:7400 /bin/bash "$d/entrypoint.sh" 2>&1)"; then
  fail "the entrypoint took PTCFS_WORKER=one"
fi
grep -q "PTCFS_WORKER='one'" <<< "$out" || fail "the entrypoint does not name a bad PTCFS_WORKER: $out"
if [ -c /dev/fuse ]; then
  printf '#!/bin/sh\necho "ARGS $*"\n' > "$tmp/fake-ptcfs" && chmod +x "$tmp/fake-ptcfs"
  echo "0123456789abcdef0123" > "$tmp/token" && chmod 644 "$tmp/token"
  out="$(env -i PATH=/usr/bin:/bin PTCFS_BIN="$tmp/fake-ptcfs" PTCFS_WORKER=1 PTCFS_ETCD=etcd://etcd:2379/job \
         PTCFS_LISTEN=worker1:7400 PTCFS_TOKEN_FILE="$tmp/token" PTCFS_STORE="$tmp/store" PTCFS_MOUNT="$tmp/mnt" \
         PTCFS_RUN_DIR="$tmp/run" PTCFS_MOUNT_ARGS="--threads 4" /bin/bash "$d/entrypoint.sh" 2>&1)" ||
    fail "the entrypoint failed with every variable set: $out"
  want="ARGS mount -f $tmp/store $tmp/mnt --worker 1 --cluster etcd://etcd:2379/job --listen worker1:7400 --token-file $tmp/run/token --lease 10 --threads 4"
  grep -qxF "$want" <<< "$out" || fail "the entrypoint ran '$(grep ARGS <<< "$out")', expected '$want'"
  [ "$(stat -c %a "$tmp/run/token")" = 600 ] || fail "the entrypoint's token copy is not mode 600"
else
  echo "check-docker: no /dev/fuse here: the entrypoint's mount command is not checked"
fi

# --- (b) the init script: a first generation, each store with its own shards only ---------------
# One rank a worker: fewer files to write and sync than the default config, the same split.
PTCFS_BIN="$bin" PTCFS_CONFIG=tp=1,pp=3,per_worker=1 PTCFS_STORES="$tmp/s0 $tmp/s1 $tmp/s2" TMPDIR="$tmp" bash "$d/init-job.sh" > "$tmp/init.log" 2>&1 ||
  fail "init-job.sh: $(cat "$tmp/init.log")"
for w in 0 1 2; do
  got="$(cd "$tmp/s$w" && echo gen-*/worker-*)"
  [ "$got" = "gen-000001/worker-0$w" ] || fail "init-job.sh: store $w holds shard directories '$got', expected worker-0$w only"
  "$bin" inspect "$tmp/s$w" > /dev/null || fail "init-job.sh: store $w does not open"
done
out="$(PTCFS_BIN="$bin" PTCFS_STORES="$tmp/s0 $tmp/s1 $tmp/s2" bash "$d/init-job.sh" 2>&1)" || fail "init-job.sh, run again: $out"
grep -q "already holds a store" <<< "$out" || fail "init-job.sh, run again, did not leave the stores as they were: $out"
echo "check-docker: entrypoint and init-job.sh: ok"
echo "check-docker: PASS"
