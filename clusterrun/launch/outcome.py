"""How a run ended: per node outcomes, the root cause (the first failure in time, without
trusting any host's clock), the report that leads with it, and the exit status.

Time: every supervisor stamps its events with the seconds since it started, by its own host's
clocks (a rank's exit is its exit file's mtime minus the supervisor's own wall-clock start, on
the same host). When a supervisor's first frame (``started``) arrives, this machine notes the
offset between its own monotonic clock and that supervisor's count (``Clock.handshake``); an
event's time here is then offset + its count. Hosts' wall clocks are never compared with each
other or with this machine's, so clocks minutes apart still give the right root cause. (The
offset includes the first frame's network delay, a few milliseconds, the same for all events
of that host.) A lost node's time is when this machine gave up on it, on its own clock.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from clusterrun.inventory.ranges import fold
from clusterrun.launch import nccl
from clusterrun.logs.mirror import verify
from clusterrun.plan.model import NodePlan
from clusterrun.remote.shared import exits, layout
from clusterrun.runs.records import Json
from clusterrun.runs.store import RunDir
from clusterrun.runs.summary import NodeSummary, Summary
from clusterrun.wire import (
    End,
    NcclReport,
    NodeFailure,
    RankExit,
    RootCause,
    Started,
    TorchrunExit,
)

LAST_LINES = 15


@dataclass(frozen=True)
class Clock:
    """A supervisor's "seconds since I started" on this machine's monotonic clock."""

    offset: float

    @classmethod
    def handshake(cls, arrived: float, elapsed: float) -> Clock:
        """``arrived``: this machine's monotonic time when the supervisor's first frame came;
        ``elapsed``: the supervisor's own count in that frame."""
        return cls(arrived - elapsed)

    def local(self, elapsed: float) -> float:
        return self.offset + elapsed


@dataclass
class NodeOutcome:
    plan: NodePlan
    started: Optional[Started] = None
    clock: Optional[Clock] = None
    end: Optional[End] = None  # the supervisor's final event
    lost: Optional[str] = None  # why the controller gave up on this node
    lost_at: Optional[float] = None  # this machine's monotonic clock
    rank_exits: dict[int, RankExit] = field(default_factory=dict)
    torchrun_exit: Optional[TorchrunExit] = None
    failure: Optional[NodeFailure] = None  # its own failure that no exit shows (a full disk)
    folded: int = 0  # lines of torchrun's own shutdown output not shown on the console
    nccl: Optional[NcclReport] = None  # what NCCL chose there, as last reported

    @property
    def done(self) -> bool:
        return self.end is not None or self.lost is not None

    @property
    def state(self) -> str:
        if self.lost is not None:
            return "lost"
        return self.end.state if self.end is not None else "unknown"


def node_failures(node: NodeOutcome) -> list[RootCause]:
    """One node's failures that happened on their own: not exits its supervisor's stop caused."""
    name = node.plan.name
    found: list[RootCause] = []
    if node.clock is not None:
        for rank, ev in node.rank_exits.items():
            if ev.code != 0 and not ev.stopping:
                found.append(RootCause(name, rank, ev.code,
                                       f"{name} rank {rank} {exits.describe(ev.code)}",
                                       t=node.clock.local(ev.elapsed)))
        if node.failure is not None:
            found.append(RootCause(name, None, node.failure.code, node.failure.detail,
                                   t=node.clock.local(node.failure.elapsed)))
        tr = node.torchrun_exit
        if tr is not None and tr.code != 0 and not tr.stopping and not found:
            found.append(RootCause(name, None, tr.code,
                                   f"{name}: torchrun {exits.describe(tr.code)}",
                                   t=node.clock.local(tr.elapsed)))
    if node.lost is not None and node.lost_at is not None:
        found.append(RootCause(name, None, None, f"{name} was lost: {node.lost}",
                               t=node.lost_at))
    elif node.end is not None and node.end.state == "lost" and node.clock is not None:
        # Its supervisor heard nothing from this controller for the lease (the controller was
        # stopped or suspended, or the channel broke one way) and ended the run there itself.
        found.append(RootCause(name, None, None, f"{name} ended the run itself: "
                               f"{node.end.reason or 'it lost the controller'}",
                               t=node.clock.local(node.end.elapsed)))
    return found


def failures(nodes: list[NodeOutcome]) -> list[RootCause]:
    """Every node's own failures, first in time first (ties: by node, then rank)."""
    found = [f for node in nodes for f in node_failures(node)]
    return sorted(found, key=lambda f: (f.t, f.node, -1 if f.rank is None else f.rank))


def last_lines(run: RunDir, node: str, rank: Optional[int], count: int = LAST_LINES) -> list[str]:
    name = layout.NODE_LOG if rank is None else layout.rank_log(rank)
    path = run.mirror(node, name)
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - 64 * 1024))
            tail: deque[str] = deque(handle.read().decode("utf-8", "replace").splitlines(), count)
    except OSError:
        return []
    return list(tail)


