"""summary.json: how one attempt of a run ended, machine-readable, with no environment values
in it. One type, ``Summary``, names every key it has, whoever saw the end: the attached launch
(launch/outcome.py, with each node's outcome in words and what NCCL chose, and the launch adds
the `environment:` lock's hash) or, for a run nobody watched, the first later command that
settles it (logs/settle.py, which says so in ``settled_by``). The run's journal writes it,
adding a stopped stall, the run's attempts and quarantined hosts and its last stall report
(runs/journal.py); readers read it through ``Summary.of``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from clusterrun.jsonfields import text
from clusterrun.runs.records import AttemptRecord, Json
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
    """A summary.json: an attempt's (in its folder) or the run's (in the run folder), every key
    it may have named here. The attempt's keys come first, as its builder gives them; the
    run's journal then adds, in this order, what a stopped stall was (``outcome``, ``stalled``),
    which attempt ended it (``attempt``, restarted runs only), the run's ``attempts`` and
    ``quarantined`` lists, and the last stall report (``stall``). ``with_`` is the one way to
    add or change a key (a JSON value, as written); ``to_json`` gives the document with each
    key where it was, so a summary read and written again is the same file."""

    run_id: str = ""
    exit_status: Optional[int] = None  # None: not a summary of an ended attempt
    interrupted: Optional[str] = None  # the user's signal by name (SIGINT), if one stopped it
    root_cause: Optional[RootCause] = None
    nodes: tuple[NodeSummary, ...] = ()
    logs: Json = field(default_factory=dict)  # the mirrors checked against the hosts' checksums
    nccl: Optional[Json] = None  # what NCCL chose on each host (launch/nccl.py summary)
    settled_by: Optional[str] = None  # SETTLED: no controller saw the end
    # Added after the attempt's keys (each only when it says something):
    environment: Optional[str] = None  # the `environment:` lock's hash every host ran
    outcome: Optional[str] = None  # "stalled": `--on-stall stop` ended it (runs/journal.py)
    stalled: Optional[Json] = None  # then: the blamed host and rank
    attempt: Optional[int] = None  # the attempt that ended the run (restarted runs)
    attempts: Optional[tuple[AttemptRecord, ...]] = None  # the run's attempts list
    quarantined: Optional[tuple[Json, ...]] = None  # Quarantine.public() entries
    stall: Optional[Json] = None  # the run's last stall report (#21)
    # The document as read (and changed by ``with_``): its keys in their order, and values this
    # type reads loosely (a root cause it cannot parse). Not part of what a summary is.
    raw: Mapping[str, object] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> Json:
        """The document: as read and changed, else (a summary made here) the attempt's keys,
        then each added key that says something, in the order of KEYS."""
        if self.raw:
            return dict(self.raw)
        out: Json = {
            "run_id": self.run_id, "exit_status": self.exit_status,
            "interrupted": self.interrupted,
            "root_cause": self.root_cause.public() if self.root_cause else None,
            "nodes": [n.to_json() for n in self.nodes], "logs": self.logs,
            "nccl": self.nccl, "settled_by": self.settled_by}
        for key in KEYS[len(out):]:
            value = getattr(self, key)
            if value is not None:
                out[key] = [a.to_json() for a in value] if key == "attempts" \
                    else list(value) if isinstance(value, tuple) else value
        return out

    def with_(self, **changes: object) -> Summary:
        """This summary with these keys set (JSON values): a key it had stays where it was, a
        new one comes last. Only the keys summary.json has (KEYS)."""
        unknown = sorted(set(changes) - set(KEYS))
        if unknown:
            raise TypeError(f"summary.json has no key {', '.join(unknown)}")
        return Summary.from_json({**self.to_json(), **changes})

    @classmethod
    def from_json(cls, raw: object) -> Summary:
        """A summary as written (an attempt's, or the run's with its lists); one that says
        nothing for what is not one."""
        if not isinstance(raw, dict):
            return cls()
        given = raw.get("nodes")
        nodes = [NodeSummary.from_json(n) for n in given] if isinstance(given, list) else []
        logs, nccl, found = raw.get("logs"), raw.get("nccl"), raw.get("attempts")
        status, attempt, quarantined = raw.get("exit_status"), raw.get("attempt"), \
            raw.get("quarantined")
        entries = [AttemptRecord.from_json(e) for e in found] if isinstance(found, list) else None
        return cls(
            str(raw.get("run_id") or ""), status if isinstance(status, int) else None,
            text(raw.get("interrupted")), root_cause(raw.get("root_cause")),
            tuple(n for n in nodes if n is not None), logs if isinstance(logs, dict) else {},
            _dict(nccl), text(raw.get("settled_by")), environment=text(raw.get("environment")),
            outcome=text(raw.get("outcome")), stalled=_dict(raw.get("stalled")),
            attempt=attempt if isinstance(attempt, int) else None,
            attempts=tuple(e for e in entries if e is not None) if entries is not None else None,
            quarantined=tuple(q for q in quarantined if isinstance(q, dict))
            if isinstance(quarantined, list) else None,
            stall=_dict(raw.get("stall")), raw=dict(raw))

    @classmethod
    def of(cls, run: RunDir) -> Optional[Summary]:
        """The summary in ``run``'s folder (a run's or an attempt's); None before it ended."""
        found = cls.from_json(read_json(run.file("summary.json")))
        return found if found.exit_status is not None else None


# Every key of summary.json, in the order a summary made here writes them.
KEYS = tuple(name for name in Summary.__dataclass_fields__ if name != "raw")


def _dict(value: object) -> Optional[Json]:
    return value if isinstance(value, dict) else None
