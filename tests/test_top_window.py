"""`top --once` without waiting its window: the readings a run's supervisor keeps
(remote/hostlib/counters.py) and a sampler (remote/tools/sampler.py, run here as a host runs it)
that starts its first window at one of them. Every time below is read on the same monotonic
clock the sampler reads, so each bound holds however loaded the machine is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun.remote.hostlib import counters, procs
from clusterrun.remote.shared import jsonfile, layout, nodestate
from clusterrun.transport import shell

LINES = 30


class Sampler:
    """The sampler program, shipped on stdin as a host gets it; ``ask`` times one answer."""

    def __init__(self, rundir: Path, path: str = "/usr/bin:/bin") -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-u", "-c", shell.BOOTSTRAP],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PATH": path})
        assert self.proc.stdin is not None
        self.proc.stdin.write(shell.program_input(
            "sampler.py", {"rundir": str(rundir), "interface": "lo", "ranks": [0, 0]}))
        self.proc.stdin.flush()

    def ask(self, window: float | None) -> tuple[float, dict[str, Any], float]:
        """(when asked, the answer, when answered)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        asked = time.monotonic()
        self.proc.stdin.write(json.dumps({"seq": 1, "window": window}).encode() + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        answered = time.monotonic()
        assert line.startswith(b"J "), line
        return asked, json.loads(line[2:]), answered

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(10) == 0

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A rundir whose supervisor is this test (alive: the run is running) and whose rank 0 is
    a process that spins."""
    rundir = tmp_path / "run"
    rundir.mkdir()
    (rundir / layout.rank_log(0)).write_text("starting\n")
    me = os.getpid()
    nodestate.write(str(rundir), state="running", supervisor_pid=me,
                    supervisor_start=procs.start_time(me))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield rundir, spinner.pid
    finally:
        spinner.kill()
        spinner.wait()


def keep(rundir: Path, pid: int, wall_skew: float = 0.0) -> dict[str, Any]:
    """One reading as the supervisor keeps it, taken now."""
    taken = counters.reading(str(rundir), "lo", {0: pid})
    jsonfile.write(str(rundir / layout.COUNTERS),
                   {"readings": [dict(taken, wall=taken["wall"] + wall_skew)]})
    return taken


def grow(rundir: Path) -> None:
    with (rundir / layout.rank_log(0)).open("a") as log:
        log.write("".join(f"step {i}\n" for i in range(LINES)))


def test_a_kept_reading_old_enough_gives_the_first_answer_at_once(
        rank: tuple[Path, int]) -> None:
    rundir, pid = rank
    kept = keep(rundir, pid)
    grow(rundir)
    time.sleep(3.2)  # the window the kept reading opened, at least
    with Sampler(rundir) as sampler:
        asked, reply, answered = sampler.ask(3.0)
        before = counters.proc_ticks(pid)
    # At once: the sampler waited nothing out (its window began before it started).
    assert answered - asked < 3.0, answered - asked
    window = reply["window"]
    assert asked - kept["mono"] <= window <= answered - kept["mono"], (reply, kept)
    entry = reply["ranks"][0]
    # The lines written since the kept reading, over the kept window (not 0: all were
    # written before this sampler started).
    assert entry["lines_per_min"] == pytest.approx(LINES * 60 / window, rel=1e-3), entry
    # The spinner's CPU time since the kept reading, over that window; this side read its
    # ticks after the answer, so at most that.
    assert before is not None and entry["pid"] == pid
    assert 0 < entry["cpu_percent"] * window / 100 <= (before[1] - kept["pids"]["0"][2]) / \
        counters.TICKS + 0.011, (entry, before, kept)
    assert reply["host"]["cpu_percent"] is not None and reply["host"]["net_rx_mbps"] is not None


def test_a_rank_the_window_s_first_reading_missed_is_timed_from_a_later_one(
        rank: tuple[Path, int]) -> None:
    """The supervisor finds a rank a moment after it starts (a walk of /proc every 2 s while
    one is missing): where the window's first reading lacks it, its CPU % is over the first
    kept reading that has it (at least a second old), not null."""
    rundir, pid = rank
    missed = counters.reading(str(rundir), "lo", {})
    time.sleep(1.1)
    found = counters.reading(str(rundir), "lo", {0: pid})
    jsonfile.write(str(rundir / layout.COUNTERS), {"readings": [missed, found]})
    time.sleep(2.2)
    with Sampler(rundir) as sampler:
        asked, reply, _answered = sampler.ask(3.0)
        after = counters.proc_ticks(pid)
    assert reply["window"] >= 3.0  # the host's rates: from the first reading
    # Its window began at ``found`` and ended after ``asked``: at least this much CPU time.
    spent = reply["ranks"][0]["cpu_percent"] * (asked - found["mono"]) / 100
    assert after is not None and 0 < spent <= (after[1] - found["pids"]["0"][2]) / \
        counters.TICKS + 0.011, (reply["ranks"][0], found, after)


def test_a_run_younger_than_the_window_waits_out_the_rest(rank: tuple[Path, int]) -> None:
    """A `top --once` a second after launch: the supervisor has kept readings for a second;
    the answer comes once the window from the oldest is whole, and its rates are over it."""
    rundir, pid = rank
    kept = keep(rundir, pid)
    grow(rundir)
    with Sampler(rundir) as sampler:
        _asked, reply, answered = sampler.ask(2.0)
    assert reply["window"] >= 2.0 and answered - kept["mono"] >= 2.0, reply
    assert reply["window"] <= answered - kept["mono"]
    rate = LINES * 60 / reply["window"]
    assert reply["ranks"][0]["lines_per_min"] == pytest.approx(rate, rel=1e-3)


@pytest.mark.parametrize("skew", [None, 60.0], ids=["none kept", "another clock"])
def test_without_a_usable_kept_reading_the_first_answer_waits_its_window(
        rank: tuple[Path, int], skew: float | None) -> None:
    """No kept reading (a run of an older supervisor), or one whose clocks disagree (written
    under another monotonic clock): the window is the sampler's own, waited out as before."""
    rundir, pid = rank
    if skew is not None:
        keep(rundir, pid, wall_skew=skew)
        time.sleep(1.6)
    grow(rundir)
    with Sampler(rundir) as sampler:
        asked, reply, answered = sampler.ask(1.5)
    assert 1.5 <= reply["window"] <= answered - asked + 1.5, reply
    # Its own first look was after the lines were written: none counted.
    assert reply["ranks"][0]["lines_per_min"] == 0


@pytest.mark.parametrize("age", [0.0, 5.0], ids=["fresh", "stale"])
def test_a_first_answer_takes_the_gpus_a_sampler_kept_within_the_window(
        rank: tuple[Path, int], tmp_path: Path, age: float) -> None:
    """An nvidia-smi that takes its time (a driver without persistence mode): the first answer
    shows what the previous sampler kept, when that is younger than the window; else it waits
    for its own query, at most the window from its start."""
    rundir, pid = rank
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nsleep 4\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    gpus = [{"index": 0, "util_percent": 97}]
    keep(rundir, pid)
    time.sleep(1.6)
    jsonfile.write(str(rundir / layout.GPUS), {"mono": time.monotonic() - age,
                                                "wall": time.time() - age, "gpus": gpus,
                                                "error": None})
    began = time.monotonic()
    with Sampler(rundir, f"{bin_dir}:/usr/bin:/bin") as sampler:
        _asked, reply, answered = sampler.ask(1.5)
    if age == 0.0:
        assert reply["host"]["gpus"] == gpus and answered - began < 1.5, reply["host"]
    else:
        assert reply["host"]["gpus"] is None and answered - began >= 1.5, reply["host"]


def test_the_supervisor_keeps_the_last_seconds_of_readings(tmp_path: Path,
                                                             clock_base: float) -> None:
    keeper = counters.Keeper(str(tmp_path), "lo", list, 1)
    t0 = clock_base + 100
    for step in range(40):  # every 0.25 s: a reading once a second
        keeper.tick(t0 + step * 0.25)
    kept = jsonfile.read(str(tmp_path / layout.COUNTERS))["readings"]
    times = [r["mono"] - t0 for r in kept]
    assert times == pytest.approx([4.0, 5.0, 6.0, 7.0, 8.0, 9.0]), times
    assert set(kept[-1]) == {"mono", "wall", "uptime", "cpu", "interface", "net", "pids", "logs"}
    keeper.forget()  # the run ended here
    assert not (tmp_path / layout.COUNTERS).exists()


def test_a_reading_that_fails_ends_the_keeping_and_never_the_supervisor(
        tmp_path: Path, clock_base: float, monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterrun.remote.node import lineup

    class Node:
        rundir = str(tmp_path)

        def roots(self) -> list[int]:
            return []

        def running(self) -> bool:
            return True

    watcher = lineup.Counters(Node(), {"public": {"ranks": [0, 0], "interface": "lo"}})
    watcher.tick(clock_base + 100)
    assert (tmp_path / layout.COUNTERS).exists()

    def unknown(interface: str) -> None:
        raise ValueError("a /proc/net/dev line this parser does not know")

    monkeypatch.setattr(counters, "net_bytes", unknown)
    watcher.tick(clock_base + 102)  # the supervisor's loop goes on: nothing raised
    assert not (tmp_path / layout.COUNTERS).exists()  # a sampler waits its window again
    monkeypatch.undo()
    watcher.tick(clock_base + 104)
    assert not (tmp_path / layout.COUNTERS).exists()  # kept no more for this run
