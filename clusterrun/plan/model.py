"""The launch plan: per host, its node rank, interface, environment and exact torchrun command."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from clusterrun.plan.secrets import masked


@dataclass(frozen=True)
class NodePlan:
    name: str
    host: str
    local: bool
    node_rank: int
    nproc: int
    first_rank: int
    interface: str
    address: str
    python: str
    setup: Optional[str]
    workdir: str
    rundir: str  # on the host
    cwd: str  # on the host: the synced copy of the script's directory
    argv: tuple[str, ...]  # torchrun and everything after it; no shell involved
    env: tuple[tuple[str, str], ...]

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    connection: tuple[tuple[str, Any], ...] = ()  # how to reach the host again (stop, logs)

    def public(self) -> dict[str, Any]:
        """For plan.json, --dry-run and the host's spec.json: secrets masked."""
        return {"name": self.name, "host": self.host, "node_rank": self.node_rank,
                "connection": dict(self.connection),
                "nproc": self.nproc, "ranks": [self.ranks.start, self.ranks.stop - 1],
                "interface": self.interface, "address": self.address, "rundir": self.rundir,
                "cwd": self.cwd, "argv": list(self.argv), "env": masked(dict(self.env))}


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    name: str
    script: Path  # on this machine
    args: tuple[str, ...]
    master_addr: str
    master_port: int
    nodes: tuple[NodePlan, ...]
    sync: bool
    grace: float
    lease: float
    detach: bool = False
    # Proved open from every worker to the master at preflight: detached runs' supervisors keep
    # their lifeline to the master's supervisor on it. None when the data path was not tested.
    lifeline_port: Optional[int] = None
    created: float = field(default_factory=time.time)

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    def public(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "script": str(self.script),
                "args": list(self.args), "master_addr": self.master_addr,
                "master_port": self.master_port, "nnodes": len(self.nodes),
                "world_size": self.world_size, "sync": self.sync, "grace": self.grace,
                "lease": self.lease, "detach": self.detach, "created": self.created,
                "lifeline_port": self.lifeline_port,
                "nodes": [n.public() for n in self.nodes]}
