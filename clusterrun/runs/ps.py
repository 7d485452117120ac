"""`clusterrun ps`: every run with its state, settled from its hosts where nobody watches it."""

from __future__ import annotations

import time
from typing import Any, Optional

from clusterrun.inventory.ranges import fold
from clusterrun.runs import attempts, lifecycle, store
from clusterrun.runs.records import PlanRecord, RunStatus
from clusterrun.runs.summary import Summary


def ps_rows(home: Any) -> list[dict[str, Any]]:
    """One row per run, newest first, as this machine recorded it (`clusterrun ps` settles the
    runs nobody watches first: logs.settle). ``hosts`` are the current attempt's; ``attempt``
    is that attempt's number, ``attempts`` and ``quarantined`` the run's lists (empty for a
    run that never restarted); ``environment`` the `environment:` lock's hash the ranks ran
    in (None without one). A run whose plan or state cannot be read is listed with what is
    wrong (``problem``; None for every other run) and nothing it cannot know."""
    rows = []
    for run in store.all_runs(home):
        if run.problem is not None:
            rows.append(unreadable_row(run, run.problem))
            continue
        status = RunStatus.of(run)
        plan = PlanRecord.of(run)
        started = status.started_at or plan.created
        ended = status.ended_at
        rows.append({
            "id": run.id, "name": plan.name,
            "state": status.state.value if status.state is not None else "unknown",
            "hosts": attempts.hosts(run, status.attempt), "started_at": started,
            "ended_at": ended, "duration": round((ended or time.time()) - started, 1)
            if started else None, "exit_status": status.exit_status,
            "detached": status.detached, "attempt": status.attempt,
            "max_attempts": attempts.most(run), "attempts": attempts.entries(run),
            "quarantined": list(status.quarantined), "root_cause": root_cause(run),
            "nccl": nccl_summary(run), "outcome": status.outcome, "stalled": status.stalled,
            "environment": plan.environment, "problem": None})
    return rows


def unreadable_row(run: store.RunDir, problem: str) -> dict[str, Any]:
    """The row of a run whose plan.json or state.json cannot be read: its id and the problem;
    no state, hosts or times (none is known: no date from nothing)."""
    return {"id": run.id, "name": None, "state": "unknown", "hosts": [], "started_at": None,
            "ended_at": None, "duration": None, "exit_status": None, "detached": False,
            "attempt": 1, "max_attempts": 1, "attempts": [], "quarantined": [],
            "root_cause": None, "nccl": None, "outcome": None, "stalled": None,
            "environment": None, "problem": problem}


def problem_line(row: dict[str, Any]) -> str:
    """The line under the row of a run that cannot be read ('' for every other run)."""
    return f"  run {row['id']}: {row['problem']}" if row.get("problem") else ""


def nccl_summary(run: store.RunDir, k: Optional[int] = None) -> Optional[dict[str, Any]]:
    """What NCCL chose on each host of attempt ``k`` (default: the run's last), as its
    summary.json keeps it (launch/nccl.py: {"hosts": {name: {..., "line"}}, "flags"}); None
    for a run still going, one that never used NCCL, or one with no summary."""
    folder = run if k is None else attempts.attempt_dir(run, k)
    summary = Summary.of(folder)
    found = summary.nccl if summary is not None else None
    return found if found is not None and isinstance(found.get("hosts"), dict) else None


def nccl_lines(found: Optional[dict[str, Any]]) -> list[str]:
    """Each host's line as the launch said it (``nccl gpu-a: eth1 ..., IB (mlx5_0:1), ...``),
    then each warning: what `logs` prints above a run's lines."""
    if not found:
        return []
    lines = [str(h.get("line")) for h in found["hosts"].values()
             if isinstance(h, dict) and h.get("line")]
    return lines + [f"nccl warning: {flag}" for flag in found.get("flags") or []]


def nccl_line(row: dict[str, Any]) -> str:
    """The line under a run's row: its hosts by the network NCCL used, and how many warnings
    (``  nccl: IB on gpu[a-b]; Socket on gpu-c; 1 warning (clusterrun logs RUN)``); '' for
    a run without NCCL."""
    found = row.get("nccl")
    if not found:
        return ""
    by_network: dict[str, list[str]] = {}
    for name, host in found["hosts"].items():
        networks = host.get("networks") if isinstance(host, dict) else None
        by_network.setdefault("/".join(networks or ()) or "network not reported",
                              []).append(name)
    text = "; ".join(f"{net} on {fold(names)}" for net, names in by_network.items())
    flags = len(found.get("flags") or [])
    if flags:
        text += f"; {flags} warning{'s' if flags > 1 else ''} (clusterrun logs {row['id']})"
    return f"  nccl: {text}"


def root_cause(run: store.RunDir) -> Optional[dict[str, Any]]:
    """An ended run's root cause ({node, rank, code, signal, detail, lost}) as its summary
    records it; None while it runs, or when nothing failed."""
    if lifecycle.live(run):
        return None
    summary = Summary.of(run)
    root = summary.root_cause if summary is not None else None
    return root.public() if root is not None and root.detail else None


def cause_line(row: dict[str, Any]) -> str:
    """The line under an ended run's row that names its root cause ('' for none)."""
    root = row.get("root_cause")
    return f"  root cause: {root['detail']}" if root else ""


def state_text(row: dict[str, Any]) -> str:
    """The STATE column: ``running``, or ``running (attempt 2/3)`` for a run that restarted;
    ``stalled (stopped)`` for a run that `--on-stall stop` ended (recorded ``failed``: ended)."""
    if row.get("problem"):
        return "unreadable"
    state = "stalled (stopped)" if row.get("outcome") == "stalled" else str(row["state"])
    if row["attempt"] > 1:
        return f"{state} (attempt {row['attempt']}/{row['max_attempts']})"
    return state


def environment_line(row: dict[str, Any]) -> str:
    """The line under a run's row that names its `environment:` lock ('' for none)."""
    return f"  environment: {row['environment']}" if row.get("environment") else ""


def quarantine_line(row: dict[str, Any]) -> str:
    """The line under a run's row that names its quarantined hosts ('' for none)."""
    if not row["quarantined"]:
        return ""
    return "  quarantined: " + "; ".join(attempts.quarantine_text(e) for e in row["quarantined"])
