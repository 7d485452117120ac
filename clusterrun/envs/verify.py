"""Whether a host's environment is the lock's: the environment as the host reports it
(``Built``), what it holds against what the lock's wheels for its platform are, package by
package, and the hash `env --json` shows of it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from clusterrun.jsonfields import strings, text


@dataclass(frozen=True)
class Built:
    """The lock's environment as built on the host (``<workdir>/envs/<lock hash>``): its
    interpreter's version and every distribution installed in it (``name==version``)."""

    path: Optional[str]
    python: Optional[str]
    dists: tuple[str, ...]

    @classmethod
    def from_json(cls, raw: object) -> Optional[Built]:
        """None where the host reports none (not built, or built without the host's own
        packages where they are to be seen)."""
        if not isinstance(raw, dict) or not raw:
            return None
        return cls(text(raw.get("path")), text(raw.get("python")), strings(raw.get("dists")))

    @property
    def hash(self) -> str:
        """`env --json`'s ``hash``: every installed distribution and the interpreter."""
        body = "\n".join([*sorted(self.dists), f"python=={self.python}"])
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def drift(self, expected: Sequence[str], python: str) -> list[str]:
        """What differs from the lock's distributions (``expected``) for a host whose Python
        is ``python``, package by package."""
        want = dict(d.split("==", 1) for d in expected)
        have = dict(d.split("==", 1) for d in self.dists)
        out = []
        if self.python != python:
            out.append(f"built for Python {self.python}, the host's is {python}")
        for name in sorted(set(want) | set(have)):
            if name not in have:
                out.append(f"{name}=={want[name]} missing")
            elif name not in want:
                out.append(f"{name}=={have[name]} not in the lock")
            elif want[name] != have[name]:
                out.append(f"{name} {have[name]} instead of {want[name]}")
        return out


def drift(built: Optional[Built], expected: Sequence[str], python: str) -> list[str]:
    """``built``'s drift from the lock; ``["not built"]`` where there is no environment."""
    return ["not built"] if built is None else built.drift(expected, python)



def env_hash(found: object) -> Optional[str]:
    """An environment's hash, as the host reports the environment (None: none there)."""
    built = Built.from_json(found)
    return built.hash if built is not None else None


def differences(expected: Sequence[str], python: str, found: object) -> list[str]:
    """What differs between the lock's distributions and a host's environment as the host
    reports it, package by package."""
    return drift(Built.from_json(found), expected, python)