def report(run: RunDir, nodes: list[NodeOutcome], root: Optional[RootCause],
           interrupted: Optional[int], stopped: bool) -> list[str]:
    """The final report: the root cause first with its last lines, then one line per group of
    nodes that fared alike."""
    lines: list[str] = []
    if root is not None:
        lines.append(f"root cause: {root.detail}")
        # A stopped stall's node log holds only torchrun's answer to the stop (a SIGTERM
        # traceback): the blamed rank's own lines, or none where no rank stood out.
        rank = root.blamed_rank if root.stalled else root.rank
        tail = last_lines(run, root.node, rank) if rank is not None or not root.stalled else []
        if tail:
            where = f"[{root.node}" + ("]" if rank is None else f" r{rank}]")
            lines.append(f"  last lines of {where}:")
            lines.extend(f"    {t}" for t in tail)
    elif interrupted is not None:
        lines.append(f"interrupted ({signal.Signals(interrupted).name}): the run was stopped on "
                     "every node")
    groups: dict[str, list[str]] = {}
    for node in nodes:
        groups.setdefault(node_text(node, root, interrupted), []).append(node.plan.name)
    for text, names in sorted(groups.items(), key=lambda kv: kv[1]):
        lines.append(f"{fold(names)}: {text}")
    folded = sorted(n.plan.name for n in nodes if n.folded)
    if folded:
        lines.append(f"torchrun's shutdown output (tracebacks, closing signals) folded for "
                     f"{fold(folded)}: see `clusterrun logs {run.id} --node NAME`")
    return lines


def _after(root: Optional[RootCause]) -> str:
    if root is None:
        return ""
    return f" after {root.node} " + ("was lost" if root.code is None else "failed")


def _own_words(detail: str, name: str) -> str:
    """A failure's detail without its node's name in front ("rank 3 exited with code 3")."""
    return detail[len(name):].lstrip(": ") if detail.startswith(name) else detail


def node_text(node: NodeOutcome, root: Optional[RootCause],
              interrupted: Optional[int] = None) -> str:
    """What happened to one node, in a few words (the root cause's node: its own failure)."""
    if node.lost is not None:
        return f"lost ({node.lost})"
    state = node.state
    if state == "succeeded":
        return "succeeded"
    own = node_failures(node)
    if state == "failed":
        what = _own_words(own[0].detail, node.plan.name) if own else (
            f"torchrun {exits.describe(node.end.exit_code)}"
            if node.end is not None and node.end.exit_code is not None else "")
        if root is not None and root.node == node.plan.name:
            return f"failed ({what})" if what else "failed"
        return f"failed{_after(root)}" + (f" ({what})" if what else "")
    if state == "stopped":
        if root is not None:
            return f"stopped{_after(root)}"
        if interrupted is not None:
            return f"stopped ({signal.Signals(interrupted).name})"
        return f"stopped ({(node.end.reason if node.end else None) or 'by clusterrun'})"
    if state == "lost" and node.end is not None:  # its supervisor lost this controller
        return f"ended the run itself ({node.end.reason or 'it lost the controller'})"
    return state


def summary(run: RunDir, nodes: list[NodeOutcome], *, root: Optional[RootCause], status: int,
            interrupted: Optional[int], checks: Json) -> Summary:
    """An attempt's summary.json (runs/summary.py): each node's state and exit code are its own
    (its supervisor's), never the controller's."""
    return Summary(
        run.id, status, signal.Signals(interrupted).name if interrupted else None, root,
        tuple(_node_summary(n, root, interrupted) for n in nodes), checks,
        nccl=nccl.summary([nccl.HostNccl(n.plan.name, n.plan.ranks, n.nccl) for n in nodes],
                          sum(n.plan.nproc for n in nodes)))


def _node_summary(n: NodeOutcome, root: Optional[RootCause],
                  interrupted: Optional[int]) -> NodeSummary:
    return NodeSummary(
        n.plan.name, n.plan.node_rank, [n.plan.ranks.start, n.plan.ranks.stop - 1], n.state,
        n.end.exit_code if n.end is not None else None,
        n.lost or (n.end.reason if n.end is not None else None),
        {str(r): ev.code for r, ev in sorted(n.rank_exits.items())},
        outcome=node_text(n, root, interrupted))


def attempt_summary(folder: RunDir, nodes: Sequence[NodeOutcome], *, root: Optional[RootCause],
                    status: int, interrupted: Optional[int]) -> tuple[Summary, dict[str, Any]]:
    """An attempt's summary, and the check of its mirrors against the hosts'."""
    logs = verify(folder, {n.plan.name: n.end.checksums if n.end else {} for n in nodes})
    return summary(folder, list(nodes), root=root, status=status, interrupted=interrupted,
                   checks=logs), logs
