"""What every clusterrun program on a host shares (stdlib only, Python 3.6+).

Shipped together with the program that imports it (see clusterrun/transport/bundle.py): the
loader registers it as ``clusterrun.remote.hostlib.hostio`` before the program runs.

- files: a private directory; the log files a run streams (layout.py names them); their
  checksums
- ``Writer``: the only writer of stdout, on its own thread (a paused controller blocks it, never
  the job), in the frames of protocol.py
- the phases of a supervisor and the causes of a stop

Beside it: procs.py (processes: ``Tree``) and mainloop.py (the selectors loop and the lifeline).
"""

import contextlib
import enum
import os
import queue
import sys
import threading
import time

from clusterrun.remote.shared import layout, protocol, timing

# How long the Writer's thread waits for an event before it looks at the streamed log files
# again: how late a rank's new output may reach the controller.
PUMP_EVERY = 0.1
CHUNK = 256 * 1024


class Phase(enum.Enum):
    """Where a supervisor is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    ENDED = "ended"


class Cause(enum.Enum):
    """Why a supervisor ended its job before the job ended on its own."""

    RANK_FAILED = "rank_failed"  # one of this node's ranks failed (the node's own failure)
    TORCHRUN_FAILED = "torchrun_failed"
    CONTROLLER = "controller"  # the controller asked (another node failed, Ctrl-C, ...)
    LIFELINE_EOF = "lifeline_eof"  # the controller's connection closed
    LEASE_EXPIRED = "lease_expired"  # no heartbeat from the controller for the lease
    SIGNAL = "signal"  # SIGTERM/SIGINT/SIGHUP/SIGUSR2 on this host (`clusterrun stop`)
    TIMEOUT = "timeout"  # `exec --timeout`
    PEER_FAILED = "peer_failed"  # detached: another node failed (the hub said so)
    PEER_LOST = "peer_lost"  # detached: the hub, or a worker the hub needs, was lost
    PEER_STOPPED = "peer_stopped"  # detached: the hub was stopped
    # the disk under the run directory filled up (remote/shared/diskfloor.py)
    DISK_FULL = "disk_full"
    STALLED = "stalled"  # no rank made progress for --stall-timeout (--on-stall stop)


# Causes that mean the controller is gone: the node's outcome is then "lost".
CONTROLLER_GONE = (Cause.LIFELINE_EOF, Cause.LEASE_EXPIRED)


class Clock:
    """Seconds since this supervisor started, by this host's own clocks: every event carries
    them, so the controller never compares two hosts' wall clocks."""

    def __init__(self):
        self.mono = time.monotonic()
        self.wall = time.time()

    def elapsed(self):
        return round(time.monotonic() - self.mono, 4)

    def since_wall(self, wall):
        """A file's mtime (this host's wall clock) as seconds since the start."""
        return round(wall - self.wall, 4)


# --------------------------------------------------------------------------------------------
# Files


def make_private_dir(path):
    """Create ``path`` and missing parents as 0700 directories, refusing symlinks."""
    parts = []
    head = path
    while head and not os.path.isdir(head):
        parts.append(head)
        head = os.path.dirname(head)
    for part in reversed(parts):
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o700)
    if os.path.islink(path) or not os.path.isdir(path):
        raise OSError("%s is not a directory" % path)
    os.chmod(path, 0o700)


def log_files(folder):
    """The files a run streams: the node's own log, then each rank's (or exec's two)."""
    names = [n for n in (layout.NODE_LOG, layout.EXEC_OUT, layout.EXEC_ERR)
             if os.path.exists(os.path.join(folder, n))]
    try:
        listed = os.listdir(folder)
    except OSError:
        listed = []
    ranks = sorted((rank, n) for rank, n in ((layout.rank_of(n), n) for n in listed)
                   if rank is not None)
    return names + [n for _rank, n in ranks]


def checksums(folder):
    import hashlib  # only at the end of a run: every program's start-up imports this module

    out = {}
    for name in log_files(folder):
        digest = hashlib.sha256()
        size = 0
        with open(os.path.join(folder, name), "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        out[name] = [size, digest.hexdigest()]
    return out

# --------------------------------------------------------------------------------------------
# Output to the controller


class Writer:
    """The only writer of stdout, on its own thread. Writes may block while the controller is
    slow or paused; that delays only this thread, never the job. Log data goes out before the
    final event. ``folder``: whose files to stream by offset (None: events only)."""

    def __init__(self, clock, folder=None, offsets=None, heartbeat=2.0, out=None):
        self.clock = clock
        self.folder = folder
        self.offsets = dict(offsets or {})
        self.heartbeat = heartbeat
        self.out = out if out is not None else sys.stdout.buffer
        self.events = queue.Queue()
        self.final = None
        self.broken = False
        self.finished = threading.Event()

    def start(self):
        threading.Thread(target=self._run, daemon=True).start()

    def event(self, ev, elapsed=None, **fields):
        """``elapsed``: when it happened, if not now (as ``Clock.elapsed`` counts)."""
        if elapsed is not None:
            fields[protocol.ELAPSED] = elapsed
        self.events.put(self.stamp(ev, fields))

    def stamp(self, ev, fields):
        fields[protocol.KIND] = ev
        fields.setdefault(protocol.ELAPSED, self.clock.elapsed())
        fields.setdefault(protocol.WALL, time.time())
        return fields

    def end(self, **fields):
        self.final = fields
        self.events.put(None)

    def _send(self, frame):
        if self.broken:
            return
        try:
            self.out.write(frame)
            self.out.flush()
        except (OSError, ValueError):
            self.broken = True  # the controller went away; the job carries on regardless

    def _pump_files(self):
        if self.folder is None:
            return False
        sent = False
        for name in log_files(self.folder):
            path = os.path.join(self.folder, name)
            offset = self.offsets.get(name, 0)
            try:
                size = os.path.getsize(path)
                if size <= offset:
                    continue
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read(min(CHUNK, size - offset))
            except OSError:
                continue
            if not data:
                continue
            self._send(protocol.data_frame(name, offset, data))
            self.offsets[name] = offset + len(data)
            sent = True
        return sent

    def _run(self):
        last = time.monotonic()
        ending = False
        while True:
            try:
                item = self.events.get(timeout=PUMP_EVERY)
                if item is None:
                    ending = True
                else:
                    self._send(protocol.event_frame(item))
                    last = time.monotonic()
            except queue.Empty:
                pass
            while self._pump_files():
                last = time.monotonic()
                if not self.events.empty():
                    break
            if ending and self.events.empty() and not self._pump_files():
                final = self.stamp(protocol.END, dict(self.final or {}))
                self._send(protocol.event_frame(final))
                self.finished.set()
                return
            if timing.due(time.monotonic(), last, self.heartbeat):
                self._send(protocol.event_frame(self.stamp(protocol.HEARTBEAT, {})))
                last = time.monotonic()


def reply(obj):
    """A one-shot program's single answer."""
    out = sys.stdout.buffer
    out.write(protocol.event_frame(obj))
    out.flush()
