"""Which nodes `clusterrun pull` reaches, where their files are there and here, and what it asks
each host's outputs.py for."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from clusterrun.errors import UsageError
from clusterrun.home import home as state_home
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import layout, protocol
from clusterrun.runs import remote as remote_runs
from clusterrun.runs.records import PlanNode
from clusterrun.runs.store import RunDir

# Under a host's workdir: clusterrun's own (run state, environments, copies of code), never
# listed unless the ranks' working directory lies inside one of them.
OWN_FOLDERS = (layout.RUNS, "envs", "code")


def check_paths(paths: Sequence[str]) -> list[str]:
    """The PATH arguments as outputs.py takes them; an absolute path or one that climbs out of
    the ranks' working directory is refused before any host is reached."""
    out = []
    for path in paths:
        clean = posixpath.normpath(path)
        if path.startswith(("/", "~")) or clean == ".." or clean.startswith("../"):
            raise UsageError(
                f"PATH {path!r}: give paths relative to the ranks' working directory on each "
                "host (where the script was copied; `clusterrun launch --dry-run` shows it as "
                "cwd), e.g. checkpoints/ or 'out/*.pt'; globs are expanded on the host.")
        out.append(clean)
    return out


def chosen(pairs: list[tuple[HostSpec, PlanNode]], run_id: str, nodes: Sequence[str],
           ranks: Sequence[int], world_size: int) -> list[tuple[HostSpec, PlanNode]]:
    """The nodes named by --node and those holding a rank of --rank (all when neither), in the
    plan's order; a name or rank the run does not have is a usage error naming those it has."""
    known = [node.name for _, node in pairs]
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise UsageError(f"run {run_id} has no node {', '.join(unknown)}; its nodes: "
                         f"{', '.join(known)}.")
    missing = [r for r in ranks if not any(node.holds(r) for _, node in pairs)]
    if missing:
        has = f"ranks 0-{world_size - 1}" if world_size else "no ranks recorded"
        raise UsageError(f"run {run_id} has no rank {', '.join(map(str, missing))}; it has "
                         f"{has}.")
    if not nodes and not ranks:
        return pairs
    return [(spec, node) for spec, node in pairs
            if node.name in nodes or any(node.holds(r) for r in ranks)]


def run_folder(rundir: str) -> str:
    """The run's folder on the host from a node's rundir (``<workdir>/runs/<run>/[attempt-K/]
    <node>``)."""
    parts = rundir.rstrip("/").split("/")[:-1]
    if layout.attempt_of(parts) > 1:
        parts.pop()
    return "/".join(parts)


def skipped(spec: HostSpec, dest: Path) -> list[str]:
    """Folders outputs.py never lists on this host: clusterrun's own under its workdir, and on
    this machine itself also $CLUSTERRUN_HOME and the destination (a pull would copy its own
    earlier copies)."""
    out = [f"{spec.workdir}/{name}" for name in OWN_FOLDERS] if spec.workdir else []
    if spec.own_files:
        out += [str(state_home()), str(dest)]
    return out


def listing_request(spec: HostSpec, node: PlanNode, paths: Optional[list[str]],
                    dest: Path) -> dict[str, Any]:
    return {protocol.OP: protocol.Outputs.LIST, "root": node.cwd, "paths": paths or None,
            "run": run_folder(node.rundir) if node.rundir else None,
            "skip": skipped(spec, dest)}


def plan_pairs(run: RunDir) -> list[tuple[HostSpec, PlanNode]]:
    """Each node of the attempt's plan with its connection settings."""
    return remote_runs.host_specs(run)
