"""Recording a run's state by the one rule (``runs.state``), and settling a run that nobody is
watching: whichever command looks first (`ps`, `logs`, `stop`) fetches a finished run's logs,
verifies them against the hosts' checksums, writes its summary and records how it ended."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from clusterrun.errors import ExitStatus
from clusterrun.logs import follow as following
from clusterrun.logs.mirror import Mirror, verify
from clusterrun.runs import attempts, remote, store
from clusterrun.runs.state import RunState, combine, merge
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions

Say = Callable[[str], None]

__all__ = ["RunState", "live", "record", "recorded", "settle", "watched"]


def recorded(run: RunDir) -> Optional[RunState]:
    """The run's state as this machine recorded it (the run folder's, also when given one of
    its attempts: an attempt ending is not the run ending)."""
    return RunState.parse(attempts.top(run).state.get("state"))


def record(run: RunDir, seen: RunState, **fields: Any) -> RunState:
    """Record ``seen`` (with ``fields``) in ``run``'s state.json (a run folder's, or one
    attempt's own) unless it has already ended: then nothing changes and the state it ended
    with is returned."""
    with run.locked("state.lock"):
        current = run.state
        state = merge(RunState.parse(current.get("state")), seen)
        if state is seen:
            current.update(fields)
            current["state"] = state.value
            if state.final:
                current.setdefault("ended_at", store.now())
            store.write_json(run.file("state.json"), current)
        return state


def live(run: RunDir) -> bool:
    """True while this machine has not seen the run end."""
    state = recorded(run)
    return state is None or not state.final


def watched(run: RunDir) -> bool:
    """An attached launch is still streaming this run (its controller holds the mirrors)."""
    state = attempts.top(run).state
    return not state.get("detached") and store.pid_alive(state.get("controller_pid"))


def settle(run: RunDir, ssh: SshOptions, say: Optional[Say] = None) -> RunState:
    """For a run this machine last saw going, with no controller watching it: ask the hosts of
    its current attempt. If every node has ended, fetch the rest of that attempt's logs, verify
    them, write the summaries and record the final state; else it is running."""
    run = attempts.top(run)  # the run's state and locks live in the run folder
    if not live(run) or watched(run):
        return recorded(run) or RunState.RUNNING
    lock = run.lock_fd("mirror.lock")
    if lock is None:  # another clusterrun process is writing the mirrors right now
        return RunState.RUNNING
    try:
        attempt = attempts.current(run)
        per_node = remote.status(attempt, ssh)
        # A host that could not be asked (crashed, partitioned, sshd gone) has no state.
        unreachable = [name for name, s in per_node.items() if s.get("unreachable")]
        states = {name: RunState.parse(s.get("state")) for name, s in per_node.items()}
        state = combine(states, unreachable=unreachable)
        if not state.final:
            return state
        root = _root_cause(per_node)
        if root is not None:
            state = RunState.LOST if root.get("lost") else RunState.FAILED
        mirror = Mirror(attempt)
        try:
            following.follow(attempt, ssh, mirror, None, say or (lambda _text: None),
                             keep_following=False)
        finally:
            mirror.close()
        checks = verify(attempt, {name: s.get("checksums") or {} for name, s in per_node.items()
                                  if name not in unreachable})
        status = _exit_status(state, root)
        ended = max((float(s.get("ended_at") or 0) for s in per_node.values()), default=0.0)
        ended = ended or store.now()
        summary = _summary(attempt, per_node, unreachable, root=root, status=status,
                           checks=checks)
        if attempt is not run:
            store.write_json(attempt.file("summary.json"), summary)
            record(attempt, state, ended_at=ended, exit_status=status)
        attempts.end_entry(run, attempt.attempt, exit_status=status,
                           root_cause=attempts.cause_text(root), ended_at=ended)
        if attempts.entries(run) or attempts.quarantined(run):
            summary = dict(summary, attempts=attempts.entries(run),
                           quarantined=attempts.quarantined(run))
        store.write_json(run.file("summary.json"), summary)
        return record(run, state, ended_at=ended, exit_status=status)
    finally:
        os.close(lock)


def _root_cause(per_node: dict[str, dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The root cause as the hosts recorded it: the master's supervisor keeps a detached run's
    (first failure in its own arrival order, so no two hosts' clocks are compared)."""
    for state in per_node.values():
        root = state.get("root_cause")
        if isinstance(root, dict):
            return root
    return None


def _exit_status(state: RunState, root: Optional[dict[str, Any]]) -> int:
    if state is RunState.SUCCEEDED:
        return int(ExitStatus.SUCCESS)
    if state is RunState.STOPPED:
        return int(ExitStatus.SIGTERM)
    if state is RunState.LOST or root is None:
        return int(ExitStatus.NODE_LOST if state is RunState.LOST else ExitStatus.ERROR)
    code = root.get("code")
    return int(code) if isinstance(code, int) and 0 < code < 256 else int(ExitStatus.ERROR)


def _summary(run: RunDir, per_node: dict[str, dict[str, Any]], unreachable: list[str], *,
             root: Optional[dict[str, Any]], status: int, checks: dict[str, Any]) -> dict[str, Any]:
    """summary.json for a run (one attempt's folder) whose controller was not there at the end
    (same shape as the one an attached launch writes; nothing here holds environment values)."""
    plan_nodes = {n["name"]: n for n in run.plan.get("nodes", [])}
    nodes = []
    for name, state in per_node.items():
        node = plan_nodes.get(name, {})
        lost = name in unreachable
        nodes.append({
            "name": name, "node_rank": node.get("node_rank"), "ranks": node.get("ranks"),
            "state": "lost" if lost else state.get("state"),
            "exit_code": None if lost else state.get("exit_code"),
            "reason": state.get("reason") or (state.get("error") if lost else None),
            "rank_exits": {str(r): c for r, c in sorted((state.get("ranks") or {}).items())},
        })
    return {"run_id": run.id, "exit_status": status, "interrupted": None, "root_cause": root,
            "nodes": nodes, "logs": checks, "settled_by": "a later clusterrun command"}
