"""The warm session's wire (stdlib only, Python 3.6+): one frame format for both of its legs,
the command line to the session daemon (a Unix socket) and the daemon to a host's agent (one
SSH channel, tools/hostagent.py).

A frame is a 4-byte big-endian length N, then N bytes: 1 byte ``kind``, a 4-byte big-endian
request id, the payload. Each request (one command on one host) has an id chosen by whoever
asked; the daemon maps a client's ids to its own on the agent's channel.

- RUN, payload JSON ``{"command": str}``: start ``/bin/sh -c command``. When the command is
  one of clusterrun's programs started the plain way (``PYTHON -u -c BOOTSTRAP``: no
  ``setup:``, no container), the daemon adds ``"python": PYTHON, "site": bool`` (False for
  -S), and an agent that is that interpreter forks itself to run it (hostlib/warmrun.py).
  On the client's leg the first RUN of a connection names the host instead (``{"host": ...,
  "options": ...}``, see clusterrun/session/), and ``{"control": "status"|"stop"}`` asks the
  daemon itself.
- STDIN (bytes), EOF (close the command's stdin), CLOSE (the asker closed its end: close the
  command's stdin and stop relaying its output; the command is not killed, as with sshd).
- STDOUT, STDERR (bytes; an empty payload is that stream's end), EXIT (JSON ``{"status": int}``,
  sent after both streams ended; -1 for a command killed by a signal, which is what paramiko
  reports for sshd's exit-signal, with ``"signal": n`` beside it).
- ERROR (JSON ``{"outcome": name, "message": str}``): could not start, could not connect; the
  outcome is the name of the controller's errors.Outcome.
- PING, PONG: liveness. The agent's first frame is a PONG of id 0 carrying ``{"pid": int}``;
  the daemon answers a client's RUN with a PONG of the same id once the command is on its way.
"""

import json
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple

RUN = 1
STDIN = 2
EOF = 3
CLOSE = 4
STDOUT = 5
STDERR = 6
EXIT = 7
ERROR = 8
PING = 9
PONG = 10

# A client's RUN that asks the daemon itself: {CONTROL: STATUS} or {CONTROL: STOP}.
CONTROL = "control"
STATUS = "status"
STOP = "stop"

# An agent's RUN for one of clusterrun's programs: the interpreter it names, with site or -S.
PYTHON = "python"
SITE = "site"

NAMES = {RUN: "RUN", STDIN: "STDIN", EOF: "EOF", CLOSE: "CLOSE", STDOUT: "STDOUT",
         STDERR: "STDERR", EXIT: "EXIT", ERROR: "ERROR", PING: "PING", PONG: "PONG"}

_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">BI")  # kind, request id
MAX_PAYLOAD = 16 * 1024 * 1024  # a length past this is a broken stream, not a frame

Frame = Tuple[int, int, bytes]


class FrameError(ValueError):
    """The bytes are not a stream of frames (a corrupt or foreign peer)."""


def encode(kind: int, rid: int, payload: bytes = b"") -> bytes:
    return _LENGTH.pack(_HEAD.size + len(payload)) + _HEAD.pack(kind, rid) + payload


def encode_json(kind: int, rid: int, value: Dict[str, Any]) -> bytes:
    return encode(kind, rid, json.dumps(value).encode())


def loads(payload: bytes) -> Dict[str, Any]:
    """A JSON payload as a dict (anything else is a FrameError)."""
    try:
        value = json.loads(payload.decode())
    except ValueError as exc:
        raise FrameError("a frame's JSON payload does not parse: %s" % exc) from None
    if not isinstance(value, dict):
        raise FrameError("a frame's JSON payload is not an object")
    return value


class Reader:
    """Frames out of a byte stream that arrives in pieces of any size."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> List[Frame]:
        self.buf += data
        out = []
        while len(self.buf) >= _LENGTH.size:
            size = _LENGTH.unpack_from(self.buf)[0]
            if size < _HEAD.size or size > MAX_PAYLOAD + _HEAD.size:
                raise FrameError("a frame of %d bytes" % size)
            end = _LENGTH.size + size
            if len(self.buf) < end:
                break
            kind, rid = _HEAD.unpack_from(self.buf, _LENGTH.size)
            out.append((kind, rid, bytes(self.buf[_LENGTH.size + _HEAD.size:end])))
            del self.buf[:end]
        return out


def read_frame(read: Callable[[int], bytes]) -> Optional[Frame]:
    """One frame from a blocking stream (``sock.recv``); None at its end (a frame cut short
    by the end counts as the end)."""
    head = _read_exactly(read, _LENGTH.size)
    if head is None:
        return None
    size = _LENGTH.unpack(head)[0]
    if size < _HEAD.size or size > MAX_PAYLOAD + _HEAD.size:
        raise FrameError("a frame of %d bytes" % size)
    body = _read_exactly(read, size)
    if body is None:
        return None
    kind, rid = _HEAD.unpack_from(body)
    return kind, rid, body[_HEAD.size:]


def _read_exactly(read: Callable[[int], bytes], size: int) -> Optional[bytes]:
    got = bytearray()
    while len(got) < size:
        chunk = read(size - len(got))
        if not chunk:
            return None
        got += chunk
    return bytes(got)
