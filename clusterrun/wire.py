"""The wire between clusterrun's programs on a host and this machine, parsed at one place.

The protocol's frames, kinds and field names are defined once, in
clusterrun/remote/shared/protocol.py, which the programs on the hosts write with. ``frames`` splits
a program's stdout into event frames and data frames; ``parse`` turns an event frame into one of the
typed events below. Every event carries its ``elapsed``, the seconds since its supervisor started by
that host's own clocks (see launch/outcome.py for how they are put on this machine's clock).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from clusterrun.errors import ExitStatus
from clusterrun.remote.shared import protocol, stallreport
from clusterrun.transport import Process

# A stall report's line (remote/shared/stallreport.py).
_ODD = re.compile(r"odd one out: rank (\d+) on ")


class ProtocolError(Exception):
    pass


@dataclass(frozen=True)
class RootCause:
    """Why a run (or one attempt) failed: the first failure in time that the teardown did not
    cause. The one shape of a root cause, as the controller decides it (launch/outcome.py), as a
    detached run's hub records it on its host, and in summary.json, state.json and events."""

    node: str
    rank: Optional[int]
    code: Optional[int]  # None: the node was lost (or ended the run itself, its controller gone)
    detail: str
    t: float = field(default=0.0, compare=False)  # this machine's monotonic clock: ordering only

    @property
    def signal(self) -> Optional[int]:
        return self.code - 128 if self.code is not None and self.code > 128 else None

    @property
    def lost(self) -> bool:
        return self.code is None

    @property
    def stalled(self) -> bool:
        """A stall that `--on-stall stop` ended: the blamed node's own failure, with the stall
        status and no rank (remote/node/stallhub.py decides it so; a rank that exits 7 has a
        rank)."""
        return (self.rank is None and self.code == ExitStatus.STALLED
                and self.detail.partition(": ")[2].startswith("stalled"))

    @property
    def blamed_rank(self) -> Optional[int]:
        """The rank a stopped stall blamed (its odd one out), when one stood out."""
        found = _ODD.search(self.detail) if self.stalled else None
        return int(found.group(1)) if found else None

    @property
    def blamed_node(self) -> Optional[str]:
        """The host a stopped stall blamed: the node that failed with it when a rank stood out
        there or its links failed. Otherwise (every rank waits alike and every link connects,
        or no rank's stack could be read) the report named no host, and the master only
        stopped the run: nothing may replace it on that basis."""
        if not self.stalled:
            return self.node
        said = self.detail.partition(": stalled, ")[2]
        named = _ODD.search(said) or said.startswith(stallreport.LINKS_FAIL)
        return self.node if named else None

    def public(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "code": self.code, "signal": self.signal,
                "detail": self.detail, "lost": self.lost}


@dataclass(frozen=True)
class Started:
    elapsed: float
    pid: Optional[int] = None  # the supervisor (for exec: the command)
    torchrun_pid: Optional[int] = None
    hostname: str = ""
    subreaper: bool = False
    hub_port: Optional[int] = None  # detached master: where its workers' supervisors connect
    cgroup: Optional[str] = None  # the job's cgroup there (remote/hostlib/cgroup.py)
    cgroup_why: Optional[str] = None  # why it has none


@dataclass(frozen=True)
class RankExit:
    elapsed: float  # the rank's exit file's mtime, as seconds since its supervisor started
    rank: int
    code: int
    stopping: bool  # it exited after its supervisor began stopping: not a cause


@dataclass(frozen=True)
class NodeFailure:
    """A node's own failure that is no rank's or torchrun's exit (its disk filled up)."""

    elapsed: float
    code: int
    detail: str


@dataclass(frozen=True)
class TorchrunExit:
    elapsed: float
    code: int
    stopping: bool


