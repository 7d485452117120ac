"""`clusterrun exec`: one shell command on this host under supervision (stdlib only, 3.6+).

The command runs in its own session under the user's shell; its stdout and stderr go to two
private files that the Writer streams by offset (so a slow controller never blocks it). stdin is
the lifeline, as for a run: EOF (Ctrl-C or a killed controller closed the connection), a missed
lease (a dead network), a ``stop``, a signal or ``timeout`` end the command and everything it
started (SIGTERM, grace, SIGKILL). When the command exits, whatever it left behind in its tree
is ended too: exec leaves no process on the host.
"""

import contextlib
import json
import os
import signal
import sys
import time

from clusterrun.remote.hostlib import hostio, mainloop, procs
from clusterrun.remote.hostlib.hostio import Cause, Phase
from clusterrun.remote.shared import layout, protocol


class Exec:
    def __init__(self, req, loop, writer, folder):
        self.req = req
        self.loop = loop
        self.writer = writer
        self.folder = folder
        self.grace = float(req.get("grace", 5))
        self.lease = float(req.get("lease", protocol.LEASE))
        timeout = req.get("timeout")
        self.deadline = time.monotonic() + float(timeout) if timeout else None
        self.tree = procs.Tree()
        self.phase = Phase.STARTING
        self.cause = None
        self.detail = None
        self.lifeline = mainloop.Lifeline(loop, self.on_op, self.on_eof)

    def start(self):
        shell = os.environ.get("SHELL") or "/bin/sh"
        fds = [os.open(os.path.join(self.folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                       0o600) for name in (layout.EXEC_OUT, layout.EXEC_ERR)]
        home = os.path.expanduser("~")
        pid = self.tree.start([shell, "-c", self.req["command"]], dict(os.environ),
                              home if os.path.isdir(home) else "/", fds[0], fds[1])
        for fd in fds:
            os.close(fd)
        self.phase = Phase.RUNNING
        self.writer.event(protocol.STARTED, pid=pid, hostname=os.uname()[1])

    def stop(self, cause, detail, force=False):
        if self.cause is None:
            self.cause, self.detail = cause, detail
            self.phase = Phase.STOPPING
            self.tree.terminate(self.grace)
        if force:
            self.tree.kill_now()

    def on_op(self, msg):
        op = msg.get(protocol.OP)
        if op in (protocol.Lifeline.STOP, protocol.Lifeline.KILL):
            self.stop(Cause.CONTROLLER, "stopped by the controller", op == protocol.Lifeline.KILL)

    def on_eof(self):
        self.stop(Cause.LIFELINE_EOF, "lifeline lost: the controller's connection closed")

    def tick(self):
        for sig in self.loop.take_signals():
            if sig == signal.SIGCHLD:
                continue  # caught only to wake the loop the moment the command exits
            self.stop(Cause.SIGNAL, "stopped by %s" % signal.Signals(sig).name,
                      sig == procs.FORCE_SIGNAL)
        if self.lifeline.lapsed(self.lease):
            self.stop(Cause.LEASE_EXPIRED, "lifeline lost: no heartbeat from the controller "
                      "for %d s" % self.lifeline.quiet())
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.stop(Cause.TIMEOUT, "timed out after %g s" % float(self.req["timeout"]))
        self.tree.reap()
        if self.tree.code is not None and self.tree.left() and self.tree.kill_at is None:
            self.tree.terminate(self.grace)  # what the command left running in the background
        self.tree.tick()
        if self.tree.done:
            self.phase = Phase.ENDED

    def run(self):
        while self.phase is not Phase.ENDED:
            self.loop.once(mainloop.TICK)
            self.tick()
        code = self.tree.code
        state = "exited" if self.cause is None else {
            Cause.TIMEOUT: "timeout", Cause.LIFELINE_EOF: "lost",
            Cause.LEASE_EXPIRED: "lost"}.get(self.cause, "stopped")
        self.writer.end(state=state, exit_code=code,
                        signal=code - 128 if code is not None and code > 128 else None,
                        cause=self.cause.value if self.cause else None, reason=self.detail)


def private_folder():
    """A new 0700 folder where tempfile.mkdtemp would make it. Not tempfile itself (nor
    shutil): importing them is a tenth of this program's start-up, paid on every host."""
    bases = [os.environ.get(v) for v in ("TMPDIR", "TEMP", "TMP")]
    # A random name made with mkdir (0700, fails if it exists): as safe as mkdtemp.
    fallback = ["/tmp", "/var/tmp", "/usr/tmp"]  # noqa: S108
    for base in [b for b in bases if b] + fallback + [os.curdir]:  # this one never chdirs
        for _attempt in range(10):
            path = os.path.join(base, "clusterrun-exec-" + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue
            except OSError:
                break
    raise OSError("no writable temporary directory (TMPDIR, /tmp, /var/tmp, here)")


def remove(folder):
    """The folder and the command's two output files in it (nothing else is ever there)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def main(req):
    folder = private_folder()
    try:
        writer = hostio.Writer(hostio.Clock(), folder, heartbeat=float(req.get("heartbeat", 2)))
        loop = mainloop.Loop()
        loop.catch((*procs.STOP_SIGNALS, procs.FORCE_SIGNAL, signal.SIGCHLD))
        job = Exec(req, loop, writer, folder)
        job.start()
        writer.start()
        job.run()
        lost = job.cause in hostio.CONTROLLER_GONE
        writer.finished.wait(5 if lost else 600)
    finally:
        remove(folder)


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
    os._exit(0)  # never block on flushing stdout to a controller that is gone
