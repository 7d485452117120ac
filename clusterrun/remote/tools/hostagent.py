"""Program hostagent.py: the warm session's resident agent on a host (stdlib only, 3.6+).

Started once per host by the session daemon over one SSH channel, it reads frames
(shared/frames.py) on stdin and, for each RUN, starts ``/bin/sh -c COMMAND`` in its own
session with pipes for stdin, stdout and stderr, as sshd starts a command on a channel of its
own. Every child's output and exit status go back as frames on stdout, one writer in one
selectors loop.

Why /bin/sh and not the user's shell: this agent was started by sshd through the user's login
shell, which read its rc file (~/.bashrc) once; the environment that left (PATH from the rc,
a venv or conda activation) passes to every child as it is. The user's bash run as a child
would see sshd's variables (SSH_CLIENT) and read ~/.bashrc again on every command, which is
the cost the session is there to save. A command that wants the user's shell (``exec``'s)
names it itself.

It exits on stdin EOF (the daemon closed the channel, or its connection broke) and when no
frame arrives for ``silence`` seconds (the daemon pings far more often: a half-open
connection). Exiting closes every child's stdin, so each sees EOF there, as when sshd dies: the
children are never killed by the agent (clusterrun's programs end on their lifeline's EOF).
"""

import contextlib
import errno
import json
import os
import select
import selectors
import subprocess
import sys
import time

from clusterrun.remote.hostlib import warmrun
from clusterrun.remote.shared import frames

SILENCE = 30.0  # seconds without a frame from the daemon before the agent calls it gone
HIGH_WATER = 1 << 20  # bytes queued for the daemon before the children's output waits
REAP_TICK = 0.02  # how often a child whose streams ended is looked at until it exits
# A child's streams end as it exits, a moment before it can be reaped: looked at this often
# for the first REAP_SOON seconds, so its EXIT (the command's end, as the client sees it) is
# not held up by a whole REAP_TICK.
REAP_FAST, REAP_SOON = 0.001, 0.05


