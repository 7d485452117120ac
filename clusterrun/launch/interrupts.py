"""Ctrl-C and SIGTERM while a launch watches its run."""

from __future__ import annotations

import signal
from typing import Any, Callable


class Interrupts:
    """Ctrl-C and SIGTERM become entries in a list the watch loop reads; a signal handler
    must not take locks the interrupted code may hold."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.received: list[int] = []
        self.say = say
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handler(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def announce(self, signum: int, first: bool) -> None:
        name = signal.Signals(signum).name
        if first:
            self.say(f"{name}: stopping the run on every node (SIGTERM, then SIGKILL after the "
                     "grace period); press Ctrl-C again to kill at once")
        else:
            self.say(f"{name} again: killing the run on every node now")
