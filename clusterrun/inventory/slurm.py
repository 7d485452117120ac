"""`hosts: slurm`: the nodes of the Slurm allocation this command runs in.

Inside `salloc` or `sbatch`, Slurm says which nodes are ours (SLURM_JOB_NODELIST, in its
compressed form, expanded with ClusterShell's NodeSet as for ranges) and which job they belong
to (SLURM_JOB_ID). Those nodes are then reached with `srun` job steps, so Slurm starts, tracks
and ends every process; `transport: ssh` reaches the same nodes over SSH instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from clusterrun.inventory.checker import Checker
from clusterrun.inventory.yaml_lines import Located

WORD = "slurm"
TRANSPORTS = ("srun", "ssh")


def allocation(chk: Checker, line: int, environ: Mapping[str, str]) -> tuple[str, list[Located]]:
    """The allocation's job id and its nodes as inventory entries, at ``line``."""
    # Here: every command that reads an inventory loads this module; only `hosts: slurm`
    # reads a node list.
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job or not nodelist:
        chk.fail(line, "`hosts: slurm` takes the nodes of the Slurm allocation this command runs "
                 "in, and there is none here (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set). "
                 "Run it inside one: `salloc -N3 clusterrun launch ...`, or in an sbatch script.")
        return "", []
    try:
        nodes = list(NodeSet(nodelist))
    except NodeSetParseError as exc:
        chk.fail(line, f"SLURM_JOB_NODELIST {nodelist!r} cannot be read: {exc}.")
        return job, []
    return job, [Located({"host": Located(node, line)}, line) for node in nodes]
