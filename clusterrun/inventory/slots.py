"""Which hosts run each attempt of a run: `launch --max-restarts N`, `spare: true`, `--min-nodes`.

The hosts of an attempt are slots in node-rank order (slot 0 is the master). A host that is
lost during a run, or fails the check before an attempt, is quarantined (never used again by
this run) and its slot goes to the next spare, so node ranks and the world size stay as they
were; without a spare, `--min-nodes M` lets the run go on with the slot removed (node ranks
renumbered, a smaller world), and otherwise the run cannot restart. A rank that exits non-zero
on a host that still passes the check is the job's failure, not the host's: the same hosts run
the next attempt.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from clusterrun.inventory.hosts import HostSpec, Inventory
from clusterrun.inventory.ranks import in_rank_order


@dataclass(frozen=True)
class Quarantine:
    """A host a run will not use again: lost during an attempt, or failed the check before one."""

    host: str
    reason: str
    at: float
    attempt: int

    def public(self) -> dict[str, Any]:
        return asdict(self)


class CannotReplace(Exception):
    """A slot lost its host and neither a spare nor --min-nodes can fill it."""


@dataclass
class Slots:
    hosts: list[HostSpec]  # node-rank order: hosts[0] is the master
    spares: list[HostSpec]
    min_nodes: Optional[int] = None
    quarantined: list[Quarantine] = field(default_factory=list)

    @classmethod
    def initial(cls, inv: Inventory, min_nodes: Optional[int] = None) -> Slots:
        return cls(in_rank_order(inv.active), list(inv.spares), min_nodes)

    @property
    def replaceable(self) -> bool:
        """A host that fails can be left out: a spare can take its slot, or the run may shrink."""
        return bool(self.spares) or self.min_nodes is not None

    def inventory(self, inv: Inventory) -> Inventory:
        """The inventory of this attempt: its hosts, the first of them the master."""
        hosts = tuple(dataclasses.replace(h, master=i == 0) for i, h in enumerate(self.hosts))
        return dataclasses.replace(inv, hosts=hosts)

    def leave_out(self, name: str, reason: str, attempt: int) -> str:
        """Quarantine ``name`` and fill its slot; returns what happened, for the user."""
        at = next(i for i, h in enumerate(self.hosts) if h.name == name)
        self.quarantined.append(Quarantine(name, reason, time.time(), attempt))
        if self.spares:
            spare = self.spares.pop(0)
            self.hosts[at] = spare
            role = " (the new master)" if at == 0 else ""
            return f"{name} {reason}; replaced by spare {spare.name}{role}"
        if self.min_nodes is not None and len(self.hosts) - 1 >= self.min_nodes:
            del self.hosts[at]
            return (f"{name} {reason}; no spare left, going on with {len(self.hosts)} nodes "
                    f"(--min-nodes {self.min_nodes})")
        need = (f"--min-nodes {self.min_nodes} allows no fewer than {self.min_nodes} nodes"
                if self.min_nodes is not None else "no --min-nodes to go on with fewer")
        raise CannotReplace(f"{name} {reason}, and there is no spare left to take its place "
                            f"({need}).")
