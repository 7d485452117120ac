"""The scripted hosts of clusterrun.transport.fake: their interfaces, facts, routes and
scripted replies (see that module for how they are played)."""

from __future__ import annotations

import ipaddress
import platform
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from clusterrun.errors import Outcome

GiB = 1 << 30


@dataclass(frozen=True)
class Interface:
    """``mtu``: None for the kernel's default (65536 on lo, else 1500); ``speed`` in Mbit/s,
    None as virtio NICs and bridges report it (no speed in /sys)."""

    name: str
    addrs: tuple[str, ...]  # CIDRs, e.g. "10.0.0.1/24"
    up: bool = True
    mtu: Optional[int] = None
    speed: Optional[int] = None

    def __init__(self, name: str, *addrs: str, up: bool = True, mtu: Optional[int] = None,
                 speed: Optional[int] = None) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "addrs", tuple(addrs))
        object.__setattr__(self, "up", up)
        object.__setattr__(self, "mtu", mtu)
        object.__setattr__(self, "speed", speed)

    def as_fact(self) -> dict[str, Any]:
        return {"name": self.name, "up": self.up, "addrs": list(self.addrs)}

    def link(self) -> dict[str, Any]:
        """As sysinfo.links reads /sys/class/net/<name>."""
        default = 65536 if self.name == "lo" else 1500
        return {"mtu": self.mtu or default, "speed": self.speed}

    def ipv4(self) -> Optional[str]:
        return next((a.split("/")[0] for a in self.addrs if ":" not in a), None)


@dataclass
class Reply:
    """What a scripted program or shell command does: its output, then its exit status
    (after ``seconds``; ``None``: it never ends on its own)."""

    stdout: bytes = b""
    stderr: bytes = b""
    code: int = 0
    seconds: Optional[float] = 0.0


Handler = Callable[[dict[str, Any]], Reply]


