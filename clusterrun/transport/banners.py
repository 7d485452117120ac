"""What a server that is not sshd said in place of SSH's greeting: paramiko reads and skips
such lines (logging them at DEBUG) and then fails as if the wait had run out, so the line is
kept here, per transport thread, for the one sentence that names the port's real owner."""

from __future__ import annotations

import logging
import threading
from typing import Optional

# What paramiko raises when the greeting is not SSH's: reading it failed (an end of file, a
# reset, bytes that are not text) or, after a hundred lines none of which began with "SSH-",
# this and the last of them.
NO_BANNER = "Error reading SSH protocol banner"
GARBLED = "Indecipherable protocol version "


class Greetings(logging.Filter):
    """The first line a server sent in place of SSH's greeting (an HTTP server's "HTTP/1.1 400
    ..."), per transport thread: paramiko logs such lines at DEBUG and keeps nothing. Every
    other record passes exactly as the logger's level would have let it."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.lines: dict[int, str] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and msg.startswith("Banner: ") and record.thread is not None:
            with self._lock:
                if len(self.lines) < 4096:  # taken by connect(); bounded all the same
                    self.lines.setdefault(record.thread, msg[len("Banner: "):])
        return record.levelno >= self.level

    def take(self, thread: Optional[int]) -> Optional[str]:
        with self._lock:
            return self.lines.pop(thread, None) if thread is not None else None


_transport_log = logging.getLogger("paramiko.transport")
greetings = Greetings(_transport_log.getEffectiveLevel())
_transport_log.addFilter(greetings)
_transport_log.setLevel(logging.DEBUG)  # the filter lets through what the level did before


def not_ssh(exc: BaseException, greeting: Optional[str]) -> Optional[str]:
    """What the server said instead of SSH's greeting, in a few escaped characters, or that it
    closed the connection; None when it said nothing at all before the wait ran out."""
    cause = exc.__context__  # paramiko's banner error is raised while handling the real one
    if isinstance(cause, UnicodeDecodeError):  # a line of bytes that are not even text
        return ascii(bytes(cause.object[:40]))
    text = str(exc)
    if not text.startswith((NO_BANNER, GARBLED)):  # past the greeting: an SSH server
        return None
    if greeting is not None or text.startswith(GARBLED):
        line = greeting if greeting is not None else text[len(GARBLED):].strip('"')
        return ascii(line[:40] + ("..." if len(line) > 40 else ""))
    # A close while our own greeting is unread arrives as a reset, not as an end of file.
    if isinstance(cause, (EOFError, ConnectionResetError)):
        return "closed the connection at once; an sshd over its MaxStartups does that too"
    return None
