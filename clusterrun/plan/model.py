"""The launch plan: per host, its node rank, interface, environment and exact torchrun command."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from clusterrun.plan.secrets import masked
from clusterrun.remote.shared import protocol


@dataclass(frozen=True)
class Job:
    """What runs on every host: a script (or a module, as with ``python -m``) and its arguments,
    under torchrun or started directly."""

    script: Path  # on this machine; for a module, its top-level package directory or file
    args: tuple[str, ...] = ()
    module: Optional[str] = None
    torchrun: bool = True
    local_rank_arg: bool = False  # every process also gets --local_rank=N first
    torchrun_args: tuple[str, ...] = ()

    @property
    def code(self) -> Path:
        """The directory copied to every host."""
        if self.module is not None and self.script.is_dir():
            return self.script
        return self.script.parent

    @property
    def label(self) -> str:
        return self.module or self.script.stem


@dataclass(frozen=True)
class RankProcess:
    """One process of a node started without torchrun: its command and the variables torchrun
    would have given it (no secrets: those are in the node's environment)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


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
    code_dest: str = ""  # on the host: where the copied directory goes ("" = cwd)
    processes: tuple[RankProcess, ...] = ()  # --no-torchrun: one per local rank, argv unused

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    connection: tuple[tuple[str, Any], ...] = ()  # how to reach the host again (stop, logs)

    @property
    def container(self) -> Optional[str]:
        """``NAME (engine[, user U])`` when everything on this host runs in a container."""
        conn = dict(self.connection)
        if not conn.get("container"):
            return None
        user = f", user {conn['container_user']}" if conn.get("container_user") else ""
        return f"{conn['container']} ({conn.get('container_engine') or 'docker or podman'}{user})"

    def public(self) -> dict[str, Any]:
        """For plan.json, --dry-run and the host's spec.json: secrets masked."""
        return {"name": self.name, "host": self.host, "node_rank": self.node_rank,
                "connection": dict(self.connection),
                "nproc": self.nproc, "ranks": [self.ranks.start, self.ranks.stop - 1],
                "interface": self.interface, "address": self.address, "rundir": self.rundir,
                "cwd": self.cwd, "argv": list(self.argv), "env": masked(dict(self.env)),
                "processes": [{"argv": list(p.argv), "env": dict(p.env)}
                              for p in self.processes]}


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    name: str
    script: Path  # on this machine (for -m, the module's package)
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
    module: Optional[str] = None  # -m MODULE instead of a script
    code: Optional[Path] = None  # the directory copied to every host (default: the script's)
    attempt: int = 1  # 2 and on: a restart of the run (`launch --max-restarts`)
    stall_timeout: float = 0.0  # the stall watchdog (docs/troubleshooting.md); 0: off
    on_stall: str = protocol.STALL_REPORT  # or STALL_STOP (exit status 7)

    @property
    def code_dir(self) -> Path:
        return self.code or self.script.parent

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    def public(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "script": str(self.script),
                "args": list(self.args), "master_addr": self.master_addr,
                "master_port": self.master_port, "nnodes": len(self.nodes),
                "world_size": self.world_size, "sync": self.sync, "grace": self.grace,
                "lease": self.lease, "detach": self.detach, "created": self.created,
                "module": self.module,
                "lifeline_port": self.lifeline_port, "attempt": self.attempt,
                "stall_timeout": self.stall_timeout, "on_stall": self.on_stall,
                "nodes": [n.public() for n in self.nodes]}
