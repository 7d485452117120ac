"""`clusterrun ps`: every run with its state, settled from its hosts where nobody watches it."""

from __future__ import annotations

import time
from typing import Any, Optional

from clusterrun.runs import attempts, lifecycle, store


def ps_rows(home: Any) -> list[dict[str, Any]]:
    """One row per run, newest first, as this machine recorded it (`clusterrun ps` settles the
    runs nobody watches first: logs.settle). ``hosts`` are the current attempt's; ``attempt``
    is that attempt's number, ``attempts`` and ``quarantined`` the run's lists (empty for a
    run that never restarted)."""
    rows = []
    for run in store.all_runs(home):
        state = run.state
        plan = run.plan
        started = state.get("started_at") or plan.get("created")
        ended = state.get("ended_at")
        rows.append({
            "id": run.id, "name": plan.get("name"), "state": state.get("state", "unknown"),
            "hosts": attempts.hosts(run, attempts.count(run)), "started_at": started,
            "ended_at": ended, "duration": round((ended or time.time()) - started, 1)
            if started else None, "exit_status": state.get("exit_status"),
            "detached": bool(state.get("detached")), "attempt": attempts.count(run),
            "max_attempts": attempts.most(run), "attempts": attempts.entries(run),
            "quarantined": attempts.quarantined(run), "root_cause": root_cause(run)})
    return rows


def root_cause(run: store.RunDir) -> Optional[dict[str, Any]]:
    """An ended run's root cause ({node, rank, code, signal, detail, lost}) as its summary
    records it; None while it runs, or when nothing failed."""
    if lifecycle.live(run):
        return None
    summary = store.read_json(run.file("summary.json"))
    root = summary.get("root_cause") if isinstance(summary, dict) else None
    return root if isinstance(root, dict) and root.get("detail") else None


def cause_line(row: dict[str, Any]) -> str:
    """The line under an ended run's row that names its root cause ('' for none)."""
    root = row.get("root_cause")
    return f"  root cause: {root['detail']}" if root else ""


def state_text(row: dict[str, Any]) -> str:
    """The STATE column: ``running``, or ``running (attempt 2/3)`` for a run that restarted."""
    if row["attempt"] > 1:
        return f"{row['state']} (attempt {row['attempt']}/{row['max_attempts']})"
    return str(row["state"])


def quarantine_line(row: dict[str, Any]) -> str:
    """The line under a run's row that names its quarantined hosts ('' for none)."""
    if not row["quarantined"]:
        return ""
    return "  quarantined: " + "; ".join(attempts.quarantine_text(e) for e in row["quarantined"])
