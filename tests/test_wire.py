"""The supervisor's wire frames (remote/shared/protocol.py, wire.py) and the local mirrors
(logs/mirror.py): framing holds whatever the bytes and wherever the stream is cut; a resumed
stream neither duplicates nor loses. Both ends use protocol.py's names."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun import wire
from clusterrun.logs.mirror import Mirror, receive, verify
from clusterrun.remote.shared import protocol
from clusterrun.runs import store
from clusterrun.transport import bundle
from clusterrun.wire import ProtocolError, frames

REMOTE = Path(wire.__file__).resolve().parent / "remote"


class Stream:
    """A Process whose stdout arrives in the given chunks, then ends."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    def write(self, data: bytes) -> None:
        raise OSError("nothing reads this process's stdin")

    def close_stdin(self) -> None:
        return None

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return 0

    def close(self) -> None:
        return None

    def recv(self, size: int) -> bytes:
        if not self.chunks:
            return b""
        head = self.chunks.pop(0)
        if len(head) > size:
            self.chunks.insert(0, head[size:])
        return head[:size]


class Broken(Stream):
    def recv(self, size: int) -> bytes:
        if self.chunks:
            return super().recv(size)
        raise OSError("the SSH channel closed")


def event(obj: dict[str, Any]) -> bytes:
    return b"J " + json.dumps(obj).encode() + b"\n"


def data(name: str, offset: int, payload: bytes) -> bytes:
    return (b"D " + json.dumps({"f": name, "o": offset, "n": len(payload)}).encode() + b"\n"
            + payload)


# Bytes that must not confuse the framing: newlines, a fake frame, \r progress bars, a partial
# line, invalid UTF-8, NUL.
TRICKY = b"line 1\nJ {\"ev\": \"end\"}\n\r 10%\r 20%\r100%\n\xff\xfe\x00 no newline"
STREAM = (event({"ev": "started", "pid": 7}) + data("rank0.log", 0, TRICKY)
          + data("rank1.log", 0, b"") + event({"ev": "exit", "rank": 0, "code": 0})
          + data("rank0.log", len(TRICKY), b"\n") + event({"ev": "end"}))
EXPECTED: list[tuple[dict[str, Any], Optional[bytes]]] = [
    ({"ev": "started", "pid": 7}, None),
    ({"f": "rank0.log", "o": 0, "n": len(TRICKY)}, TRICKY),
    ({"f": "rank1.log", "o": 0, "n": 0}, b""),
    ({"ev": "exit", "rank": 0, "code": 0}, None),
    ({"f": "rank0.log", "o": len(TRICKY), "n": 1}, b"\n"),
    ({"ev": "end"}, None),
]


def test_frames_in_one_piece() -> None:
    assert list(frames(Stream(STREAM))) == EXPECTED


def test_a_frame_split_anywhere_reads_the_same() -> None:
    for cut in range(1, len(STREAM)):
        assert list(frames(Stream(STREAM[:cut], STREAM[cut:]))) == EXPECTED, cut


def test_one_byte_at_a_time_reads_the_same() -> None:
    assert list(frames(Stream(*(STREAM[i:i + 1] for i in range(len(STREAM)))))) == EXPECTED


def test_a_stream_that_ends_inside_a_frame_is_an_error() -> None:
    for cut in (3, STREAM.index(b"line 1") + 2, len(STREAM) - 2):
        with pytest.raises(ProtocolError, match="middle of a frame"):
            list(frames(Stream(STREAM[:cut])))


def test_a_dropped_connection_ends_the_stream_like_eof() -> None:
    whole = event({"ev": "started"})
    assert list(frames(Broken(whole))) == [({"ev": "started"}, None)]
    with pytest.raises(ProtocolError):
        list(frames(Broken(whole + b"J {\"ev\"")))


def test_a_line_that_is_no_frame_is_an_error() -> None:
    with pytest.raises(ProtocolError, match="unexpected output"):
        list(frames(Stream(b"X {}\n")))


def test_stray_text_is_a_protocol_error_naming_the_output() -> None:
    with pytest.raises(ProtocolError, match="Traceback"):
        list(frames(Stream(b"Traceback (most recent call last):\n")))
    with pytest.raises(ProtocolError, match="garbled"):
        list(frames(Stream(b"J {not json\n")))


