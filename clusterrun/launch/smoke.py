"""`clusterrun check --smoke`: after the checks pass, a tiny all-reduce across all hosts, run
exactly the way `launch` runs a job (same interfaces, ports, supervisors, teardown).

Its run directory is kept apart, under $CLUSTERRUN_HOME/smoke/runs/, so a smoke test never
becomes the run that `logs` shows by default, nor a row of `ps`."""

from __future__ import annotations

from pathlib import Path

from clusterrun.inventory import Inventory
from clusterrun.launch import launcher as launch
from clusterrun.plan import build as planning
from clusterrun.plan.model import Job
from clusterrun.preflight.report import CheckReport
from clusterrun.transport.pool import Connections

SCRIPT = Path(__file__).resolve().parent / "smoke_payload" / "allreduce.py"


def run(inv: Inventory, report: CheckReport, pool: Connections, home: Path) -> int:
    opts = launch.LaunchOptions(nproc_per_node=1, name="smoke", grace=5.0)
    plan = planning.build(inv, report, Job(SCRIPT), name="smoke", nproc_override=1, grace=5.0)
    return launch.execute(plan, inv, report, pool, home=smoke_home(home), opts=opts)


def smoke_home(home: Path) -> Path:
    """Where smoke runs keep their files: a home of their own inside clusterrun's."""
    return home / "smoke"
