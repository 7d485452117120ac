"""`clusterrun logs`: a run's mirrors replayed, then (with -f) followed on its hosts."""

from __future__ import annotations

import os
from typing import Callable, Optional

from clusterrun.console import Printer
from clusterrun.logs import follow as following
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.replay import Collector, replay
from clusterrun.logs.view import Filter, LogView
from clusterrun.runs import remote, store
from clusterrun.runs.status import live_state
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions


def show(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
         printer: Printer, say: Callable[[str], None]) -> int:
    lock = None
    if live_state(run) is not None:
        # Held by a launch streaming this run in another terminal; free when the run is
        # detached or its controller died: then the hosts' files are fetched from here.
        lock = run.lock_fd("mirror.lock")
        if lock is not None:
            mirror = Mirror(run)
            following.follow(run, ssh, mirror, None, say, keep_following=False)
            mirror.close()
    try:
        return _show(run, flt, tail=tail, follow=follow, ssh=ssh, printer=printer, say=say,
                     lock=lock)
    finally:
        if lock is not None:
            os.close(lock)


def _show(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
          printer: Printer, say: Callable[[str], None], lock: Optional[int]) -> int:
    if tail is not None:
        collector = Collector(tail)
        view = LogView(collector, flt)  # type: ignore[arg-type]
        positions, offset = replay(run, view)
        if not follow or live_state(run) is None:
            view.close()
        for key, prefix, text in collector.lines:
            printer.line(key, prefix, text)
        view.printer = printer  # what follows continues each file where the tail left it
    else:
        view = LogView(printer, flt)
        positions, offset = replay(run, view)
    if not follow or live_state(run) is None:
        view.close()
        return 0
    if lock is None:  # a launch in another terminal is streaming this run: read its mirrors
        following.wait_local(run, view, positions, offset)
        return 0
    mirror = Mirror(run)
    ends = following.follow(run, ssh, mirror, view, say)
    mirror.close()
    states = {name: {"state": e.get("state")} for name, e in ends.items()}
    final = remote.combined_state(states) if len(states) == len(run.plan["nodes"]) \
        else None
    if final:
        run.update_state(state=final, ended_at=run.state.get("ended_at") or store.now())
        say(f"run {run.id} {final}")
    return 0


