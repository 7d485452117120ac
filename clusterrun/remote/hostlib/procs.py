"""Processes on a host: a command in its own session and everything it starts (``Tree``), and
naming one process for good by pid and start time (stdlib only, Python 3.6+)."""

import contextlib
import ctypes
import os
import signal
import time
from typing import List, Optional, overload

from clusterrun.remote.hostlib import cgroup
from clusterrun.remote.shared import nodestate

PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORCE_SIGNAL = signal.SIGUSR2  # `clusterrun stop --force`: no grace period


def start_time(pid):
    """A process's start time in clock ticks: with the pid, it names one process for good."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(state: Optional[nodestate.Snapshot]) -> bool:
    """Whether the supervisor a state file (or None: no file) names is still the
    same live process. A killed one stays a zombie until its new parent reaps it: dead all the
    same."""
    if state is None or not state.supervisor_pid:
        return False
    pid = state.supervisor_pid
    return start_time(pid) == state.supervisor_start and not zombie(pid)


def zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@overload
def observed(state: nodestate.Snapshot) -> nodestate.Snapshot: ...


@overload
def observed(state: None) -> None: ...


def observed(state: Optional[nodestate.Snapshot]) -> Optional[nodestate.Snapshot]:
    """A state file (or None: no file) as it stands, or "lost" when the supervisor
    that should still be writing it is gone (the host rebooted, or it was killed)."""
    if state is not None and not state.ended and not alive(state):
        return state.lost()
    return state


def rank_roots(state: nodestate.Snapshot) -> List[int]:
    """Where a live run's ranks are below: the launcher the supervisor recorded (torchrun), if
    it is still that process, and whatever is in the job's cgroup."""
    roots: List[int] = []
    if launcher_alive(state) and state.torchrun_pid is not None:
        roots.append(state.torchrun_pid)
    if state.cgroup:
        roots.extend(cgroup.members(state.cgroup))
    return roots


def launcher_alive(state: nodestate.Snapshot) -> bool:
    """Whether the launcher a state file names is still that process."""
    pid = state.torchrun_pid
    return bool(pid) and start_time(pid) == state.torchrun_start


def descendants(root):
    """Every live process below ``root``: by the kernel's list of each task's children where
    it keeps one (a few files, whatever else runs on the host), else by parent links in /proc
    (every process's stat: tens of milliseconds on a busy host, paid at each look)."""
    if not _children_files():
        return _descendants_by_scan(root)
    found = []
    todo = [root]
    while todo:
        for child in _children(todo.pop()):
            if not zombie(child):
                found.append(child)
                todo.append(child)
    return found


_has_children_files = []  # [bool] once looked at (CONFIG_PROC_CHILDREN, Linux 3.5+)


def _children_files():
    if not _has_children_files:
        pid = os.getpid()
        _has_children_files.append(os.path.exists("/proc/%d/task/%d/children" % (pid, pid)))
    return _has_children_files[0]


def _children(pid):
    """The children of every thread of ``pid`` (none once it is gone)."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return []
    found = []
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as handle:
                found.extend(int(word) for word in handle.read().split())
        except (OSError, ValueError):
            continue
    return found


def _descendants_by_scan(root):
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


def become_subreaper():
    """Orphans of the job are re-parented to us, so nothing it starts escapes our tree."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def close_inherited():
    """Close every file descriptor but stdin, stdout and stderr (a forked child that does not
    exec keeps its parent's sockets and pipes otherwise)."""
    for entry in os.listdir("/proc/self/fd"):
        if int(entry) > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone
                os.close(int(entry))


