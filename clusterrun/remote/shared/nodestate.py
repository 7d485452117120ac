"""The node's state.json: its fields named once, with the one writer and the one reader (stdlib
only, Python 3.6+).

The node's supervisor keeps the file (remote/node/run.py ``Supervisor.state``, its watchers
through it): each change merges some fields into it, written whole or not at all. The host's
programs read it (status, stop, tail, sampler, stackdump) through ``read``; the controller reads
the same fields from their answers (runs/records.py ``NodeState``).
"""

import os
from typing import Any, Dict, Mapping, Optional

from clusterrun.remote.shared import jsonfile, layout

# The fields, what each holds in JSON, and what it means. Every one may be missing or null.
STATE = "state"  # str: running, stalled (a detached hub's while a stall lasts), then succeeded,
# failed, stopped; or lost, as ``lost`` reads a file whose supervisor is gone
SUPERVISOR_PID = "supervisor_pid"  # int
SUPERVISOR_START = "supervisor_start"  # int: its start time in clock ticks (procs.start_time)
TORCHRUN_PID = "torchrun_pid"  # int: what runs the ranks: torchrun, or clusterrun's launcher
TORCHRUN_START = "torchrun_start"  # int: its start time in clock ticks
STARTED_AT = "started_at"  # float: this host's wall clock when the job started
DETACHED = "detached"  # bool: no controller; the gang's hub decides
SUBREAPER = "subreaper"  # bool: orphans of the job come back to the supervisor
CGROUP = "cgroup"  # str: the job's own cgroup's path, where it has one
CAUSE = "cause"  # str: why the run was ended from outside (hostio.Cause's value)
REASON = "reason"  # str: the same, or the node's own failure, in words
ROOT_CAUSE = "root_cause"  # object: a detached run's root cause (protocol.ROOT_CAUSE's fields)
NCCL = "nccl"  # object: what NCCL's log said of the node (remote/node/nccllog.py)
PEERS = "peers"  # object: a detached hub's {worker: where it stands} (remote/node/gang.py)
STALL = "stall"  # object: a detached hub's stall report while the stall lasts
EXIT_CODE = "exit_code"  # int: the node's exit status
TORCHRUN_EXIT_CODE = "torchrun_exit_code"  # int: its launcher's
ENDED_AT = "ended_at"  # float: this host's wall clock when the node's part ended
RANKS = "ranks"  # object: {rank: its exit status}
CHECKSUMS = "checksums"  # object: {file: [size, sha256]} of the files a run streams

FIELDS = {
    STATE: str, SUPERVISOR_PID: int, SUPERVISOR_START: int, TORCHRUN_PID: int,
    TORCHRUN_START: int, STARTED_AT: float, DETACHED: bool, SUBREAPER: bool, CGROUP: str,
    CAUSE: str, REASON: str, ROOT_CAUSE: dict, NCCL: dict, PEERS: dict, STALL: dict,
    EXIT_CODE: int, TORCHRUN_EXIT_CODE: int, ENDED_AT: float, RANKS: dict, CHECKSUMS: dict,
}
# What `logs` (tail.py) reports of an ended node.
FINAL = (STATE, EXIT_CODE, REASON, CAUSE, RANKS, ROOT_CAUSE, ENDED_AT)

LOST = "lost"
LOST_REASON = "the supervisor is gone (host rebooted or it was killed)"


class Snapshot:
    """state.json as read once, by typed accessors; ``raw`` is the object itself, which status.py
    and stop.py answer with."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw: Dict[str, Any] = dict(raw)

    def _int(self, name: str) -> Optional[int]:
        value = self.raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def state(self) -> Optional[str]:
        value = self.raw.get(STATE)
        return value if isinstance(value, str) else None

    @property
    def supervisor_pid(self) -> Optional[int]:
        return self._int(SUPERVISOR_PID)

    @property
    def supervisor_start(self) -> Optional[int]:
        return self._int(SUPERVISOR_START)

    @property
    def torchrun_pid(self) -> Optional[int]:
        return self._int(TORCHRUN_PID)

    @property
    def torchrun_start(self) -> Optional[int]:
        return self._int(TORCHRUN_START)

    @property
    def cgroup(self) -> Optional[str]:
        value = self.raw.get(CGROUP)
        return value if isinstance(value, str) and value else None

    @property
    def ended(self) -> bool:
        """Whether the supervisor has recorded the node's end (``ended_at``)."""
        return bool(self.raw.get(ENDED_AT))

    @property
    def stall(self) -> Optional[Dict[str, Any]]:
        value = self.raw.get(STALL)
        return value if isinstance(value, dict) else None

    def final(self) -> Dict[str, Any]:
        """The fields of an ended node's report (``FINAL``); its state "unknown" when unsaid."""
        out = {name: self.raw.get(name) for name in FINAL}
        out[STATE] = self.raw.get(STATE, "unknown")
        return out

    def lost(self) -> "Snapshot":
        """The same, said lost: its supervisor is gone without recording an end."""
        return Snapshot(dict(self.raw, **{STATE: LOST, REASON: LOST_REASON}))


def path(rundir: str) -> str:
    return os.path.join(rundir, layout.STATE)


def read(rundir: str) -> Optional[Snapshot]:
    """The node's state as its file holds it now; None where there is none (no such run here)."""
    raw = jsonfile.read(path(rundir))
    return Snapshot(raw) if isinstance(raw, dict) else None


def write(rundir: str, **fields: Any) -> None:
    """``fields`` merged into the node's state and written whole (the supervisor's, alone).
    A name outside the table is a mistake here, never the host's: it raises."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError("not fields of state.json: %s" % ", ".join(unknown))
    before = read(rundir)
    jsonfile.write(path(rundir), dict(before.raw if before is not None else {}, **fields))