# -- one protocol, both ends ----------------------------------------------------------------

# Each kind of event the hosts send, and what the controller makes of it.
TYPED = {protocol.HEARTBEAT: wire.Heartbeat, protocol.STARTED: wire.Started,
         protocol.RANK_EXIT: wire.RankExit, protocol.FAILURE: wire.NodeFailure,
         protocol.TORCHRUN_EXIT: wire.TorchrunExit, protocol.NCCL: wire.NcclReport,
         protocol.END: wire.End, protocol.STATUS: wire.Status, protocol.STOPPED: wire.StopResult,
         protocol.PROGRESS: wire.Progress, protocol.STALL_ASK: wire.StallAsk,
         protocol.STALLED: wire.Stalled, protocol.RESUMED: wire.Resumed}


def test_the_hosts_encoders_write_the_frames_the_controller_reads() -> None:
    assert protocol.event_frame({"ev": "end"}) == event({"ev": "end"})
    assert protocol.data_frame("rank0.log", 5, TRICKY) == data("rank0.log", 5, TRICKY)
    stream = protocol.event_frame({"ev": "started", "pid": 7}) + protocol.data_frame(
        "rank0.log", 0, TRICKY) + protocol.event_frame({"ev": "end"})
    assert list(frames(Stream(stream))) == [EXPECTED[0], EXPECTED[1], EXPECTED[-1]]


def test_every_kind_has_a_typed_event_made_of_its_fields() -> None:
    assert set(TYPED) == set(protocol.FIELDS)
    given = {"rank": 3, "code": 1, "stopping": False, "detail": "disk full", "quiet": 12.5}
    for kind, cls in TYPED.items():
        names = {f.name for f in dataclasses.fields(cls)} - {"elapsed"}
        assert names <= set(protocol.FIELDS[kind]), (kind, names - set(protocol.FIELDS[kind]))
        raw = {protocol.KIND: kind, protocol.ELAPSED: 1.5, protocol.WALL: 0.0,
               **{name: given.get(name) for name in protocol.FIELDS[kind]}}
        parsed = wire.parse(raw)
        assert isinstance(parsed, cls), kind
        assert getattr(parsed, "elapsed", 1.5) == 1.5


def test_a_root_cause_has_the_protocols_fields() -> None:
    cause = wire.root_cause({"node": "n1", "rank": 0, "code": 1, "detail": "exited with 1"})
    assert cause is not None and set(cause.public()) == set(protocol.ROOT_CAUSE)


