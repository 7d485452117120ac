"""Asking torch's Flight Recorder for a dump through the ranks' pipes in a run's folder on this
host (stdlib only, Python 3.6+).

torch makes a named pipe per rank (``<rundir>/flight-pipe-rank-<R>.pipe``) on GPU hosts
(plan/environment.py arms it) and dumps the rank's ring buffer to ``<rundir>/flight-rank-<R>``
when anything is written to it, while the job runs. ``request`` asks every rank of this host
(``ask``: and says whose dumps came). Reading the dumps is remote/shared/flight.py's, which the
controller uses too; writing to a rank's pipe happens only here, on the host.
"""

import os
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

from clusterrun.remote.shared.flight import DUMP, PIPE

PIPE_END = ".pipe"


def request(rundir: str, wait: float = 5.0) -> List[str]:
    """Ask every rank with a pipe here for a dump now; wait up to ``wait`` s for the dumps to be
    written. Returns the ranks asked."""
    return _ask(rundir, wait)[0]


def ask(rundir: str, wait: float = 5.0) -> List[str]:
    """As ``request``, but returns the ranks whose dump was written anew, whole (its size and
    time held between two looks): only those say where the rank is now."""
    return _ask(rundir, wait)[1]


def armed(rundir: str) -> bool:
    """Whether a rank here has a Flight Recorder pipe (NCCL's, armed by launch on GPU hosts)."""
    try:
        return any(_is_pipe(n) for n in os.listdir(rundir))
    except OSError:
        return False


def _is_pipe(name: str) -> bool:
    return name.startswith(PIPE) and name.endswith(PIPE_END)


def _ask(rundir: str, wait: float) -> Tuple[List[str], List[str]]:
    try:
        pipes = sorted(n for n in os.listdir(rundir) if _is_pipe(n))
    except OSError:
        return [], []
    asked: Dict[str, Tuple[str, Optional[int]]] = {}
    for name in pipes:
        rank = name[len(PIPE):-len(PIPE_END)]
        dump = os.path.join(rundir, DUMP + rank)
        before = (_mtime(dump) or (None,))[0]
        try:  # torch holds the read end open while the group lives; none: ENXIO, left out
            fd = os.open(os.path.join(rundir, name), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, b"1\n")
        except OSError:
            continue
        finally:
            os.close(fd)
        asked[rank] = (dump, before)
    # A dump is written in pieces (a few MB): done once it is new and has not changed since
    # the last look.
    last: Dict[str, Optional[Tuple[int, int]]] = dict.fromkeys(asked)
    done: Set[str] = set()
    deadline = time.monotonic() + wait
    while len(done) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank, (dump, before) in asked.items():
            now = _mtime(dump)
            if now is not None and now[0] != before and now == last[rank]:
                done.add(rank)
            last[rank] = now
    return _by_rank(asked), _by_rank(done)


def _by_rank(ranks: Iterable[str]) -> List[str]:
    return sorted(ranks, key=lambda r: (0, int(r), "") if r.isdigit() else (1, 0, r))


def _mtime(path: str) -> Optional[Tuple[int, int]]:
    """(modification time, size), or None."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size
