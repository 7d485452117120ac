"""Showing a launch plan (`launch --dry-run`, and the banner of a real launch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clusterrun.inventory.ranges import fold
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.plan.secrets import describe, masked
from clusterrun.transport import shell


def banner(plan: LaunchPlan) -> list[str]:
    nodes = len(plan.nodes)
    return [
        f"run {plan.run_id}: {nodes} node{'s' * (nodes != 1)}, world size {plan.world_size}, "
        f"master {plan.master_addr}:{plan.master_port}",
        *(f"  {n.name}: node_rank {n.node_rank}, ranks {n.ranks.start}-{n.ranks.stop - 1}, "
          f"interface {n.interface} ({n.address})"
          + (f", in container {n.container}" if n.container else "") for n in plan.nodes),
        # PyTorch's SECURITY.md: the store executes what it is sent, from anyone who reaches it.
        f"note: torch's c10d store on {plan.master_addr}:{plan.master_port} is unauthenticated; "
        "anyone who can reach that port can join or disrupt the job. Use a trusted network.",
    ]


def dry_run(plan: LaunchPlan, spares: Sequence[str] = ()) -> list[str]:
    """Per host: node rank, interface, environment (secrets masked) and the exact command; then
    the spare hosts, which start nothing until a restart needs them."""
    lines = [f"dry run: nothing was started. {banner(plan)[0]}"]
    for node in plan.nodes:
        lines.append("")
        lines.append(f"{node.name} ({node.host}{', local' if node.local else ''}): node_rank "
                     f"{node.node_rank}, {node.nproc} process(es), global ranks "
                     f"{node.ranks.start}-{node.ranks.stop - 1}")
        if node.container:
            lines.append(f"  container: {node.container}")
        lines.append(f"  interface: {node.interface} ({node.address})")
        lines.append(f"  directory: {node.cwd}")
        lines.append(f"  run files: {node.rundir}")
        if node.setup:
            lines.append(f"  setup:     {node.setup}")
        for key, value in masked(dict(node.env)).items():
            lines.append(f"  env:       {key}={value}")
        if node.processes:
            for process in node.processes:
                rank = dict(process.env)
                lines.append(f"  rank {rank['RANK']} (local {rank['LOCAL_RANK']}): "
                             f"{shell.join(process.argv)}")
        else:
            lines.append(f"  command:   {shell.join(node.argv)}")
    if spares:
        lines.append("")
        lines.append(f"spares (nothing starts there; with --max-restarts one takes the node rank "
                     f"of a failed host): {fold(list(spares))}")
    lines.append("")
    lines.append("The command runs without a shell: arguments and environment values arrive "
                 "byte-exact. Secrets are masked here and travel on the supervisor's stdin, never "
                 "on a command line.")
    lines.append(describe())
    return lines


def dry_run_json(plan: LaunchPlan, spares: Sequence[str] = ()) -> dict[str, Any]:
    """`launch --dry-run --json`: what ``dry_run`` shows, as one object (docs/commands.md).
    Environments are the variables each host's ranks get, secrets masked (the names stay)."""
    return {
        "ok": True, "dry_run": True, "run_id": plan.run_id, "name": plan.name,
        "script": str(plan.script), "module": plan.module, "args": list(plan.args),
        "master_addr": plan.master_addr, "master_port": plan.master_port,
        "nnodes": len(plan.nodes), "world_size": plan.world_size,
        "nodes": [_node_json(node) for node in plan.nodes], "spares": list(spares),
        "secrets": describe()}


def _node_json(node: NodePlan) -> dict[str, Any]:
    return {
        "name": node.name, "host": node.host, "local": node.local, "node_rank": node.node_rank,
        "nproc": node.nproc, "ranks": [node.ranks.start, node.ranks.stop - 1],
        "interface": node.interface, "address": node.address, "container": node.container,
        "python": node.python, "directory": node.cwd, "rundir": node.rundir, "setup": node.setup,
        "env": masked(dict(node.env)),
        # Without torchrun, one command per rank (argv null then); else torchrun's, the same
        # on every rank of the node.
        "argv": None if node.processes else list(node.argv),
        "command": None if node.processes else shell.join(node.argv),
        "processes": [{"rank": int(dict(p.env)["RANK"]),
                       "local_rank": int(dict(p.env)["LOCAL_RANK"]), "argv": list(p.argv),
                       "command": shell.join(p.argv)} for p in node.processes]}
