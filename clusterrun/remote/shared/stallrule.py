"""The stall rule both ends apply (stdlib only, Python 3.6+): is the whole run stalled.

The rule (docs/troubleshooting.md, "My job hangs"): a rank makes progress when it writes a new
line, when its process's CPU time grows while its stack is not inside a torch.distributed
collective, barrier or wait (NCCL's waiting ranks may spin a core), when the bytes it reads or
writes grow (/proc/PID/io: a checkpoint written slowly uses little CPU and prints nothing), or
while one of its threads sits in uninterruptible I/O (state D, an fsync to a slow filesystem) for
at most IO_WAIT_MAX at a stretch. A run is stalled when no rank on any node has made progress for
the timeout. A silent busy job is never stalled. Without py-spy on the host, growing CPU time
counts as progress (never a false stall), but for one case: where the ranks have torch's Flight
Recorder (NCCL on GPU hosts), a rank whose busy CPU has been the node's only sign of progress
for half the timeout, and whose collective sequence numbers then stand still with a collective
open, is stuck: its CPU is NCCL's spinning, no progress (remote/node/flightwatch.py).

Each supervisor measures its own node (``Progress``, remote/node/progress.py) and reports how long
it has been quiet: to the controller (a "progress" event, passed on to the master) or, detached, to
the hub over the gang connection. The one decision is ``stalled``, made by the master's supervisor
(remote/node/stallhub.py ``Decider``) for attached and detached runs alike, which then gathers every
rank's stack.
"""

from typing import Mapping, Optional

from clusterrun.remote.shared import timing

REPORT = 2.0  # seconds between reports of a node's quiet time
STACKS_WAIT = 20.0  # the hub waits this long for the peers' stacks
STATUS = 7  # the exit status of a stall ended by --on-stall stop (docs/exit-status.md)


def stalled(quiet: Mapping[str, Optional[float]], timeout: float) -> bool:
    """THE rule: a watchdog that is on, every node heard from, and none of them has had a rank
    make progress for ``timeout`` seconds. ``quiet``: node -> seconds (None: not heard yet)."""
    return (timeout > 0 and bool(quiet)
            and all(q is not None and q >= timeout - timing.SLACK for q in quiet.values()))
