"""Where a run's folders are, named once for both ends (stdlib only, Python 3.6+): this
machine's run folders (runs/store.py, runs/attempts.py), the plan's rundirs on the hosts
(plan/build.py), and the programs on a host that find their way from a rundir (pystack.py).

A run's folder is ``runs/<run-id>/`` (under $CLUSTERRUN_HOME here, under the host's workdir
there). Attempt 1 is the run folder itself, so a run that never restarted looks as it always
did; attempt K >= 2 is its ``attempt-K/`` folder. On a host each node has a folder of its own
in its attempt's (its rundir), and a py-spy `clusterrun stacks` shipped is kept in
``runs/.tools/``, beside the runs, for every run of that workdir.

The files in a rundir are named here too: the supervisor writes them (remote/node/run.py), the
ranks theirs through rank.sh (remote/node/spawn.py), the host's programs read them, and the
controller names them where it shows a node's output (launch/, logs/).
"""

import re
from typing import Optional, Sequence

RUNS = "runs"
TOOLS = ".tools"

_ATTEMPT = re.compile(r"attempt-([1-9][0-9]*)")

# A node's rundir.
STATE = "state.json"  # the node's state: remote/shared/nodestate.py holds its fields
SPEC = "spec.json"  # what the plan says of this node, for people
COUNTERS = "counters.json"  # the supervisor's last readings for `top`'s rates (hostlib/counters.py)
GPUS = "gpus.json"  # the last nvidia-smi answer a `top` sampler had, for the next one's first
NODE_LOG = "node.log"  # torchrun's (or clusterrun's launcher's) own output
RANK_SH = "rank.sh"  # the wrapper each rank runs in, which writes its log and exit file
RANK = "rank-"  # + the rank + LOG or EXIT
LOG = ".log"
EXIT = ".exit"  # the rank's exit status, once it ended ("stopped" after it: ended by a stop)
EXEC_OUT = "stdout"  # `clusterrun exec`'s command's output, in its own folder
EXEC_ERR = "stderr"


def rank_log(rank: int) -> str:
    """``rank-3.log``: what rank 3 printed."""
    return "%s%d%s" % (RANK, rank, LOG)


def rank_exit(rank: int) -> str:
    """``rank-3.exit``: rank 3's exit status, written as it ends."""
    return "%s%d%s" % (RANK, rank, EXIT)


def rank_of(name: str, suffix: str = LOG) -> Optional[int]:
    """3 for ``rank-3.log`` (``suffix`` EXIT: ``rank-3.exit``); None for any other name."""
    digits = name[len(RANK):-len(suffix)]
    if name.startswith(RANK) and name.endswith(suffix) and digits.isdecimal():
        return int(digits)
    return None


def attempt_folder(k: int) -> str:
    """The name of attempt k's folder inside its run's (k >= 2)."""
    if k < 2:
        raise ValueError("attempt %d has no folder of its own: it is the run's" % k)
    return "attempt-%d" % k


def attempt_of(parts: Sequence[str]) -> int:
    """K when the path whose components are ``parts`` is attempt K's folder (K >= 2), else 1.
    Its grandparent must be ``runs``: a run whose own id looks like an attempt's stays a run."""
    if len(parts) < 3 or parts[-3] != RUNS:
        return 1
    match = _ATTEMPT.fullmatch(parts[-1])
    return int(match.group(1)) if match and int(match.group(1)) >= 2 else 1


def rundir(workdir: str, run_id: str, attempt: int, node: str) -> str:
    """A node's folder on its host for attempt ``attempt`` of run ``run_id``."""
    attempt_dir = [attempt_folder(attempt)] if attempt > 1 else []
    return "/".join([workdir, RUNS, run_id, *attempt_dir, node])


def tools_dir(rundir_: str) -> str:
    """``<workdir>/runs/.tools`` from a node's rundir (``<workdir>/runs/<run>/[attempt-K/]
    <node>``)."""
    parts = rundir_.rstrip("/").split("/")[:-1]  # the run's folder, or its attempt's
    if attempt_of(parts) > 1:
        parts.pop()
    return "/".join([*parts[:-1], TOOLS])