@dataclass(frozen=True)
class NcclReport:
    """What NCCL chose on a host, from its ranks' NCCL_DEBUG files (remote/node/nccllog.py); sent
    again whenever it changes. ``init_done``: global ranks whose world communicator is
    initialised."""

    elapsed: float
    interfaces: tuple[tuple[str, str], ...] = ()  # (interface, address)
    networks: tuple[str, ...] = ()  # IB, Socket, or a plugin's name
    devices: tuple[str, ...] = ()  # "mlx5_0:1/IB"
    no_ib: bool = False  # NCCL looked for IB devices there and found none
    gdr: Optional[str] = None  # on, off, partly; None: unknown or not IB
    nranks: Optional[int] = None  # the world communicator's size as NCCL saw it
    nnodes: Optional[int] = None  # the nodes NCCL counted in it (NCCL 2.19 on)
    init_started: tuple[int, ...] = ()
    init_done: tuple[int, ...] = ()
    version: Optional[str] = None

    def public(self) -> dict[str, Any]:
        return {"interfaces": [list(p) for p in self.interfaces], "networks": list(self.networks),
                "devices": list(self.devices), "no_ib": self.no_ib, "gdr": self.gdr,
                "nranks": self.nranks, "nnodes": self.nnodes,
                "init_started": list(self.init_started), "init_done": list(self.init_done),
                "version": self.version}


@dataclass(frozen=True)
class Heartbeat:
    elapsed: float


@dataclass(frozen=True)
class Progress:
    """The stall watchdog: seconds since any rank of the node last made progress."""

    elapsed: float
    quiet: float


@dataclass(frozen=True)
class StallAsk:
    """An attached run's stall decider (the master's supervisor) asks its controller for what
    it cannot fetch itself: every rank's stacks, or the links' re-test (``what``)."""

    elapsed: float
    what: str


@dataclass(frozen=True)
class Stalled:
    """The stall decider's decision: the report's lines and record, and the node the controller
    is to stop (--on-stall stop; None: none, or the master, which stops itself)."""

    elapsed: float
    lines: tuple[str, ...]
    report: dict[str, Any]
    stop: Optional[str] = None
    detail: Optional[str] = None


@dataclass(frozen=True)
class Resumed:
    """A stalled run moves again, by its stall decider."""

    elapsed: float


@dataclass(frozen=True)
class End:
    """A program's final event. Runs: state is succeeded/failed/stopped/lost (or missing,
    unknown for `logs -f` of a run that is not there); exec: exited/timeout/stopped/lost."""

    elapsed: float
    state: str
    exit_code: Optional[int] = None
    reason: Optional[str] = None
    cause: Optional[str] = None
    signal: Optional[int] = None
    ranks: dict[int, int] = field(default_factory=dict)
    checksums: dict[str, Any] = field(default_factory=dict)
    root_cause: Optional[RootCause] = None


@dataclass(frozen=True)
class Status:
    """`ps`: a run's state.json on a host as it stands (None: no such run there)."""

    state: Optional[dict[str, Any]]


@dataclass(frozen=True)
class StopResult:
    found: bool
    was: Optional[str]
    state: Optional[dict[str, Any]]


Event = Union[Started, RankExit, NodeFailure, TorchrunExit, NcclReport, Heartbeat, End, Status,
              StopResult, Progress, StallAsk, Stalled, Resumed]


def root_cause(raw: Any) -> Optional[RootCause]:
    """A root cause as a host or a summary records it (``RootCause.public``'s shape)."""
    if not isinstance(raw, dict) or "node" not in raw:
        return None
    code = raw.get("code")
    lost = bool(raw.get("lost")) or not isinstance(code, int)
    rank = raw.get("rank")
    return RootCause(node=str(raw["node"]), rank=rank if isinstance(rank, int) else None,
                     code=None if lost else code, detail=str(raw.get("detail") or ""))


def _float(ev: dict[str, Any]) -> float:
    return float(ev.get(protocol.ELAPSED) or 0.0)


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def nccl_report(ev: dict[str, Any]) -> NcclReport:
    return NcclReport(
        _float(ev),
        interfaces=tuple((str(i), str(a)) for i, a in ev.get("interfaces") or ()),
        networks=tuple(str(n) for n in ev.get("networks") or ()),
        devices=tuple(str(d) for d in ev.get("devices") or ()),
        no_ib=bool(ev.get("no_ib")), gdr=ev.get("gdr"),
        nranks=_optional_int(ev.get("nranks")), nnodes=_optional_int(ev.get("nnodes")),
        init_started=tuple(int(r) for r in ev.get("init_started") or ()),
        init_done=tuple(int(r) for r in ev.get("init_done") or ()),
        version=ev.get("version"))


