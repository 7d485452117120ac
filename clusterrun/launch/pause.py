"""A controller that was not running for a while: stopped (SIGSTOP, Ctrl-Z) or its machine
suspended.

Its own silence is not the nodes': when it runs again, the nodes get a fresh lease to be heard
from. And where no heartbeat left it for longer than the lease, every node's supervisor has
ended the run on its own (remote/node/run.py, ``lease_expired``): the controller says so at once,
then collects the nodes' reports, which say the same.
"""

from __future__ import annotations

import platform
import sys
import time
from typing import Callable, Optional

# A watch-loop turn this late means the process was not scheduled at all (the loop turns every
# 0.2 s and heartbeats leave every 2 s).
PAUSED = 5.0


def sleep_clock() -> Optional[int]:
    """The clock_gettime() clock that keeps counting while this machine sleeps, None where
    there is none. Each system names it differently, and the same name can mean the opposite:
    - Linux: CLOCK_BOOTTIME. Its CLOCK_MONOTONIC (Python's time.monotonic) stops in suspend.
    - macOS: CLOCK_MONOTONIC, which Apple's clock_gettime(3) says "will continue to increment
      while the system is asleep". time.monotonic there is mach_absolute_time, which stops, as
      does CLOCK_UPTIME_RAW.
    """
    system = sys.platform  # through a name: mypy would call the other systems unreachable
    if system.startswith("linux"):
        return getattr(time, "CLOCK_BOOTTIME", None)
    if system == "darwin":
        return getattr(time, "CLOCK_MONOTONIC", None)
    return None


def awake() -> float:
    """Seconds on a clock that also counts a suspended machine's sleep, where there is one (a
    pause of the process alone, SIGSTOP, shows on time.monotonic too)."""
    clock = sleep_clock()
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def unseen_sleep() -> Optional[str]:
    """Where this machine's sleep cannot be seen (no clock counts it), what to add when the
    nodes say they lost this controller while it saw no pause of its own; None elsewhere."""
    if sleep_clock() is not None:
        return None
    system = platform.system() or sys.platform
    return (f"this controller cannot tell whether its machine slept ({system} offers no clock "
            "that counts sleep): if it did, that silence was this controller's, not the nodes'. "
            "Keep it awake, or launch with --detach")


class Pauses:
    """Gaps in this controller's own running, as its watch loop and heartbeat thread see them
    (either may run first after a SIGCONT)."""

    def __init__(self) -> None:
        self.loop: Optional[float] = None  # the watch loop's last turn
        self.beat: Optional[float] = None  # the last heartbeat round
        self.beat_gap = 0.0  # the longest wait between two heartbeat rounds, not yet reported
        self.unseen_told = False  # unseen_sleep()'s words were said

    def beating(self) -> None:
        """Called by the heartbeat thread before each round."""
        now = awake()
        if self.beat is not None:
            self.beat_gap = max(self.beat_gap, now - self.beat)
        self.beat = now

    def turn(self) -> Optional[tuple[float, float]]:
        """Called by the watch loop at each turn: (how long it did not run, how long no
        heartbeat left) after a pause, else None."""
        now = awake()
        gap = 0.0 if self.loop is None else now - self.loop
        self.loop = now
        if gap <= PAUSED:
            return None
        silent = max(self.beat_gap, 0.0 if self.beat is None else now - self.beat)
        self.beat_gap = 0.0
        return gap, silent


    def unseen(self, cause: Optional[str], abandoned: bool, notify: Callable[[str], None]
               ) -> None:
        """A node ended the run with ``cause``. Where it heard no heartbeat for the lease, yet
        this controller saw no pause of its own (``abandoned`` False) and no clock here counts
        sleep, tell the user so, once, rather than leave the nodes looking at fault."""
        if cause != "lease_expired" or abandoned or self.unseen_told:
            return
        self.unseen_told = True
        text = unseen_sleep()
        if text:
            notify(text)


def notice(gap: float, silent: float, lease: float) -> Optional[str]:
    """What to tell the user when the controller runs again (None: nothing the nodes noticed)."""
    if silent > lease:
        return (f"this controller was stopped or suspended for {gap:.0f} s: the nodes heard no "
                f"heartbeat for longer than the lease ({lease:g} s), so each one ends the run on "
                "its own. Keep the controller running (tmux, screen) or launch with --detach; a "
                "longer --lease tolerates longer pauses")
    if silent > PAUSED:
        return (f"this controller was stopped or suspended for {gap:.0f} s; the run goes on (a "
                f"node ends it after {lease:g} s without a heartbeat)")
    return None
