"""The preflight report: per host, every check with its verdict and detail, and the facts read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.inventory.hosts import CPU, GPU
from clusterrun.preflight.facts import HostFacts


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    # The same problem in words that do not name the host, so that the report says it once for
    # every host that has it: `gpu[03,07]: mtu: MTU 9000 on eth0, others 1500`.
    group: Optional[str] = None

    @property
    def warning(self) -> bool:
        """Passed, with something the user should know (the job may be slow or fragile)."""
        return self.ok and self.detail.startswith("warning:")

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "warning": self.warning,
                "detail": self.detail}


def warn(name: str, detail: str, group: Optional[str] = None) -> Check:
    return Check(name, True, f"warning: {detail}", group and f"warning: {group}")


@dataclass
class HostReport:
    spec: HostSpec
    node_rank: int
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    interface: Optional[str] = None
    address: Optional[str] = None
    outcome: Optional[Outcome] = None  # set when the host could not be probed at all

    @property
    def ok(self) -> bool:
        return self.outcome is None and all(c.ok for c in self.checks)

    @property
    def reached(self) -> bool:
        """False when the host could not be connected to, authenticated or trusted."""
        return self.outcome is None or self.outcome.reached

    # ``facts`` read into typed values, and the reply they were read from.
    _known: Optional[tuple[Mapping[str, object], HostFacts]] = field(
        default=None, init=False, repr=False, compare=False)

    @property
    def known(self) -> HostFacts:
        """The facts as the checks read them (preflight/facts.py), read once per reply: a new
        ``facts`` (the next probe's, a test's) is read again. Keys added to the reply later
        (``container``, ``bandwidth``) are not among those read."""
        if self._known is None or self._known[0] is not self.facts:
            self._known = (self.facts, HostFacts.from_json(self.facts))
        return self._known[1]

    @property
    def gpus(self) -> int:
        if self.spec.gpus is not None:
            return len(self.spec.gpus)
        return self.known.gpus

    @property
    def python(self) -> Optional[str]:
        return self.known.python

    @property
    def nproc(self) -> Optional[int]:
        """The host's process count: `nproc_per_node` as a number, or resolved here as torchrun
        resolves its words (`gpu`: the GPUs, `cpu`: the CPUs; `auto`: the GPUs, else 1, where
        torchrun's falls back to the CPUs). None: `gpu` with no GPU, or `cpu` with the CPUs
        not reported."""
        value = self.spec.nproc_per_node
        if isinstance(value, int):
            return value
        if value == GPU:
            return self.gpus or None
        if value == CPU:
            return self.known.cpus
        return self.gpus or 1

    @property
    def torch(self) -> Optional[str]:
        torch = self.known.torch
        return torch.version if torch is not None else None

    @property
    def workdir(self) -> Optional[str]:
        return self.known.workdir.path

    def add(self, name: str, ok: bool, detail: str, group: Optional[str] = None) -> None:
        self.checks.append(Check(name, ok, detail, group))

    def replace(self, check: Check) -> None:
        """Put ``check`` in place of the one with its name (or add it)."""
        for i, old in enumerate(self.checks):
            if old.name == check.name:
                self.checks[i] = check
                return
        self.checks.append(check)

    def probe_failed(self, outcome: Outcome, detail: str) -> None:
        """The probe died or went silent mid-conversation (a phase's deadline passed)."""
        self.fail(Outcome.PROBE_TIMEOUT if outcome is Outcome.COMMAND_TIMEOUT else outcome,
                  "probe", detail)

    def fail(self, outcome: Outcome, check: str, detail: str) -> None:
        """The host could not be probed (not reached, or its probe failed): nothing else runs."""
        if self.outcome is None:
            self.outcome = outcome
        self.add(check, False, detail)

    def as_json(self) -> dict[str, object]:
        return {"host": self.spec.host, "name": self.spec.name, "node_rank": self.node_rank,
                "ok": self.ok, "interface": self.interface, "address": self.address,
                "python": self.python, "torch": self.torch, "gpus": self.gpus,
                "checks": [c.as_json() for c in self.checks]}


class Blocked(NamedTuple):
    """``source`` could not connect to an ephemeral port of ``target``: a triple, as the rule
    shared with the hosts (remote/shared/linkrule.py) reads a failed pair."""

    source: str
    target: str
    error: str


@dataclass
class Pairs:
    """Every host's TCP connection to every other host's ephemeral port: which pairs failed."""

    hosts: list[str]
    blocked: list[Blocked]
    port_ranges: dict[str, Optional[list[int]]]

    def as_json(self) -> dict[str, object]:
        return {"hosts": self.hosts, "tested": len(self.hosts) * (len(self.hosts) - 1),
                "blocked": [{"from": b.source, "to": b.target, "error": b.error}
                            for b in self.blocked],
                "port_ranges": self.port_ranges}


@dataclass
class CheckReport:
    hosts: list[HostReport]
    master_addr: Optional[str]
    master_port: Optional[int]
    # A second port proved open from every worker to the master: detached runs' supervisors
    # keep their lifeline to the master's supervisor on it.
    lifeline_port: Optional[int] = None
    # The all-pairs test (preflight/mesh.py): None when fewer than two hosts got that far.
    pairs: Optional[Pairs] = None
    # Preflight ended after the facts, as the caller asked (checks.run's ``after_facts``): no
    # cluster-wide check ran, and no host is to be replaced for what the facts showed.
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def unreachable(self) -> list[HostReport]:
        return [h for h in self.hosts if not h.reached]

    def as_json(self) -> dict[str, object]:
        return {"ok": self.ok, "master_addr": self.master_addr, "master_port": self.master_port,
                "hosts": [h.as_json() for h in self.hosts],
                "pairs": self.pairs.as_json() if self.pairs else None}