def stall_event(ev: dict[str, Any]) -> Event:
    """An attached run's stall decider to its controller (remote/node/stallreach.py)."""
    kind = ev.get(protocol.KIND)
    if kind == protocol.STALL_ASK:
        return StallAsk(_float(ev), str(ev["what"]))
    if kind == protocol.STALLED:
        return Stalled(_float(ev), tuple(str(x) for x in ev.get("lines") or ()),
                       dict(ev.get("report") or {}), stop=ev.get("stop"),
                       detail=ev.get("detail"))
    return Resumed(_float(ev))


def parse(ev: dict[str, Any]) -> Event:
    """One event frame's JSON as its typed event."""
    kind = ev.get(protocol.KIND)
    try:
        if kind == protocol.HEARTBEAT:
            return Heartbeat(_float(ev))
        if kind == protocol.STARTED:
            return Started(_float(ev), pid=ev.get("pid"), torchrun_pid=ev.get("torchrun_pid"),
                           hostname=str(ev.get("hostname") or ""),
                           subreaper=bool(ev.get("subreaper")), hub_port=ev.get("hub_port"),
                           cgroup=ev.get("cgroup"), cgroup_why=ev.get("cgroup_why"))
        if kind == protocol.RANK_EXIT:
            return RankExit(_float(ev), int(ev["rank"]), int(ev["code"]), bool(ev["stopping"]))
        if kind == protocol.FAILURE:
            return NodeFailure(_float(ev), int(ev["code"]), str(ev["detail"]))
        if kind == protocol.TORCHRUN_EXIT:
            return TorchrunExit(_float(ev), int(ev["code"]), bool(ev["stopping"]))
        if kind == protocol.NCCL:
            return nccl_report(ev)
        if kind == protocol.END:
            return End(_float(ev), str(ev.get("state") or "unknown"),
                       exit_code=ev.get("exit_code"), reason=ev.get("reason"),
                       cause=ev.get("cause"), signal=ev.get("signal"),
                       ranks={int(r): int(c) for r, c in (ev.get("ranks") or {}).items()},
                       checksums=dict(ev.get("checksums") or {}),
                       root_cause=root_cause(ev.get("root_cause")))
        if kind == protocol.STATUS:
            return Status(ev.get("state"))
        if kind == protocol.PROGRESS:
            return Progress(_float(ev), float(ev["quiet"]))
        if kind in (protocol.STALL_ASK, protocol.STALLED, protocol.RESUMED):
            return stall_event(ev)
        if kind == protocol.STOPPED:
            return StopResult(bool(ev.get("found")), ev.get("was"), ev.get("state"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind!r} event from a supervisor: {exc}") from None
    raise ProtocolError(f"unknown event from a supervisor: {str(ev)[:80]}")


def frames(proc: Process) -> Iterator[tuple[dict[str, Any], Optional[bytes]]]:
    """(event, None) or (data header, bytes) until the stream ends."""
    buf = bytearray()
    eof = False
    while True:
        nl = buf.find(b"\n")
        if nl >= 0:
            kind = bytes(buf[:2])
            if kind not in (protocol.EVENT, protocol.DATA):
                raise ProtocolError(f"unexpected output from the supervisor: {bytes(buf[:80])!r}")
            try:
                header = json.loads(bytes(buf[2:nl]))
            except ValueError:
                raise ProtocolError(f"a garbled frame from the supervisor: "
                                    f"{bytes(buf[:80])!r}") from None
            if kind == protocol.EVENT:
                del buf[: nl + 1]
                yield header, None
                continue
            need = nl + 1 + header[protocol.LENGTH]
            if len(buf) >= need:
                data = bytes(buf[nl + 1 : need])
                del buf[:need]
                yield header, data
                continue
        if eof:
            if buf:
                raise ProtocolError("the supervisor's stream ended in the middle of a frame")
            return
        try:
            chunk = proc.recv(262144)
        except OSError:
            chunk = b""
        if not chunk:
            eof = True
        buf.extend(chunk)
