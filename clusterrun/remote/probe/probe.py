"""clusterrun preflight probe: runs on a host with the host's own Python (stdlib only, 3.6+).

It arrives on stdin (see clusterrun/transport/shell.py), reads one JSON request line, prints the
host's facts as one JSON line, then answers JSON operations line by line (route, listen, connect,
mesh, resolve, throughput) until stdin closes. It never imports torch: that takes seconds and
proves nothing here.
"""

import errno
import fcntl
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from clusterrun.remote.probe import envstate, meshtest, nvidia, pathcheck, sysinfo, throughput
from clusterrun.remote.shared import diskfloor, protocol

TYPE_CHECKING = False  # mypy takes it as true; hosts skip importing typing (~4 ms)
if TYPE_CHECKING:
    from typing import Any  # noqa: F401 - used in type comments (Python 3.6: no annotations)

SIOCGIFFLAGS = 0x8913
SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B
IFF_UP = 0x1
IFF_RUNNING = 0x40
P = protocol.Probe  # what the controller asks for (OPS below)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run(argv, timeout=10):
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace")


def _ioctl(sock, request, name):
    packed = struct.pack("256s", name.encode()[:15])
    return fcntl.ioctl(sock.fileno(), request, packed)


def interfaces():
    """Every interface with its state and addresses: `ip` when present, else ioctl (IPv4)."""
    found = {}  # type: dict[str, Any]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _index, name in socket.if_nameindex():
            try:
                flags = struct.unpack("H", _ioctl(probe, SIOCGIFFLAGS, name)[16:18])[0]
            except OSError:
                flags = 0
            found[name] = {"name": name, "up": bool(flags & IFF_UP and flags & IFF_RUNNING),
                           "addrs": []}
        listing = run(["ip", "-o", "addr", "show"])
        if listing is not None:
            for line in listing.splitlines():
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("inet", "inet6") and parts[1] in found:
                    found[parts[1]]["addrs"].append(parts[3])
        else:
            for name, item in found.items():
                try:
                    addr = socket.inet_ntoa(_ioctl(probe, SIOCGIFADDR, name)[20:24])
                    mask = socket.inet_ntoa(_ioctl(probe, SIOCGIFNETMASK, name)[20:24])
                except OSError:
                    continue
                bits = bin(struct.unpack("!I", socket.inet_aton(mask))[0]).count("1")
                item["addrs"].append("%s/%d" % (addr, bits))
    finally:
        probe.close()
    return sorted(found.values(), key=lambda i: i["name"])


def owner_of(addr, ifaces):
    for item in ifaces:
        for cidr in item["addrs"]:
            if cidr.split("/")[0] == addr:
                return item["name"]
    return None


def route(addr):
    """The device and source address this host uses to reach ``addr``. For one of its own
    addresses the kernel answers `lo`; the device holding the address is the useful answer."""
    ifaces = interfaces()
    own = owner_of(addr, ifaces)
    if own is not None:
        return {"dev": own, "src": addr, "local": True}
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    src = None
    try:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.connect((addr, 9))  # UDP: no packet is sent, the kernel just picks a route
            src = sock.getsockname()[0]
        finally:
            sock.close()
    except OSError as exc:
        return {"dev": None, "src": None, "error": "no route to %s (%s)" % (addr, exc.strerror)}
    dev = None
    text = run(["ip", "-o", "route", "get", addr], timeout=5)
    if text:
        words = text.split()
        if "dev" in words:
            dev = words[words.index("dev") + 1]
        if "src" in words:
            src = words[words.index("src") + 1]
    if dev is None or dev == "lo":
        dev = owner_of(src, ifaces)
    return {"dev": dev, "src": src, "local": False}


def resolve_self(timeout):
    """How long this host takes to look its own name up (torch does it at start-up)."""
    name = socket.gethostname()
    return dict(sysinfo.lookup(name, timeout, socket.AF_INET), hostname=name)


