"""The preflight report: per host, every check with its verdict and detail, and the facts read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from clusterrun.inventory import HostSpec
from clusterrun.transport import Transport

CONNECTION_KINDS = frozenset({"dns", "refused", "timeout", "unreachable", "auth", "hostkey",
                              "deadline"})


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class HostReport:
    spec: HostSpec
    node_rank: int
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    interface: Optional[str] = None
    address: Optional[str] = None
    failure_kind: Optional[str] = None  # set when the host could not be probed at all

    @property
    def ok(self) -> bool:
        return self.failure_kind is None and all(c.ok for c in self.checks)

    @property
    def gpus(self) -> int:
        if self.spec.gpus is not None:
            return len(self.spec.gpus)
        return int(self.facts.get("gpus") or 0)

    @property
    def python(self) -> Optional[str]:
        return self.facts.get("python")

    @property
    def torch(self) -> Optional[str]:
        return (self.facts.get("torch") or {}).get("version")

    @property
    def workdir(self) -> Optional[str]:
        return (self.facts.get("workdir") or {}).get("path")

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    def as_json(self) -> dict[str, Any]:
        return {"host": self.spec.host, "name": self.spec.name, "node_rank": self.node_rank,
                "ok": self.ok, "interface": self.interface, "address": self.address,
                "python": self.python, "torch": self.torch, "gpus": self.gpus,
                "checks": [c.as_json() for c in self.checks]}


@dataclass
class CheckReport:
    hosts: list[HostReport]
    master_addr: Optional[str]
    master_port: Optional[int]
    transports: dict[str, Transport] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def unreachable(self) -> list[HostReport]:
        return [h for h in self.hosts if h.failure_kind in CONNECTION_KINDS]

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "master_addr": self.master_addr, "master_port": self.master_port,
                "hosts": [h.as_json() for h in self.hosts]}

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()
