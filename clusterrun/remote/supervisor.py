"""clusterrun node supervisor: runs on a host with the host's own Python (stdlib only, 3.6+).

It arrives on stdin (see clusterrun/command.py) followed by one JSON request line:

- mode "run": start torchrun for one node of a run and watch over it. The ranks write their
  output to files on this host (rank-<R>.log) and their exit status next to it (rank-<R>.exit);
  this process streams those files to the controller by byte offset, so a slow or paused
  controller never slows the ranks. Its stdin is the lifeline: heartbeats and commands from the
  controller. On EOF or a missed lease it ends the run (SIGTERM, grace, SIGKILL), unless the run
  is detached. It is a child subreaper, so nothing the job starts can escape its process tree,
  and it kills exactly that tree: never a `pkill -f` pattern.
- mode "tail": stream a run's files from given offsets (`clusterrun logs -f`).
- mode "stop": end a run from a new controller (`clusterrun stop`).
- mode "status": report a run's state (`clusterrun ps`).

Frames on stdout: b"J <json>\\n" for events, b"D <json>\\n" + raw bytes for file data.
"""

import contextlib
import ctypes
import glob
import hashlib
import json
import os
import queue
import signal
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
POLL = 0.1
CHUNK = 256 * 1024
OUT = sys.stdout.buffer
OUT_LOCK = threading.Lock()


def now():
    return time.time()


# --------------------------------------------------------------------------------------------
# Files


