"""Replaying a run's mirrors in the order their bytes arrived: the interleaving the live console
showed."""

from __future__ import annotations

import collections
from typing import Optional

from clusterrun.logs.view import LogView
from clusterrun.runs.store import RunDir


class Collector:
    """A printer stand-in that keeps the last ``n`` lines (for --tail)."""

    def __init__(self, n: int) -> None:
        self.lines: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=n)

    def line(self, key: str, prefix: str, text: str) -> None:
        self.lines.append((key, prefix, text))


def replay_from(run: RunDir, view: LogView, positions: dict[tuple[str, str], int],
                offset: int) -> int:
    """Feed the view what the arrivals index records from byte ``offset`` of the index on, in
    arrival order; returns the new index offset. ``positions`` tracks each file's progress."""
    path = run.file("arrivals")
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset
    complete = data[: data.rfind(b"\n") + 1]
    for raw in complete.splitlines():
        node, name, end = raw.decode().split("\t")
        _feed(run, view, positions, node, name, end=int(end))
    return offset + len(complete)


def _feed(run: RunDir, view: LogView, positions: dict[tuple[str, str], int], node: str,
          name: str, *, end: Optional[int]) -> None:
    start = positions.get((node, name), 0)
    path = run.mirror(node, name)
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read() if end is None else handle.read(max(0, end - start))
    except FileNotFoundError:
        return
    if data:
        positions[(node, name)] = start + len(data)
        view.feed(node, name, data)


def replay(run: RunDir, view: LogView) -> tuple[dict[tuple[str, str], int], int]:
    """Everything mirrored so far, in the order it arrived."""
    positions: dict[tuple[str, str], int] = {}
    offset = replay_from(run, view, positions, 0)
    # Bytes written to a mirror whose arrival entry never made it (the writer was killed).
    nodes_dir = run.path / "nodes"
    if nodes_dir.is_dir():
        for node_dir in sorted(nodes_dir.iterdir()):
            for path in sorted(node_dir.iterdir()):
                _feed(run, view, positions, node_dir.name, path.name, end=None)
    return positions, offset
