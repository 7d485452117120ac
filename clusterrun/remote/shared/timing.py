"""Gates on elapsed time, for the loops that do something every so many seconds (stdlib only,
Python 3.6+).

Times are floats from ``time.monotonic()``. Two times that stand a whole number of seconds apart
can differ by a hair more or less once summed as floats (``(t + 3) + 1`` against ``t + 4``), and
by more where the clock reads a few hundred seconds (a machine booted minutes ago) and the sum
crosses a power of two: a difference meant to be 1.0 comes out 0.9999999999999716. Compared
bare, a look due now is put off by a whole period, or a boundary falls the other way. Every gate
here allows ``SLACK``, far above that rounding at any uptime and far below any period.
"""

from typing import Optional

SLACK = 1e-6  # seconds


def due(now: float, since: Optional[float], every: float) -> bool:
    """Whether ``every`` seconds have passed from ``since`` to ``now`` (``since`` None: never
    done, so due)."""
    return since is None or now - since >= every - SLACK


def over(now: float, since: float, limit: float) -> bool:
    """Whether more than ``limit`` seconds have passed from ``since`` to ``now``: strictly
    over, so an interval of exactly ``limit`` (rounding aside) is not."""
    return now - since > limit + SLACK


def within(now: float, since: float, limit: float) -> bool:
    """Whether at most ``limit`` seconds have passed from ``since`` to ``now``."""
    return not over(now, since, limit)
