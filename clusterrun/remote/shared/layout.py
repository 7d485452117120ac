"""Where a run's folders are, named once for both ends (stdlib only, Python 3.6+): this
machine's run folders (runs/store.py, runs/attempts.py), the plan's rundirs on the hosts
(plan/build.py), and the programs on a host that find their way from a rundir (pystack.py).

A run's folder is ``runs/<run-id>/`` (under $CLUSTERRUN_HOME here, under the host's workdir
there). Attempt 1 is the run folder itself, so a run that never restarted looks as it always
did; attempt K >= 2 is its ``attempt-K/`` folder. On a host each node has a folder of its own
in its attempt's (its rundir), and a py-spy `clusterrun stacks` shipped is kept in
``runs/.tools/``, beside the runs, for every run of that workdir.
"""

import re
from typing import Sequence

RUNS = "runs"
TOOLS = ".tools"

_ATTEMPT = re.compile(r"attempt-([1-9][0-9]*)")


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
