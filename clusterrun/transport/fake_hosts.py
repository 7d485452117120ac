"""The scripted hosts of clusterrun.transport.fake: their interfaces, facts, routes and
scripted replies (see that module for how they are played)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from clusterrun.errors import Outcome


@dataclass(frozen=True)
class Interface:
    name: str
    addrs: tuple[str, ...]  # CIDRs, e.g. "10.0.0.1/24"
    up: bool = True

    def __init__(self, name: str, *addrs: str, up: bool = True) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "addrs", tuple(addrs))
        object.__setattr__(self, "up", up)

    def as_fact(self) -> dict[str, Any]:
        return {"name": self.name, "up": self.up, "addrs": list(self.addrs)}

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
    data-path connect from this host fails so."""

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

    def all_facts(self, request: dict[str, Any], server_address: str) -> dict[str, Any]:
        name = self.hostname or self.address
        first = next((i.ipv4() for i in self.interfaces if i.ipv4()), None)
        workdir = str(request.get("workdir", "~/clusterrun")).replace("~", f"/home/{self.user}", 1)
        facts = {
            "hostname": name, "user": self.user, "python": self.python,
            "python_path": "/usr/bin/python3",
            "torch": {"version": self.torch, "cuda": None, "path": None} if self.torch else None,
            "gpus": self.gpus, "interfaces": [i.as_fact() for i in self.interfaces],
            "ssh_server_address": server_address if self.owns(server_address) else None,
            "dns": {"hostname": name, "seconds": 0.001, "addresses": [first] if first else [],
                    "error": None},
            "workdir": {"path": workdir, "ok": True, "error": None},
            "rsync": True,
        }
        facts.update(self.facts)
        return facts

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
