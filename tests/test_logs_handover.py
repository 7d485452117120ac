"""`logs -f` of a run another clusterrun process is fetching (logs.follow.while_held): it shows
what that process mirrors until the mirror lock is free, then replays the rest of the mirrors,
bytes whose arrival entry the other process never wrote included, and takes over. No host:
the other process is this test, writing the mirrors as a follower would. The cluster test
(tests/test_logs_lock.py) shows the same end to end."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from clusterrun.logs import follow
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.replay import replay, replay_rest
from clusterrun.logs.view import LogView
from clusterrun.runs import lifecycle, store


class Lines:
    """A printer that keeps the lines it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        self.lines.append(f"{prefix} {text}")

    def block(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        for line in text.split("\n"):
            self.line(key, prefix, line, at)


def numbered(first: int, last: int) -> bytes:
    return b"".join(b"line %03d\n" % i for i in range(first, last))


@pytest.fixture
def run(tmp_path: Path) -> store.RunDir:
    return store.create(tmp_path / "home", "run-1")


def test_lines_of_the_holder_then_its_unindexed_bytes_show_once(run: store.RunDir) -> None:
    holder = run.lock_fd("mirror.lock")
    assert holder is not None
    mirror = Mirror(run)
    mirror.append("node1", "rank-0.log", 0, numbered(0, 10))
    printer = Lines()
    view = LogView(printer)  # type: ignore[arg-type]
    positions, offset = replay(run, view)
    taken: list[int] = []
    shown_then: list[int] = []  # how many lines had shown when the lock was taken

    def take() -> bool:
        fd = run.lock_fd("mirror.lock")
        if fd is not None:
            taken.append(fd)
            shown_then.append(len(printer.lines))
        return fd is not None

    def holding() -> None:
        # More lines while it holds the lock, then bytes with no arrival entry (killed
        # before it wrote one), then it lets go.
        mirror.append("node1", "rank-0.log", len(numbered(0, 10)), numbered(10, 20))
        deadline = time.monotonic() + 20
        while len(printer.lines) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(run.mirror("node1", "rank-0.log"), "ab") as handle:
            handle.write(numbered(20, 25))
        mirror.close()
        os.close(holder)

    timer = threading.Timer(0.5, holding)
    timer.start()
    took, offset = follow.while_held(run, view, positions, offset, take)
    timer.join()
    assert took
    assert shown_then == [20]  # what the holder mirrored showed as it mirrored it
    replay_rest(run, view, positions, offset)
    view.close()
    os.close(taken[0])
    assert printer.lines == [f"[node1 r0] line {i:03d}" for i in range(25)]


def test_a_run_that_ends_under_the_holder_ends_the_wait(run: store.RunDir,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    holder = run.lock_fd("mirror.lock")
    assert holder is not None
    mirror = Mirror(run)
    mirror.append("node1", "rank-0.log", 0, numbered(0, 5))
    printer = Lines()
    view = LogView(printer)  # type: ignore[arg-type]
    positions, offset = replay(run, view)
    mirror.append("node1", "rank-0.log", len(numbered(0, 5)), numbered(5, 8))
    monkeypatch.setattr(lifecycle, "live", lambda _run: False)  # settled by the holder
    took, _ = follow.while_held(run, view, positions, offset,
                                lambda: run.lock_fd("mirror.lock") is not None)
    view.close()
    mirror.close()
    os.close(holder)
    assert not took
    assert printer.lines == [f"[node1 r0] line {i:03d}" for i in range(8)]
