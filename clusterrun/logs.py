"""`clusterrun logs`, `ps` and `stop`: runs as this machine remembers them, refreshed from their
hosts where they may still be going."""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, Optional

from clusterrun import remote_runs, runs
from clusterrun.console import Printer
from clusterrun.logview import Filter, LogView
from clusterrun.mirror import Mirror
from clusterrun.runs import RunDir
from clusterrun.transport import SshOptions


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


def show(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
         printer: Printer, say: Callable[[str], None]) -> int:
    lock = None
    if live_state(run) is not None:
        # Held by a launch streaming this run in another terminal; free when the run is
        # detached or its controller died: then the hosts' files are fetched from here.
        lock = run.lock_fd("mirror.lock")
        if lock is not None:
            mirror = Mirror(run)
            remote_runs.follow(run, ssh, mirror, None, say, keep_following=False)
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
        remote_runs.wait_local(run, view, positions, offset)
        return 0
    mirror = Mirror(run)
    ends = remote_runs.follow(run, ssh, mirror, view, say)
    mirror.close()
    states = {name: {"state": e.get("state")} for name, e in ends.items()}
    final = remote_runs.combined_state(states) if len(states) == len(run.plan["nodes"]) \
        else None
    if final:
        run.update_state(state=final, ended_at=run.state.get("ended_at") or runs.now())
        say(f"run {run.id} {final}")
    return 0


def live_state(run: RunDir) -> Optional[str]:
    """The run's state if it may still be going on its hosts, else None."""
    state = run.state
    if state.get("ended_at") or state.get("state") not in runs.LIVE_STATES:
        return None
    return state.get("state")


def refresh(run: RunDir, ssh: SshOptions) -> dict[str, Any]:
    """For a run this machine last saw going without a live controller: ask its hosts."""
    state = run.state
    if live_state(run) is None:
        return state
    if not state.get("detached") and runs.pid_alive(state.get("controller_pid")):
        return state
    per_node = remote_runs.status(run, ssh)
    final = remote_runs.combined_state(per_node)
    if final is None:
        return dict(state, state="running")
    if not state.get("detached") and final != "succeeded":
        final = "lost"  # its controller died and the hosts ended it (the lifeline rule)
    ended = max((s.get("ended_at") or 0 for s in per_node.values()), default=0) or runs.now()
    return run.update_state(state=final, ended_at=ended)


def ps_rows(home: Any, ssh: SshOptions, refresh_remote: bool = True) -> list[dict[str, Any]]:
    rows = []
    for run in runs.all_runs(home):
        state = refresh(run, ssh) if refresh_remote else run.state
        plan = run.plan
        started = state.get("started_at") or plan.get("created")
        ended = state.get("ended_at")
        rows.append({
            "id": run.id, "name": plan.get("name"), "state": state.get("state", "unknown"),
            "hosts": [n["name"] for n in plan.get("nodes", [])], "started_at": started,
            "ended_at": ended, "duration": round((ended or time.time()) - started, 1)
            if started else None, "exit_status": state.get("exit_status"),
            "detached": bool(state.get("detached"))})
    return rows
