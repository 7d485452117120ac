"""Ctrl-C and SIGTERM while a launch watches its run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable


class Interrupted(KeyboardInterrupt):
    """A signal that ended a stretch run under ``Interrupts.raising`` (the check of the hosts
    before a restart): that stretch only waits, so it is cut short, not waited out."""


class Interrupts:
    """Ctrl-C and SIGTERM become entries in a list the watch loop reads; a signal handler
    must not take locks the interrupted code may hold."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.received: list[int] = []
        self.say = say
        self._old: dict[int, Any] = {}
        self._raise = False

    def __enter__(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handler(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        if self._raise:
            self._raise = False  # once: a second signal must not break the unwinding
            raise Interrupted()

    @contextmanager
    def raising(self) -> Iterator[None]:
        """A stretch that a signal ends at once (Interrupted), as Ctrl-C ends preflight before
        a run exists; the signal is in ``received`` as always."""
        if self.received:
            raise Interrupted()
        self._raise = True
        try:
            yield
        finally:
            self._raise = False

    def announce(self, signum: int, first: bool) -> None:
        name = signal.Signals(signum).name
        if first:
            self.say(f"{name}: stopping the run on every node (SIGTERM, then SIGKILL after the "
                     "grace period); press Ctrl-C again to kill at once")
        else:
            self.say(f"{name} again: killing the run on every node now")
