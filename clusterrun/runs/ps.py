"""`clusterrun ps`: every run with its state, settled from its hosts where nobody watches it."""

from __future__ import annotations

import time
from typing import Any

from clusterrun.runs import lifecycle, store
from clusterrun.transport import SshOptions


def ps_rows(home: Any, ssh: SshOptions, refresh_remote: bool = True) -> list[dict[str, Any]]:
    rows = []
    for run in store.all_runs(home):
        if refresh_remote:
            lifecycle.settle(run, ssh)
        state = run.state
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
