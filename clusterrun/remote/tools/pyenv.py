"""`environment:` on a host: its wheel store, fetching from the master, building with uv (stdlib
only, Python 3.6+; runs with the host's base interpreter, the inventory's `python:`).

One request per call, by ``op``:
- ``status``: the host's platform (Python, CPU, glibc), its absolute workdir, the lock's
  environment as built there (every installed distribution and the interpreter), which of
  ``want`` (sha256s) its store lacks, and ``interface``'s IPv4 address where one is named;
  with ``system_site_packages``, every distribution ``host_python`` (the inventory's
  `python:`) sees, as ``host_packages``.
  A host holding the lock's environment answers only this.
- ``receive``: ``files`` [{sha, name, size}] follow the request on stdin, one after another.
- ``fetch``: ``files`` from the master's wheelserve.py at ``url`` (``token`` in a header).
- ``build``: ``<workdir>/envs/<lock>``, with uv, offline, from the store alone: into a
  temporary folder renamed into place when complete, under a lock file (two launches at once
  build it once); with ``system_site_packages``, a virtual environment's own site-packages
  kept visible (sitedirs.py).
- ``prune``: every environment but ``keep`` and the most recently used other one.

Layout under the workdir: ``wheels/<sha256>/<file name>`` (content-addressed: a wheel is stored
once whatever the locks that name it), ``envs/<lock hash>/``, ``envs/.<lock hash>.lock``, and uv
itself under ``runs/.tools/uv-<sha>`` (beside a shipped py-spy).
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zipfile

from clusterrun.remote.hostlib import hostio
from clusterrun.remote.probe import envstate, sitedirs
from clusterrun.remote.shared import protocol

BLOCK = 1 << 20
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*\.whl$")
SIOCGIFADDR = 0x8915
BUILD_SECONDS = 1800
PR_SET_PDEATHSIG = 1


class Refused(Exception):
    """A problem to report as this host's answer (disk full, a bad wheel, uv failing)."""

    def __init__(self, message, disk_full=None):
        Exception.__init__(self, message)
        self.disk_full = disk_full


def workdir_of(req):
    return os.path.abspath(os.path.expanduser(req["workdir"]))


def store_path(workdir, sha, name):
    if not _SHA_RE.match(sha) or not _NAME_RE.match(name):
        raise Refused("refused a wheel named %r (sha %r)" % (name, sha))
    return os.path.join(workdir, "wheels", sha, name)


def has(workdir, sha, name):
    return os.path.isfile(store_path(workdir, sha, name))


