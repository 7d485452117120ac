"""The daemon's side of one client's socket: who is at the other end, and what goes back to
it, written by a thread of its own."""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux: SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class Outbox:
    """What goes to one client, written by a thread of its own: a client that stops reading
    (a stopped CLI) holds up only itself, never an agent's channel that other commands share.
    Past LIMIT bytes queued it is cut off, as a client that died."""

    LIMIT = 256 * 1024 * 1024

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queue: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.closed = False
        self.cond = threading.Condition()
        threading.Thread(target=self._write, daemon=True, name="outbox").start()

    def put(self, data: bytes) -> None:
        with self.cond:
            if self.closed:
                return
            if self.size + len(data) > self.LIMIT:
                self.closed = True
                with contextlib.suppress(OSError):  # its reader sees the end, ends its requests
                    self.sock.shutdown(socket.SHUT_RDWR)
                self.cond.notify_all()
                return
            self.queue.append(data)
            self.size += len(data)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def _write(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue:
                    break
                data = self.queue.popleft()
                self.size -= len(data)
            try:
                self.sock.sendall(data)
            except OSError:
                self.close()
                break
        self.sock.close()
