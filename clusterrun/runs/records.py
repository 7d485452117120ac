"""A run's records as types: what its state.json says, each entry of its attempts list, each
event of its events.jsonl, with one ``to_json``/``from_json`` each (the JSON on disk is what
users and tests read: its shape is the one docs/observability.md describes), each node's
state as its host keeps it (read only: the host's supervisor writes it), and the fields of an
attempt's plan.json that commands read again (``PlanRecord``, read only). summary.json's type is
runs/summary.py's.

runs.journal is their one writer; everything outside runs/ reads a run through these types
(``RunStatus.of(run)``, ``PlanRecord.of(run)``), never through the raw dict.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from clusterrun.jsonfields import integer, text
from clusterrun.remote.shared import nodestate
from clusterrun.runs.state import RunState
from clusterrun.runs.store import RunDir
from clusterrun.wire import RootCause, root_cause

Json = dict[str, object]


class EventKind(str, enum.Enum):
    """Every kind of event a run's journal writes (the table in docs/observability.md)."""

    STARTED = "started"
    ATTEMPT_BEGUN = "attempt_begun"
    FIRST_LINE = "first_line"
    DETACHED = "detached"
    STALLED = "stalled"
    RESUMED = "resumed"
    STRAGGLER = "straggler"
    RANK_FAILED = "rank_failed"
    HOST_LOST = "host_lost"
    ATTEMPT_ENDED = "attempt_ended"
    HOST_QUARANTINED = "host_quarantined"
    RESTARTED = "restarted"
    FINISHED = "finished"


@dataclass(frozen=True)
class Event:
    """One line of events.jsonl: its kind, the run, its number in the run, when (this
    machine's clock), and what it is about (``fields``, masked by the journal)."""

    kind: EventKind
    run: str
    seq: int
    at: float
    fields: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {"event": self.kind.value, "run": self.run, "seq": self.seq, "at": self.at,
                **self.fields}

    @classmethod
    def from_json(cls, raw: object) -> Optional[Event]:
        """An event as written; None for a line that is not one (or of an unknown kind)."""
        if not isinstance(raw, dict):
            return None
        try:
            kind = EventKind(raw.get("event"))
            seq, at = int(raw["seq"]), float(raw["at"])
        except (KeyError, TypeError, ValueError):
            return None
        rest = {k: v for k, v in raw.items() if k not in ("event", "run", "seq", "at")}
        return cls(kind, str(raw.get("run") or ""), seq, at, rest)


@dataclass(frozen=True)
class AttemptRecord:
    """One entry of the run's ``attempts`` list (``ps --json``, summary.json)."""

    attempt: int
    hosts: tuple[str, ...]
    started_at: float
    exit_status: Optional[int] = None
    root_cause: Optional[str] = None  # the root cause's detail, in words
    ended_at: Optional[float] = None

    def to_json(self) -> Json:
        return dict(asdict(self), hosts=list(self.hosts))

    def ended(self, status: int, at: float, root: Optional[Mapping[str, object]]) -> AttemptRecord:
        """This attempt, ended with ``status`` at ``at``; ``root``: its root cause as
        RootCause.public() gives it (the entry keeps its detail, in words)."""
        return replace(self, exit_status=status, ended_at=at,
                       root_cause=text(root.get("detail")) if root else None)

    @classmethod
    def from_json(cls, raw: object) -> Optional[AttemptRecord]:
        if not isinstance(raw, dict) or not isinstance(raw.get("attempt"), int):
            return None
        return cls(raw["attempt"], tuple(str(h) for h in raw.get("hosts") or ()),
                   _float(raw.get("started_at")) or 0.0, integer(raw.get("exit_status")),
                   text(raw.get("root_cause")), _float(raw.get("ended_at")))


