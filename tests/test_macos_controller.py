"""A macOS laptop as the controller, faked here on Linux: its sleep is seen on a clock that
counts sleep there."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from clusterrun.launch import pause
from clusterrun.launch.session import Session
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.wire import End

# The clock ids as Python's time module has them on each system.
MAC_MONOTONIC, MAC_UPTIME_RAW = 6, 8
LINUX_MONOTONIC, LINUX_BOOTTIME = 1, 7


class Clocks:
    """A machine's clocks: ``sleep`` moves only those that count sleep."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, system: str, counting: set[int],
                 stopping: set[int], monotonic: int) -> None:
        self.now = dict.fromkeys(counting | stopping, 1000.0)
        self.counting = counting
        monkeypatch.setattr(sys, "platform", system)
        monkeypatch.setattr(time, "clock_gettime", lambda clock: self.now[clock])
        # time.monotonic is one of the clocks that stop (Linux: CLOCK_MONOTONIC, macOS:
        # mach_absolute_time, the same as CLOCK_UPTIME_RAW).
        monkeypatch.setattr(time, "monotonic", lambda: self.now[monotonic])

    def run(self, seconds: float) -> None:
        self.now = {k: v + seconds for k, v in self.now.items()}

    def sleep(self, seconds: float) -> None:
        self.now = {k: v + (seconds if k in self.counting else 0) for k, v in self.now.items()}


@pytest.fixture
def mac(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", MAC_MONOTONIC, raising=False)
    monkeypatch.setattr(time, "CLOCK_UPTIME_RAW", MAC_UPTIME_RAW, raising=False)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    return Clocks(monkeypatch, "darwin", {MAC_MONOTONIC}, {MAC_UPTIME_RAW}, MAC_UPTIME_RAW)


def slept(clocks: Clocks, seconds: float) -> Optional[tuple[float, float]]:
    """What the watch loop sees after the machine slept ``seconds`` between two turns."""
    found = pause.Pauses()
    found.beating()
    assert found.turn() is None
    clocks.run(0.2)
    assert found.turn() is None
    clocks.sleep(seconds)
    return found.turn()


def test_a_sleeping_mac_is_seen_on_its_clock_that_counts_sleep(mac: Clocks) -> None:
    """Apple's clock_gettime(3): CLOCK_MONOTONIC "will continue to increment while the system
    is asleep"; time.monotonic (mach_absolute_time) and CLOCK_UPTIME_RAW do not."""
    assert pause.sleep_clock() == MAC_MONOTONIC
    found = slept(mac, 600)
    assert found is not None and found[0] == pytest.approx(600, abs=1)
    text = pause.notice(*found, lease=30)
    assert text is not None and "suspended for 600 s" in text and "lease (30 s)" in text
    assert pause.unseen_sleep() is None


def test_linux_counts_sleep_on_boottime_never_on_its_monotonic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "CLOCK_BOOTTIME", LINUX_BOOTTIME, raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", LINUX_MONOTONIC, raising=False)
    clocks = Clocks(monkeypatch, "linux", {LINUX_BOOTTIME}, {LINUX_MONOTONIC}, LINUX_MONOTONIC)
    found = slept(clocks, 600)
    assert found is not None and found[0] == pytest.approx(600, abs=1)
    # Without CLOCK_BOOTTIME, Linux's CLOCK_MONOTONIC would miss the sleep: none is used.
    monkeypatch.delattr(time, "CLOCK_BOOTTIME")
    assert pause.sleep_clock() is None


@pytest.mark.parametrize(("system", "name"), [("freebsd14", "FreeBSD"), ("linux", "Linux")])
def test_without_a_clock_that_counts_sleep_the_controller_says_it_cannot_tell(
        monkeypatch: pytest.MonkeyPatch, system: str, name: str) -> None:
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", LINUX_MONOTONIC, raising=False)
    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(platform, "system", lambda: name)
    assert pause.sleep_clock() is None
    text = pause.unseen_sleep()
    assert text is not None
    assert f"cannot tell whether its machine slept ({name} offers no clock" in text


def _session(notes: list[str]) -> Session:
    node = NodePlan(name="node0", host="10.0.0.1", local=False, node_rank=0, nproc=1,
                    first_rank=0, interface="eth0", address="10.0.0.1", python="python3",
                    setup=None, workdir="/w", rundir="/w/r", cwd="/w/c", argv=(), env=())
    plan = LaunchPlan(run_id="r1", name="r1", script=Path("/t.py"), args=(),
                      master_addr="10.0.0.1", master_port=29500, nodes=(node,), sync=False,
                      grace=5, lease=30)
    return Session(plan, {}, {}, mirror=None, view=None, notify=notes.append)  # type: ignore[arg-type]


def test_nodes_that_lost_the_controller_are_not_left_to_blame_where_sleep_is_unseen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' lease ran out while this controller's clock saw no pause: where no clock
    counts sleep, the user hears that this machine may have slept, once."""
    lost = End(40.0, "lost", reason="lifeline lost: no heartbeat from the controller for 30 s",
               cause="lease_expired")
    monkeypatch.setattr(pause, "sleep_clock", lambda: None)
    notes: list[str] = []
    session = _session(notes)
    session.handle("node0", lost, 0.0)
    session.handle("node0", lost, 0.0)
    assert len(notes) == 1 and "cannot tell whether its machine slept" in notes[0]
    monkeypatch.setattr(pause, "sleep_clock", lambda: LINUX_BOOTTIME)
    notes.clear()
    _session(notes).handle("node0", lost, 0.0)  # its clock would have seen the sleep
    assert notes == []
