"""A host's `environment:` as read from the inventory: the lock's pins and where its wheels come
from (read and checked by inventory/lockfile.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them: numpy, typing-extensions."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockedWheel:
    """A wheel the lock itself says where to find: uv.lock's `path`/`url` wheels, a
    requirements line's `name @ URL`. The controller takes it from there (envs/locked.py)."""

    filename: str
    location: str  # an absolute path on this machine, or an http(s):// URL
    sha: Optional[str] = None  # the sha256 the lock records for it (None: it records none)
    index_url: Optional[str] = None  # the index it is from, whose credentials it takes
    index_name: Optional[str] = None  # that index's name in pyproject.toml (uv's UV_INDEX_<NAME>_*)
    # A local file the lock records no hash of: its size and mtime, so that a wheel rebuilt
    # under the same name is gathered again rather than taken from the cache.
    stamp: str = ""

    @property
    def is_url(self) -> bool:
        return self.location.startswith(("http://", "https://"))


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    line: int
    hashes: tuple[str, ...] = ()  # sha256 hex digests the lock allows for this pin
    # PEP 508 environment marker: the pin is for the hosts where it holds (None: every host).
    marker: Optional[str] = None
    # Where the lock says its wheels are; empty: pip finds it (find_links, index_url, pip's
    # own configuration).
    files: tuple[LockedWheel, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def shown(self) -> str:
        """As messages name it: the requirement, its marker where it has one."""
        return self.requirement + (f"; {self.marker}" if self.marker else "")

    def applies(self, environment: Mapping[str, str]) -> bool:
        """Whether the pin is for a host whose marker values are ``environment``."""
        if self.marker is None:
            return True
        from packaging.markers import Marker

        return bool(Marker(self.marker).evaluate(dict(environment)))


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
        pins = [[p.name, p.version, sorted(p.hashes)] + ([p.marker] if p.marker else [])
                for p in self.pins]
        body = json.dumps({"pins": pins, "system_site_packages": self.system_site_packages},
                          sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def pins_for(self, environment: Mapping[str, str]) -> list[Pin]:
        """The pins of the hosts whose marker values are ``environment``."""
        return [p for p in self.pins if p.applies(environment)]


