"""The free space a run needs under its run directory (stdlib only, Python 3.6+): the floor the
supervisor stops a run at (remote/node/diskwatch.py) and preflight checks a workdir against.

The ranks write their output straight into files on the host; on a full disk those writes fail
(a Python rank dies of ENOSPC at its next print, C code may lose lines without a word). So the
supervisor looks at the free space every 0.1 s and stops the run, naming the host and the
directory, while a margin is left: a run is never silently truncated.
"""

import os
from typing import Optional, Union

# The margin: looking at every 0.1 s tick of the supervisor (statvfs costs microseconds), a
# host's ranks writing under 80 MB/s together lose nothing before the stop.
FLOOR = 8 * 1024 * 1024
# The exit status of a run stopped for a full disk (ExitStatus.SYNC in clusterrun/errors.py,
# which this program, shipped alone, cannot import: a disk problem, as a failed copy is).
STATUS = 6  # HostStatus.DISK_FULL: tests/test_exit_status.py holds them equal


def free_bytes(path: str) -> Optional[int]:
    """Bytes this user may still write under ``path`` (None when it cannot be told)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def size_text(n: Union[int, float]) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "bytes" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return str(n)
