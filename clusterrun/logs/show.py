"""`clusterrun logs`: a run's mirrors replayed, then (with -f) followed on its hosts."""

from __future__ import annotations

import os
from typing import Callable, Optional

from clusterrun.console import Printer
from clusterrun.logs import follow as following
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.replay import Collector, replay
from clusterrun.logs.view import Filter, LogView
from clusterrun.runs import lifecycle
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions


def show(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
         printer: Printer, say: Callable[[str], None]) -> int:
    # Whichever command looks first at a run nobody watches fetches what its hosts have; a
    # finished one is then verified, summarised and recorded (runs.lifecycle).
    lifecycle.settle(run, ssh, say)
    lock = None
    if lifecycle.live(run) and not lifecycle.watched(run):
        lock = run.lock_fd("mirror.lock")  # None: another clusterrun is fetching this run
    try:
        status = _show(run, flt, tail=tail, follow=follow, ssh=ssh, printer=printer, say=say,
                       lock=lock)
    finally:
        if lock is not None:
            os.close(lock)
    if follow and lock is not None:  # followed to its end from the hosts: record how it ended
        state = lifecycle.settle(run, ssh, say)
        say(f"run {run.id} {state.value}")
    return status


def _show(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
          printer: Printer, say: Callable[[str], None], lock: Optional[int]) -> int:
    if lock is not None and lifecycle.live(run):
        # Nobody else mirrors this live run: first fetch what its hosts have now, so what is
        # shown (the tail above all) is the run's present, not where its mirrors stopped.
        mirror = Mirror(run)
        following.follow(run, ssh, mirror, None, say, keep_following=False)
        mirror.close()
    if tail is not None:
        collector = Collector(tail)
        view = LogView(collector, flt)  # type: ignore[arg-type]
        positions, offset = replay(run, view, collector.chunk)
        if not follow or not lifecycle.live(run):
            view.close()
        for key, prefix, text in collector.lines:
            printer.line(key, prefix, text)
        view.printer = printer  # what follows continues each file where the tail left it
    else:
        view = LogView(printer, flt)
        positions, offset = replay(run, view)
    if not follow or not lifecycle.live(run):
        view.close()
        return 0
    if lock is None:  # a launch in another terminal is streaming this run: read its mirrors
        following.wait_local(run, view, positions, offset)
        return 0
    mirror = Mirror(run)
    following.follow(run, ssh, mirror, view, say)
    mirror.close()
    return 0