def ipv4_of(interface):
    """The IPv4 address of ``interface`` on this host (None: no such interface, or none)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = struct.pack("256s", interface.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFADDR, packed)[20:24])
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def status(req):
    workdir = workdir_of(req)
    ssh = (os.environ.get("SSH_CONNECTION") or "").split()
    found = envstate.state(workdir, req["lock"])
    found.update(python_path=sys.executable,
                 ssh_server_address=ssh[2] if len(ssh) == 4 else None,
                 interface_address=ipv4_of(req["interface"]) if req.get("interface") else None,
                 missing=[w["sha"] for w in req.get("want", [])
                          if not has(workdir, w["sha"], w["name"])])
    if req.get("system_site_packages"):  # asked of `python:`: this may be the env's interpreter
        host = sitedirs.ask(sitedirs.resolve(req.get("host_python") or sys.executable))
        found["host_packages"] = sitedirs.distributions(host["path"])
        if found["env"] and not sitedirs.kept(found["env"]["path"], sitedirs.own_site_dirs(host)):
            found["env"] = None  # built without the host's own packages: to be built again
    return found


def _store_from(workdir, item, read):
    """One wheel into the store from ``read(n)``, checked against its sha256, never half a
    file under its name."""
    path = store_path(workdir, item["sha"], item["name"])
    hostio.make_private_dir(os.path.dirname(path))
    tmp = "%s.tmp.%d" % (path, os.getpid())
    digest = hashlib.sha256()
    left = int(item["size"])
    try:
        with open(tmp, "wb") as out:
            while left:
                block = read(min(left, BLOCK))
                if not block:
                    raise Refused("%s ended early" % item["name"])
                digest.update(block)
                out.write(block)
                left -= len(block)
        if digest.hexdigest() != item["sha"]:
            raise Refused("%s arrived with another sha256 than sent" % item["name"])
        os.replace(tmp, path)
    except OSError as exc:
        raise _disk(exc, path) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return path


def _disk(exc, path):
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Refused("no space left on the device holding %s" % os.path.dirname(path),
                       disk_full=os.path.dirname(path))
    return Refused("%s: %s" % (path, exc.strerror or exc))


def receive(req, stdin):
    workdir = workdir_of(req)
    for item in req["files"]:
        _store_from(workdir, item, stdin.read)
    return {"received": sum(int(i["size"]) for i in req["files"])}


def fetch(req):
    from urllib.request import Request, urlopen  # only here: the other ops need no network

    workdir = workdir_of(req)
    moved = 0
    for item in req["files"]:
        if has(workdir, item["sha"], item["name"]):
            continue
        if not req["url"].startswith("http://"):
            raise Refused("refused to fetch from %r" % req["url"])
        ask = Request("%s/%s" % (req["url"], item["sha"]),  # noqa: S310 - http:// only, above
                      headers={"X-Clusterrun-Token": req["token"]})
        try:
            with contextlib.closing(urlopen(ask, timeout=60)) as answer:  # noqa: S310
                _store_from(workdir, item, answer.read)
        except (OSError, ValueError) as exc:
            raise Refused("fetching %s from the master (%s) failed: %s"
                          % (item["name"], req["url"], exc)) from None
        moved += int(item["size"])
    return {"fetched": moved}


def uv_binary(workdir, uv):
    """uv's binary out of its wheel (``<name>.data/scripts/uv``), kept for next time."""
    tools = os.path.join(workdir, "runs", ".tools")
    path = os.path.join(tools, "uv-%s" % uv["sha"][:16])
    if os.access(path, os.X_OK):
        return path
    hostio.make_private_dir(tools)
    with zipfile.ZipFile(store_path(workdir, uv["sha"], uv["name"])) as wheel:
        inside = [n for n in wheel.namelist() if n.endswith("/scripts/uv")]
        if not inside:
            raise Refused("the wheel %s holds no uv binary" % uv["name"])
        tmp = "%s.tmp.%d" % (path, os.getpid())
        with wheel.open(inside[0]) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, BLOCK)
    os.chmod(tmp, 0o700)
    os.replace(tmp, path)
    return path


