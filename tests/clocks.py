"""A test of time logic runs at several clocks (a plugin: tests/conftest.py's pytest_plugins).

``clock_base`` runs a test once per base in BASES, with ``time.monotonic()`` reading that base
when the test starts and running on from there, as on a machine booted that many seconds ago;
it gives the base, from which the test builds the times it passes in (``t0 = clock_base + 100``).

Float seconds built on a small clock stop adding exactly near powers of two: ``t0 + 4 - t0`` can
come out 3.9999999999999716 where ``t0`` is 4093.2. A comparison that always holds on a machine
up for days then fails on one booted minutes ago, as a new CI machine is. So the bases: a few
hundred seconds, ten days, and some that put a test's times across 256, 512, 4096 and 8192,
each with a fraction as a real clock has (a whole number of seconds adds exactly).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

# With t0 = base + 100, whole seconds later a test's times cross 256, 512, 4096 and 8192, and
# their fractions are such that the crossing loses a bit: (t0 + 6) - (t0 + 5) is 0.99999999999997
# at 150.120008. 1000.81 and ten days (864000.61) cross nothing in a test's minute.
BASES = (150.120008, 400.370015, 1000.81, 3986.440002, 8074.130004, 864000.61)
ROUNDING = 1e-6  # seconds: what float sums of times may be off by here, with room to spare


def seconds(expected: float | Iterable[float]) -> Any:
    """Computed times as a test expects them (one, or a list): equal but for float rounding.
    A test never compares them bare."""
    wanted = expected if isinstance(expected, (int, float)) else [float(x) for x in expected]
    return pytest.approx(wanted, rel=0, abs=ROUNDING)


def offset_clock(monkeypatch: pytest.MonkeyPatch, base: float) -> Callable[[], float]:
    """``time.monotonic`` reads ``base`` now and runs on; returns the real one."""
    real = time.monotonic
    offset = base - real()
    monkeypatch.setattr(time, "monotonic", lambda: real() + offset)
    return real


@pytest.fixture(params=BASES, ids=lambda base: f"clock{int(base)}")
def clock_base(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> float:
    base = float(request.param)
    offset_clock(monkeypatch, base)
    return base
