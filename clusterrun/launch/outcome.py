"""How a run ended: per node outcomes, the root cause (the first failure in time), the report
that leads with it, and the exit status."""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from clusterrun.errors import ExitStatus
from clusterrun.plan.model import NodePlan
from clusterrun.runs.store import RunDir
from clusterrun.transport.parallel import fold

LAST_LINES = 15


@dataclass
class NodeOutcome:
    plan: NodePlan
    started: bool = False
    end: Optional[dict[str, Any]] = None  # the supervisor's final event
    lost: Optional[str] = None  # why the controller gave up on this node
    lost_at: Optional[float] = None
    rank_exits: dict[int, dict[str, Any]] = field(default_factory=dict)
    torchrun_exit: Optional[dict[str, Any]] = None

    @property
    def done(self) -> bool:
        return self.end is not None or self.lost is not None

    @property
    def state(self) -> str:
        if self.lost is not None:
            return "lost"
        return (self.end or {}).get("state", "unknown")


@dataclass(frozen=True)
class Failure:
    t: float
    node: str
    rank: Optional[int]
    code: Optional[int]  # None: the node was lost
    detail: str


def describe_code(code: int) -> str:
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            return f"exited with code {code}"
        return f"was killed by signal {code - 128} ({name})"
    return f"exited with code {code}"


def failures(nodes: list[NodeOutcome]) -> list[Failure]:
    """Failures that happened on their own: not exits caused by clusterrun's own teardown."""
    found: list[Failure] = []
    for node in nodes:
        name = node.plan.name
        ranked = False
        for rank, ev in node.rank_exits.items():
            if ev["code"] != 0 and not ev.get("stopping"):
                found.append(Failure(ev["t"], name, rank, ev["code"],
                                     f"{name} rank {rank} {describe_code(ev['code'])}"))
                ranked = True
        tr = node.torchrun_exit
        if tr and tr["code"] != 0 and not tr.get("stopping") and not ranked:
            found.append(Failure(tr["t"], name, None, tr["code"],
                                 f"{name}: torchrun {describe_code(tr['code'])}"))
        if node.lost is not None and node.lost_at is not None:
            found.append(Failure(node.lost_at, name, None, None, f"{name} was lost: {node.lost}"))
    return sorted(found, key=lambda f: f.t)


def exit_status(root: Optional[Failure], interrupted: Optional[int], stopped: bool) -> int:
    if interrupted is not None:
        return 128 + interrupted
    if root is None:
        return int(ExitStatus.SIGTERM) if stopped else int(ExitStatus.SUCCESS)
    if root.code is None:
        return int(ExitStatus.NODE_LOST)
    return root.code if 0 < root.code < 256 else int(ExitStatus.ERROR)


def last_lines(run: RunDir, node: str, rank: Optional[int], count: int = LAST_LINES) -> list[str]:
    name = "node.log" if rank is None else f"rank-{rank}.log"
    path = run.mirror(node, name)
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - 64 * 1024))
            tail: deque[str] = deque(handle.read().decode("utf-8", "replace").splitlines(), count)
    except OSError:
        return []
    return list(tail)


def report(run: RunDir, nodes: list[NodeOutcome], root: Optional[Failure],
           interrupted: Optional[int], stopped: bool) -> list[str]:
    """The final report: the root cause first with its last lines, then every node folded by
    outcome."""
    lines: list[str] = []
    if root is not None:
        lines.append(f"root cause: {root.detail}")
        tail = last_lines(run, root.node, root.rank)
        if tail:
            where = f"[{root.node}" + ("]" if root.rank is None else f" r{root.rank}]")
            lines.append(f"  last lines of {where}:")
            lines.extend(f"    {t}" for t in tail)
    elif interrupted is not None:
        lines.append(f"interrupted ({signal.Signals(interrupted).name}): the run was stopped on "
                     "every node")
    groups: dict[str, list[str]] = {}
    for node in nodes:
        groups.setdefault(_node_text(node), []).append(node.plan.name)
    for text, names in sorted(groups.items(), key=lambda kv: kv[1]):
        lines.append(f"{fold(names)}: {text}")
    return lines


def _node_text(node: NodeOutcome) -> str:
    if node.lost is not None:
        return f"lost ({node.lost})"
    end = node.end or {}
    state = end.get("state", "unknown")
    code = end.get("exit_code")
    if state == "succeeded":
        return "succeeded"
    if state == "stopped":
        return f"stopped ({end.get('reason') or 'by clusterrun'})"
    return f"{state} (torchrun {describe_code(code)})" if code is not None else state


def summary(run: RunDir, nodes: list[NodeOutcome], *, root: Optional[Failure], status: int,
            interrupted: Optional[int], checks: dict[str, Any]) -> dict[str, Any]:
    """summary.json: machine-readable, secrets never included (nothing here holds env)."""
    return {
        "run_id": run.id,
        "exit_status": status,
        "interrupted": signal.Signals(interrupted).name if interrupted else None,
        "root_cause": None if root is None else {
            "node": root.node, "rank": root.rank, "code": root.code, "t": root.t,
            "detail": root.detail},
        "nodes": [{
            "name": n.plan.name, "node_rank": n.plan.node_rank,
            "ranks": [n.plan.ranks.start, n.plan.ranks.stop - 1], "state": n.state,
            "exit_code": (n.end or {}).get("exit_code"), "reason": n.lost or
            (n.end or {}).get("reason"),
            "rank_exits": {str(r): ev["code"] for r, ev in sorted(n.rank_exits.items())},
        } for n in nodes],
        "logs": checks,
    }
