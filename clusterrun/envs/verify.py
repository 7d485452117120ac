"""Whether a host's environment is the lock's: what it holds against what the lock's wheels
for its platform are, package by package, and the hash `env --json` shows of it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Optional


def env_hash(found: Optional[dict[str, Any]]) -> Optional[str]:
    """An environment's hash: every installed distribution (name==version) and the interpreter."""
    if not found:
        return None
    body = "\n".join([*sorted(found.get("dists") or []), f"python=={found.get('python')}"])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def differences(expected: Sequence[str], python: str, found: Optional[dict[str, Any]]) -> list[str]:
    """What differs between the lock's distributions and a host's, package by package."""
    if not found:
        return ["not built"]
    want = dict(d.split("==", 1) for d in expected)
    have = dict(d.split("==", 1) for d in found.get("dists") or [])
    out = []
    if found.get("python") != python:
        out.append(f"built for Python {found.get('python')}, the host's is {python}")
    for name in sorted(set(want) | set(have)):
        if name not in have:
            out.append(f"{name}=={want[name]} missing")
        elif name not in want:
            out.append(f"{name}=={have[name]} not in the lock")
        elif want[name] != have[name]:
            out.append(f"{name} {have[name]} instead of {want[name]}")
    return out
