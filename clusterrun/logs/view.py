"""The display side of logs: one prefixed line per line of output, per node and rank."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Optional

from clusterrun.console import Printer
from clusterrun.logs.lines import LineFramer
from clusterrun.remote.shared import layout, timing

PARTIAL_LINE_SECONDS = 1.0


def rank_of(name: str) -> Optional[int]:
    """The rank whose log a host's file is (layout.py names them), or None: the node's own."""
    return layout.rank_of(name)


def prefix(node: str, name: str) -> str:
    """``[gpu-a r3]`` for a rank's output, ``[gpu-a]`` for the node's own (torchrun's)."""
    rank = rank_of(name)
    return f"[{node}]" if rank is None else f"[{node} r{rank}]"


@dataclass(frozen=True)
class Filter:
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    grep: Optional[re.Pattern[str]] = None

    def wants_file(self, node: str, name: str) -> bool:
        if self.nodes and node not in self.nodes:
            return False
        return not self.ranks or rank_of(name) in self.ranks

    def wants_line(self, text: str) -> bool:
        return self.grep is None or bool(self.grep.search(text))


class LogView:
    """Feeds chunks per (node, file) to line framers and prints complete lines; a partial line
    (a prompt, a progress bar) shows after a quiet second."""

    def __init__(self, printer: Printer, flt: Optional[Filter] = None,
                 label: Callable[[str, str], str] = prefix) -> None:
        self.printer = printer
        self.filter = flt or Filter()
        self.label = label  # (node, file) -> the line prefix
        self._framers: dict[tuple[str, str], LineFramer] = {}
        self._touched: dict[tuple[str, str], float] = {}
        # When each file's last chunk reached this machine (seconds since 1970): the time of
        # its lines for a printer that shows one (`logs --json`).
        self._arrived: dict[tuple[str, str], Optional[float]] = {}
        self._lock = threading.Lock()

    def _emit(self, node: str, name: str, text: str) -> None:
        """``text``: one line, or several joined by ``\\n`` (LineFramer.blocks)."""
        at = self._arrived.get((node, name))
        if self.filter.grep is not None:
            for line in text.split("\n"):
                if self.filter.wants_line(line):
                    self.printer.line(node, self.label(node, name), line, at=at)
            return
        self.printer.block(node, self.label(node, name), text, at=at)

    def feed(self, node: str, name: str, data: bytes, at: Optional[float] = None) -> None:
        """``at``: when ``data`` reached this machine, where it was recorded (a replay); now
        by default (a live stream)."""
        if not self.filter.wants_file(node, name):
            return
        with self._lock:
            framer = self._framers.setdefault((node, name), LineFramer())
            self._touched[(node, name)] = time.monotonic()
            self._arrived[(node, name)] = time.time() if at is None else at
            for text in framer.blocks(data):
                self._emit(node, name, text)

    def tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            for key, framer in self._framers.items():
                if framer.pending and timing.due(now, self._touched[key], PARTIAL_LINE_SECONDS):
                    text = framer.flush()
                    if text is not None:
                        self._emit(*key, text)

    @contextlib.contextmanager
    def ticking(self, every: float = 0.25) -> Iterator[LogView]:
        """Partial lines show on time while the body runs (for callers with no loop of
        their own that could call tick())."""
        done = threading.Event()

        def run() -> None:
            while not done.wait(every):
                self.tick()

        ticker = threading.Thread(target=run, daemon=True, name="clusterrun-tick")
        ticker.start()
        try:
            yield self
        finally:
            done.set()
            # A tick under way ends before the caller goes on: no partial line is printed
            # after the block, below what the caller says next (a run's end, a summary).
            ticker.join()

    def close(self, node: Optional[str] = None) -> None:
        """End of stream (for one node, or all): print what is left."""
        with self._lock:
            for key, framer in self._framers.items():
                if node is None or key[0] == node:
                    text = framer.close()
                    if text is not None:
                        self._emit(*key, text)
