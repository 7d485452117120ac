"""Which process on this host is which rank of a run (stdlib only, Python 3.6+).

Every rank runs under rank.sh (remote/launcher.py), started by torchrun or clusterrun's own
launcher, whose pid the supervisor records in the run's state.json: a rank is the topmost
process below it that has ``RANK`` in its environment and is not rank.sh's own shell (a rank's
data-loader workers inherit RANK too, but sit below the rank).
"""

import os

from clusterrun.remote import common, procs


def state(rundir):
    return common.read_json(os.path.join(rundir, "state.json"))


def _environ_rank(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            environ = handle.read()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(b"RANK="):
            try:
                return int(item[5:])
            except ValueError:
                return None
    return None


def _is_wrapper(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return True
    return any(word == b"rank.sh" or word.endswith(b"/rank.sh") for word in argv[:4])


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def find(run_state):
    """{rank: pid} of the ranks of the run ``run_state`` (its state.json) describes, as far as
    they are running now; empty when its launcher is gone."""
    root = (run_state or {}).get("torchrun_pid")
    if not root or procs.start_time(root) != run_state.get("torchrun_start"):
        return {}
    candidates = {}
    for pid in procs.descendants(root):
        rank = _environ_rank(pid)
        if rank is not None and not _is_wrapper(pid):
            candidates[pid] = rank
    found = {}
    for pid, rank in candidates.items():
        if candidates.get(_parent(pid)) != rank:  # not a worker process of that rank
            found[rank] = pid
    return found