def _found_on_path(name, env):
    """The file ``os.execvpe(name, ..., env)`` tries first: found with ``env``'s PATH."""
    if os.sep in name:
        return name
    for folder in os.get_exec_path(env):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _here(cwd):
    """Whether ``cwd`` is this process's working directory (a child started by posix_spawn
    starts there: it cannot chdir first)."""
    try:
        here, there = os.stat("."), os.stat(cwd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def status_code(raw):
    """A wait status as a shell reports it: the exit code, or 128 + the signal number."""
    return os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 128 + os.WTERMSIG(raw)


class Tree:
    """One command in its own session and every process it starts: start, reap, terminate
    (SIGTERM, then SIGKILL when the grace period is over), kill. With ``group`` (a cgroup
    path, remote/hostlib/cgroup.py) the command starts inside it, and whatever is in it counts
    too."""

    def __init__(self, group=None):
        self.pid = None
        self.code = None  # the command's exit status once reaped
        self.kill_at = None  # monotonic time when SIGKILL is due
        self.subreaper = become_subreaper()
        self.group = group

    def start(self, argv, env, cwd, out_fd, err_fd):
        """``argv`` (with ``env``, in ``cwd``) in a session of its own."""
        pid = self._spawn(argv, env, cwd, out_fd, err_fd) if self.group is None else None
        if pid is not None:
            self.pid = pid
            return pid
        return self._fork(argv[0], cwd, out_fd, err_fd,
                          lambda: os.execvpe(argv[0], argv, env))  # noqa: S606 - no shell

    def _spawn(self, argv, env, cwd, out_fd, err_fd):
        """What ``_fork`` does for a command, by posix_spawn (a vfork: this process's memory is
        neither copied nor shared copy-on-write, which a fork of a big Python pays in page
        faults here and in the child); None where it cannot do exactly that (no posix_spawn
        or setsid, ``cwd`` not where this process is, the command not found as execvpe would
        find it, a failing exec): ``_fork`` then starts it, or reports why not, as ever."""
        path = _found_on_path(argv[0], env)
        if path is None or not hasattr(os, "posix_spawn") or not _here(cwd):
            return None
        try:
            return os.posix_spawn(path, argv, env, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_fd, 1), (os.POSIX_SPAWN_DUP2, err_fd, 2)],
                setsid=True, setsigmask=(),
                setsigdef=(*STOP_SIGNALS, signal.SIGPIPE, FORCE_SIGNAL))
        except (OSError, NotImplementedError, TypeError):
            return None

    def start_function(self, what, target, cwd, out_fd, err_fd):
        """``target()`` in a forked child, in a session of its own, as if it were a command
        (clusterrun's own launcher): its return value is the child's exit status. The child
        keeps none of the supervisor's files (sockets, pipes) open."""
        def child():
            close_inherited()
            try:
                return target()
            except Exception:  # said in the log, as a command's crash would be
                import traceback  # only here: it costs every supervisor's start ~10 ms

                os.write(2, ("clusterrun: %s failed:\n%s" % (what, traceback.format_exc()))
                         .encode("utf-8", "replace"))
                return 1

        return self._fork(what, cwd, out_fd, err_fd, child)

    def _fork(self, what, cwd, out_fd, err_fd, body):
        pid = os.fork()
        if pid == 0:  # the child: its own session, default signal handling, then the body
            code = 127
            try:
                if self.group is not None:
                    cgroup.enter(self.group)  # before anything it starts can exist
                os.setsid()
                for sig in (*STOP_SIGNALS, signal.SIGPIPE, FORCE_SIGNAL):
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                # Output first, so that a failing chdir or exec is reported in the log.
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out_fd, 1)
                os.dup2(err_fd, 2)
                os.chdir(cwd)
                code = body() or 0
            except BaseException as exc:
                os.write(2, ("clusterrun: cannot start %s: %s\n" % (what, exc)).encode())
            os._exit(code)
        self.pid = pid
        return pid

    def reap(self):
        """Collect exited children (orphans re-parented to us too). True when the command
        itself has just been reaped."""
        reaped = False
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped
            if pid == 0:
                return reaped
            if pid == self.pid:
                self.code = status_code(raw)
                reaped = True

    def left(self):
        found = descendants(os.getpid())
        if self.group is not None:
            # A process in the cgroup that is no descendant escaped the tree some other way.
            seen = set(found)
            found.extend(p for p in cgroup.members(self.group) if p not in seen and not zombie(p))
        return found

    @property
    def done(self):
        return self.code is not None and not self.left()

    def terminate(self, grace):
        """SIGTERM to the command's session (torchrun passes it on to every rank) and to
        anything else left; SIGKILL after ``grace`` seconds."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + grace
        if self.code is None and self.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGTERM)
                return
        signal_all(self.left(), signal.SIGTERM)

    def kill_now(self):
        self.kill_at = time.monotonic()

    def tick(self):
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            signal_all(self.left(), signal.SIGKILL)
            if self.group is not None:
                cgroup.kill(self.group)

    def release(self):
        """The run has ended: kill whatever is still in the cgroup, then remove it."""
        if self.group is not None:
            cgroup.end(self.group, 2, self.reap)