def _with_parent():
    """For uv's process: killed when this build process dies (Linux's PR_SET_PDEATHSIG). A
    killed build otherwise leaves uv running on, writing into a folder that no one will use
    and that the next build clears while it writes. None where that cannot be asked for."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # this process died before the line above
            os._exit(1)

    return arm


def _uv(argv, workdir):
    env = dict(os.environ, UV_OFFLINE="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never",
               UV_NO_PROGRESS="1", UV_CACHE_DIR=os.path.join(workdir, "envs", ".uv-cache"))
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_INDEX",
                 "VIRTUAL_ENV", "CONDA_PREFIX"):
        env.pop(name, None)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env, timeout=BUILD_SECONDS, check=False,
                          preexec_fn=_with_parent())
    if proc.returncode != 0:
        said = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-6:]
        if any("No space left" in line for line in said):
            raise Refused("no space left on the device holding %s" % workdir,
                          disk_full=os.path.join(workdir, "envs"))
        raise Refused("uv %s failed (exit %d): %s" % (argv[1], proc.returncode,
                                                      " | ".join(said)))


def _build_into(tmp, workdir, req, host_dirs):
    links = tmp + ".links"  # the lock's wheels under their names: uv's --find-links
    hostio.make_private_dir(links)
    for item in req["files"]:
        os.symlink(store_path(workdir, item["sha"], item["name"]),
                   os.path.join(links, item["name"]))
    lock = tmp + ".txt"
    with open(lock, "w") as out:
        out.write(req["requirements"])
    uv = uv_binary(workdir, req["uv"])
    _uv([uv, "venv", "--quiet", "--relocatable", "--python", sys.executable]
        + (["--system-site-packages"] if req.get("system_site_packages") else []) + [tmp],
        workdir)
    # --no-deps: the lock names every distribution; a host never resolves anything itself.
    _uv([uv, "pip", "install", "--quiet", "--python", os.path.join(tmp, "bin", "python"),
         "--offline", "--no-index", "--no-deps", "--find-links", links, "-r", lock], workdir)
    if host_dirs:  # a venv's own packages, not only its base's
        sitedirs.keep_host(tmp, host_dirs)


def _clear(envs, prefix):
    for item in os.listdir(envs):
        if item.startswith(prefix):
            path = os.path.join(envs, item)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def build(req):
    workdir = workdir_of(req)
    envs = os.path.join(workdir, "envs")
    final = os.path.join(envs, req["lock"])
    expected = sorted(req["expected"])
    # The host interpreter's own site directories, asked once for the check and the build.
    host_dirs = sitedirs.own_site_dirs(sitedirs.ask(sys.executable)) \
        if req.get("system_site_packages") else None
    try:
        hostio.make_private_dir(envs)
        with open(os.path.join(envs, ".%s.lock" % req["lock"]), "a") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another launch's build: wait for it
            found = envstate.describe(final)
            if found and found["dists"] == expected and found["python"] == req["python"] \
                    and (host_dirs is None or sitedirs.kept(final, host_dirs)):
                os.utime(final)
                return {"built": False, "env": found}
            # Holding the lock, any temporary folder of this lock is a killed build's.
            _clear(envs, ".tmp-%s-" % req["lock"])
            tmp = os.path.join(envs, ".tmp-%s-%d" % (req["lock"], os.getpid()))
            start = time.monotonic()
            try:
                _build_into(tmp, workdir, req, host_dirs)
                if os.path.isdir(final):  # a drifted one: out of the way, then gone
                    old = os.path.join(envs, ".tmp-%s-old-%d" % (req["lock"], os.getpid()))
                    os.rename(final, old)
                    shutil.rmtree(old, ignore_errors=True)
                os.rename(tmp, final)
            finally:
                _clear(envs, ".tmp-%s-" % req["lock"])
            return {"built": True, "seconds": round(time.monotonic() - start, 2),
                    "env": envstate.describe(final)}
    except OSError as exc:
        raise _disk(exc, final) from None


def prune(req):
    workdir = workdir_of(req)
    envs = os.path.join(workdir, "envs")
    keep = set(req["keep"])
    try:
        others = [e for e in os.listdir(envs) if not e.startswith(".") and e not in keep
                  and os.path.isfile(os.path.join(envs, e, "pyvenv.cfg"))]
    except OSError:
        return {"removed": []}
    others.sort(key=lambda e: os.path.getmtime(os.path.join(envs, e)), reverse=True)
    removed = []
    for name in others[1:]:  # the most recently used other one is the previous: kept
        with open(os.path.join(envs, ".%s.lock" % name), "a") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            shutil.rmtree(os.path.join(envs, name), ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(envs, ".%s.lock" % name))
        removed.append(name)
    return {"removed": removed, "kept": sorted(keep) + others[:1]}


def main(stdin):
    req = json.loads(stdin.readline())
    op = req[protocol.OP]
    try:
        if op == protocol.Env.STATUS:
            answer = status(req)
        elif op == protocol.Env.RECEIVE:
            answer = receive(req, stdin)
        elif op == protocol.Env.FETCH:
            answer = fetch(req)
        elif op == protocol.Env.BUILD:
            answer = build(req)
        elif op == protocol.Env.PRUNE:
            answer = prune(req)
        else:
            answer = {"error": "unknown operation %r" % op}
    except (Refused, sitedirs.AskFailed) as exc:
        answer = {"error": str(exc), "disk_full": getattr(exc, "disk_full", None)}
    except subprocess.TimeoutExpired:
        answer = {"error": "the build took over %d s" % BUILD_SECONDS}
    answer[protocol.OP] = op
    hostio.reply(answer)


if __name__ == "__main__":
    main(sys.stdin.buffer)
