"""The supervisor's wire frames (logs/wire.py) and the local mirrors (logs/mirror.py): framing
holds whatever the bytes and wherever the stream is cut; a resumed stream neither duplicates
nor loses."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun.logs.mirror import Mirror, receive, verify
from clusterrun.logs.wire import ProtocolError, frames
from clusterrun.runs import store


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
