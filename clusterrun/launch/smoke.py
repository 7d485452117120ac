"""`clusterrun check --smoke`: after the checks pass, a tiny all-reduce across all hosts, run
exactly the way `launch` runs a job (same interfaces, ports, supervisors, teardown)."""

from __future__ import annotations

from pathlib import Path

from clusterrun.inventory import Inventory
from clusterrun.launch import launcher as launch
from clusterrun.plan import build as planning
from clusterrun.preflight.report import CheckReport

SCRIPT = Path(__file__).resolve().parent / "smoke_payload" / "allreduce.py"


def run(inv: Inventory, report: CheckReport, home: Path) -> int:
    opts = launch.LaunchOptions(nproc_per_node=1, name="smoke", grace=5.0)
    plan = planning.build(inv, report, SCRIPT, [], name="smoke", nproc_override=1, grace=5.0)
    return launch.execute(plan, inv, report, home=home, opts=opts)
