"""The controller's leases and grace (launch/watchers.py ``Leases``) at any clock: a node heard
from exactly a lease ago, stopping for exactly the grace and its margin, or not started for
exactly START_SECONDS is not lost yet; a moment later it is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from clusterrun.launch import watchers

LEASE, GRACE = 10.0, 2.0


def leases(heard: float, *, started: bool = True,
           stopping_since: Optional[float] = None) -> tuple[watchers.Leases, Any, list[str]]:
    """One node, gpu-a, last heard from at ``heard``; what it is lost for goes to the list."""
    lost: list[str] = []
    run: Any = SimpleNamespace(
        plan=SimpleNamespace(lease=LEASE, grace=GRACE),
        nodes={"gpu-a": SimpleNamespace(done=False, started=object() if started else None)},
        last_frame={"gpu-a": heard}, stopping_since=stopping_since, silent=set(),
        lose=lambda name, why: lost.append(f"{name}: {why}"))
    return watchers.Leases(run), run, lost


def test_a_node_is_lost_only_past_its_lease(clock_base: float) -> None:
    t0 = clock_base + 100.3  # at 3986: (t0 + 10) - t0 comes out over 10
    watch, run, lost = leases(t0)
    for second in range(1, int(LEASE) + 1):  # up to exactly the lease
        watch.tick(t0 + second)
    assert lost == []
    watch.tick(t0 + LEASE + 0.2)
    assert lost == ["gpu-a: no word from it for 10 s (host down or network partitioned; its "
                    "supervisor ends the run there when its lease runs out)"]
    assert run.silent == {"gpu-a"}


def test_a_stop_unconfirmed_past_the_grace_and_its_margin_loses_the_node(
        clock_base: float) -> None:
    t0 = clock_base + 100.3  # at 3986: (t0 + 10) - t0 comes out over 10
    watch, run, lost = leases(t0, stopping_since=t0)
    limit = GRACE + watchers.TEARDOWN_MARGIN
    for second in range(1, int(limit) + 1):  # heard all along, the stop never confirmed
        run.last_frame["gpu-a"] = t0 + second
        watch.tick(t0 + second)
    assert lost == []
    watch.tick(t0 + limit + 0.2)
    assert lost == ["gpu-a: it did not confirm the stop in time"]


def test_a_supervisor_that_never_starts_is_lost_after_its_time(clock_base: float) -> None:
    t0 = clock_base + 100.3  # at 3986: (t0 + 10) - t0 comes out over 10
    watch, run, lost = leases(t0, started=False)
    run.plan.lease = 1000.0  # only the start is timed here
    for second in range(1, int(watchers.START_SECONDS) + 1):
        watch.tick(t0 + second)
    assert lost == []
    watch.tick(t0 + watchers.START_SECONDS + 0.2)
    assert lost == ["gpu-a: its supervisor did not start within 60 s"]
