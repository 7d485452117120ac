"""The counters `clusterrun top`'s rates come from (stdlib only, Python 3.6+): the host's CPU
time, the run's interface's bytes, each rank's CPU time and log size; and the readings of them
a node's supervisor keeps in its rundir.

A rate needs two readings some seconds apart. A sampler (remote/tools/sampler.py) started now
has only its own, so `top --once` used to wait a whole window before it could answer. The
supervisor, which lives as long as the run (attached or detached), takes one reading every
EVERY seconds and keeps the last SPAN seconds of them in ``counters.json``; a sampler starts
its first window at the newest kept reading old enough, and answers at once. Only counters are
kept (sizes, not lines: the sampler counts the lines between two sizes), so a reading is a few
small reads of /proc and one stat per log: well under a millisecond a second.
"""

import contextlib
import os
import time

from clusterrun.remote.hostlib import pystack
from clusterrun.remote.shared import jsonfile, layout, timing

EVERY = 1.0  # seconds between kept readings
SPAN = 5.0  # seconds of readings kept: enough for top's default 2 s window and then some
FIND_EVERY = 30.0  # the ranks are looked for again at least this often (a walk of /proc)
REFIND = 2.0  # ... and this often while some are missing or gone
# A kept reading is used only where the time since it reads the same on the monotonic and the
# wall clock: one written under another monotonic clock (a container's time namespace) is not.
CLOCKS_AGREE = 1.0
TICKS = os.sysconf("SC_CLK_TCK")


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def cpu_times():
    """(busy, total) jiffies of the whole host, from /proc/stat's first line."""
    fields = [int(x) for x in (read("/proc/stat") or b"cpu 0 0 0 0").split(b"\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def net_bytes(interface):
    """(rx, tx) bytes of one interface, from this network namespace's /proc/net/dev."""
    for line in (read("/proc/net/dev") or b"").decode("ascii", "replace").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == interface:
            words = rest.split()
            return int(words[0]), int(words[8])
    return None


def uptime():
    """Seconds since boot: the clock a process's start time is counted on."""
    words = (read("/proc/uptime") or b"").split()
    return float(words[0]) if words else None


def proc_ticks(pid):
    """(start time, cpu jiffies) of one process, or None when it is gone."""
    stat = read("/proc/%d/stat" % pid)
    if not stat:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return int(fields[19]), int(fields[11]) + int(fields[12])


def started_after(start, reading):
    """Whether a process that started at ``start`` (clock ticks since boot) started after
    ``reading`` was taken: all of its CPU time is then within the window from there."""
    return reading.get("uptime") is not None and start / float(TICKS) > reading["uptime"]


def log_sizes(rundir):
    """``{rank: bytes}`` of the rank logs there are; None where the folder cannot be listed
    (a rank missing from a dict is a log not written yet, all of whose lines are then new)."""
    try:
        names = os.listdir(rundir)
    except OSError:
        return None
    sizes = {}
    for name in names:
        rank = layout.rank_of(name)
        if rank is not None:
            with contextlib.suppress(OSError):
                sizes[str(rank)] = os.stat(os.path.join(rundir, name)).st_size
    return sizes


def reading(rundir, interface, pids, now=None):
    """The counters now (``now``: time.monotonic(), where the caller has just read it).
    ``pids``: ``{rank: pid}``; JSON keys are strings, so ranks are too."""
    ranks = {}
    for rank, pid in pids.items():
        ticks = proc_ticks(pid)
        if ticks is not None:
            ranks[str(rank)] = [pid, ticks[0], ticks[1]]
    net = net_bytes(interface) if interface else None
    return {"mono": time.monotonic() if now is None else now, "wall": time.time(),
            "uptime": uptime(), "cpu": list(cpu_times()), "interface": interface,
            "net": list(net) if net else None, "pids": ranks, "logs": log_sizes(rundir)}


def path(rundir):
    return os.path.join(rundir, layout.COUNTERS)


def kept(rundir, interface):
    """The supervisor's readings still good to start a window at, oldest first."""
    found = (jsonfile.read(path(rundir)) or {}).get("readings")
    good = [each if each.get("interface") == interface else dict(each, net=None)
            for each in (found if isinstance(found, list) else [])
            if isinstance(each, dict) and fresh(each, SPAN + 2 * EVERY)]
    return sorted(good, key=lambda r: r["mono"])


def fresh(each, most):
    """Whether a kept reading was taken at most ``most`` seconds ago, on this clock."""
    try:
        age = time.monotonic() - each["mono"]
        return 0 <= age <= most and abs(age - (time.time() - each["wall"])) <= CLOCKS_AGREE
    except (KeyError, TypeError):
        return False


def keep_gpus(rundir, gpus, error):
    """A sampler's last nvidia-smi answer, for the next sampler's first (GPUs are no rate, but
    a new sampler's first query may take longer than the rest of its answer)."""
    with contextlib.suppress(OSError):
        jsonfile.write(os.path.join(rundir, layout.GPUS),
                       {"mono": time.monotonic(), "wall": time.time(), "gpus": gpus,
                        "error": error})


def kept_gpus(rundir, most):
    """(gpus, error) a sampler kept at most ``most`` seconds ago, or None."""
    found = jsonfile.read(os.path.join(rundir, layout.GPUS))
    if not isinstance(found, dict) or not fresh(found, most):
        return None
    return found.get("gpus"), found.get("error")


class Keeper:
    """A supervisor's kept readings: ``tick`` (``now``: time.monotonic()) takes one every EVERY
    seconds and writes the last SPAN seconds of them."""

    def __init__(self, rundir, interface, roots, nranks):
        self.rundir = rundir
        self.interface = interface
        self.roots = roots  # () -> the pids the ranks are below
        self.nranks = nranks
        self.readings = []
        self.taken = None
        self.pids = {}
        self.found_at = None

    def find(self, now):
        gone = any(proc_ticks(p) is None for p in self.pids.values())
        short = len(self.pids) < self.nranks
        if (self.found_at is None or timing.due(now, self.found_at, FIND_EVERY)
                or ((gone or short) and timing.due(now, self.found_at, REFIND))):
            self.pids = pystack.find_ranks(self.rundir, self.roots())
            self.found_at = now

    def tick(self, now):
        if not timing.due(now, self.taken, EVERY):
            return
        self.taken = now
        self.find(now)
        self.readings = [r for r in self.readings if timing.within(now, r["mono"], SPAN)]
        self.readings.append(reading(self.rundir, self.interface, self.pids, now))
        with contextlib.suppress(OSError):  # a full disk: the disk watch says so
            jsonfile.write(path(self.rundir), {"readings": self.readings})

    def forget(self):
        """The run has ended here: nothing left to take a rate of."""
        for name in (layout.COUNTERS, layout.GPUS):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.rundir, name))