def _sent(tree: ast.AST) -> Iterator[tuple[str, set[str], int]]:
    """(kind, field names, line) of each ``writer.event(protocol.KIND, ...)``,
    ``writer.stamp(protocol.KIND, {...})`` and ``writer.end(...)`` in a program."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "end" and ast.unparse(node.func.value).endswith("writer")):
            yield protocol.END, {k.arg for k in node.keywords if k.arg is not None}, node.lineno
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("event", "stamp") and node.args
                and isinstance(node.args[0], ast.Attribute)
                and isinstance(node.args[0].value, ast.Name)
                and node.args[0].value.id == "protocol"):
            continue
        kind = getattr(protocol, node.args[0].attr)
        names = {k.arg for k in node.keywords if k.arg not in (None, "elapsed")}
        for arg in node.args[1:]:
            if isinstance(arg, ast.Dict):
                names |= {k.value for k in arg.keys if isinstance(k, ast.Constant)}
        yield kind, names, node.lineno


def test_the_hosts_programs_send_only_the_protocols_fields() -> None:
    seen = set()
    for path in sorted(REMOTE.rglob("*.py")):
        for kind, names, line in _sent(ast.parse(path.read_text())):
            seen.add(kind)
            unknown = names - set(protocol.FIELDS[kind])
            assert not unknown, f"{path.name}:{line}: {kind} with {sorted(unknown)}"
    assert {protocol.STARTED, protocol.RANK_EXIT, protocol.TORCHRUN_EXIT, protocol.END} <= seen


# -- messages, both ways -----------------------------------------------------------------------

PACKAGE = REMOTE.parent
NAMESPACES = {"Lifeline": protocol.Lifeline, "Gang": protocol.Gang, "Probe": protocol.Probe,
              "Env": protocol.Env}
# Any line is heard as a sign of life (mainloop.Lifeline.quiet, gang.Conn.last_heard): a
# heartbeat needs no handler of its own.
HEARD_ANYWAY = {protocol.Lifeline.HEARTBEAT, protocol.Gang.HEARTBEAT}

# The gang's own messages; the others it hands to the stall watchdog (on_gang of stallreach.py's
# ByGang on the hub, stallpeer.py's Peer on a peer), which hands the link test's to linkwatch.py.
GANG_OWN = {protocol.Gang.HELLO, protocol.Gang.AUTH, protocol.Gang.WELCOME,
            protocol.Gang.HEARTBEAT, protocol.Gang.STOP, protocol.Gang.FAILED, protocol.Gang.ENDED}
ALL_PROBE = {v for n, v in vars(protocol.Probe).items() if n.isupper() and isinstance(v, str)}

# A supervisor's watcher (remote/node/watchbase.py) names the ops and gang messages it takes in
# these class attributes; the supervisor hands it those (Supervisor.on_op, Supervisor.on_gang).
WATCHER_TAKES = {"ops", "gang"}

Unit = tuple[str, Optional[str]]  # (module, "Class" or "Class.method"; None: all of it)


@dataclasses.dataclass(frozen=True)
class Channel:
    """One direction of messages: who sends them, the receiver's dispatch (which must handle
    every op sent), the handlers it passes some to (which must handle those), and the ops."""

    name: str
    namespace: str
    carries: frozenset[str]
    senders: tuple[Unit, ...]
    dispatch: tuple[Unit, ...]
    passed: tuple[Unit, ...] = ()
    passed_ops: frozenset[str] = frozenset()


CHANNELS = [
    Channel("the controller to a run's supervisors", "Lifeline",
            frozenset({protocol.Lifeline.HEARTBEAT, protocol.Lifeline.STOP,
                       protocol.Lifeline.KILL, protocol.Lifeline.STALL,
                       protocol.Lifeline.PROGRESS, protocol.Lifeline.STACKS,
                       protocol.Lifeline.LINKS}),
            (("launch/session.py", None), ("stacks/stallview.py", None)),
            (("remote/node/run.py", "Supervisor.on_op"), ("remote/node/stallpeer.py", "Reporter"),
             ("remote/node/stallreach.py", "ByController")),
            (("remote/node/stallpeer.py", "Reporter.on_op"),
             ("remote/node/stallreach.py", "ByController.on_op")),
            frozenset({protocol.Lifeline.PROGRESS, protocol.Lifeline.STACKS,
                       protocol.Lifeline.LINKS})),
    Channel("the controller to exec's supervisors", "Lifeline",
            frozenset({protocol.Lifeline.HEARTBEAT, protocol.Lifeline.STOP,
                       protocol.Lifeline.KILL}),
            (("exec.py", None),), (("remote/tools/command.py", "Exec.on_op"),)),
    Channel("a peer to its hub", "Gang", frozenset(protocol.Gang.TO_HUB),
            (("remote/node/gang.py", "Peer"), ("remote/node/run.py", "Supervisor._failed"),
             ("remote/node/stallpeer.py", "Peer"), ("remote/node/linkwatch.py", "PeerSide")),
            (("remote/node/gang.py", "Hub._message"), ("remote/node/gang.py", "Hub._auth")),
            (("remote/node/stallreach.py", "ByGang.on_gang"),
             ("remote/node/linkwatch.py", "HubTest.on_message")),
            frozenset(protocol.Gang.TO_HUB) - GANG_OWN),
    Channel("a hub to its peers", "Gang", frozenset(protocol.Gang.TO_PEER),
            (("remote/node/gang.py", "Hub"), ("remote/node/stallreach.py", "ByGang"),
             ("remote/node/linkwatch.py", "HubTest")),
            (("remote/node/gang.py", "Peer._message"),),
            (("remote/node/stallpeer.py", "Peer.on_gang"),
             ("remote/node/linkwatch.py", "PeerSide.on_message")),
            frozenset(protocol.Gang.TO_PEER) - GANG_OWN),
    Channel("the controller to a probe", "Probe",
            frozenset(ALL_PROBE - {protocol.Probe.FACTS}),
            (("preflight/checks.py", None), ("preflight/mesh.py", None),
             ("preflight/bandwidth.py", None),
             ("preflight/probe_session.py", "ProbeSession.close")),
            (("remote/probe/probe.py", None),)),
    Channel("the controller to pyenv.py", "Env",
            frozenset(v for n, v in vars(protocol.Env).items() if n.isupper()),
            (("envs/sync.py", None),), (("remote/tools/pyenv.py", None),)),
]


def _members(namespace: type) -> dict[str, str]:
    return {n: v for n, v in vars(namespace).items() if n.isupper() and isinstance(v, str)}


def _unit(path: Path, name: Optional[str]) -> ast.AST:
    tree: ast.AST = ast.parse(path.read_text())
    for part in name.split(".") if name else ():
        tree = next(n for n in ast.iter_child_nodes(tree)
                    if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part)
    return tree


def _aliases(tree: ast.Module) -> dict[str, str]:
    """A module's ``G = protocol.Gang``, and ``from clusterrun.remote.shared.protocol import
    Gang``."""
    found = {name: name for name in NAMESPACES}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Attribute)
                and node.value.attr in NAMESPACES):
            found[node.targets[0].id] = node.value.attr
    return found


def _refs(path: Path, unit: Optional[str], namespace: str) -> tuple[set[str], set[str]]:
    """The ops of ``namespace`` a unit of code sends (named anywhere but in a comparison or as a
    dispatch table's key) and those it handles (compared with, or a dispatch table's key)."""
    aliases = _aliases(ast.parse(path.read_text()))
    tree = _unit(path, unit)
    handled_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            handled_nodes |= {id(n) for n in ast.walk(node)}
        elif isinstance(node, ast.Dict):
            handled_nodes |= {id(n) for k in node.keys if k is not None for n in ast.walk(k)}
        elif isinstance(node, ast.Assign) and any(  # a watcher's ops and gang: what it takes
                isinstance(t, ast.Name) and t.id in WATCHER_TAKES for t in node.targets):
            handled_nodes |= {id(n) for n in ast.walk(node.value)}
    sent: set[str] = set()
    handled: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.isupper()):
            continue
        owner = ast.unparse(node.value).removeprefix("protocol.")
        if aliases.get(owner) != namespace:
            continue
        value = getattr(NAMESPACES[namespace], node.attr)
        values = {value} if isinstance(value, str) else set(value)
        (handled if id(node) in handled_nodes else sent).update(values)
    return sent, handled


def _ops_sent(units: tuple[Unit, ...], namespace: str) -> set[str]:
    return set().union(*(_refs(PACKAGE / m, u, namespace)[0] for m, u in units))


def _ops_handled(units: tuple[Unit, ...], namespace: str) -> set[str]:
    return set().union(*(_refs(PACKAGE / m, u, namespace)[1] for m, u in units))


@pytest.mark.parametrize("channel", CHANNELS, ids=[c.name for c in CHANNELS])
def test_every_op_sent_is_one_its_receiver_handles(channel: Channel) -> None:
    sent = _ops_sent(channel.senders, channel.namespace)
    assert sent == channel.carries, f"sent {sorted(sent)}, the protocol says " \
        f"{sorted(channel.carries)}"
    unhandled = sent - _ops_handled(channel.dispatch, channel.namespace) - HEARD_ANYWAY
    assert not unhandled, f"sent, never dispatched: {sorted(unhandled)}"
    unhandled = channel.passed_ops - _ops_handled(channel.passed, channel.namespace)
    assert not unhandled, f"passed on, never handled: {sorted(unhandled)}"


def test_every_op_is_carried_one_way_or_the_other() -> None:
    for name, namespace in NAMESPACES.items():
        members = _members(namespace)
        assert len(set(members.values())) == len(members), f"{name}: two names, one op"
        carried = set().union(*(c.carries for c in CHANNELS if c.namespace == name))
        unused = set(members.values()) - carried - {protocol.Probe.FACTS}
        assert not unused, f"{name}: {sorted(unused)} named but never sent"
    assert set(protocol.Gang.LINKS) <= set(protocol.Gang.TO_HUB) | set(protocol.Gang.TO_PEER)


def test_the_answers_kinds_are_sent_and_read() -> None:
    """The probe's first answer, the sampler's and a chained program's last event: each is
    written by its program and looked for by the controller with protocol.py's name."""
    for sender, reader, name in (("remote/probe/probe.py", "preflight/probe_session.py", "FACTS"),
                                 ("remote/tools/sampler.py", "observe/watch.py", "SAMPLE"),
                                 ("remote/tools/stackdump.py", None, "STACKS"),
                                 ("remote/tools/toolcache.py", None, "TOOLS"),
                                 ("transport/shell.py", "logs/follow.py", "NEXT")):
        for path in filter(None, (sender, reader)):
            source = (PACKAGE / path).read_text()
            assert f"P.{name}" in source or f"protocol.{name}" in source \
                or f"Probe.{name}" in source, (path, name)


