"""Run one function per item (a host, a node) in parallel, under one deadline, never losing one.

Unlike fabric's ThreadingGroup (whose join has no timeout), every item ends with either a value
or a typed failure by the deadline; a thread still stuck then is abandoned (it is a daemon). The
answer is a ``GroupResult``, modelled on fabric's: a result per item in input order, ``.ok``,
``.failed``, and failures grouped by outcome for ``node[1,3]: ...`` summaries.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar, overload

from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory.ranges import fold

K = TypeVar("K")
T = TypeVar("T")

DEFAULT_FANOUT = 64
SIGNAL_SLICE = 0.25  # the longest a signal waits for the main thread to see it


@dataclass(frozen=True)
class Failure:
    """Why an item has no result: its outcome and one sentence naming the host."""

    outcome: Outcome
    message: str

    @property
    def kind(self) -> str:
        return self.outcome.label


@dataclass(frozen=True)
class HostResult(Generic[K, T]):
    item: K
    name: str
    value: Optional[T] = None
    failure: Optional[Failure] = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def spec(self) -> K:
        """The item mapped over (a HostSpec for host maps)."""
        return self.item


class GroupResult(Sequence[HostResult[K, T]]):
    """Per item, in input order, its value or its failure."""

    def __init__(self, results: Sequence[HostResult[K, T]]) -> None:
        self._results = list(results)

    @overload
    def __getitem__(self, index: int) -> HostResult[K, T]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[HostResult[K, T]]: ...

    def __getitem__(self, index: Any) -> Any:
        return self._results[index]

    def __len__(self) -> int:
        return len(self._results)

    def __iter__(self) -> Iterator[HostResult[K, T]]:
        return iter(self._results)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self._results)

    @property
    def succeeded(self) -> list[HostResult[K, T]]:
        return [r for r in self._results if r.ok]

    @property
    def failed(self) -> list[HostResult[K, T]]:
        return [r for r in self._results if not r.ok]

    def values(self) -> dict[str, T]:
        """Name -> value of every item that succeeded."""
        return {r.name: r.value for r in self._results if r.ok}  # type: ignore[misc]

    def failures(self) -> dict[str, Failure]:
        return {r.name: r.failure for r in self._results if r.failure is not None}

    def by_outcome(self) -> dict[Outcome, list[str]]:
        """The failed items' names, grouped by outcome (first-seen order)."""
        groups: dict[Outcome, list[str]] = {}
        for r in self.failed:
            assert r.failure is not None
            groups.setdefault(r.failure.outcome, []).append(r.name)
        return groups

    def failure_groups(self) -> dict[str, list[str]]:
        """``outcome: message`` (the host's name taken out) -> the names of the items that
        failed so, in first-seen order."""
        groups: dict[str, list[str]] = {}
        for r in self.failed:
            assert r.failure is not None
            text = f"{r.failure.outcome.label}: {strip_name(r.failure.message, r.name)}"
            groups.setdefault(text, []).append(r.name)
        return groups

    def failure_lines(self) -> list[str]:
        """One line per distinct failure, the hosts that share it folded: ``node[1,3]: ...``."""
        return [f"{fold(names)}: {text}" for text, names in self.failure_groups().items()]

    def raise_if_failed(self, intro: str) -> None:
        """One error for every failure (as fabric's GroupException), with the worst outcome's
        exit status: a host that was never reached outranks one that answered."""
        failed = self.failed
        if not failed:
            return
        outcomes = [r.failure.outcome for r in failed if r.failure is not None]
        worst = next((o for o in outcomes if not o.reached), outcomes[0])
        lines = [r.failure.message for r in failed if r.failure is not None]
        raise ClusterrunError(f"{intro}:\n  " + "\n  ".join(lines), outcome=worst)


def _name(item: Any) -> str:
    return str(getattr(item, "name", item))


def run(fn: Callable[[K], T], items: Sequence[K], deadline: Optional[float],
        fanout: int = DEFAULT_FANOUT,
        name: Callable[[K], str] = _name) -> GroupResult[K, T]:
    """``fn(item)`` for every item, at most ``fanout`` at once; results in ``items`` order.

    ``deadline`` is in seconds from now and bounds the whole call (None: no bound, for commands
    that run as long as they need). ``name`` says which host an item is, for messages.
    """
    end = time.monotonic() + (deadline if deadline is not None else 10.0 ** 9)
    results: dict[int, HostResult[K, T]] = {}
    done = threading.Condition()
    slots = threading.BoundedSemaphore(max(1, fanout))

    def work(index: int, item: K) -> None:
        outcome: HostResult[K, T]
        label = name(item)
        try:
            outcome = HostResult(item, label, value=fn(item))
        except ClusterrunError as exc:
            outcome = HostResult(item, label, failure=Failure(exc.outcome, exc.message))
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            outcome = HostResult(item, label, failure=Failure(Outcome.INTERNAL,
                                                              f"{label}: {detail}"))
        finally:
            slots.release()
        with done:
            results.setdefault(index, outcome)
            done.notify_all()

    def feeder() -> None:
        for index, item in enumerate(items):
            remaining = end - time.monotonic()
            if remaining <= 0 or not slots.acquire(timeout=remaining):
                return
            threading.Thread(target=work, args=(index, item), daemon=True,
                             name=f"clusterrun-{name(item)}").start()

    threading.Thread(target=feeder, daemon=True, name="clusterrun-feeder").start()
    with done:
        while len(results) < len(items):
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            # In slices: Ctrl-C or SIGTERM delivered to one of the host threads does not wake
            # the main thread's wait, and its handler runs only when the wait returns.
            done.wait(min(remaining, SIGNAL_SLICE))
        for index, item in enumerate(items):
            label = name(item)
            results.setdefault(index, HostResult(item, label, failure=Failure(
                Outcome.COMMAND_TIMEOUT, f"{label}: no answer within {deadline or 0:g} s.")))
        return GroupResult([results[i] for i in range(len(items))])


def strip_name(message: str, name: str) -> str:
    """``gpu-a: refused`` or ``gpu-a (root@10.0.0.8:22): refused`` -> ``refused``: in a folded
    line the names stand in front."""
    if message.startswith((f"{name}: ", f"{name} (")) and ": " in message:
        return message.split(": ", 1)[1]
    return message
