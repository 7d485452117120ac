"""The supervisor's wire protocol, named in one place (stdlib only, Python 3.6+).

The programs on a host write it (common.Writer, run.py, exec.py, tail.py, status.py, stop.py)
and the controller reads it (clusterrun/wire.py turns each event into a typed one): both sides
import these names. Shipped along with the programs that import it (transport/shell.py).

A program's stdout is a sequence of frames:

- ``J <json>\\n``: an event, a JSON object whose KIND field says which one (the kinds below) and
  whose ELAPSED field is the seconds since its supervisor started, by that host's own clocks;
- ``D <json>\\n<bytes>``: file data, the header naming the FILE, the OFFSET in it where the
  bytes start, and their LENGTH.
"""

import json

EVENT = b"J "
DATA = b"D "

# Defaults the controller (launch/options.py, the command line) and the programs on a host (for
# a request that leaves one out) both hold to.
GRACE = 15.0  # seconds between SIGTERM and SIGKILL when a run is ended
LEASE = 30.0  # seconds a node's supervisor runs on without hearing its controller (or hub)
STALL_TIMEOUT = 300.0  # seconds without progress on any rank before a run is called stalled
STALL_REPORT = "report"  # --on-stall: say what hangs and keep waiting
STALL_STOP = "stop"  # --on-stall: end the stalled run (exit 7)

# The fields of every event.
KIND = "ev"
ELAPSED = "e"
WALL = "t"  # the host's wall clock when it was sent: for people, never compared between hosts

# The fields of a data frame's header.
FILE = "f"
OFFSET = "o"
LENGTH = "n"

# The kinds of event.
HEARTBEAT = "hb"
STARTED = "started"
RANK_EXIT = "rank_exit"
FAILURE = "failure"  # a node's own failure that is no rank's or torchrun's exit (a full disk)
TORCHRUN_EXIT = "torchrun_exit"
NCCL = "nccl"
END = "end"  # a program's final event
STATUS = "status"  # status.py's one answer (`ps`)
STOPPED = "stopped"  # stop.py's one answer
PROGRESS = "progress"  # the stall watchdog: how long no rank of the node has made progress

# Per kind, the fields its events may carry besides KIND, ELAPSED and WALL.
FIELDS = {
    HEARTBEAT: (),
    STARTED: ("pid", "torchrun_pid", "hostname", "subreaper", "hub_port", "cgroup",
              "cgroup_why"),
    RANK_EXIT: ("rank", "code", "stopping"),
    FAILURE: ("code", "detail"),
    TORCHRUN_EXIT: ("code", "stopping"),
    NCCL: ("interfaces", "networks", "devices", "no_ib", "gdr", "nranks", "nnodes",
           "init_started", "init_done", "version"),
    END: ("state", "exit_code", "reason", "cause", "signal", "ranks", "checksums",
          "root_cause", "torchrun_exit_code", "ended_at", "peers"),
    STATUS: ("state",),
    STOPPED: ("found", "was", "state"),
    PROGRESS: ("quiet",),
}

# The fields of a detached run's root cause (an END's root_cause), as its hub recorded it.
ROOT_CAUSE = ("node", "rank", "code", "signal", "detail", "lost")


def event_frame(event):
    """An event (a dict with its KIND) as a frame."""
    return EVENT + json.dumps(event).encode() + b"\n"


def data_frame(name, offset, data):
    """``data``, found at ``offset`` in the file ``name``, as a frame."""
    header = {FILE: name, OFFSET: offset, LENGTH: len(data)}
    return DATA + json.dumps(header).encode() + b"\n" + data
