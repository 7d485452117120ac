"""Replaying a run's mirrors in the order their bytes arrived: the interleaving the live console
showed."""

from __future__ import annotations

import collections
import os
from typing import Callable, Optional

from clusterrun.logs.view import LogView
from clusterrun.runs.store import RunDir

Stream = tuple[str, str]  # (node, line prefix): one file's lines
Line = tuple[str, str, str, Optional[float]]  # (node, prefix, text, arrived), as a Printer gets it
OnChunk = Callable[[str, str], None]


class Collector:
    """A printer stand-in that keeps what ``--tail N`` shows: the last N lines across all nodes,
    in the order they arrived. Lines that arrived together (one chunk per file, as when a live
    run's files are fetched from its hosts at once) are interleaved as if each file had been
    written at an even pace over the same time, so every node shows, not just the one whose
    chunk happened to land last."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._batches: list[dict[Stream, _Stream]] = [{}]
        self._files: set[tuple[str, str]] = set()

    def chunk(self, node: str, name: str) -> None:
        """Called before each chunk is fed: a file seen again starts a new batch."""
        if (node, name) in self._files:
            self._batches.append({})
            self._files = set()
            self._prune()
        self._files.add((node, name))

    def line(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        stream = self._batches[-1].setdefault((key, prefix), _Stream(self.n))
        stream.seen += 1
        stream.lines.append((key, prefix, text, at))

    def block(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        for line in text.split("\n"):
            self.line(key, prefix, line, at)

    def _prune(self) -> None:
        """Forget batches that the later ones push out of the last N lines."""
        sizes = [sum(len(s.lines) for s in batch.values()) for batch in self._batches]
        keep = len(sizes) - 1
        later = sizes[-1]
        while keep > 0 and later < self.n:
            keep -= 1
            later += sizes[keep]
        self._batches = [b for i, b in enumerate(self._batches)
                         if i >= keep and (sizes[i] or i == len(sizes) - 1)]

    @property
    def lines(self) -> list[Line]:
        if self.n == 0:
            return []
        out: list[Line] = []
        for batch in self._batches:
            out.extend(_interleaved(list(batch.values())))
        return out[-self.n:]


class _Stream:
    """One file's lines in one batch: how many arrived, and the last N of them."""

    def __init__(self, n: int) -> None:
        self.seen = 0
        self.lines: collections.deque[Line] = collections.deque(maxlen=n)


def _interleaved(streams: list[_Stream]) -> list[Line]:
    """Lines of files that arrived together, each line placed at its relative position in its
    own file's batch (the middle of the k-th of m slots)."""
    keyed = []
    for order, stream in enumerate(streams):
        first = stream.seen - len(stream.lines)
        for i, line in enumerate(stream.lines):
            keyed.append(((first + i + 0.5) / stream.seen, order, i, line))
    return [line for *_, line in sorted(keyed, key=lambda k: k[:3])]


def replay_from(run: RunDir, view: LogView, positions: dict[tuple[str, str], int],
                offset: int, on_chunk: Optional[OnChunk] = None) -> int:
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
        # node, file, its size after the chunk, and (since arrivals had times) when it came
        node, name, end, *when = raw.decode().split("\t")
        _feed(run, view, positions, node, name, end=int(end), on_chunk=on_chunk,
              at=float(when[0]) if when else None)
    return offset + len(complete)


def _feed(run: RunDir, view: LogView, positions: dict[tuple[str, str], int], node: str,
          name: str, *, end: Optional[int], on_chunk: Optional[OnChunk] = None,
          at: Optional[float] = None) -> None:
    """``at``: when the chunk reached this machine; unknown (None), the file's last change."""
    start = positions.get((node, name), 0)
    path = run.mirror(node, name)
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read() if end is None else handle.read(max(0, end - start))
            if at is None:
                at = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return
    if data:
        positions[(node, name)] = start + len(data)
        if on_chunk is not None:
            on_chunk(node, name)
        view.feed(node, name, data, at=at)


def replay(run: RunDir, view: LogView, on_chunk: Optional[OnChunk] = None,
           ) -> tuple[dict[tuple[str, str], int], int]:
    """Everything mirrored so far, in the order it arrived; ``on_chunk(node, file)`` before
    each chunk."""
    positions: dict[tuple[str, str], int] = {}
    return positions, replay_rest(run, view, positions, 0, on_chunk)


def replay_rest(run: RunDir, view: LogView, positions: dict[tuple[str, str], int],
                offset: int, on_chunk: Optional[OnChunk] = None) -> int:
    """What ``replay_from`` gives, then every mirror to its end: bytes written to a mirror
    whose arrival entry never made it (the writer was killed). Returns the new index offset."""
    offset = replay_from(run, view, positions, offset, on_chunk)
    nodes_dir = run.path / "nodes"
    if nodes_dir.is_dir():
        for node_dir in sorted(nodes_dir.iterdir()):
            for path in sorted(node_dir.iterdir()):
                _feed(run, view, positions, node_dir.name, path.name, end=None,
                      on_chunk=on_chunk)
    return offset