def write_json(path, obj):
    """Atomic and private: readers (ps, stop) never see half a file."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(obj, handle)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


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


def log_files(rundir):
    """The files a run streams: the node's own log, then each rank's."""
    names = []
    if os.path.exists(os.path.join(rundir, "node.log")):
        names.append("node.log")
    ranks = glob.glob(os.path.join(rundir, "rank-*.log"))
    ranks.sort(key=lambda p: int(os.path.basename(p)[5:-4] or 0))
    return names + [os.path.basename(p) for p in ranks]


def checksums(rundir):
    out = {}
    for name in log_files(rundir):
        digest = hashlib.sha256()
        size = 0
        with open(os.path.join(rundir, name), "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        out[name] = [size, digest.hexdigest()]
    return out


# --------------------------------------------------------------------------------------------
# Output to the controller


class Streamer:
    """The only writer of stdout. Writes may block while the controller is slow or paused; that
    only delays this thread, never the job. Log data goes out before the final event."""

    def __init__(self, rundir, offsets=None, heartbeat=2.0):
        self.rundir = rundir
        self.offsets = dict(offsets or {})
        self.heartbeat = heartbeat
        self.events = queue.Queue()
        self.final = None
        self.broken = False
        self.finished = threading.Event()

    def event(self, **fields):
        self.events.put(fields)

    def end(self, **fields):
        self.final = fields
        self.events.put(None)

    def _send(self, header, data=b""):
        if self.broken:
            return
        try:
            with OUT_LOCK:
                OUT.write(header + b"\n" + data)
                OUT.flush()
        except (OSError, ValueError):
            self.broken = True  # the controller went away; the job carries on regardless

    def _send_event(self, fields):
        fields.setdefault("t", now())
        self._send(b"J " + json.dumps(fields).encode())

    def _pump_files(self):
        sent = False
        for name in log_files(self.rundir):
            path = os.path.join(self.rundir, name)
            offset = self.offsets.get(name, 0)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size <= offset:
                continue
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read(min(CHUNK, size - offset))
            if not data:
                continue
            self._send(b"D " + json.dumps({"f": name, "o": offset, "n": len(data)}).encode(),
                       data)
            self.offsets[name] = offset + len(data)
            sent = True
        return sent

    def run(self):
        last = time.monotonic()
        ending = False
        while True:
            try:
                item = self.events.get(timeout=POLL)
                if item is None:
                    ending = True
                else:
                    self._send_event(item)
                    last = time.monotonic()
            except queue.Empty:
                pass
            while self._pump_files():
                last = time.monotonic()
                if not self.events.empty():
                    break
            if ending and self.events.empty() and not self._pump_files():
                self._send_event(dict(self.final or {}, ev="end"))
                self.finished.set()
                return
            if time.monotonic() - last >= self.heartbeat:
                self._send_event({"ev": "hb"})
                last = time.monotonic()


# --------------------------------------------------------------------------------------------
# Processes


def start_time(pid):
    """A process's start time in clock ticks: with the pid, it names one process for good."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root):
    """Every live process below ``root`` (by parent links in /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids, sig):
    for pid in pids:
        with contextlib.suppress(OSError):  # already gone
            os.kill(pid, sig)


class Job:
    """One node's torchrun and everything it starts."""

    def __init__(self, req, streamer):
        self.req = req
        self.rundir = req["rundir"]
        self.streamer = streamer
        self.grace = float(req.get("grace", 15))
        # Re-entrant: the stop signals' handlers run on the main thread, maybe inside a `with`.
        self.lock = threading.RLock()
        self.stop_reason = None  # why the run is being ended from outside (None: it was not)
        self.cleaning = False  # ending what a finished torchrun left behind
        self.stop_at = None  # when SIGKILL is due
        self.forced = False
        self.detached = bool(req.get("detach"))
        self.done = threading.Event()
        self.proc_pid = None
        self.rank_exits = {}
        self.exited_on_its_own = False
        self.subreaper = self._become_subreaper()

    @staticmethod
    def _become_subreaper():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            return False

    def state(self, **fields):
        with self.lock:
            path = os.path.join(self.rundir, "state.json")
            state = read_json(path) or {}
            state.update(fields)
            write_json(path, state)
            return state

    def start(self):
        req = self.req
        log = os.open(os.path.join(self.rundir, "node.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        env = dict(os.environ)
        env.update(req["env"])
        env["CLUSTERRUN_RUNDIR"] = self.rundir
        pid = os.fork()
        if pid == 0:  # the child: its own session, default signal handling, then torchrun
            try:
                os.setsid()
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE,
                            signal.SIGUSR2):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.chdir(req["cwd"])
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.execvpe(req["argv"][0], req["argv"], env)  # noqa: S606 - an argv, no shell
            except BaseException as exc:
                os.write(2, ("clusterrun: cannot start %s: %s\n" % (req["argv"][0], exc)).encode())
            os._exit(127)
        os.close(log)
        self.proc_pid = pid
        self.state(state="running", supervisor_pid=os.getpid(),
                   supervisor_start=start_time(os.getpid()), torchrun_pid=pid,
                   torchrun_start=start_time(pid), started_at=now(), detached=self.detached,
                   subreaper=self.subreaper)
        self.streamer.event(ev="started", pid=os.getpid(), torchrun_pid=pid,
                            hostname=os.uname()[1], subreaper=self.subreaper)

    def stop(self, reason, force=False):
        """SIGTERM to torchrun (it passes it to the ranks), SIGKILL to everything left after the
        grace period; ``force`` skips the grace period."""
        with self.lock:
            if self.stop_reason is None:
                self.stop_reason = reason
                self.state(stopping=reason)
                self.streamer.event(ev="stopping", reason=reason)
                self._terminate()
            if force and not self.forced:
                self.forced = True
                self.stop_at = time.monotonic()

    def cleanup(self):
        """torchrun has exited but left processes behind (a daemon a rank forked): end them."""
        with self.lock:
            if not self.cleaning and self.stop_at is None:
                self.cleaning = True
                self._terminate()

    def _terminate(self):
        if self.stop_at is None:
            self.stop_at = time.monotonic() + self.grace
        try:
            os.killpg(self.proc_pid, signal.SIGTERM)  # torchrun forwards it to every rank
        except (OSError, TypeError):
            signal_all(descendants(os.getpid()), signal.SIGTERM)

    def _check_ranks(self):
        for path in glob.glob(os.path.join(self.rundir, "rank-*.exit")):
            rank = int(os.path.basename(path)[5:-5])
            if rank in self.rank_exits:
                continue
            try:
                with open(path) as handle:
                    text = handle.read()
                when = os.path.getmtime(path)
            except OSError:
                continue
            if not text.endswith("\n"):
                continue
            code = int(text.strip() or -1)
            self.rank_exits[rank] = code
            self.streamer.event(ev="rank_exit", rank=rank, code=code, t=when,
                                stopping=self.stop_reason is not None)

    def _reap(self):
        """Collect exited children (orphans re-parented to us too); torchrun's status returned."""
        status = None
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                return status
            if pid == self.proc_pid:
                status = (os.WEXITSTATUS(raw) if os.WIFEXITED(raw)
                          else 128 + os.WTERMSIG(raw))

    def watch(self):
        """Until torchrun and every process it started are gone."""
        code = None
        while True:
            self._check_ranks()
            reaped = self._reap()
            if reaped is not None and code is None:
                code = reaped
                self.exited_on_its_own = self.stop_reason is None
                self.streamer.event(ev="torchrun_exit", code=code,
                                    stopping=not self.exited_on_its_own)
            if code is not None:
                left = descendants(os.getpid())
                if not left:
                    break
                self.cleanup()
            with self.lock:
                due = self.stop_at is not None and time.monotonic() >= self.stop_at
            if due:
                signal_all(descendants(os.getpid()), signal.SIGKILL)
            time.sleep(POLL)
        self._check_ranks()
        return code

    def finish(self, code):
        if self.stop_reason is not None and code != 0 and not self.exited_on_its_own:
            outcome = "lost" if self.stop_reason.startswith("lifeline") else "stopped"
        else:
            outcome = "succeeded" if code == 0 else "failed"
        state = self.state(state=outcome, exit_code=code, ended_at=now(),
                           reason=self.stop_reason, ranks=self.rank_exits,
                           checksums=checksums(self.rundir))
        self.done.set()
        return state


# --------------------------------------------------------------------------------------------
# Modes


class Lifeline:
    """stdin from the controller: heartbeats and commands. EOF means the controller is gone
    (sshd closes the command's stdin when the connection drops); silence longer than the lease
    means it may be partitioned away."""

    def __init__(self, job, lease):
        self.job = job
        self.lease = lease
        self.last = time.monotonic()

    def read(self):
        for raw in iter(sys.stdin.buffer.readline, b""):
            self.last = time.monotonic()
            try:
                op = json.loads(raw).get("op")
            except ValueError:
                continue
            if op == "stop":
                self.job.stop("stopped by the controller")
            elif op == "kill":
                self.job.stop("stopped by the controller", force=True)
            elif op == "detach":
                self.job.detached = True
                self.job.state(detached=True)
        if not self.job.detached:
            self.job.stop("lifeline lost: the controller's connection closed")

    def watch(self):
        while not self.job.done.wait(1.0):
            quiet = time.monotonic() - self.last
            if not self.job.detached and quiet > self.lease:
                self.job.stop("lifeline lost: no heartbeat from the controller for %d s" % quiet)


def install_stop_signals(job):
    def graceful(signum, _frame):
        job.stop("stopped by signal %d (clusterrun stop)" % signum)

    def force(_signum, _frame):
        job.stop("stopped by clusterrun stop --force", force=True)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, graceful)
    signal.signal(signal.SIGUSR2, force)


