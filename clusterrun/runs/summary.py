"""summary.json: how one attempt of a run ended, machine-readable, with no environment values
in it. One shape, built here, whoever saw the end: the attached launch (launch/outcome.py, with
each node's outcome in words and what NCCL chose) or, for a run nobody watched, the first later
command that settles it (logs/settle.py, which says so in ``settled_by``). The run's journal
writes it, adding the run's attempts and quarantined hosts (runs/journal.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from clusterrun.runs.records import Json
from clusterrun.runs.store import RunDir, read_json
from clusterrun.wire import RootCause, root_cause

SETTLED = "a later clusterrun command"  # ``settled_by`` of a run nobody watched to its end


@dataclass(frozen=True)
class NodeSummary:
    """One node of an attempt, as its supervisor ended it (or as lost)."""

    name: str
    node_rank: Optional[int]
    ranks: Optional[list[int]]  # [first, last]
    state: Optional[str]
    exit_code: Optional[int]
    reason: Optional[str]
    rank_exits: Mapping[str, int] = field(default_factory=dict)
    outcome: Optional[str] = None  # in words, from the controller that saw it (None: settled)

    @property
    def signal(self) -> Optional[int]:
        return self.exit_code - 128 if self.exit_code is not None and self.exit_code > 128 \
            else None

    def to_json(self) -> Json:
        return {"name": self.name, "node_rank": self.node_rank, "ranks": self.ranks,
                "state": self.state, "exit_code": self.exit_code, "signal": self.signal,
                "reason": self.reason, "outcome": self.outcome,
                "rank_exits": dict(self.rank_exits)}

    @classmethod
    def from_json(cls, raw: object) -> Optional[NodeSummary]:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            return None
        exits = raw.get("rank_exits")
        return cls(raw["name"], raw.get("node_rank"), raw.get("ranks"), raw.get("state"),
                   raw.get("exit_code"), raw.get("reason"),
                   dict(exits) if isinstance(exits, dict) else {}, raw.get("outcome"))


@dataclass(frozen=True)
class Summary:
    """An attempt's summary.json."""

    run_id: str
    exit_status: int
    interrupted: Optional[str]  # the user's signal by name (SIGINT), if one stopped it
    root_cause: Optional[RootCause]
    nodes: tuple[NodeSummary, ...]
    logs: Json  # the mirrors checked against the hosts' checksums (logs/mirror.py verify)
    nccl: Optional[Json] = None  # what NCCL chose on each host (launch/nccl.py summary)
    settled_by: Optional[str] = None  # SETTLED: no controller saw the end

    def to_json(self) -> Json:
        return {"run_id": self.run_id, "exit_status": self.exit_status,
                "interrupted": self.interrupted,
                "root_cause": self.root_cause.public() if self.root_cause else None,
                "nodes": [n.to_json() for n in self.nodes], "logs": self.logs,
                "nccl": self.nccl, "settled_by": self.settled_by}

    @classmethod
    def from_json(cls, raw: object) -> Optional[Summary]:
        """A summary as written (also one with the run's lists added); None for none."""
        if not isinstance(raw, dict) or not isinstance(raw.get("exit_status"), int):
            return None
        nodes = [NodeSummary.from_json(n) for n in raw.get("nodes") or []]
        logs, nccl = raw.get("logs"), raw.get("nccl")
        return cls(str(raw.get("run_id") or ""), raw["exit_status"], raw.get("interrupted"),
                   root_cause(raw.get("root_cause")), tuple(n for n in nodes if n is not None),
                   logs if isinstance(logs, dict) else {},
                   nccl if isinstance(nccl, dict) else None, raw.get("settled_by"))

    @classmethod
    def of(cls, run: RunDir) -> Optional[Summary]:
        """The summary in ``run``'s folder (a run's or an attempt's); None before it ended."""
        return cls.from_json(read_json(run.file("summary.json")))
