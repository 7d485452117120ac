"""How a node's ranks are started (stdlib only, Python 3.6+): rank.sh, which every rank runs
under, and clusterrun's own launcher for `--no-torchrun`.

With ``"ranks"`` in its request the supervisor runs this where torchrun would be: in a forked
child of its own, in its own session (procs.Tree), its output going to node.log. It starts each
rank as ``/bin/sh <rundir>/rank.sh ARGV...`` with the node's environment plus the rank's own
(RANK, LOCAL_RANK, WORLD_SIZE, ...), so rank-<R>.log, rank-<R>.exit and everything the
supervisor does with them work as with torchrun. Nothing is written to disk here: the node's
environment, secrets included, reaches the ranks only through execve.

Towards its processes it behaves like torchrun: each in its own session (a signal reaches the
rank and whatever it started); when one exits non-zero the others get SIGTERM and SIGKILL after
``grace``, and it exits with that first failure's status; SIGTERM, SIGINT or SIGHUP is passed
on to every process, and once they are gone it exits with 128 + the signal; 0 when all exit 0.
"""

import contextlib
import os
import signal
import time

from clusterrun.remote.hostlib import procs
from clusterrun.remote.shared import layout

GRACE = 5.0  # after a failure or a signal, how long the others get before SIGKILL
# The launcher's pause between looks for exited ranks and received signals: short, so a rank's
# failure or a signal reaches the other ranks within a twentieth of a second.
REAP_EVERY = 0.05
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# torchrun starts this for every rank (`--no-python /bin/sh rank.sh python -u script ...`), and
# so does the launcher below; run.prepare() writes it into the run's folder. The rank's stdout
# and stderr go, in order, to one file on this host, and its exit status to another, which
# tells the supervisor which rank failed first and how. With CLUSTERRUN_LOCAL_RANK_AT=<k>
# (`--local-rank-arg`) the command gets `--local_rank=$LOCAL_RANK` before its word k (k: the
# words before the script's own arguments; last when there are none), every other word intact.
RANK_WRAPPER = """\
# clusterrun: one rank's output to rank-$RANK.log and its exit status to rank-$RANK.exit.
# The files are private (0600) whatever the umask; the rank itself keeps the user's umask.
log="$CLUSTERRUN_RUNDIR/rank-$RANK.log"
mask=$(umask)
umask 077
: >>"$log"
umask "$mask"
_cr_ok=1
if [ -n "${CLUSTERRUN_LOCAL_RANK_AT-}" ]; then
  case "$CLUSTERRUN_LOCAL_RANK_AT" in *[!0-9]*|?????*) _cr_ok= ;; esac
  case "${LOCAL_RANK-}" in ''|*[!0-9]*|?????*) _cr_ok= ;; esac
  if [ -n "$_cr_ok" ]; then
    # Rotate the words through "$@" once, --local_rank=N going in before word k.
    _cr_at=$CLUSTERRUN_LOCAL_RANK_AT _cr_i=0 _cr_n=$#
    while [ "$_cr_i" -lt "$_cr_n" ]; do
      [ "$_cr_i" -ne "$_cr_at" ] || set -- "$@" "--local_rank=$LOCAL_RANK"
      set -- "$@" "$1"
      shift
      _cr_i=$((_cr_i + 1))
    done
    [ "$_cr_at" -lt "$_cr_n" ] || set -- "$@" "--local_rank=$LOCAL_RANK"
  else
    printf 'clusterrun: rank.sh: not numbers: LOCAL_RANK=%s CLUSTERRUN_LOCAL_RANK_AT=%s\\n' \\
      "${LOCAL_RANK-}" "$CLUSTERRUN_LOCAL_RANK_AT" >>"$log"
  fi
fi
if [ -n "$_cr_ok" ]; then
  # torchrun's teardown signals the rank's whole process group, this shell too: a trap (reset
  # to the default in the rank) keeps the shell alive until the rank has exited, to record how,
  # and marks the exit as ended by its launcher, which the supervisor never takes for a cause.
  _cr_by=
  trap '_cr_by=" stopped"' TERM INT HUP
  if [ -n "${CLUSTERRUN_PTRACER-}" ]; then
    # Yama's ptrace_scope 1 lets only a process's ancestors trace it: the rank names any
    # process of this user as its tracer (PR_SET_PTRACER_ANY, kept across exec), so that
    # `clusterrun stacks` and the stall report can read its stack (docs/troubleshooting.md).
    set -- "$CLUSTERRUN_PTRACER" -S -c 'import ctypes, os, sys
ctypes.CDLL(None).prctl(0x59616d61, ctypes.c_ulong(-1), 0, 0, 0)
os.execvp(sys.argv[1], sys.argv[1:])' "$@"
  fi
  # The rank's redirection is made in a shell that execs it, not in this one: this shell's
  # stderr stays /dev/null while it waits, which takes only its own "Terminated" notice for a
  # rank a signal ended. All the rank writes (or a failed exec of it) goes to its log.
  { /bin/sh -c 'log=$1; shift; exec "$@" >>"$log" 2>&1' rank.sh "$log" "$@"; } 2>/dev/null
  code=$?
else
  code=2
fi
umask 077
printf '%s%s\\n' "$code" "${_cr_by-}" >"$CLUSTERRUN_RUNDIR/.rank-$RANK.exit"
mv -f "$CLUSTERRUN_RUNDIR/.rank-$RANK.exit" "$CLUSTERRUN_RUNDIR/rank-$RANK.exit"
exit "$code"
"""


