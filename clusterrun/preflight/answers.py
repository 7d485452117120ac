"""The probe's answers to preflight's questions after the facts (clusterrun/remote/probe/probe.py,
meshtest.py, throughput.py), read into frozen values where they arrive: a port opened, a
connection tried, a transfer measured. (A route and a name lookup: net_facts.py.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from clusterrun.jsonfields import flag, integer, number, obj, text


@dataclass(frozen=True)
class Listening:
    """A port opened on the host (``listen``, ``mesh_listen``, ``sink``): the port, or why not
    (``errno``: the OSError's number, where the probe sends it)."""

    ok: bool = False
    port: Optional[int] = None
    errno: Optional[int] = None
    error: Optional[str] = None

    @classmethod
    def from_json(cls, value: object) -> Listening:
        found = obj(value)
        return cls(flag(found.get("ok")) is True, integer(found.get("port")),
                   integer(found.get("errno")), text(found.get("error")))


@dataclass(frozen=True)
class Connected:
    """A TCP connection tried from the host (``connect``, one target of ``mesh_connect``)."""

    ok: bool = False
    error: Optional[str] = None

    @classmethod
    def from_json(cls, value: object) -> Connected:
        found = obj(value)
        return cls(flag(found.get("ok")) is True, text(found.get("error")))


def connections(value: object) -> Mapping[str, Connected]:
    """``mesh_connect``'s answer: target host -> how connecting to it went."""
    return {str(target): Connected.from_json(found) for target, found in obj(value).items()}


@dataclass(frozen=True)
class Blast:
    """``blast``: the bytes the master confirmed and the seconds they took, or the stage that
    failed (connect, send, answer) and why."""

    ok: bool = False
    bytes: int = 0
    seconds: float = 0.0
    stage: Optional[str] = None
    error: Optional[str] = None

    @classmethod
    def from_json(cls, value: object) -> Blast:
        found = obj(value)
        return cls(flag(found.get("ok")) is True, integer(found.get("bytes")) or 0,
                   float(number(found.get("seconds")) or 0.0), text(found.get("stage")),
                   text(found.get("error")))
