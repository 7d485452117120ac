"""Prefixed, per-host colored output lines, written whole so sources never mix within a line."""

from __future__ import annotations

import io
import os
import sys
import threading
from typing import Optional, TextIO, cast

# Bright, distinguishable on dark and light terminals; red is kept for errors.
_PALETTE = (36, 33, 35, 32, 34, 96, 93, 95, 92, 94)


def use_color(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return hasattr(stream, "isatty") and stream.isatty()


class Printer:
    def __init__(self, out: Optional[TextIO] = None, color: Optional[bool] = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.color = use_color(self.out) if color is None else color
        self._lock = threading.Lock()
        self._colors: dict[str, int] = {}
        self.broken = False  # stdout went away (e.g. `| head`): stop writing, keep working

    def _paint(self, key: str, text: str) -> str:
        if not self.color:
            return text
        code = self._colors.setdefault(key, _PALETTE[len(self._colors) % len(_PALETTE)])
        return f"\033[{code}m{text}\033[0m"

    def line(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        """One output line: ``prefix`` (colored by ``key``) then ``text`` (``at``, when it
        arrived, is not shown here)."""
        self.write(f"{self._paint(key, prefix)} {text}\n")

    def block(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        """Lines joined by ``\\n``, each with the prefix, in one write (see ``write``)."""
        head = f"{self._paint(key, prefix)} "
        self.write(head + text.replace("\n", "\n" + head) + "\n")

    def write(self, data: str) -> None:
        if self.broken:
            return
        with self._lock:
            try:
                self.out.write(data)
                self.out.flush()
            except BrokenPipeError:
                self.broken = True
            except UnicodeEncodeError:
                self.out.write(data.encode("ascii", "backslashreplace").decode())
                self.out.flush()


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def discard() -> TextIO:
    """A text stream that keeps nothing: the console of `launch --json`, whose stdout holds the
    run's events alone (its lines are in the run's logs)."""
    return cast(TextIO, _Discard())
