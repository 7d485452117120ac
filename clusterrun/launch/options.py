"""The options of one launch, as the command line gives them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from clusterrun.remote.shared import protocol

STALL_TIMEOUT = protocol.STALL_TIMEOUT
GRACE = protocol.GRACE
LEASE = protocol.LEASE


@dataclass(frozen=True)
class LaunchOptions:
    nproc_per_node: Optional[int] = None
    master_port: Optional[int] = None
    env: tuple[tuple[str, str], ...] = ()
    check: bool = True
    sync: bool = True
    dry_run: bool = False
    detach: bool = False
    name: Optional[str] = None
    grace: float = GRACE
    lease: float = LEASE
    excludes: tuple[str, ...] = ()
    env_file: Optional[str] = None
    forward_env: tuple[str, ...] = ()
    allow_busy_gpus: bool = False
    max_restarts: int = 0
    min_nodes: Optional[int] = None  # None: a lost host with no spare left ends the run
    stall_timeout: float = STALL_TIMEOUT  # 0: no stall watchdog
    on_stall: str = protocol.STALL_REPORT  # or STALL_STOP: end a stalled run (exit 7)
    notify: Optional[str] = None  # a command run on this machine for each event of the run
    as_json: bool = False  # `--json`: the plan as JSON, or the events as JSON lines on stdout
