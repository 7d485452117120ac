"""The fault-injection suite: every test here is marked ``reliability`` (and ``cluster`` when it
uses the namespace cluster), so ``pytest -m reliability`` runs it alone.

Each scenario measures what it promises with ``timed``: the seconds a fault took to be handled
are asserted against the scenario's limit and listed at the end of the session, and written as
JSON to $CLUSTERRUN_RELIABILITY_TIMES when that is set (docs/reliability.md quotes a real run).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@dataclass
class Measured:
    scenario: str
    limit: float
    seconds: float = field(default=0.0)


MEASURED: list[Measured] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.reliability)
            if "cluster" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.cluster)
                # Timed against each scenario's limit: runs alone, not beside other workers.
                item.add_marker(pytest.mark.serial)


class Timer:
    """``with timed("rank SIGKILL: teardown", 15) as t: ...`` measures the block; ``t.stop()``
    ends the measurement early (the rest of the block only inspects what happened). The
    limit is asserted when the block ends."""

    def __init__(self, scenario: str, limit: float) -> None:
        self.entry = Measured(scenario, limit)
        self.start = time.monotonic()
        self.stopped: float | None = None

    def stop(self) -> float:
        if self.stopped is None:
            self.stopped = time.monotonic() - self.start
        return self.stopped

    @property
    def seconds(self) -> float:
        return self.stopped if self.stopped is not None else time.monotonic() - self.start


Timed = Callable[[str, float], contextlib.AbstractContextManager["Timer"]]


@pytest.fixture
def timed() -> Timed:
    @contextlib.contextmanager
    def measure(scenario: str, limit: float) -> Iterator[Timer]:
        timer = Timer(scenario, limit)
        yield timer
        timer.entry.seconds = timer.stop()
        MEASURED.append(timer.entry)
        assert timer.entry.seconds <= limit, (
            f"{scenario}: took {timer.entry.seconds:.1f} s, the limit is {limit:.0f} s")

    return measure


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not MEASURED:
        return
    terminalreporter.section("reliability: measured times")
    for m in MEASURED:
        terminalreporter.write_line(f"{m.seconds:7.1f} s  (limit {m.limit:5.0f} s)  {m.scenario}")
    target = os.environ.get("CLUSTERRUN_RELIABILITY_TIMES")
    if target:
        Path(target).write_text(json.dumps(
            [{"scenario": m.scenario, "limit": m.limit, "seconds": round(m.seconds, 2)}
             for m in MEASURED], indent=1) + "\n")
