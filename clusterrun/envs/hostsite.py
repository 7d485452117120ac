"""A host's own packages beside the lock's (`system_site_packages: true`): which of the packages
an environment sees come from the lock and which from the host's `python:` (a venv, a conda
environment, a base interpreter), and a lock that pins one of the host's at another version,
refused: the environment would load the lock's copy where the host's own packages were built
against theirs, and neither the user nor `check` could tell which one a rank imported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional, Protocol

from packaging.version import InvalidVersion, Version

from clusterrun.envs.hoststatus import HostStatus
from clusterrun.inventory import HostSpec
from clusterrun.inventory.pylock import PythonEnv


class Host(Protocol):
    """A host's environment as sync.py's HostEnv holds it (imported from there, not here)."""

    spec: HostSpec

    @property
    def found(self) -> HostStatus: ...

    @property
    def env(self) -> PythonEnv: ...

    def expected(self) -> list[str]: ...


def asked(host: Host) -> dict[str, object]:
    """What pyenv.py's status is asked beside its own: the packages of the host's `python:`
    (the status may run in the environment's interpreter: the host's is named)."""
    if not host.env.system_site_packages:
        return {}
    return {"system_site_packages": True, "host_python": host.spec.python}


@dataclass(frozen=True)
class Conflict:
    name: str
    locked: str  # the lock's version
    host: str  # the host's


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _pins(lock: Sequence[str]) -> dict[str, str]:
    return dict(d.split("==", 1) for d in lock)


def conflicts(lock: Sequence[str], host: Mapping[str, str]) -> list[Conflict]:
    """The lock's distributions (``name==version``) that the host has at another version."""
    return [Conflict(name, version, host[name]) for name, version in sorted(_pins(lock).items())
            if name in host and not _same(version, host[name])]


def from_host(lock: Sequence[str], host: Mapping[str, str]) -> dict[str, str]:
    """The host's packages the environment takes from the host: those the lock does not name
    (the lock's own come first)."""
    pinned = _pins(lock)
    return {name: version for name, version in sorted(host.items()) if name not in pinned}


def refusal(host: Host) -> Optional[str]:
    """One paragraph refusing the host where the lock pins one of its own packages at another
    version; None where nothing clashes (or the host's packages are unknown)."""
    found = conflicts(host.expected(), host.found.host_packages or {})
    if not found:
        return None
    said = "; ".join(f"{c.name}=={c.locked} in the lock, {c.name} {c.host} on the host"
                     for c in found)
    first = found[0]
    return (f"{host.spec.name}: the lock ({host.env.lock}) pins packages that the host's own "
            f"`python:` ({host.spec.python}) has at other versions, and the environment would "
            f"see both (`system_site_packages: true`): {said}. Pin the host's version in the "
            f"lock ({first.name}=={first.host}), or leave {first.name} out of the lock to use "
            "the host's, or set `system_site_packages: false` to keep the host's packages out "
            "of the environment.")


def origins(host: Host) -> dict[str, Optional[list[str]]]:
    """`env --json`'s ``lock_packages`` and ``host_packages`` (``name==version``): what the
    environment takes from the host, none without `system_site_packages`, None where that is
    unknown (the host's status did not say)."""
    found = host.found.host_packages
    taken = [] if not host.env.system_site_packages else None if found is None else [
        f"{n}=={v}" for n, v in from_host(host.expected(), found).items()]
    return {"lock_packages": host.expected(), "host_packages": taken}


def summary(host: Host) -> str:
    """Which packages come from where, in a few words: torch named where the host has it."""
    found = host.found.host_packages
    if not host.env.system_site_packages or found is None:
        return ""
    lock = host.expected()
    mine = from_host(lock, found)
    said = f"{len(lock)} package(s) from the lock, {len(mine)} from the host's {host.spec.python}"
    return said + (f" (torch {mine['torch']} among them)" if "torch" in mine else "")