def prepare(req):
    make_private_dir(req["rundir"])
    wrapper = os.path.join(req["rundir"], "rank.sh")
    fd = os.open(wrapper, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as handle:
        handle.write(RANK_WRAPPER)
    write_json(os.path.join(req["rundir"], "spec.json"), req.get("public", {}))


# torchrun starts this for every rank (`--no-python /bin/sh rank.sh python -u script ...`): the
# rank's stdout and stderr go, in order, to one file on this host, and its exit status to
# another, which tells the supervisor which rank failed first and how.
RANK_WRAPPER = """\
# clusterrun: one rank's output to rank-$RANK.log and its exit status to rank-$RANK.exit.
# The files are private (0600) whatever the umask; the rank itself keeps the user's umask.
log="$CLUSTERRUN_RUNDIR/rank-$RANK.log"
mask=$(umask)
umask 077
: >>"$log"
umask "$mask"
"$@" >>"$log" 2>&1
code=$?
umask 077
printf '%s\\n' "$code" >"$CLUSTERRUN_RUNDIR/.rank-$RANK.exit"
mv -f "$CLUSTERRUN_RUNDIR/.rank-$RANK.exit" "$CLUSTERRUN_RUNDIR/rank-$RANK.exit"
exit "$code"
"""


def daemonize():
    """Detach from the SSH session: the run must outlive it. Returns in the daemon; the
    original process reports the daemon's first event and exits."""
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        OUT.write(data)
        OUT.flush()
        os._exit(0 if data else 1)
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    return write_end


def mode_run(req):
    umask = os.umask(0o077)
    prepare(req)
    pipe = daemonize() if req.get("detach") else None
    streamer = Streamer(req["rundir"], heartbeat=float(req.get("heartbeat", 2)))
    job = Job(req, streamer)
    install_stop_signals(job)
    os.umask(umask)
    job.start()
    if pipe is not None:
        os.write(pipe, b"J " + json.dumps(streamer.events.get()).encode() + b"\n")
        os.close(pipe)
        streamer.broken = True  # nobody is listening; `clusterrun logs -f` reads the files
    else:
        threading.Thread(target=streamer.run, daemon=True).start()
        lifeline = Lifeline(job, float(req.get("lease", 30)))
        threading.Thread(target=lifeline.read, daemon=True).start()
        threading.Thread(target=lifeline.watch, daemon=True).start()
    code = job.watch()
    state = job.finish(code)
    streamer.end(state=state["state"], exit_code=code, reason=state.get("reason"),
                 ranks=state["ranks"], checksums=state["checksums"])
    if pipe is None:
        # The controller gets the logs' last bytes and the final event. Unless it is the very
        # reason the run ended: then nobody may be reading, and the job is already gone.
        lost = (job.stop_reason or "").startswith("lifeline")
        streamer.finished.wait(5 if lost else 600)


def mode_tail(req):
    """Stream a run's files from the given offsets; with ``follow``, until the run has ended
    and everything is sent."""
    rundir = req["rundir"]
    if not os.path.isdir(rundir):
        OUT.write(b"J " + json.dumps({"ev": "end", "state": "missing"}).encode() + b"\n")
        OUT.flush()
        return
    streamer = Streamer(rundir, req.get("offsets"), heartbeat=float(req.get("heartbeat", 2)))
    threading.Thread(target=streamer.run, daemon=True).start()
    # The follower went away: nothing left to do (its EOF closes our stdin).
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()
    while req.get("follow") and not streamer.broken:
        state = read_json(os.path.join(rundir, "state.json")) or {}
        if state.get("ended_at") or not alive(state):
            break
        time.sleep(0.2)
    state = read_json(os.path.join(rundir, "state.json")) or {}
    streamer.end(state=state.get("state", "unknown"), exit_code=state.get("exit_code"),
                 reason=state.get("reason"), ranks=state.get("ranks", {}),
                 checksums=checksums(rundir))
    streamer.finished.wait(600)


def alive(state):
    pid = state.get("supervisor_pid")
    return bool(pid) and start_time(pid) == state.get("supervisor_start")


def mode_status(req):
    state = read_json(os.path.join(req["rundir"], "state.json"))
    if state is not None and not state.get("ended_at") and not alive(state):
        state["state"] = "lost"
        state["reason"] = "the supervisor is gone (host rebooted or it was killed)"
    OUT.write(b"J " + json.dumps({"ev": "status", "state": state}).encode() + b"\n")
    OUT.flush()


def mode_stop(req):
    """Ask a run's supervisor to stop (SIGTERM: graceful; SIGUSR2: at once) and wait for it.
    If the supervisor itself is gone, kill what it recorded, checking identities first."""
    path = os.path.join(req["rundir"], "state.json")
    state = read_json(path)
    result = {"ev": "stopped", "found": state is not None, "was": None}
    if state is not None:
        result["was"] = state.get("state")
        deadline = time.monotonic() + float(req.get("grace", 15)) + 10
        if not state.get("ended_at") and alive(state):
            sig = signal.SIGUSR2 if req.get("force") else signal.SIGTERM
            os.kill(state["supervisor_pid"], sig)
            while time.monotonic() < deadline and alive(state):
                time.sleep(0.2)
            if alive(state):
                os.kill(state["supervisor_pid"], signal.SIGUSR2)
                time.sleep(2)
        torchrun = state.get("torchrun_pid")
        if torchrun and start_time(torchrun) == state.get("torchrun_start"):
            signal_all([*descendants(torchrun), torchrun], signal.SIGKILL)
        result["state"] = read_json(path)
    OUT.write(b"J " + json.dumps(result).encode() + b"\n")
    OUT.flush()


def main():
    req = json.loads(sys.stdin.buffer.readline())
    mode = req.get("mode")
    if mode == "run":
        mode_run(req)
    elif mode == "tail":
        mode_tail(req)
    elif mode == "stop":
        mode_stop(req)
    elif mode == "status":
        mode_status(req)
    else:
        sys.stderr.write("clusterrun supervisor: unknown mode %r\n" % mode)
        sys.exit(2)


main()
# Not sys.exit: flushing stdout at shutdown would block for good if the controller stopped
# reading (partitioned away); everything meant for it has been written or given up on.
os._exit(0)
