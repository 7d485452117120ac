"""`clusterrun check --smoke`: after the checks pass, a tiny all-reduce across all hosts, run
exactly the way `launch` runs a job (same interfaces, ports, supervisors, teardown).

Its run directory is kept apart, under $CLUSTERRUN_HOME/smoke/runs/, so a smoke test never
becomes the run that `logs` shows by default, nor a row of `ps`.

With `--bandwidth` the payload also times an all-reduce of BANDWIDTH_BYTES (or
$CLUSTERRUN_SMOKE_BYTES) and prints its bus bandwidth. A few hundred MB: small collectives
measure latency, not the link."""

from __future__ import annotations

import os
from pathlib import Path

from clusterrun.errors import Result, UsageError
from clusterrun.inventory import Inventory
from clusterrun.launch import launcher as launch
from clusterrun.plan import build as planning
from clusterrun.plan.model import Job
from clusterrun.preflight.report import CheckReport
from clusterrun.transport.pool import Connections

SCRIPT = Path(__file__).resolve().parent / "smoke_payload" / "allreduce.py"
BANDWIDTH_BYTES = 256 << 20
BYTES_ENV = "CLUSTERRUN_SMOKE_BYTES"


def run(inv: Inventory, report: CheckReport, pool: Connections, home: Path, *,
        bandwidth: bool = False) -> Result:
    opts = launch.LaunchOptions(nproc_per_node=1, name="smoke", grace=5.0)
    args = ("--bandwidth-bytes", str(bandwidth_bytes())) if bandwidth else ()
    job = Job(SCRIPT, args)
    plan = planning.build(inv, report, job, name="smoke", nproc_override=1, grace=5.0)
    return launch.execute(job, plan, inv, report, pool, home=smoke_home(home), opts=opts)


def smoke_home(home: Path) -> Path:
    """Where smoke runs keep their files: a home of their own inside clusterrun's."""
    return home / "smoke"


def bandwidth_bytes() -> int:
    """The size of the timed all-reduce: $CLUSTERRUN_SMOKE_BYTES, else BANDWIDTH_BYTES."""
    raw = os.environ.get(BYTES_ENV, "").strip()
    if not raw:
        return BANDWIDTH_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 4:  # one float32
        raise UsageError(f"{BYTES_ENV}={raw!r}: give the all-reduce size in bytes, at least 4.")
    return value
