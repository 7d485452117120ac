"""A host's `environment:` status as types: what pyenv.py's status (and preflight's probe, its
``pyenv`` fact: remote/probe/envstate.py) reports of the host and of the lock's environment
there, read once where it is used (``HostStatus.from_json``), as runs/records.py reads a run's
files. The reply itself stays as it came in ``HostEnv.status``; nothing else reads its keys.

A key the host did not send reads as unknown (None) or empty, as the sync has always taken a
missing one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from clusterrun.envs.verify import Built, drift
from clusterrun.jsonfields import obj, text

Json = dict[str, object]  # a request to pyenv.py, or its reply as it came


@dataclass(frozen=True)
class HostStatus:
    """One host's status: its platform (Python, CPU, glibc), where its workdir is, the lock's
    environment there, and what the request asked beside (the address of its `interface:`,
    the packages of its own `python:`)."""

    python: str = ""  # the host's interpreter, major.minor.micro
    machine: Optional[str] = None
    system: Optional[str] = None
    libc: Optional[str] = None  # "glibc 2.36"
    workdir: Optional[str] = None  # absolute, as the host expands it
    env: Optional[Built] = None
    python_path: Optional[str] = None  # the interpreter that answered
    ssh_server_address: Optional[str] = None
    interface_address: Optional[str] = None
    # With `system_site_packages`: the host's `python:`'s own distributions; None: not said.
    host_packages: Optional[Mapping[str, str]] = None

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> HostStatus:
        packages = raw.get("host_packages")
        return cls(str(raw.get("python", "")), _said(raw.get("machine")),
                   _said(raw.get("system")), text(raw.get("libc")), text(raw.get("workdir")),
                   Built.from_json(raw.get("env")), text(raw.get("python_path")),
                   text(raw.get("ssh_server_address")), text(raw.get("interface_address")),
                   {str(k): str(v) for k, v in obj(packages).items()}
                   if isinstance(packages, dict) else None)

    def drift(self, expected: Sequence[str]) -> list[str]:
        """The lock's environment here against the lock's distributions (``expected``), for
        this host's Python; ``["not built"]`` where there is none."""
        return drift(self.env, expected, self.python)


def _said(value: object) -> Optional[str]:
    """A value the host said, in words (``uname`` fields are strings; anything else as
    written)."""
    return None if value is None else str(value)