# Where a message's type is written or read: the places a bare string would escape protocol.py.
_OP_FIELDS = {"op", "ev"}  # protocol.OP, protocol.KIND
# Calls that take a message's type as an argument (the others take the message, a dict).
_SENDS = {"ask", "_send", "event", "stamp", "_answer"}


def _is_field(node: ast.AST) -> bool:
    """``protocol.OP`` / ``OP`` / ``protocol.KIND``: the key that names a message's type."""
    return ((isinstance(node, ast.Attribute) and node.attr in ("OP", "KIND"))
            or (isinstance(node, ast.Name) and node.id in ("OP", "KIND")))


def _is_type(node: ast.AST) -> bool:
    """A message's type as read: ``op``/``kind``, or ``msg.get(protocol.OP)``, ``msg[OP]``."""
    if isinstance(node, ast.Name):
        return node.id in ("op", "kind")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "get" and bool(node.args) and _is_field(node.args[0])
    return isinstance(node, ast.Subscript) and _is_field(node.slice)


def _strings(node: ast.AST) -> list[str]:
    """Bare strings a value may be: ``"stop"``, ``("stop", "kill")``, ``"a" if x else "b"``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    return []


def bare_message_types(source: str) -> list[str]:
    """Each place in ``source`` that writes or reads a message's type as a string of its own
    instead of a name from protocol.py, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value in _OP_FIELDS:
                    found.append(f"{line}: the key {key.value!r}")
                elif key is not None and _is_field(key) and _strings(value):
                    found.append(f"{line}: {_strings(value)}")
        elif isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Constant) and node.slice.value in _OP_FIELDS:
                found.append(f"{line}: [{node.slice.value!r}]")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else (
                node.func.id if isinstance(node.func, ast.Name) else "")
            if name == "get" and node.args and _strings(node.args[0]) and \
                    _strings(node.args[0])[0] in _OP_FIELDS:
                found.append(f"{line}: .get({_strings(node.args[0])[0]!r})")
            found += [f"{line}: {k.arg}={_strings(k.value)}" for k in node.keywords
                      if k.arg in _OP_FIELDS and _strings(k.value)]
            if name in _SENDS:
                found += [f"{line}: {name}({_strings(a)})" for a in node.args if _strings(a)]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_type(o) for o in operands):
                found += [f"{line}: compared with {_strings(o)}" for o in operands
                          if _strings(o)]
    return found


