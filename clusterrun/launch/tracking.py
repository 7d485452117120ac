"""What a launch says about how each host tracks the job's processes (remote/hostlib/cgroup.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from clusterrun.inventory import HostSpec
from clusterrun.inventory.ranges import fold
from clusterrun.launch.outcome import NodeOutcome


def untracked_note(nodes: Mapping[str, NodeOutcome], specs: Mapping[str, HostSpec]
                   ) -> Optional[str]:
    """One line naming the hosts whose job runs without a cgroup, once every node has started.
    A container's or a Slurm step's processes are its engine's or slurmd's to end, so those
    hosts are not named."""
    why: dict[str, list[str]] = {}
    for name, node in nodes.items():
        spec = specs[name]
        if (node.started is None or node.started.cgroup is not None or spec.container
                or spec.transport != "ssh"):
            continue
        why.setdefault(node.started.cgroup_why or "no cgroup v2", []).append(name)
    if not why:
        return None
    reasons = "; ".join(f"{fold(names)}: {text}" for text, names in sorted(why.items()))
    if len(why) == 1:
        reasons = next(iter(why))
    return (f"note: no cgroup for the job on {fold(sorted(n for ns in why.values() for n in ns))} "
            f"({reasons}). Its processes are tracked as the supervisor's children, which a "
            "process leaves only if the supervisor itself is killed (docs/reliability.md)")
