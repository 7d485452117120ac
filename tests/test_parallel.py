"""The parallel map: every host ends with a value or a typed failure, by the deadline."""

from __future__ import annotations

import threading
import time

from clusterrun.errors import ClusterrunError
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
    assert results[2].failure == parallel.Failure("error", "h2: broke")
    assert results[3].failure is not None and "ValueError: bug" in results[3].failure.message


def test_a_stuck_host_times_out_without_holding_the_others() -> None:
    release = threading.Event()

    def fn(spec: HostSpec) -> str:
        if spec.name == "h1":
            release.wait(30)
        return "ok"

    start = time.monotonic()
    results = parallel.run(fn, hosts(3), deadline=0.5)
    assert time.monotonic() - start < 2
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].failure is not None and results[1].failure.kind == "deadline"
    release.set()


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
