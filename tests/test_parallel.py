"""The parallel map: every host ends with a value or a typed failure, by the deadline."""

from __future__ import annotations

import threading
import time

import pytest

from clusterrun.errors import ClusterrunError, ExitStatus, Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport import parallel


def hosts(n: int) -> list[HostSpec]:
    return [HostSpec(host=f"10.0.0.{i}", name=f"h{i}", master=i == 0, line=i + 1)
            for i in range(n)]


def test_results_keep_host_order_and_failures_stay_in_their_slot() -> None:
    def fn(spec: HostSpec) -> str:
        if spec.name == "h2":
            raise ClusterrunError("h2: broke")
        if spec.name == "h3":
            raise ValueError("bug")
        return spec.name.upper()

    results = parallel.run(fn, hosts(5), deadline=5)
    assert [r.spec.name for r in results] == ["h0", "h1", "h2", "h3", "h4"]
    assert [r.value for r in results] == ["H0", "H1", None, None, "H4"]
    assert results[2].failure == parallel.Failure(Outcome.INTERNAL, "h2: broke")
    assert results[3].failure is not None and "ValueError: bug" in results[3].failure.message
    assert not results.ok
    assert [r.name for r in results.failed] == ["h2", "h3"]
    assert results.values() == {"h0": "H0", "h1": "H1", "h4": "H4"}


def test_failures_group_by_outcome_and_fold_host_names() -> None:
    def fn(spec: HostSpec) -> None:
        if spec.name in ("h1", "h2", "h3"):
            raise ClusterrunError(f"{spec.name}: connection refused", outcome=Outcome.REFUSED)
        if spec.name == "h5":
            raise ClusterrunError(f"{spec.name}: no python", outcome=Outcome.PROBE_FAILED)

    results = parallel.run(fn, hosts(6), deadline=5)
    assert results.by_outcome() == {Outcome.REFUSED: ["h1", "h2", "h3"],
                                    Outcome.PROBE_FAILED: ["h5"]}
    assert results.failure_lines() == ["h[1-3]: refused: connection refused",
                                       "h5: probe failed: no python"]
    # An SSH failure names the host with how it was reached: the folded line shows it once.
    assert parallel.strip_name("h1 (root@10.0.0.1:22): no SSH answer", "h1") == "no SSH answer"
    assert parallel.strip_name("h10: refused", "h1") == "h10: refused"
    with pytest.raises(ClusterrunError) as caught:
        results.raise_if_failed("copying failed")
    # A host never reached outranks one that answered: the exit status says "unreachable".
    assert caught.value.outcome is Outcome.REFUSED
    assert caught.value.exit_status == ExitStatus.UNREACHABLE
    assert "h5: no python" in caught.value.message


def test_maps_over_any_item_with_a_name() -> None:
    results = parallel.run(lambda n: n * 2, [1, 2, 3], deadline=5, name=lambda n: f"n{n}")
    assert results.values() == {"n1": 2, "n2": 4, "n3": 6}


def test_a_stuck_host_times_out_without_holding_the_others() -> None:
    release = threading.Event()

    def fn(spec: HostSpec) -> str:
        if spec.name == "h1":
            release.wait()  # until the results are in: a run that waited for it never returns
        return "ok"

    try:
        results = parallel.run(fn, hosts(3), deadline=0.5)
    finally:
        release.set()
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].failure is not None
    assert results[1].failure.outcome is Outcome.COMMAND_TIMEOUT


def test_fanout_bounds_concurrency() -> None:
    live, peak = 0, 0
    lock = threading.Lock()

    def fn(spec: HostSpec) -> None:
        nonlocal live, peak
        with lock:
            live += 1
            peak = max(peak, live)
        time.sleep(0.05)
        with lock:
            live -= 1

    results = parallel.run(fn, hosts(20), deadline=10, fanout=4)
    assert all(r.ok for r in results)
    assert peak == 4
