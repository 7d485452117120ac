"""How a node's supervisor measures its ranks' progress for the stall rule (stdlib only, Python
3.6+): ``Progress``, what progress is (remote/shared/stallrule.py says when a run is stalled), and
``Dumper``, every rank's stacks taken for the report.
"""

import os
import threading
import time

from clusterrun.remote.hostlib import flightpipe, pystack
from clusterrun.remote.node import flightwatch
from clusterrun.remote.shared import flight, layout, protocol, stackrule, timing, userframe

LOOK = 1.0  # seconds between looks at the ranks' logs and CPU times
BUSY = 0.05  # a rank using more than this share of a core is busy
STACK_AGE = 10.0  # how long a look at a busy rank's stack (in a collective or not) holds
FIND_EVERY = 30.0  # the ranks are looked for again (a walk of /proc) at least this often
MAX_FRAMES = 24  # per thread over the gang: a line stays far below its 64 KiB limit
# Uninterruptible I/O with no byte moving counts as progress this long at a stretch: a flush of a
# large checkpoint to a slow filesystem takes minutes; a dead NFS server holds a rank forever.
IO_WAIT_MAX = 600.0


class Progress:
    """One node's ranks: when did any of them last make progress."""

    def __init__(self, rundir, roots, pyspy=None, timeout=protocol.STALL_TIMEOUT):
        self.rundir = rundir
        self.roots = roots  # () -> pids under which the ranks are (the launcher, the cgroup)
        self.pyspy = pyspy
        self.last = time.monotonic()
        self.last_other = self.last  # the last progress by output or I/O (or no rank to judge)
        self.busy_at = {}  # rank -> when its busy CPU last counted, since last_other
        self.sizes = {}
        self.cpu = {}  # pid -> (ticks, when)
        self.ranks = {}
        self.looked = None  # when the last look was (None: none yet)
        self.found_at = None  # when the ranks were last looked for
        self.waiting = {}  # pid -> (when, in a collective)
        self.io = {}  # pid -> bytes read and written, at the last look
        self.io_wait = {}  # pid -> since when it sits in state D with no byte moving
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        # A short timeout needs fresher looks at the stacks; the default one, fewer.
        self.stack_age = max(1.0, min(STACK_AGE, timeout / 4.0))
        # NCCL's waiters on a GPU (flightwatch.py): asked after half the timeout of busy CPU
        # alone, and every half timeout after, a stall is reported about 1.5 timeouts after the
        # last output.
        self.flight = flightwatch.Recorder(rundir, max(LOOK, timeout / 2.0))

    def quiet(self, now):
        return max(0.0, now - self.last)

    def look(self, now):
        if not timing.due(now, self.looked, LOOK):
            return
        self.looked = now
        moved = self._output()
        # Walking /proc is the costly part: only when a rank is gone, none is known yet, or
        # now and then (a rank that a launcher restarted keeps no pid).
        if (self.found_at is None or (not self.ranks and timing.over(now, self.found_at, 2))
                or timing.over(now, self.found_at, FIND_EVERY)
                or any(pystack.proc_state(p) is None for p in self.ranks.values())):
            self.ranks = pystack.find_ranks(self.rundir, self.roots())
            self.found_at = now
        if not self.ranks:
            moved = True  # starting (torchrun importing torch) or ending: nothing to judge
        busy = []
        for rank, pid in self.ranks.items():
            # Every test runs for every rank: each keeps its own last reading up to date.
            io = self._io(pid, now)
            if self._busy(pid, now) and not self._waiting(pid, now):
                busy.append(rank)
            moved = moved or io
        if moved:
            self.last = self.last_other = now
            self.busy_at = {}
            self.flight.reset()
            return
        for rank in busy:
            self.busy_at[rank] = now
        # Busy CPU alone for a while: the ranks' Flight Recorders (if any) say whether it is
        # NCCL's spinning. A rank stuck in a collective since S counted only up to S.
        stuck = self.flight.stuck(
            now, bool(busy) and timing.due(now, self.last_other, self.flight.every))
        for rank, since in stuck.items():
            if rank in self.busy_at:
                self.busy_at[rank] = min(self.busy_at[rank], since)
        self.last = max([self.last_other, *self.busy_at.values()])

    def _io(self, pid, now):
        """Progress through I/O: the rank's bytes grew since the last look, or it waits in the
        kernel for I/O (not longer than IO_WAIT_MAX at a stretch)."""
        total = pystack.io_bytes(pid)
        before = self.io.get(pid)
        self.io[pid] = total
        if total is not None and before is not None and total > before:
            self.io_wait.pop(pid, None)
            return True
        if not pystack.in_io_wait(pid):
            self.io_wait.pop(pid, None)
            return False
        since = self.io_wait.setdefault(pid, now)
        return not timing.due(now, since, IO_WAIT_MAX)

    def _output(self):
        moved = False
        try:
            names = [n for n in os.listdir(self.rundir) if layout.rank_of(n) is not None]
        except OSError:
            return False
        for name in names:
            try:
                size = os.path.getsize(os.path.join(self.rundir, name))
            except OSError:
                continue
            if size > self.sizes.get(name, 0):
                moved = True
            self.sizes[name] = size
        return moved

    def _busy(self, pid, now):
        ticks = pystack.cpu_ticks(pid)
        before = self.cpu.get(pid)
        if ticks is None:
            return False
        self.cpu[pid] = (ticks, now)
        if before is None or now <= before[1]:
            return False
        return (ticks - before[0]) / float(self.hz) / (now - before[1]) > BUSY

    def _waiting(self, pid, now):
        """Whether a busy rank's CPU is not its progress: its main thread waits for its peers
        (a collective, DDP's backward) or for its DataLoader, and other threads burn the CPU."""
        if self.pyspy is None:
            return False
        seen = self.waiting.get(pid)
        if seen is None or timing.over(now, seen[0], self.stack_age):
            threads, _error = pystack.dump(self.pyspy, pid, tries=1)
            main = userframe.main_thread(threads) or {}
            frames, active = main.get("frames") or [], main.get("active")
            seen = (now, stackrule.peer_wait(frames, active) is not None
                    or stackrule.data_wait(frames, active))
            self.waiting[pid] = seen
        return seen[1]


