"""clusterrun's wire protocol, both ways, named in one place (stdlib only, Python 3.6+).

The programs on a host write events (hostio.Writer, run.py, command.py, tail.py, status.py,
stop.py, sampler.py, stackdump.py) and the controller reads them (clusterrun/wire.py turns a
supervisor's into typed ones); the controller, a detached run's hub and its peers send the
messages named at the end (``OP`` and the classes below). Every sender and receiver imports these
names, never a string of its own (tests/test_wire.py holds both ends to them). Shipped along with
the programs that import it (transport/shell.py).

A program's stdout is a sequence of frames:

- ``J <json>\\n``: an event, a JSON object whose KIND field says which one (the kinds below) and
  whose ELAPSED field is the seconds since its supervisor started, by that host's own clocks;
- ``D <json>\\n<bytes>``: file data, the header naming the FILE, the OFFSET in it where the
  bytes start, and their LENGTH.
"""

import json
from typing import Any, Dict

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
# An attached run's stall decider (the master's supervisor, remote/node/stallhub.py) to its
# controller: what to fetch for it (``what``: Lifeline.STACKS or Lifeline.LINKS), what it decided
# (the report to show and record, and the node the controller is to stop), the run moves again.
STALL_ASK = "stall_ask"
STALLED = "stalled"
RESUMED = "resumed"

# The one answer of the programs that are not supervisors (common.reply), and the last event of a
# chained program (transport/shell.py: its interpreter now waits for the next one).
SAMPLE = "sample"  # sampler.py, for `top` (observe/watch.py)
STACKS = "stacks"  # stackdump.py, for `stacks` and the stall report
TOOLS = "tools"  # toolcache.py: where a shipped tool (py-spy) went
NEXT = "next"

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
    STALL_ASK: ("what",),
    STALLED: ("lines", "report", "stop", "detail"),
    RESUMED: (),
}

# The fields of a detached run's root cause (an END's root_cause), as its hub recorded it.
ROOT_CAUSE = ("node", "rank", "code", "signal", "detail", "lost")


# -- messages: one JSON object per line, whose OP field says which one -----------------------

OP = "op"


class Lifeline:
    """The controller to a supervisor (run.py, command.py), on its stdin (mainloop.Lifeline).
    Any line is heard as a sign of life; HEARTBEAT says nothing more."""

    HEARTBEAT = "hb"
    STOP = "stop"  # may carry a "reason"
    KILL = "kill"  # stop without the grace period (a second Ctrl-C)
    STALL = "stall"  # "fail": the stall decider stops this node (--on-stall stop)
    # To an attached run's stall decider (the master): another node's quiet time, and what the
    # decider asked for (STALL_ASK): every rank's stacks, the links' re-test.
    PROGRESS = "progress"
    STACKS = "stacks"
    LINKS = "links"


class Gang:
    """A detached run's hub and its peers (gang.py), over their TCP connections; the stall
    watchdog (stallreach.py, stallpeer.py) and its link test (linkwatch.py) ride on them. Any
    line is heard as a sign of life; HEARTBEAT says nothing more."""

    HELLO = "hello"  # hub: the challenge
    AUTH = "auth"  # peer: its answer, and its own challenge
    WELCOME = "welcome"  # hub: its answer to the peer's challenge
    HEARTBEAT = "hb"
    STOP = "stop"  # hub: stop, with the gang's root cause or why the master stopped
    FAILED = "failed"  # peer: its own failure
    ENDED = "ended"  # peer: its job ended, it is leaving
    PROGRESS = "progress"  # peer: how long none of its ranks has made progress (as PROGRESS)
    STACKS = "stacks"  # hub: send your ranks' stacks; peer: here they are
    STALL_STOP = "stall_stop"  # hub: the stall's cause is your rank (--on-stall stop)
    LINKS_LISTEN = "links_listen"  # hub: listen for the link test
    LINKS_PORT = "links_port"  # peer: where it listens (or why it cannot)
    LINKS_CONNECT = "links_connect"  # hub: connect to these
    LINKS_PAIRS = "links_pairs"  # peer: what each connect did
    LINKS_CLOSE = "links_close"  # hub: the test is over
    LINKS = (LINKS_LISTEN, LINKS_PORT, LINKS_CONNECT, LINKS_PAIRS, LINKS_CLOSE)
    TO_HUB = (AUTH, HEARTBEAT, FAILED, ENDED, PROGRESS, STACKS, LINKS_PORT, LINKS_PAIRS)
    TO_PEER = (HELLO, WELCOME, HEARTBEAT, STOP, STACKS, STALL_STOP, LINKS_LISTEN, LINKS_CONNECT,
               LINKS_CLOSE)


class Probe:
    """The controller to probe.py (preflight/probe_session.py), after the probe's first answer
    (FACTS). Each reply is ``{op: value}``, in the order asked."""

    FACTS = "facts"
    EXIT = "exit"  # no reply: the probe ends
    ROUTE = "route"
    LISTEN = "listen"
    CONNECT = "connect"
    MESH_LISTEN = "mesh_listen"
    MESH_CONNECT = "mesh_connect"
    RESOLVE = "resolve"
    SINK = "sink"
    BLAST = "blast"
    # Operations the probe runs while it reads the next request: the controller sends these two
    # together (preflight/mesh.py), so each host connects to the others while it resolves their
    # names instead of one after the other. Replies still go out in request order, as the
    # controller reads them; any other operation waits for these to finish, so it sees the state
    # they left.
    CONCURRENT = (MESH_CONNECT, RESOLVE)


class Env:
    """The controller (envs/sync.py) to pyenv.py: one request each, answered with its OP."""

    STATUS = "status"
    RECEIVE = "receive"
    FETCH = "fetch"
    BUILD = "build"
    PRUNE = "prune"


class Outputs:
    """The controller (pull/) to outputs.py: one request each (its docstring has the shapes)."""

    LIST = "list"  # the files, with sizes and SHA-256
    SEND = "send"  # their bytes, as frames


def event_frame(event: Dict[str, Any]) -> bytes:
    """An event (a dict with its KIND) as a frame."""
    return EVENT + json.dumps(event).encode() + b"\n"


def data_frame(name: str, offset: int, data: bytes) -> bytes:
    """``data``, found at ``offset`` in the file ``name``, as a frame."""
    header = {FILE: name, OFFSET: offset, LENGTH: len(data)}
    return DATA + json.dumps(header).encode() + b"\n" + data
