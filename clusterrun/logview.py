"""The display side of logs: one prefixed line per line of output, per node and rank."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Optional

from clusterrun.console import Printer
from clusterrun.framing import LineFramer

PARTIAL_LINE_SECONDS = 1.0
_RANK_FILE = re.compile(r"rank-(\d+)\.log$")


def rank_of(name: str) -> Optional[int]:
    match = _RANK_FILE.match(name)
    return int(match.group(1)) if match else None


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

    def __init__(self, printer: Printer, flt: Optional[Filter] = None) -> None:
        self.printer = printer
        self.filter = flt or Filter()
        self._framers: dict[tuple[str, str], LineFramer] = {}
        self._touched: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def _emit(self, node: str, name: str, text: str) -> None:
        if self.filter.wants_line(text):
            self.printer.line(node, prefix(node, name), text)

    def feed(self, node: str, name: str, data: bytes) -> None:
        if not self.filter.wants_file(node, name):
            return
        with self._lock:
            framer = self._framers.setdefault((node, name), LineFramer())
            self._touched[(node, name)] = time.monotonic()
            for text in framer.feed(data):
                self._emit(node, name, text)

    def tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            for key, framer in self._framers.items():
                if framer.pending and now - self._touched[key] >= PARTIAL_LINE_SECONDS:
                    text = framer.flush()
                    if text is not None:
                        self._emit(*key, text)

    def close(self, node: Optional[str] = None) -> None:
        """End of stream (for one node, or all): print what is left."""
        with self._lock:
            for key, framer in self._framers.items():
                if node is None or key[0] == node:
                    text = framer.close()
                    if text is not None:
                        self._emit(*key, text)