def say(text):
    with contextlib.suppress(OSError):
        os.write(2, ("clusterrun launcher: %s\n" % text).encode("utf-8", "replace"))


def rank_argv(rundir, entry):
    return ["/bin/sh", os.path.join(rundir, layout.RANK_SH)] + [str(a) for a in entry["argv"]]


def rank_env(node_env, entry, index):
    env = dict(node_env)
    env.update((str(k), str(v)) for k, v in (entry.get("env") or {}).items())
    env.setdefault("RANK", str(index))  # rank.sh names its files after it
    return env


def spawn(argv, env):
    """One process in a session of its own, signals as a fresh process has them."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for sig in (*SIGNALS, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(argv[0], argv, env)  # noqa: S606 - an argv, no shell
        except BaseException as exc:  # the child must never return
            say("cannot start %s: %s" % (argv[0], exc))
        os._exit(127)
    return pid


class Launcher:
    def __init__(self, ranks, rundir, node_env, grace=GRACE):
        self.ranks = ranks
        self.rundir = rundir
        self.node_env = node_env
        self.grace = grace
        self.children = {}  # pid -> RANK, while it runs
        self.groups = []  # each process's group (its own session: pgid = its pid)
        self.failure = None  # (rank, code) of the first process that failed on its own
        self.signum = None  # the first signal we were sent
        self.pending = []
        self.kill_at = None

    def _record(self, signum, _frame):
        self.pending.append(signum)

    def start(self):
        for sig in SIGNALS:
            signal.signal(sig, self._record)
        for index, entry in enumerate(self.ranks):
            env = rank_env(self.node_env, entry, index)
            pid = spawn(rank_argv(self.rundir, entry), env)
            self.children[pid] = env["RANK"]
            self.groups.append(pid)
        say("started %s" % ", ".join("rank %s (pid %d)" % (rank, pid)
                                      for pid, rank in sorted(self.children.items())))

    def stop(self, sig):
        """``sig`` to each process's session (the rank and what it started), SIGKILL when the
        grace period is over."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace
        for pgid in list(self.groups):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:  # all gone: never signal that number again
                self.groups.remove(pgid)
            except OSError:
                pass

    def _groups_left(self):
        """The processes' groups that still have members: a rank.sh that died of SIGTERM may
        leave its command behind (no longer our child). A group once empty is forgotten."""
        left = []
        for pgid in self.groups:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except OSError:
                pass
            left.append(pgid)
        self.groups = left
        return left

    def _signals(self):
        while self.pending:  # a handler may append meanwhile: take one at a time
            sig = self.pending.pop(0)
            if self.signum is None:
                self.signum = sig
                say("got %s: passing it on to %d processes" % (
                    signal.Signals(sig).name, len(self.children)))
            self.stop(sig)

    def _reap(self):
        while self.children:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            rank = self.children.pop(pid, None)
            if rank is None:
                continue
            code = procs.status_code(raw)
            if code != 0 and self.failure is None and self.signum is None:
                self.failure = (rank, code)
                say("rank %s exited with status %d: stopping the other %d (SIGTERM, SIGKILL "
                    "after %g s)" % (rank, code, len(self.children), self.grace))
                self.stop(signal.SIGTERM)

    def run(self):
        self.start()
        # Until every process has exited; once stopping, until their groups are empty too
        # (bounded: a member's zombie is reaped by the supervisor, not by us).
        while self.children or (self.kill_at is not None and self._groups_left()
                                and time.monotonic() < self.kill_at + 2):
            self._signals()
            self._reap()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                self.stop(signal.SIGKILL)
            time.sleep(REAP_EVERY)
        return self.code()

    def code(self):
        if self.failure is not None:
            return self.failure[1]
        if self.signum is not None:
            return 128 + self.signum
        return 0


def run(ranks, rundir, node_env, grace=GRACE):
    """Start the ranks, supervise them as torchrun does; the launcher's exit status."""
    if not ranks or any(not entry.get("argv") for entry in ranks):
        say("nothing to start: every rank needs an argv")
        return 2
    return Launcher(ranks, rundir, node_env, grace).run()