def compact(ranks):
    """Stacks small enough for one gang line: each thread's innermost frames."""
    def trim(threads):
        return [dict(t, frames=t["frames"][-MAX_FRAMES:]) for t in threads or []]

    out = []
    for entry in ranks:
        kids = [dict(c, threads=trim(c.get("threads"))) for c in entry.get("children") or []]
        out.append(dict(entry, threads=trim(entry.get("threads")), children=kids))
    return out


def attach_flight(ranks, rundir):
    """Each rank's Flight Recorder, dumped now where it has a pipe (NCCL), as ``flight``: its
    process groups' last collectives, which the report compares (stallreport.py)."""
    if flightpipe.armed(rundir):
        flightpipe.request(rundir)
    found = {r["rank"]: r for r in flight.flight(rundir)}
    for entry in ranks:
        record = found.get(str(entry["rank"]))
        if record is not None:
            entry["flight"] = {"rank": record["rank"], "groups": record["groups"]}


class Dumper:
    """Every rank of this node's stacks, taken on a thread of its own (py-spy takes a moment per
    rank: the supervisor's loop never waits for it); ``take`` returns them once ready."""

    def __init__(self):
        self.result = None
        self.thread = None

    def start(self, progress):
        if self.thread is not None:
            return

        def run():
            ranks = pystack.find_ranks(progress.rundir, progress.roots())
            found = pystack.dump_all(progress.pyspy, ranks, progress.rundir)
            attach_flight(found, progress.rundir)
            self.result = compact(found)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def take(self):
        if self.result is None:
            return None
        result, self.result, self.thread = self.result, None, None
        return result
