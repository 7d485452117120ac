"""The supervisor's wire frames (remote/protocol.py, wire.py) and the local mirrors
(logs/mirror.py): framing holds whatever the bytes and wherever the stream is cut; a resumed
stream neither duplicates nor loses. Both ends use protocol.py's names."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun import wire
from clusterrun.logs.mirror import Mirror, receive, verify
from clusterrun.remote import protocol
from clusterrun.runs import store
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
         protocol.PROGRESS: wire.Progress}


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
    for path in sorted(REMOTE.glob("*.py")):
        for kind, names, line in _sent(ast.parse(path.read_text())):
            seen.add(kind)
            unknown = names - set(protocol.FIELDS[kind])
            assert not unknown, f"{path.name}:{line}: {kind} with {sorted(unknown)}"
    assert {protocol.STARTED, protocol.RANK_EXIT, protocol.TORCHRUN_EXIT, protocol.END} <= seen


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
    arrivals = mirror.run.file("arrivals").read_text().splitlines()
    assert arrivals == ["n1\trank0.log\t3", "n1\trank0.log\t6", "n1\trank0.log\t8"]


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
