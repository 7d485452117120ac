"""What the stall watchdog counts as a rank's progress (remote/shared/stallrule.py ``Progress``):
new output, CPU outside a collective, bytes read or written, uninterruptible I/O; and what it does
not (CPU spent spinning inside a collective, a rank that only sleeps)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun.remote.hostlib import pystack
from clusterrun.remote.node import progress as measure
from tests.clocks import seconds

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
# A stand-in for a rank writing a checkpoint: one 64 KiB block to its file for each line it
# reads, and nothing else (no output, next to no CPU).
WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
for line in sys.stdin:
    os.write(fd, b"x" * 65536)
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    target = tmp_path / "checkpoint.pt"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdin=subprocess.PIPE)
    yield proc, target
    proc.kill()
    proc.wait()


def progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid: int) -> measure.Progress:
    (tmp_path / "rank-0.log").write_text("rank 0 step 1\n")
    monkeypatch.setattr(pystack, "find_ranks", lambda rundir, roots: {0: pid})
    found = measure.Progress(str(tmp_path), lambda: [pid], None, timeout=8.0)
    return found


def write_block(proc: subprocess.Popen[bytes], target: Path) -> None:
    """One block, waited for: the file grows once the writer has written it."""
    size = target.stat().st_size if target.exists() else 0
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not target.exists() or target.stat().st_size <= size:
        assert time.monotonic() < deadline, "the writer wrote nothing"
        time.sleep(0.01)


def test_bytes_written_are_progress_and_a_still_rank_is_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        writer: tuple[subprocess.Popen[bytes], Path], clock_base: float) -> None:
    proc, target = writer
    write_block(proc, target)  # started: its interpreter's own reads are behind it
    found = progress(tmp_path, monkeypatch, proc.pid)
    t0 = clock_base + 100
    found.look(t0)  # the first look: the log is new output, the bytes a first reading
    assert found.quiet(t0) == seconds(0)
    for second in range(1, 4):  # nothing written, nothing printed: quiet grows
        found.look(t0 + second)
    assert found.quiet(t0 + 3) == seconds(3)
    write_block(proc, target)
    found.look(t0 + 4)
    assert found.quiet(t0 + 4) == seconds(0)  # the bytes it wrote are progress
    found.look(t0 + 5)
    assert found.quiet(t0 + 5) == seconds(1)


def test_uninterruptible_io_is_progress_for_a_bounded_stretch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_base: float) -> None:
    found = progress(tmp_path, monkeypatch, os.getpid())
    monkeypatch.setattr(pystack, "io_bytes", lambda pid: 1000)  # no byte moves
    monkeypatch.setattr(pystack, "cpu_ticks", lambda pid: 5)  # no CPU either
    waits = {"D": True}
    monkeypatch.setattr(pystack, "in_io_wait", lambda pid: waits["D"])
    t0 = clock_base + 100
    found.look(t0)
    for second in range(1, 60):  # an fsync to a slow filesystem: state D, a minute long
        found.look(t0 + second)
    assert found.quiet(t0 + 59) == seconds(0)
    waits["D"] = False  # done, and then nothing: quiet again
    for second in range(60, 70):
        found.look(t0 + second)
    assert found.quiet(t0 + 69) == seconds(10)
    waits["D"] = True  # a dead NFS server: D for ever counts only IO_WAIT_MAX
    start = t0 + 70
    step = 0.0
    while step <= measure.IO_WAIT_MAX + 20:
        found.look(start + step)
        step += 5
    # The stretch began at 0 s and is used up at 600 s: the look at 595 s was the last that
    # counted, 25 s before the last look.
    assert found.quiet(start + step - 5) == seconds(25)


def test_cpu_counts_only_outside_a_collective(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              clock_base: float) -> None:
    found = progress(tmp_path, monkeypatch, os.getpid())
    found.pyspy = "/usr/bin/py-spy"
    found.stack_age = 0.0  # a fresh stack at every look
    ticks = iter(range(0, 100000, 100))  # a whole core, every second
    monkeypatch.setattr(pystack, "cpu_ticks", lambda pid: next(ticks))
    monkeypatch.setattr(pystack, "io_bytes", lambda pid: 1000)
    monkeypatch.setattr(pystack, "in_io_wait", lambda pid: False)
    where: dict[str, Any] = {"frames": [{"function": "all_reduce", "file": TORCH, "line": 1}]}
    monkeypatch.setattr(pystack, "dump", lambda spy, pid, tries=1: (
        [{"name": "MainThread", "frames": where["frames"]}], None))
    t0 = clock_base + 100
    for second in range(6):  # spinning in all_reduce (NCCL's waiters may): not progress
        found.look(t0 + second)
    assert found.quiet(t0 + 5) == seconds(5)
    where["frames"] = [{"function": "forward", "file": "/job/model.py", "line": 9}]
    found.look(t0 + 6)
    assert found.quiet(t0 + 6) == seconds(0)  # computing: progress


AUTOGRAD = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"
LOADER = "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py"


@pytest.mark.parametrize(("frames", "active", "waits"), [
    # DDP: the main thread idle in the backward pass waits for the reducer's all-reduce.
    ([("<module>", "/job/train.py", 40), ("_engine_run_backward", AUTOGRAD, 979)], False, True),
    # The same frames running: a CPU backward computing the gradients.
    ([("<module>", "/job/train.py", 40), ("_engine_run_backward", AUTOGRAD, 979)], True, False),
    # Idle for its own DataLoader: not a peer's wait, but no computing either.
    ([("<module>", "/job/train.py", 33), ("_next_data", LOADER, 1450)], False, True),
    ([("<module>", "/job/train.py", 33), ("sleep", "/job/train.py", 20)], False, False),
])
def test_busy_cpu_counts_only_while_the_main_thread_computes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frames: list[tuple[str, str, int]],
        active: bool, waits: bool, *, clock_base: float) -> None:
    """Other threads may burn CPU (NCCL's, Gloo's, a pin-memory thread) while the main thread
    waits: py-spy's idle flag and the frame it waits in decide."""
    found = progress(tmp_path, monkeypatch, os.getpid())
    found.pyspy = "/usr/bin/py-spy"
    ticks = iter(range(0, 100000, 100))
    monkeypatch.setattr(pystack, "cpu_ticks", lambda pid: next(ticks))
    monkeypatch.setattr(pystack, "io_bytes", lambda pid: 1000)
    monkeypatch.setattr(pystack, "in_io_wait", lambda pid: False)
    stack = [{"function": f, "file": p, "line": n} for f, p, n in frames]
    monkeypatch.setattr(pystack, "dump", lambda spy, pid, tries=1: (
        [{"name": "MainThread", "frames": stack, "active": active}], None))
    t0 = clock_base + 100
    for second in range(4):
        found.look(t0 + second)
    assert found.quiet(t0 + 3) == seconds(3 if waits else 0)


def test_without_a_flight_recorder_busy_cpu_stays_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_base: float) -> None:
    """A busy, silent rank on a host with no Flight Recorder pipe (no GPU, or a torch without
    one): its CPU is progress, however long, and no dump is ever asked for."""
    from clusterrun.remote.hostlib import flightpipe

    asked: list[str] = []

    def ask(rundir: str, wait: float = 5.0) -> list[str]:
        asked.append(rundir)
        return []

    monkeypatch.setattr(flightpipe, "ask", ask)
    monkeypatch.setattr(flightpipe, "request", ask)
    found = progress(tmp_path, monkeypatch, os.getpid())
    ticks = iter(range(0, 100000, 100))
    monkeypatch.setattr(pystack, "cpu_ticks", lambda pid: next(ticks))
    monkeypatch.setattr(pystack, "io_bytes", lambda pid: 1000)
    monkeypatch.setattr(pystack, "in_io_wait", lambda pid: False)
    t0 = clock_base + 100
    for second in range(40):  # five timeouts
        found.look(t0 + second)
        found.flight.wait()
        assert found.quiet(t0 + second) == seconds(0)
    assert asked == []