def test_the_scan_finds_every_form_of_a_bare_message_type() -> None:
    bad = """
send({"op": "stop"})
send({protocol.OP: "kill" if force else "stop"})
x = msg["op"]
y = msg.get("ev")
send(dict(info, op="ended"))
session.ask("route", addr=a)
_send(proc, "hb")
writer.event("started", pid=1)
if op in ("stall", "resumed"): pass
if msg.get(protocol.OP) == "welcome": pass
if kind == "exit": pass
"""
    assert sorted({int(f.split(":")[0]) for f in bare_message_types(bad)}) == list(range(2, 13))
    good = """
send({protocol.OP: Lifeline.KILL if force else Lifeline.STOP, "reason": "Ctrl-C"})
if op in (protocol.Lifeline.STOP, protocol.Lifeline.KILL) and state == "running": pass
session.ask(Probe.ROUTE, addr=a)
"""
    assert bare_message_types(good) == []


def test_no_module_writes_or_reads_a_message_type_of_its_own() -> None:
    """Every op and event kind between the controller, the supervisors, the hub and the
    programs on the hosts is a name from protocol.py, never a string typed in place."""
    found = {str(p.relative_to(PACKAGE)): bare_message_types(p.read_text())
             for p in sorted(PACKAGE.rglob("*.py")) if p.name != "protocol.py"}
    assert not {path: where for path, where in found.items() if where}


