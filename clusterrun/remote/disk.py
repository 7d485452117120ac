"""Free space under a run directory, watched while the run goes on (stdlib only, Python 3.6+).

The ranks write their output straight into files on the host; on a full disk those writes fail
(a Python rank dies of ENOSPC at its next print, C code may lose lines without a word). So the
supervisor looks at the free space every 0.1 s and stops the run, naming the host and the
directory, while a margin is left: a run is never silently truncated.
"""

import os

from clusterrun.remote import timing

# The margin: looking at every 0.1 s tick of the supervisor (statvfs costs microseconds), a
# host's ranks writing under 80 MB/s together lose nothing before the stop.
FLOOR = 8 * 1024 * 1024
EVERY = 0.1
# The exit status of a run stopped for a full disk (ExitStatus.SYNC in clusterrun/errors.py,
# which this program, shipped alone, cannot import: a disk problem, as a failed copy is).
STATUS = 6  # HostStatus.DISK_FULL: tests/test_exit_status.py holds them equal


def free_bytes(path):
    """Bytes this user may still write under ``path`` (None when it cannot be told)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def size_text(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "bytes" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return str(n)


class Watch:
    """``check(now)``: None while there is room, then (once) what to tell the user."""

    def __init__(self, path, floor=FLOOR, every=EVERY):
        self.path = path
        self.floor = floor
        self.every = every
        self.next = 0.0
        self.told = False

    def check(self, now):
        if self.told or now < self.next - timing.SLACK:  # due at next, rounding aside
            return None
        self.next = now + self.every
        free = free_bytes(self.path)
        if free is None or free >= self.floor:
            return None
        self.told = True
        return ("disk nearly full under %s (%s free, runs stop below %s): free space there "
                "or set `workdir:` to a larger disk" % (
                    self.path, size_text(free), size_text(self.floor)))