def check_workdir(path):
    """Create the workdir (0700, as the run would) and write a file in it: a directory that
    looks writable can still refuse (/proc, a read-only mount, a full disk, quotas)."""
    path = os.path.abspath(os.path.expanduser(path))
    old = os.umask(0o077)
    try:
        os.makedirs(path, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path, prefix=".clusterrun-check-")
        try:
            os.write(fd, b"ok\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name)
    except OSError as exc:
        # What is in the way, and whose home: the controller words the fix (hostpaths.py).
        return pathcheck.failure(path, exc)
    finally:
        os.umask(old)
    # Runs go to <workdir>/runs, which may be a mount of its own.
    runs = os.path.join(path, "runs")
    where = runs if os.path.isdir(runs) else path
    return {"path": path, "ok": True, "error": None, "free": diskfloor.free_bytes(where),
            "free_at": where}


def facts(request):
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    gpus = nvidia.facts()
    # Each runs subprocesses or walks sys.path: once per probe, shared with system_facts.
    ifaces, torch = interfaces(), sysinfo.torch_info()
    return {
        "hostname": socket.gethostname(),
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
        "python": sys.version.split()[0],
        "python_path": sys.executable,
        "torch": torch,
        "gpus": gpus["count"],
        "cpus": cpu_count(),
        "nvidia": gpus,
        "interfaces": ifaces,
        "ssh_server_address": ssh[2] if len(ssh) == 4 else None,
        "dns": resolve_self(request.get("dns_timeout", 5)),
        "workdir": check_workdir(request.get("workdir", "~/clusterrun")),
        "rsync": any(os.access(os.path.join(d, "rsync"), os.X_OK)
                     for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)),
        # `environment:` (the request names the lock's hash): its state as pyenv.py's status
        # reports it, so that a host already holding the lock's needs no status of its own.
        "pyenv": envstate.state(request.get("workdir", "~/clusterrun"), request["lock"])
        if request.get("lock") else None,
        **system_facts(request, torch or {}, [i["name"] for i in ifaces]),
    }


