"""What the preflight probe reads about a host besides its interfaces (stdlib only, 3.6+):
its names, the software ranks will load, the limits they will run under, and its links.

Everything is read from files (/proc, /sys, dist-info folder names) without importing torch or
any other package: importing torch takes seconds and proves nothing here. The probe runs the
same way the job will (after `setup:`, in the container), so these are the job's own values.
"""

import os
import re
import resource
import socket
import sys
import threading
import time

TYPE_CHECKING = False  # mypy takes it as true; hosts skip importing typing (~4 ms)
if TYPE_CHECKING:
    from typing import Any  # noqa: F401 - used in type comments (Python 3.6: no annotations)

INFINIBAND = "/sys/class/infiniband"
_DIST = re.compile(r"^(.+?)-([^-]+?)(?:-py\d.*)?\.(?:dist-info|egg-info)$")


def read_version_file(path, field):
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    match = re.search(r"^%s\s*(?::\s*\S+\s*)?=\s*['\"]([^'\"]+)['\"]" % field, text, re.M)
    return match.group(1) if match else None


def torch_info():
    """torch's version read from its files, without importing it."""
    for entry in sys.path:
        version_py = os.path.join(entry or ".", "torch", "version.py")
        if os.path.isfile(version_py):
            return {"version": read_version_file(version_py, "__version__"),
                    "cuda": read_version_file(version_py, "cuda"), "path": version_py}
    if not _torch_listed():
        return None
    try:
        from importlib import metadata

        return {"version": metadata.version("torch"), "cuda": None, "path": None}
    except Exception:
        return None


def _torch_listed():
    """Whether importlib.metadata may find torch: its *.dist-info or *.egg-info in a folder on
    sys.path, or a zip file there (which only importlib.metadata looks into). Importing it costs
    every host without torch ~15 ms (an `environment:` of numpy alone, a bare host)."""
    for entry in sys.path:
        if os.path.isfile(entry):
            return True
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            low = name.lower()
            if low.startswith(("torch-", "torch.")) and low.endswith((".dist-info", ".egg-info")):
                return True
    return False


def lookup(name, timeout, family=0):
    """Every address ``name`` resolves to (of ``family``, 0: any), bounded in time: a resolver
    that hangs must not hang the probe."""
    box = {}  # type: dict[str, Any]

    def ask():
        box["out"] = _addresses(name, family)

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout)
    if "out" not in box:
        return {"addresses": [], "error": "no answer within %g s" % timeout, "seconds": None}
    return box["out"]


def _addresses(name, family=0):
    start = time.monotonic()
    out = {"addresses": [], "error": None, "seconds": None}  # type: dict[str, Any]
    try:
        infos = socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
        out["addresses"] = sorted({info[4][0] for info in infos})
    except OSError as exc:
        out["error"] = str(exc)
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


# Enough that a slow resolver (a dead first nameserver costs each lookup its timeout) still
# answers a 128-host mesh's names within the deadline, as a thread per name did; bounded so a
# big mesh does not start hundreds of threads per host. From /etc/hosts a name takes ~40 us of
# CPU: 129 names took 5 ms on one thread, 8 ms on 32 (and 70 ms with two threads per name).
RESOLVERS = 32


