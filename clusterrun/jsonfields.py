"""Reading JSON that clusterrun did not just write (a probe's reply, a run's files) into typed
values, once, where it arrives: each helper returns the value when it has the expected type, else
what a missing key gives. The probe's facts (preflight/facts.py) and the run's records
(runs/records.py, runs/summary.py) are read with these; nothing here judges."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional


def obj(value: object) -> Mapping[str, object]:
    """A JSON object, or an empty one for anything else (missing, null, odd)."""
    return value if isinstance(value, dict) else {}


def items(value: object) -> list[object]:
    """A JSON array, or an empty one for anything else."""
    return list(value) if isinstance(value, list) else []


def text(value: object) -> Optional[str]:
    return value if isinstance(value, str) else None


def integer(value: object) -> Optional[int]:
    """An integer (JSON has no other; true/false are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: object) -> Optional[float]:
    """An integer or a float, kept as the probe sent it (seconds, for one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def flag(value: object) -> Optional[bool]:
    """true/false; None (unknown) for null, a missing key or anything else."""
    return value if isinstance(value, bool) else None


def strings(value: object) -> tuple[str, ...]:
    """The strings of a JSON array (an address list, say); the rest is dropped."""
    return tuple(v for v in items(value) if isinstance(v, str))


def integers(value: object) -> tuple[int, ...]:
    """The integers of a JSON array (a port range, say); the rest is dropped."""
    return tuple(v for v in items(value) if isinstance(v, int) and not isinstance(v, bool))