@dataclass
class FakeHost:
    """One scripted host. ``unreachable``: connecting fails with that outcome. ``probe``:
    "answers", "silent" (started, never answers) or "exits" (``probe_exit``, ``probe_stderr``).
    ``firewalled``: ports whose connections from other hosts time out; ``admits``: the only
    ports others can connect to (the rest time out). ``connect_error``: every
    data-path connect from this host fails so.

    Its facts are those the real probe (clusterrun/remote/probe/probe.py) sends, key for key
    (tests/test_fake_probe.py holds them to that), with the values of a plain Linux training
    host: ``gpus`` idle NVIDIA GPUs (none: no nvidia-smi, as on a CPU host), no RDMA, a CPU
    torch. ``facts`` replaces whole top-level keys of that answer."""

    address: str
    interfaces: list[Interface]
    hostname: str = ""
    user: str = "user"
    unreachable: Optional[Outcome] = None
    connect_delay: float = 0.0
    probe: str = "answers"
    probe_exit: int = 1
    probe_stderr: bytes = b""
    python: str = "3.11.7"
    torch: Optional[str] = "2.4.0"
    gpus: int = 0
    cpus: int = 8
    disk_free: Optional[int] = 200 * GiB  # in the workdir; None: statvfs failed
    facts: dict[str, Any] = field(default_factory=dict)
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_route: Optional[str] = None  # interface name for addresses on no subnet of ours
    ports_in_use: set[int] = field(default_factory=set)
    firewalled: set[int] = field(default_factory=set)
    admits: Optional[set[int]] = None  # a firewall letting only these ports in from others
    connect_error: Optional[str] = None
    silent_ops: set[str] = field(default_factory=set)  # probe operations never answered
    programs: dict[str, Handler] = field(default_factory=dict)
    shell: Optional[Callable[[str], Reply]] = None

    def owns(self, addr: str) -> bool:
        return any(a.split("/")[0] == addr for i in self.interfaces for a in i.addrs)

    def own_address(self) -> Optional[str]:
        """What the host's name resolves to there: its address, as /etc/hosts or DNS say on
        a well-kept cluster (never loopback when it has another)."""
        if self.owns(self.address):
            return self.address
        ipv4 = [a for a in (i.ipv4() for i in self.interfaces) if a]
        return next((a for a in ipv4 if not a.startswith("127.")), ipv4[0] if ipv4 else None)

    def all_facts(self, request: dict[str, Any], server_address: str) -> dict[str, Any]:
        name = self.hostname or self.address
        own = self.own_address()
        minor = ".".join(self.python.split(".")[:2])
        workdir = str(request.get("workdir", "~/clusterrun")).replace("~", f"/home/{self.user}", 1)
        lookup = {"addresses": [own] if own else [], "error": None, "seconds": 0.001}
        facts: dict[str, Any] = {
            "hostname": name, "user": self.user, "python": self.python,
            "python_path": "/usr/bin/python3",
            "torch": {"version": self.torch, "cuda": None, "path": f"/usr/local/lib/python"
                      f"{minor}/dist-packages/torch/version.py"} if self.torch else None,
            "gpus": self.gpus, "cpus": self.cpus, "nvidia": self.nvidia(),
            "interfaces": [i.as_fact() for i in self.interfaces],
            "ssh_server_address": server_address if self.owns(server_address) else None,
            "dns": dict(lookup, hostname=name),
            "workdir": {"path": workdir, "ok": True, "error": None, "free": self.disk_free,
                        "free_at": workdir},
            "rsync": True,
            # `environment:` asked for: the platform, and no environment built (none is here).
            "pyenv": {"python": self.python, "machine": platform.machine(), "system": "Linux",
                      "libc": "glibc 2.36", "workdir": workdir, "env": None}
            if request.get("lock") else None,
            "names": {"hostname": name, "fqdn": name, "resolved": {name: lookup}},
            "port_range": [32768, 60999],
            "packages": self.packages(),
            "nccl": None,  # a CPU build of torch: no NCCL
            "limits": {"nofile": [65536, 1048576], "memlock": [8 << 20, 8 << 20],
                       "stack": [8 << 20, None], "shm": {"size": 32 * GiB, "free": 32 * GiB}},
            "links": {i.name: i.link() for i in self.interfaces},
            "infiniband": None,  # no /sys/class/infiniband
            "env": {},
            "machine": self.machine(),
            # The controller's CPU: its py-spy is the one shipped there.
            "ptrace": {"scope": 1, "root": self.user == "root", "cap_sys_ptrace": False,
                       "pyspy": None, "machine": platform.machine(), "shipped": []},
        }
        facts.update(self.facts)
        return facts

    def nvidia(self) -> dict[str, Any]:
        """nvidia-smi's answer (clusterrun/remote/probe/nvidia.py): ``gpus`` idle H100s, or none."""
        if not self.gpus:
            return {"smi": None, "count": 0, "driver": None, "gpus": [], "apps": [],
                    "errors": {}}
        driver = "550.54.15"
        gpus = [{"index": i, "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.address}/{i}')}",
                 "name": "NVIDIA H100 80GB HBM3", "driver": driver, "memory_used": 1,
                 "memory_total": 81559, "compute_mode": "Default", "ecc_uncorrected": 0,
                 "retired_pages_pending": False, "remap_pending": False,
                 "remap_failure": False} for i in range(self.gpus)]
        return {"smi": "/usr/bin/nvidia-smi", "count": self.gpus, "driver": driver,
                "gpus": gpus, "apps": [], "errors": {}}

    def packages(self) -> dict[str, str]:
        """A training environment's distributions, as sysinfo.packages names them."""
        found = {"numpy": "1.26.4", "filelock": "3.15.4", "fsspec": "2024.6.1",
                 "jinja2": "3.1.4", "networkx": "3.3", "sympy": "1.13.1",
                 "typing-extensions": "4.12.2", "pip": "24.0", "setuptools": "69.5.1"}
        if self.torch:
            found["torch"] = self.torch
        return found

    def machine(self) -> dict[str, Any]:
        """One system per FakeHost: two addresses added as the same host object share it."""
        boot = uuid.uuid5(uuid.NAMESPACE_DNS, f"boot/{self.address}")
        return {"machine_id": uuid.uuid5(uuid.NAMESPACE_DNS, self.address).hex,
                "boot_id": str(boot), "netns": 4026531840}

    def route(self, addr: str) -> dict[str, Any]:
        """As probe.py answers: the device holding ``addr``, else the one on its subnet."""
        if addr in self.routes:
            return self.routes[addr]
        for iface in self.interfaces:
            if any(a.split("/")[0] == addr for a in iface.addrs):
                return {"dev": iface.name, "src": addr, "local": True}
        target = ipaddress.ip_address(addr)
        for iface in self.interfaces:
            for cidr in iface.addrs:
                net = ipaddress.ip_interface(cidr).network
                if iface.up and target.version == net.version and target in net:
                    return {"dev": iface.name, "src": cidr.split("/")[0], "local": False}
        gateway = next((i for i in self.interfaces if i.name == self.default_route), None)
        if gateway is not None and gateway.up and gateway.ipv4():
            return {"dev": gateway.name, "src": gateway.ipv4(), "local": False}
        return {"dev": None, "src": None, "error": f"no route to {addr} (Network is unreachable)"}
