"""The wire between a host's supervisor and this machine: ``J <json>\\n`` event frames and
``D <json>\\n<bytes>`` data frames, each naming a file and the byte offset it starts at."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Optional

from clusterrun.transport import Process


class ProtocolError(Exception):
    pass


def frames(proc: Process) -> Iterator[tuple[dict[str, Any], Optional[bytes]]]:
    """(event, None) or (data header, bytes) until the stream ends."""
    buf = bytearray()
    eof = False
    while True:
        nl = buf.find(b"\n")
        if nl >= 0:
            kind, header = bytes(buf[:2]), json.loads(bytes(buf[2:nl]))
            if kind == b"J ":
                del buf[: nl + 1]
                yield header, None
                continue
            if kind != b"D ":
                raise ProtocolError(f"unexpected output from the supervisor: {bytes(buf[:80])!r}")
            need = nl + 1 + header["n"]
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