@dataclass(frozen=True)
class RunStatus:
    """A run's state.json (or an attempt folder's own): who the run is, how it stands, who
    watches it, its attempts. ``from_json`` reads what any clusterrun wrote; ``with_`` is the
    one way to change it, and ``to_json`` gives back the document with each key where it was
    and the keys this type does not name (a newer or older clusterrun's) kept, so a state read
    and written again is the same file."""

    id: Optional[str] = None
    name: Optional[str] = None
    hosts: tuple[str, ...] = ()  # the hosts it started on (attempt K's: its own folder's)
    inventory: Optional[str] = None
    state: Optional[RunState] = None  # None: not recorded (yet), or not a state the rule knows
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    exit_status: Optional[int] = None
    detached: bool = False
    controller_pid: Optional[int] = None
    notify: Optional[str] = None  # `launch --notify CMD`
    attempt: int = 1  # the current attempt
    max_restarts: int = 0
    attempts: tuple[AttemptRecord, ...] = ()
    quarantined: tuple[Json, ...] = ()  # Quarantine.public() entries
    outcome: Optional[str] = None  # "stalled": `--on-stall stop` ended it
    stalled: Optional[Json] = None  # then: the blamed host and rank
    stall: Optional[Json] = None  # the last stall report (#21), kept after it resumed
    stragglers: tuple[int, ...] = ()  # the ranks a profile named last (`stacks --profile`)
    events: int = 0  # how many events the run has written (the last one's ``seq``)
    # The document as read (and changed by ``with_``): its keys in their order, and those this
    # type does not name. Not part of what a status is.
    raw: Mapping[str, object] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: object) -> RunStatus:
        if not isinstance(raw, dict):
            return cls()
        attempt, restarts = raw.get("attempt"), raw.get("max_restarts")
        found = raw.get("attempts")
        entries = [AttemptRecord.from_json(e) for e in found] if isinstance(found, list) else []
        quarantined, hosts = raw.get("quarantined"), raw.get("hosts")
        stalled, stall, stragglers = raw.get("stalled"), raw.get("stall"), raw.get("stragglers")
        return cls(
            id=text(raw.get("id")), name=text(raw.get("name")),
            hosts=tuple(str(h) for h in hosts) if isinstance(hosts, list) else (),
            inventory=text(raw.get("inventory")),
            state=RunState.parse(raw.get("state")), started_at=_float(raw.get("started_at")),
            ended_at=_float(raw.get("ended_at")), exit_status=integer(raw.get("exit_status")),
            detached=bool(raw.get("detached")), controller_pid=integer(raw.get("controller_pid")),
            notify=text(raw.get("notify")),
            attempt=attempt if isinstance(attempt, int) and attempt >= 1 else 1,
            max_restarts=restarts if isinstance(restarts, int) and restarts >= 0 else 0,
            attempts=tuple(e for e in entries if e is not None),
            quarantined=tuple(q for q in quarantined if isinstance(q, dict))
            if isinstance(quarantined, list) else (),
            outcome=text(raw.get("outcome")),
            stalled=stalled if isinstance(stalled, dict) else None,
            stall=stall if isinstance(stall, dict) else None,
            stragglers=tuple(r for r in stragglers if integer(r) is not None)
            if isinstance(stragglers, list) else (),
            events=integer(raw.get("events")) or 0, raw=dict(raw))

    def to_json(self) -> Json:
        """The document: as read and changed, else (a status made here) its fields that say
        something, in their order."""
        out = dict(self.raw)
        for key, value in self._fields().items():
            out.setdefault(key, value)
        return out

    def with_(self, **changes: object) -> RunStatus:
        """This state with these state.json keys set (JSON values, as written): a key it had
        stays where it was, a new one comes last."""
        return RunStatus.from_json({**self.to_json(), **changes})

    def _fields(self) -> Json:
        """Each field that differs from a state that says nothing, as state.json writes it."""
        out: Json = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "raw" or value == getattr(_NOTHING, name):
                continue
            if isinstance(value, RunState):
                value = value.value
            elif name == "attempts":
                value = [a.to_json() for a in self.attempts]
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out

    @classmethod
    def of(cls, run: RunDir) -> RunStatus:
        """The state of ``run`` (a run's folder or an attempt's) as its folder keeps it."""
        return cls.from_json(run.state)


_NOTHING = RunStatus()


