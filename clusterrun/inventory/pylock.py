"""A host's `environment:` as read from the inventory: the lock's pins and where its wheels come
from (read and checked by inventory/lockfile.py)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Optional


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them: numpy, typing-extensions."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    line: int
    hashes: tuple[str, ...] = ()  # sha256 hex digests the lock allows for this pin

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class PythonEnv:
    """One host's `environment:`, the lock read and checked."""

    lock: str  # absolute path on this machine
    pins: tuple[Pin, ...]
    system_site_packages: bool = False
    find_links: tuple[str, ...] = ()  # absolute directories on this machine
    index_url: Optional[str] = None
    # A uv project's requires-python: the hosts' Python must be one it allows. Not part of the
    # digest: it changes nothing that is built.
    requires_python: Optional[str] = None

    @property
    def digest(self) -> str:
        """The lock's hash: what is built (pins, hashes, system_site_packages), not where the
        wheels come from. It names the environment's folder on every host."""
        body = json.dumps({"pins": [[p.name, p.version, sorted(p.hashes)] for p in self.pins],
                           "system_site_packages": self.system_site_packages}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def requirements(self) -> str:
        """The lock as every host installs it: one pin a line, hashes kept."""
        return "".join(p.requirement + "".join(f" --hash=sha256:{h}" for h in p.hashes) + "\n"
                       for p in self.pins)


