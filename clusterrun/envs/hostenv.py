"""One host's `environment:` as a sync finds and leaves it (HostEnv), all of them (EnvReport),
and what a host that could not get its environment is told (describe_problem)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Optional

from clusterrun.envs import hostsite, wheels
from clusterrun.envs.hoststatus import HostStatus
from clusterrun.envs.platforms import Platform
from clusterrun.envs.wheels import Wheel
from clusterrun.errors import PreflightError, SyncError, UnreachableError
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.inventory.pylock import PythonEnv


class EnvState(str, enum.Enum):
    """A host's environment as the sync finds or leaves it (`env --json`'s ``state``)."""

    READY = "ready"  # the lock's already: nothing moved
    BUILT = "built"  # made the lock's by this sync
    DRIFT = "drift"  # differs from the lock (after a build here: something else is at work)
    MISSING = "missing"  # not built there yet
    FAILED = "failed"  # it could not get it: ``problem`` says why

    def __str__(self) -> str:  # its word, in messages and progress bars on any Python
        return self.value


READY, BUILT, DRIFT, MISSING, FAILED = (EnvState.READY, EnvState.BUILT, EnvState.DRIFT,
                                        EnvState.MISSING, EnvState.FAILED)


@dataclass
class HostEnv:
    """One host's environment: where it is, what it holds, what this sync did."""

    spec: HostSpec  # as the inventory says (its `python:` is the base interpreter)
    state: EnvState = FAILED
    # pyenv.py's status as the host sent it (or preflight's probe, envs/warm.py), read as
    # ``found``; a later reply (the relay's address, the build's environment) is merged in.
    status: dict[str, object] = field(default_factory=dict)
    platform: Optional[Platform] = None
    wheels: list[Wheel] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # sha256s its store lacks
    drift: list[str] = field(default_factory=list)
    problem: Optional[str] = None
    unreachable: bool = False  # the host could not be reached, authenticated or trusted
    disk_full: Optional[str] = None
    received: int = 0  # bytes from the controller
    fetched: int = 0  # bytes from the master
    seconds: Optional[float] = None  # the build's
    built_here: bool = False  # this sync built it: drift now is the build's, not a hand's
    # Its status came from the environment's own interpreter, now parked on its connection:
    # the command's next program there (preflight's probe) runs in it, with no new channel.
    in_env: bool = False

    @property
    def env(self) -> PythonEnv:
        assert self.spec.environment is not None
        return self.spec.environment

    @property
    def found(self) -> HostStatus:
        """``status`` read: read again at each use, as a test or a later reply may change it."""
        return HostStatus.from_json(self.status)

    @property
    def path(self) -> str:
        workdir = self.found.workdir or self.spec.workdir
        return f"{workdir}/envs/{self.env.digest}"

    @property
    def python(self) -> str:
        return f"{self.path}/bin/python"

    @property
    def ok(self) -> bool:
        return self.state in (READY, BUILT)

    def expected(self) -> list[str]:
        return sorted(w.dist for w in self.wheels if w.name != wheels.UV.name)

    def as_json(self) -> dict[str, object]:
        """This host's object in `env --json` (docs/commands.md names its keys)."""
        built = self.found.env
        return {"name": self.spec.name, "state": self.state.value, "lock": self.env.digest,
                "path": self.path, "platform": self.platform.label if self.platform else None,
                "hash": built.hash if built is not None else None, "drift": self.drift,
                "problem": self.problem, "received_bytes": self.received,
                "fetched_bytes": self.fetched, "build_seconds": self.seconds,
                **hostsite.origins(self)}


@dataclass
class EnvReport:
    hosts: list[HostEnv]
    sent: int = 0  # bytes of wheels over the controller's own link

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def lock(self) -> Optional[str]:
        """The lock's hash (summary.json); several, comma-separated, when hosts differ."""
        return ",".join(sorted({h.env.digest for h in self.hosts})) or None

    def by_name(self) -> dict[str, HostEnv]:
        return {h.spec.name: h for h in self.hosts}

    def inventory(self, inv: Inventory) -> Inventory:
        """``inv`` with each host's `python:` its environment's interpreter: what preflight
        checks and the ranks run."""
        found = self.by_name()
        hosts = tuple(dataclasses.replace(h, python=found[h.name].python)
                      if h.name in found else h for h in inv.hosts)
        return dataclasses.replace(inv, hosts=hosts)

    def raise_if_failed(self) -> None:
        bad = [h for h in self.hosts if not h.ok]
        if not bad:
            return
        # A platform's problem (no wheel, a wrong hash) names all its hosts: said once.
        lines = list(dict.fromkeys(line for h in bad for line in describe_problem(h)))
        if any(h.unreachable for h in bad):
            raise UnreachableError("\n".join(lines))
        if any(h.disk_full for h in bad):
            raise SyncError("\n".join(lines))
        raise PreflightError("\n".join(lines))


def describe_problem(host: HostEnv) -> list[str]:
    name = host.spec.name
    if host.disk_full:
        return [f"{name}: no space left in {host.disk_full}; free some there (clusterrun env "
                "INVENTORY --prune removes old environments) and run again."]
    if host.problem:
        return [host.problem]
    if host.built_here:  # rebuilding again would give the same: something else is at work
        return [f"{name}: its environment {host.path} still differs from the lock "
                f"({host.env.lock}) after it was built there: " + "; ".join(host.drift)
                + ". A wheel installed something other than its file name says (another "
                "version, or a second distribution), or something on that host writes into "
                "the environment: replace that wheel, or stop what writes there, then run "
                "`clusterrun env INVENTORY` again."]
    return [f"{name}: its environment {host.path} differs from the lock "
            f"({host.env.lock}): " + "; ".join(host.drift)
            + ". Run `clusterrun env INVENTORY` to rebuild it."]