@dataclass(frozen=True)
class NodeState:
    """One node's state.json on its host, as its supervisor keeps it (remote/node/run.py) and
    status.py answers for `ps`, `logs` and `stop` (runs/remote.py ``status``), by the field
    names remote/shared/nodestate.py holds; a host that could not be asked is ``unreachable``,
    with why in ``reason`` (``error`` and ``unreachable`` are this side's own)."""

    state: Optional[str] = None  # as the host says it: a RunState's value, "missing", "unknown"
    exit_code: Optional[int] = None
    reason: Optional[str] = None
    error: Optional[str] = None
    rank_exits: Mapping[str, int] = field(default_factory=dict)  # its ``ranks``: rank: code
    root_cause: Optional[RootCause] = None  # a detached run's, on its master's host
    checksums: Mapping[str, Json] = field(default_factory=dict)  # {file: [size, sha256]}
    ended_at: Optional[float] = None
    stall: Optional[Json] = None  # a detached run's stall report, while it lasts
    unreachable: bool = False

    @property
    def run_state(self) -> Optional[RunState]:
        return RunState.parse(self.state)

    @classmethod
    def from_json(cls, raw: object) -> NodeState:
        if not isinstance(raw, dict):
            return cls()
        ranks = raw.get(nodestate.RANKS)
        sums, stall = raw.get(nodestate.CHECKSUMS), raw.get(nodestate.STALL)
        return cls(text(raw.get(nodestate.STATE)), integer(raw.get(nodestate.EXIT_CODE)),
                   text(raw.get(nodestate.REASON)), text(raw.get("error")),
                   {str(r): c for r, c in ranks.items() if integer(c) is not None}
                   if isinstance(ranks, dict) else {},
                   root_cause(raw.get(nodestate.ROOT_CAUSE)),
                   dict(sums) if isinstance(sums, dict) else {},
                   _float(raw.get(nodestate.ENDED_AT)),
                   stall if isinstance(stall, dict) else None, bool(raw.get("unreachable")))


@dataclass(frozen=True)
class PlanNode:
    """One node of an attempt's plan.json, as the commands that reach a run again read it."""

    name: str
    host: str
    node_rank: Optional[int] = None
    ranks: Optional[tuple[int, ...]] = None  # as plan.json keeps them: [first, last]
    address: Optional[str] = None  # where its ranks talk to the others
    rundir: str = ""  # the attempt's folder on the host
    python: Optional[str] = None  # the interpreter its ranks ran (their environment's)
    interface: Optional[str] = None  # the data interface its ranks use
    cwd: str = ""  # the ranks' working directory on the host (the copy of the code)

    def holds(self, rank: int) -> bool:
        """Whether ``rank`` runs on this node (plan.json's ``[first, last]``, both included)."""
        if not self.ranks or len(self.ranks) != 2:
            return False
        return self.ranks[0] <= rank <= self.ranks[1]

    @classmethod
    def from_json(cls, raw: object) -> Optional[PlanNode]:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            return None
        ranks = raw.get("ranks")
        return cls(raw["name"], str(raw.get("host") or ""), integer(raw.get("node_rank")),
                   tuple(r for r in ranks if integer(r) is not None)
                   if isinstance(ranks, list) else None,
                   text(raw.get("address")), str(raw.get("rundir") or ""),
                   text(raw.get("python")), text(raw.get("interface")),
                   str(raw.get("cwd") or ""))


@dataclass(frozen=True)
class PlanRecord:
    """An attempt's plan.json as the commands that reach a run again read it (`logs`, `stacks`,
    `ps`, the settling of a run nobody watched): only the fields they use. The file itself is
    LaunchPlan.public()'s (plan/model.py), written once by the journal."""

    name: Optional[str] = None
    created: Optional[float] = None
    world_size: int = 0
    environment: Optional[str] = None  # the `environment:` lock's hash (launch/loop.py)
    nodes: tuple[PlanNode, ...] = ()

    @property
    def node_names(self) -> set[str]:
        return {n.name for n in self.nodes}

    def node(self, name: str) -> Optional[PlanNode]:
        return next((n for n in self.nodes if n.name == name), None)

    @classmethod
    def from_json(cls, raw: object) -> PlanRecord:
        if not isinstance(raw, dict):
            return cls()
        nodes = raw.get("nodes")
        found = [PlanNode.from_json(n) for n in nodes] if isinstance(nodes, list) else []
        world = raw.get("world_size")
        return cls(text(raw.get("name")), _float(raw.get("created")),
                   int(world) if isinstance(world, (int, float)) and world else 0,
                   text(raw.get("environment")), tuple(n for n in found if n is not None))

    @classmethod
    def of(cls, run: RunDir) -> PlanRecord:
        """The plan in ``run``'s folder (a run's, attempt 1's, or an attempt's own)."""
        return cls.from_json(run.plan)


def _float(value: object) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
