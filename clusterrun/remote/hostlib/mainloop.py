"""The supervisor's one loop: ``selectors`` over stdin and sockets, signals recorded by their
handlers and acted on in the loop, and the lifeline (stdlib only, Python 3.6+)."""

import contextlib
import errno
import fcntl
import json
import os
import selectors
import signal
import sys
import time

from clusterrun.remote.shared import timing

# The longest one turn of the loop waits for a file or a signal, so the caller's timers (lease,
# deadlines, watchers) run at most this late.
TICK = 0.1


def set_nonblocking(fd):
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


class Loop:
    """One selectors loop: callbacks on readable files, signals recorded by their handlers
    (no locks, no I/O there: a handler may interrupt any code) and handled here."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()
        self.signals = []
        read_end, write_end = os.pipe()
        set_nonblocking(read_end)
        set_nonblocking(write_end)
        self.wakeup = read_end
        signal.set_wakeup_fd(write_end)  # a signal wakes select() at once
        self.selector.register(read_end, selectors.EVENT_READ, self._drain_wakeup)

    def _drain_wakeup(self, _fd):
        with contextlib.suppress(OSError):
            os.read(self.wakeup, 4096)

    def catch(self, signums):
        for sig in signums:
            signal.signal(sig, self._record)

    def _record(self, signum, _frame):
        self.signals.append(signum)

    def take_signals(self):
        taken, self.signals[:] = list(self.signals), []
        return taken

    def watch(self, fileobj, callback):
        self.selector.register(fileobj, selectors.EVENT_READ, callback)

    def unwatch(self, fileobj):
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(fileobj)

    def once(self, timeout=TICK):
        for key, _mask in self.selector.select(timeout):
            key.data(key.fileobj)


class Lifeline:
    """stdin from the controller: one JSON object per line, a protocol.Lifeline message,
    handed to ``on_op`` whole. EOF means
    the controller is gone (sshd closes the command's stdin when the connection drops); silence
    longer than the lease means it may be partitioned away."""

    def __init__(self, loop, on_op, on_eof, fd=0):
        self.fd = fd
        self.on_op = on_op
        self.on_eof = on_eof
        self.buf = b""
        self.last = time.monotonic()
        self.closed = False
        set_nonblocking(fd)
        self.loop = loop
        loop.watch(fd, self._readable)
        if fd == 0:
            # The request line was read through sys.stdin's buffer, which may hold what came
            # right after it (an early stop). Only buffered bytes, or one non-blocking read:
            # an EOF missed here shows again on the descriptor.
            with contextlib.suppress(OSError, ValueError):
                self._feed(sys.stdin.buffer.read1(65536) or b"")  # type: ignore[union-attr]

    def _readable(self, _fd):
        try:
            data = os.read(self.fd, 65536)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return
            data = b""
        if not data:
            self.closed = True
            self.loop.unwatch(self.fd)
            self.on_eof()
            return
        self._feed(data)

    def _feed(self, data):
        if not data:
            return
        self.last = time.monotonic()
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if isinstance(msg, dict):
                self.on_op(msg)

    def quiet(self):
        return time.monotonic() - self.last

    def lapsed(self, lease):
        """Silent for longer than ``lease`` (float rounding aside)."""
        return timing.over(time.monotonic(), self.last, lease)