class Child:
    """One RUN: the child's process, its pipes, what waits to be written to its stdin."""

    def __init__(self, rid, proc):
        self.rid = rid
        self.proc = proc
        self.streams = {proc.stdout.fileno(): frames.STDOUT, proc.stderr.fileno(): frames.STDERR}
        self.pending = bytearray()
        self.eof_asked = False
        self.relay = True  # False once the daemon closed it: output is dropped, nothing sent

    def stdin_fd(self):
        """The child's stdin, or None once it is closed."""
        stdin = self.proc.stdin
        return None if stdin is None or stdin.closed else stdin.fileno()

    def close_stdin(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.close()


class Pending:
    """A RUN of one of clusterrun's programs that this agent forks: started once the program
    is all here (BOOTSTRAP's length line and that many bytes), so that the fork runs the
    agent's kept code of it (warmrun.Programs). What came for it so far."""

    def __init__(self, rid, site):
        self.rid = rid
        self.site = site
        self.stdin = bytearray()


class Agent:
    def __init__(self, silence, boot=None, loader=None):
        self.silence = silence
        self.boot = boot  # BOOTSTRAP's body, when the daemon lets programs start as forks
        self.programs = warmrun.Programs(loader.encode() if loader else None)
        self.selector = selectors.DefaultSelector()
        self.reader = frames.Reader()
        self.out = bytearray()
        self.children = {}  # rid -> Child, or Pending until its program is here
        self.reaping = []  # children whose streams ended (or were dropped), until they exit
        self.reaping_since = 0.0  # monotonic: when the last one joined
        self.heard = time.monotonic()
        self.home = os.path.expanduser("~")
        # Each child starts from home itself; the agent, resident for minutes, holds no folder
        # open, so unmounting the home (or a workdir under it) between commands is not "busy".
        with contextlib.suppress(OSError):
            os.chdir("/")
        os.set_blocking(0, False)
        os.set_blocking(1, False)
        self.selector.register(0, selectors.EVENT_READ, None)

    # -- to the daemon

    def send(self, kind, rid, payload=b""):
        self.out += frames.encode(kind, rid, payload)

    def flush(self):
        while self.out:
            try:
                n = os.write(1, self.out)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    return
                raise SystemExit(0) from None  # the channel is gone: nobody to answer
            del self.out[:n]

    # -- from the daemon

    def on_stdin(self):
        try:
            data = os.read(0, 65536)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return True
            data = b""
        if not data:
            return False
        self.heard = time.monotonic()
        for kind, rid, payload in self.reader.feed(data):
            self.on_frame(kind, rid, payload)
        return True

    def on_frame(self, kind, rid, payload):
        child = self.children.get(rid)
        if kind == frames.PING:
            self.send(frames.PONG, rid)
        elif kind == frames.RUN:
            request = frames.loads(payload)
            python = request.get(frames.PYTHON)
            if self.boot and python and warmrun.is_this_interpreter(str(python)):
                self.children[rid] = Pending(rid, bool(request.get(frames.SITE)))
            else:
                self.start(rid, request.get("command") or "")
        elif child is None:
            return  # a request that already ended: what comes late for it is dropped
        elif isinstance(child, Pending):
            self.on_pending(child, kind, payload)
        elif kind == frames.STDIN:
            if not child.eof_asked:
                child.pending += payload
                self.feed_child(child)
        elif kind == frames.EOF:
            child.eof_asked = True
            self.feed_child(child)
        elif kind == frames.CLOSE:
            self.drop(child)

    def on_pending(self, pending, kind, payload):
        """Its program is all here, or nothing more will come (EOF, CLOSE): it starts, with
        the kept code when the program is whole, else reading what came as BOOTSTRAP does."""
        if kind == frames.STDIN:
            pending.stdin += payload
        split = warmrun.split_program(pending.stdin)
        if split is None and kind == frames.STDIN:
            return
        del self.children[pending.rid]
        kept = self.programs.get(split[1]) if split else None
        self.start(pending.rid, None, pending.site,
                   None if kept is None else (split[0], *kept))
        child = self.children.get(pending.rid)
        if child is None:
            return  # it could not start (ERROR sent)
        child.pending += pending.stdin if kept is None else split[2]
        self.feed_child(child)
        if kind != frames.STDIN:
            self.on_frame(kind, pending.rid, payload)

    def start(self, rid, command, site=False, kept=None):
        """``/bin/sh -c command``, or with no command one of clusterrun's programs in a fork
        of this interpreter (hostlib/warmrun.py; ``kept``: see warmrun.spawn)."""
        cwd = self.home if os.path.isdir(self.home) else "/"
        try:
            if command is None:
                proc = warmrun.spawn(self.boot, site, cwd, kept)
            else:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, cwd=cwd, start_new_session=True,
                    restore_signals=True, close_fds=True)
        except OSError as exc:
            self.send(frames.ERROR, rid, json.dumps(
                {"outcome": "CONNECTION_LOST", "message": "cannot start %s: %s" % (
                    "/bin/sh" if command is not None else "a program", exc)}).encode())
            return
        child = Child(rid, proc)
        os.set_blocking(child.stdin_fd(), False)
        self.children[rid] = child
        for fd in child.streams:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, child)

    # -- the children

    def feed_child(self, child):
        fd = child.stdin_fd()
        while child.pending and fd is not None:
            try:
                n = os.write(fd, child.pending)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    break
                child.pending.clear()  # it closed its stdin (EPIPE): nothing more goes in
                break
            del child.pending[:n]
        watched = self._watched(fd)
        if child.pending and fd is not None and not watched:
            self.selector.register(fd, selectors.EVENT_WRITE, child)
        elif not child.pending:
            self.unwatch(fd)
        if not child.pending and child.eof_asked:
            child.close_stdin()

    def unwatch(self, fd):
        if self._watched(fd):
            self.selector.unregister(fd)

    def _watched(self, fd):
        if fd is None:
            return False
        try:
            self.selector.get_key(fd)
        except KeyError:
            return False
        return True

    def dispatch(self, key, events):
        """One ready descriptor of a round of select(); False when the daemon is gone."""
        if key.fd == 0:
            return self.on_stdin()
        if key.fd == 1:
            self.flush()
        elif not self._still(key):
            pass  # an earlier event of this round dropped its request (and the fd may be anew)
        elif events & selectors.EVENT_WRITE:
            self.feed_child(key.data)
        else:
            self.on_output(key.data, key.fd)
        return True

    def _still(self, key):
        """Whether ``key`` is still what its fd is registered as: a CLOSE read earlier in the
        same round unregisters and closes a child's pipes, and a RUN may get the same fd number
        for a new child's."""
        try:
            found = self.selector.get_key(key.fd)
        except KeyError:
            return False
        return found.data is key.data and found.events == key.events

    def on_output(self, child, fd):
        try:
            data = os.read(fd, 65536)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return
            data = b""
        if data:
            self.send(child.streams[fd], child.rid, data)
            return
        self.selector.unregister(fd)
        self.send(child.streams.pop(fd), child.rid)  # an empty payload: that stream ended
        if not child.streams:
            self.reap_later(child)

    def drop(self, child):
        """The daemon closed this request: its stdin closes, its output is no longer read
        (a write there gets EPIPE, as when sshd's channel closes), no EXIT is sent."""
        child.relay = False
        child.pending.clear()
        self.unwatch(child.stdin_fd())
        child.close_stdin()
        for fd in list(child.streams):
            self.selector.unregister(fd)
        for stream in (child.proc.stdout, child.proc.stderr):
            stream.close()  # by its file object: the fd number may be reused after this
        child.streams.clear()
        del self.children[child.rid]
        self.reap_later(child)

    def reap_later(self, child):
        self.reaping.append(child)
        self.reaping_since = time.monotonic()

    def reap(self):
        for child in list(self.reaping):
            code = child.proc.poll()
            if code is None:
                continue
            self.reaping.remove(child)
            if child.relay:
                del self.children[child.rid]
                self.unwatch(child.stdin_fd())
                child.close_stdin()
                status = {"status": code} if code >= 0 else {"status": -1, "signal": -code}
                self.send(frames.EXIT, child.rid, json.dumps(status).encode())

    # -- the loop

    def hello(self):
        """The first frame, then what the programs forked later will find loaded."""
        self.send(frames.PONG, 0, json.dumps({"pid": os.getpid()}).encode())
        self.flush()
        if self.boot:
            warmrun.preload()

    def tick(self):
        """How long the loop may wait for a frame or output."""
        if not self.reaping:
            return 1.0
        soon = time.monotonic() - self.reaping_since < REAP_SOON
        return REAP_FAST if soon else REAP_TICK

    def run(self):
        while True:
            if self.out and not self._watched(1):
                self.selector.register(1, selectors.EVENT_WRITE, None)
            elif not self.out and self._watched(1):
                self.selector.unregister(1)
            timeout = self.tick()
            if len(self.out) >= HIGH_WATER:  # the children's output waits for the daemon
                readable, _, _ = select.select([0], [1], [], timeout)
                if readable and not self.on_stdin():
                    return
                self.flush()
                continue
            for key, events in self.selector.select(timeout):
                if not self.dispatch(key, events):
                    return
            self.flush()
            self.reap()
            if time.monotonic() - self.heard > self.silence:
                return


def main(req):
    agent = Agent(float(req.get("silence", SILENCE)), req.get("bootstrap"), req.get("loader"))
    with contextlib.suppress(OSError, ValueError):
        # The request line was read through sys.stdin's buffer, which may hold what followed.
        early = sys.stdin.buffer.read1(65536)  # type: ignore[union-attr]
        if early:
            for kind, rid, payload in agent.reader.feed(early):
                agent.on_frame(kind, rid, payload)
    try:
        agent.hello()
        agent.run()
    finally:
        with contextlib.suppress(OSError, SystemExit):
            agent.flush()


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
    os._exit(0)  # the children keep their own pipes; their stdin closes with this process