def cpu_count():
    """The CPUs this process may run on, as torchrun counts them for `--nproc-per-node cpu`
    (its affinity mask: cgroups and taskset respected)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def system_facts(request, torch, ifaces):
    """Names, software, limits and links (clusterrun/remote/probe/sysinfo.py)."""
    installed = sysinfo.packages()
    return {
        "names": sysinfo.names(request.get("dns_timeout", 5)),
        "port_range": sysinfo.port_range(),
        "packages": installed,
        "nccl": sysinfo.nccl_version(installed, torch.get("path")),
        "limits": sysinfo.limits(),
        "links": sysinfo.links(ifaces),
        "infiniband": sysinfo.infiniband(),
        "env": sysinfo.environment(),
        "machine": sysinfo.machine(),
        "ptrace": sysinfo.ptrace(request.get("workdir", "~/clusterrun")),
    }


class Listener:
    """The short-lived stand-in for torchrun's c10d store on the master: proves the port is free
    and that workers reach it."""

    def __init__(self, family, port):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        # The same option TCPStore sets: a port in TIME_WAIT is still usable by the job.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bind_any = "::" if family == socket.AF_INET6 else "0.0.0.0"
        if port:
            self.sock.bind((bind_any, port))
        else:
            self._bind_random(bind_any)
        self.port = self.sock.getsockname()[1]
        self.sock.listen(128)
        meshtest.close_whatever_comes(self.sock)

    def _bind_random(self, bind_any):
        # Below the kernel's ephemeral range, so outgoing connections will not take it meanwhile.
        for _ in range(200):
            try:
                self.sock.bind((bind_any, random.randrange(20000, 32000)))
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise OSError(errno.EADDRINUSE, "no free port found")


def connect(addr, port, src, timeout):
    start = time.monotonic()
    try:
        source = (src, 0) if src else None
        sock = socket.create_connection((addr, port), timeout=timeout, source_address=source)
        sock.close()
    except socket.timeout:
        return {"ok": False, "error": "timed out after %g s" % timeout}
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc)}
    return {"ok": True, "seconds": round(time.monotonic() - start, 3)}


def _listen(state, op):
    family = socket.AF_INET6 if ":" in op.get("addr", "") else socket.AF_INET
    try:
        state["listener"] = Listener(family, op.get("port") or 0)
        return {"ok": True, "port": state["listener"].port}
    except OSError as exc:
        return {"ok": False, "port": op.get("port"), "errno": exc.errno,
                "error": exc.strerror or str(exc)}


def _mesh_listen(state, addr):
    try:
        state["mesh"] = meshtest.EphemeralListener(addr)
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc)}
    return {"ok": True, "port": state["mesh"].port}


# The operations the controller may ask for after the facts: name -> handler(state, op) -> reply.
# ``state`` lives as long as the probe (listeners the controller opened, and so on).
OPS = {
    P.ROUTE: lambda _state, op: route(op["addr"]),
    P.LISTEN: _listen,
    P.CONNECT: lambda _state, op: connect(op["addr"], op["port"], op.get("src"),
                                          op.get("timeout", 5)),
    P.MESH_LISTEN: lambda state, op: _mesh_listen(state, op["addr"]),
    P.MESH_CONNECT: lambda _state, op: meshtest.connect_many(op["targets"], op.get("src"),
                                                         op.get("timeout", 5)),
    P.RESOLVE: lambda _state, op: sysinfo.resolve_many(op["names"], op.get("timeout", 5)),
    P.SINK: throughput.sink,
    P.BLAST: throughput.blast,
}



class _Replies:
    """Each reply is written as soon as it and every one asked before it are ready."""

    def __init__(self):
        self.lock = threading.Lock()
        self.unwritten = []  # type: list[dict[str, Any]]

    def add(self, kind):
        reply = {"kind": kind, "done": threading.Event(), "value": None}
        with self.lock:
            self.unwritten.append(reply)
        return reply

    def finish(self, reply, value):
        with self.lock:
            reply["value"] = value
            reply["done"].set()
            while self.unwritten and self.unwritten[0]["done"].is_set():
                head = self.unwritten.pop(0)
                emit({head["kind"]: head["value"]})

    def answer(self, reply, handler, state, op):
        try:
            value = handler(state, op)
        except BaseException:
            # As if it had failed in the main thread: the probe exits with the traceback,
            # which the controller shows, rather than leaving it waiting for this reply.
            import traceback  # only here: importing it costs every host's start-up ~4 ms

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        self.finish(reply, value)


def serve():
    request = json.loads(sys.stdin.buffer.readline() or b"{}")
    emit({P.FACTS: facts(request)})
    state = {}  # type: dict[str, Any]
    replies = _Replies()
    running = []  # type: list[dict[str, Any]]
    for raw in iter(sys.stdin.buffer.readline, b""):
        op = json.loads(raw)
        kind = op.get(protocol.OP)
        if kind == P.EXIT:
            break
        reply = replies.add(kind)
        handler = OPS.get(kind)
        if handler is None:
            replies.finish(reply, {"ok": False, "error": "unknown operation %r" % kind})
        elif kind in P.CONCURRENT:  # replies still go out in request order
            threading.Thread(target=replies.answer, args=(reply, handler, state, op),
                             daemon=True).start()
            running.append(reply)
        else:
            for earlier in running:
                earlier["done"].wait()
            running = []
            replies.answer(reply, handler, state, op)
    for reply in running:
        reply["done"].wait()
    release_ports()


def release_ports():
    """Close every socket the probe opened, for the supervisor its interpreter may run next (its
    torchrun binds master_port). shutdown() wakes the accept() thread, which close() does not."""
    import contextlib  # only here, as traceback above
    import gc

    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.fileno() != -1:
            with contextlib.suppress(OSError):  # one that never listened nor connected
                obj.shutdown(socket.SHUT_RDWR)
            obj.close()


serve()