def test_the_programs_that_name_the_protocol_ship_it() -> None:
    """A program on a host sees protocol.py only when its imports ship it along
    (transport/bundle.py): the probe and the gang's modules gained it."""
    for name in ("probe.py", "run.py", "pyenv.py", "stackdump.py", "sampler.py"):
        shipped = bundle.program_source(name)
        assert b'_clusterrun_module("clusterrun.remote.shared.protocol"' in shipped


# -- the mirror ------------------------------------------------------------------------------


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    made = Mirror(store.create(tmp_path / "home", "run-1"))
    yield made
    made.close()


def test_overlapping_offsets_never_duplicate(mirror: Mirror) -> None:
    assert mirror.append("n1", "rank0.log", 0, b"abc") == b"abc"
    assert mirror.append("n1", "rank0.log", 0, b"abcdef") == b"def"  # resent from the start
    assert mirror.append("n1", "rank0.log", 2, b"cdefgh") == b"gh"  # overlapping
    assert mirror.append("n1", "rank0.log", 3, b"def") == b""  # nothing new
    assert mirror.append("n1", "rank0.log", 8, b"") == b""
    assert mirror.run.mirror("n1", "rank0.log").read_bytes() == b"abcdefgh"
    assert mirror.size("n1", "rank0.log") == 8
    assert mirror.offsets("n1") == {"rank0.log": 8}
    arrivals = [line.split("\t") for line in
                mirror.run.file("arrivals").read_text().splitlines()]
    assert [fields[:3] for fields in arrivals] == [
        ["n1", "rank0.log", "3"], ["n1", "rank0.log", "6"], ["n1", "rank0.log", "8"]]
    assert all(abs(float(fields[3]) - time.time()) < 60 for fields in arrivals)


def test_a_gap_is_refused(mirror: Mirror) -> None:
    mirror.append("n1", "rank0.log", 0, b"abc")
    with pytest.raises(ProtocolError, match="jumped from byte 3 to 5"):
        mirror.append("n1", "rank0.log", 5, b"fg")
    assert mirror.run.mirror("n1", "rank0.log").read_bytes() == b"abc"


def test_file_names_that_would_leave_the_node_folder_are_refused(mirror: Mirror) -> None:
    for name in ("../state.json", "a/b", ".hidden"):
        with pytest.raises(ProtocolError, match="refusing a log file name"):
            mirror.append("n1", name, 0, b"x")


def test_receive_resumes_a_dropped_stream_byte_exact(mirror: Mirror) -> None:
    events: list[dict[str, Any]] = []
    shown: list[tuple[str, str, bytes]] = []

    def on_data(node: str, name: str, chunk: bytes) -> None:
        shown.append((node, name, chunk))

    cut = STREAM.index(b"J {\"ev\": \"exit\"")
    receive("n1", Stream(STREAM[:cut]), mirror, events.append, on_data)
    # The stream dropped; the resumed one starts over from offset 0 (overlapping everything).
    receive("n1", Stream(STREAM), mirror, events.append, on_data)
    whole = TRICKY + b"\n"
    assert mirror.run.mirror("n1", "rank0.log").read_bytes() == whole
    assert b"".join(chunk for _, name, chunk in shown if name == "rank0.log") == whole
    assert [e["ev"] for e in events] == ["started", "started", "exit", "end"]
    checked = verify(mirror.run, {"n1": {"rank0.log": [len(whole),
                                                       hashlib.sha256(whole).hexdigest()],
                                         "rank1.log": [0, hashlib.sha256(b"").hexdigest()]}})
    assert checked == {"files": 2, "identical": 2, "differ": []}


def test_verify_names_a_file_that_differs(mirror: Mirror) -> None:
    mirror.append("n1", "rank0.log", 0, b"abc")
    checked = verify(mirror.run, {"n1": {"rank0.log": [3, hashlib.sha256(b"abd").hexdigest()]}})
    assert checked["differ"] == ["n1/rank0.log"] and checked["identical"] == 0