def resolve_many(names, timeout, workers=RESOLVERS):
    """name -> lookup result, at most ``workers`` lookups at once, all under one deadline
    ``timeout`` s away: a name not answered by then (its lookup hangs, or never started behind
    hanging ones) says so, and the threads still stuck are abandoned (daemons)."""
    todo = sorted(set(names), reverse=True)
    results = {}  # type: dict[str, Any]
    lock = threading.Lock()
    deadline = time.monotonic() + timeout

    def work():
        while True:
            with lock:
                if not todo or time.monotonic() >= deadline:
                    return
                name = todo.pop()
            out = _addresses(name)
            with lock:
                if time.monotonic() <= deadline:
                    results[name] = out

    threads = [threading.Thread(target=work, daemon=True)
               for _ in range(max(1, min(workers, len(todo))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        done = dict(results)
        todo[:] = []  # workers still in a lookup take no further name
    for name in names:
        done.setdefault(name, {"addresses": [], "error": "no answer within %g s" % timeout,
                               "seconds": None})
    return done


def names(timeout):
    """The host's own name and fully qualified name, and what each resolves to here."""
    hostname = socket.gethostname()
    try:
        fqdn = socket.getfqdn()
    except OSError:
        fqdn = hostname
    return {"hostname": hostname, "fqdn": fqdn,
            "resolved": resolve_many([hostname, fqdn], timeout)}


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def port_range():
    text = _read("/proc/sys/net/ipv4/ip_local_port_range")
    try:
        low, high = (int(x) for x in text.split())
    except (AttributeError, ValueError):
        return None
    return [low, high]


def packages():
    """Installed distributions as {normalized name: version}, from the folder names on sys.path
    (the first one on the path wins, as it does for imports)."""
    found = {}
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in listing:
            match = _DIST.match(item)
            if not match:
                continue
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            found.setdefault(name, match.group(2))
    return found


def nccl_version(installed, torch_path):
    """The NCCL torch will load, when that can be told without importing torch: the
    nvidia-nccl-cu* wheel torch's CUDA builds depend on, or a versioned libnccl in torch/lib.
    None for CPU builds and builds that link NCCL statically."""
    for name in sorted(installed):
        if name.startswith("nvidia-nccl-cu"):
            return installed[name]
    if torch_path:
        lib = os.path.join(os.path.dirname(torch_path), "lib")
        try:
            listing = os.listdir(lib)
        except OSError:
            listing = []
        for item in sorted(listing):
            match = re.match(r"^libnccl\.so\.(\d+\.\d+\.\d+)$", item)
            if match:
                return match.group(1)
    return None


def _limit(which):
    soft, hard = resource.getrlimit(which)
    return [None if soft == resource.RLIM_INFINITY else soft,
            None if hard == resource.RLIM_INFINITY else hard]


def limits():
    """The limits the job's processes inherit (None = unlimited), and /dev/shm's size."""
    out = {"nofile": _limit(resource.RLIMIT_NOFILE), "memlock": _limit(resource.RLIMIT_MEMLOCK),
           "stack": _limit(resource.RLIMIT_STACK), "shm": None}
    try:
        stat = os.statvfs("/dev/shm")  # noqa: S108 - its size is read, nothing is written
        out["shm"] = {"size": stat.f_blocks * stat.f_frsize,
                      "free": stat.f_bavail * stat.f_frsize}
    except OSError:
        pass
    return out


def _number(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def links(names_):
    """MTU and speed (Mbit/s; None where the driver does not say, as for virtual links) of each
    interface."""
    out = {}
    for name in names_:
        base = os.path.join("/sys/class/net", name)
        speed = _number(_read(os.path.join(base, "speed")))
        out[name] = {"mtu": _number(_read(os.path.join(base, "mtu"))),
                     "speed": speed if speed is not None and speed > 0 else None}
    return out


def infiniband(root=INFINIBAND):
    """RDMA devices and their ports: state, link layer and rate, as the kernel shows them.
    None when the host has no RDMA stack at all."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return None
    out = {}
    for device in devices:
        ports_dir = os.path.join(root, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: _number(p) or 0)
        except OSError:
            ports = []
        out[device] = {}
        for port in ports:
            base = os.path.join(ports_dir, port)
            state = _read(os.path.join(base, "state")) or ""
            out[device][port] = {
                "state": state.split(":", 1)[-1].strip() or None,  # "4: ACTIVE" -> ACTIVE
                "link_layer": _read(os.path.join(base, "link_layer")),
                "rate": _read(os.path.join(base, "rate")),
            }
    return out


def machine():
    """Which running system this is, to tell two inventory entries that reach the same one:
    the kernel's boot id and the network namespace. /etc/machine-id alone is not enough: it is
    copied with cloned VM images and shared by containers and namespaces on one machine."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = None
    return {"machine_id": _read("/etc/machine-id"),
            "boot_id": _read("/proc/sys/kernel/random/boot_id"), "netns": netns}


def ptrace(workdir=None):
    """Whether `clusterrun stacks` can read a rank's stack here (preflight/stacks.py judges):
    Yama's ptrace_scope (None: no Yama), root or CAP_SYS_PTRACE, py-spy next to this Python or
    on PATH, and the machine type; and the py-spy copies shipped to ``workdir`` before
    (remote/tools/toolcache.py: launch ships one only where its copy is missing)."""
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    caps = [x for x in (_read("/proc/self/status") or "").splitlines() if x.startswith("CapEff:")]
    try:
        cap = bool(int(caps[0].split()[1], 16) >> 19 & 1) if caps else False
    except ValueError:
        cap = False
    spy = [os.path.join(d, "py-spy") for d in
           [os.path.dirname(sys.executable), *os.environ.get("PATH", "").split(":")] if d]
    spy = [p for p in spy if os.path.isfile(p) and os.access(p, os.X_OK)]
    # machine: whether the controller's py-spy can be shipped here (the same `uname -m`).
    return {"scope": int(scope) if scope and scope.strip().isdigit() else None,
            "root": os.geteuid() == 0, "cap_sys_ptrace": cap,
            "pyspy": spy[0] if spy else None, "machine": os.uname()[4],
            "shipped": shipped_tools(workdir) if workdir else []}


def shipped_tools(workdir):
    """The names of the py-spy copies in ``<workdir>/runs/.tools`` (``py-spy-<sha>``)."""
    tools = os.path.join(os.path.abspath(os.path.expanduser(workdir)), "runs", ".tools")
    try:
        return sorted(n for n in os.listdir(tools) if n.startswith("py-spy-") and "." not in n)
    except OSError:
        return []


def environment():
    """The NCCL/Gloo variables the host's own environment sets (after `setup:`)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_"))}
