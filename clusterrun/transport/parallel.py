"""Run one function per host in parallel, under one deadline, without ever losing a host.

Unlike fabric's ThreadingGroup (whose join has no timeout), every host ends with either a value
or a typed failure by the deadline; a thread still stuck then is abandoned (it is a daemon).
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Generic, Optional, TypeVar

from clusterrun.errors import ClusterrunError
from clusterrun.inventory import HostSpec

T = TypeVar("T")

DEFAULT_FANOUT = 64


@dataclass(frozen=True)
class Failure:
    """Why a host has no result. ``kind``: dns, refused, timeout, unreachable, auth, hostkey,
    deadline, exit, error."""

    kind: str
    message: str


@dataclass(frozen=True)
class HostResult(Generic[T]):
    spec: HostSpec
    value: Optional[T] = None
    failure: Optional[Failure] = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def run(fn: Callable[[HostSpec], T], hosts: Sequence[HostSpec], deadline: Optional[float],
        fanout: int = DEFAULT_FANOUT) -> list[HostResult[T]]:
    """``fn(host)`` for every host, at most ``fanout`` at once; results in ``hosts`` order.

    ``deadline`` is in seconds from now and bounds the whole call (None: no bound, for commands
    that run as long as they need).
    """
    end = time.monotonic() + (deadline if deadline is not None else 10.0 ** 9)
    results: dict[int, HostResult[T]] = {}
    done = threading.Condition()
    slots = threading.BoundedSemaphore(max(1, fanout))

    def work(index: int, spec: HostSpec) -> None:
        outcome: HostResult[T]
        try:
            outcome = HostResult(spec, value=fn(spec))
        except ClusterrunError as exc:
            kind = getattr(exc, "kind", "error")
            outcome = HostResult(spec, failure=Failure(kind, exc.message))
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            outcome = HostResult(spec, failure=Failure("error", f"{spec.name}: {detail}"))
        finally:
            slots.release()
        with done:
            results.setdefault(index, outcome)
            done.notify_all()

    def feeder() -> None:
        for index, spec in enumerate(hosts):
            remaining = end - time.monotonic()
            if remaining <= 0 or not slots.acquire(timeout=remaining):
                return
            threading.Thread(target=work, args=(index, spec), daemon=True,
                             name=f"clusterrun-{spec.name}").start()

    threading.Thread(target=feeder, daemon=True, name="clusterrun-feeder").start()
    with done:
        while len(results) < len(hosts):
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            done.wait(remaining)
        for index, spec in enumerate(hosts):
            results.setdefault(index, HostResult(spec, failure=Failure(
                "deadline", f"{spec.name}: no answer within {deadline or 0:g} s.")))
        return [results[i] for i in range(len(hosts))]


def fold(names: list[str]) -> str:
    """``node1 node2 node3 gpu-a`` -> ``gpu-a,node[1-3]``: how pdsh and clush name host sets."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)(\D*)", name)
        if match is None:
            plain.append(name)
            continue
        head, digits, tail = match.groups()
        groups.setdefault((head, tail, len(digits) if digits[0] == "0" and len(digits) > 1 else 0),
                          []).append(int(digits))
    parts = sorted(plain)
    for (head, tail, width), found in sorted(groups.items()):
        numbers = sorted(set(found))
        if len(numbers) == 1:
            parts.append(f"{head}{numbers[0]:0{width}d}{tail}")
            continue
        spans, start, prev = [], numbers[0], numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(f"{start:0{width}d}" if start == prev else
                         f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{head}[{','.join(spans)}]{tail}")
    return ",".join(parts)
