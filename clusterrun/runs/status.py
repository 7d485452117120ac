"""A run's state as `ps` shows it: this machine's record, refreshed from the hosts where the run
may still be going without a live controller."""

from __future__ import annotations

import time
from typing import Any, Optional

from clusterrun.runs import remote, store
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions


def live_state(run: RunDir) -> Optional[str]:
    """The run's state if it may still be going on its hosts, else None."""
    state = run.state
    if state.get("ended_at") or state.get("state") not in store.LIVE_STATES:
        return None
    return state.get("state")


def refresh(run: RunDir, ssh: SshOptions) -> dict[str, Any]:
    """For a run this machine last saw going without a live controller: ask its hosts."""
    state = run.state
    if live_state(run) is None:
        return state
    if not state.get("detached") and store.pid_alive(state.get("controller_pid")):
        return state
    per_node = remote.status(run, ssh)
    final = remote.combined_state(per_node)
    if final is None:
        return dict(state, state="running")
    if not state.get("detached") and final != "succeeded":
        final = "lost"  # its controller died and the hosts ended it (the lifeline rule)
    ended = max((s.get("ended_at") or 0 for s in per_node.values()), default=0) or store.now()
    return run.update_state(state=final, ended_at=ended)


def ps_rows(home: Any, ssh: SshOptions, refresh_remote: bool = True) -> list[dict[str, Any]]:
    rows = []
    for run in store.all_runs(home):
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
