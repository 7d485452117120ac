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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from clusterrun.inventory import HostSpec, Inventory, ranks
from clusterrun.launch import outcome
from clusterrun.launch.outcome import NodeOutcome
from clusterrun.logs.mirror import verify
from clusterrun.plan.model import LaunchPlan
from clusterrun.preflight import checks as preflight
from clusterrun.preflight.report import CheckReport, HostReport
from clusterrun.runs import attempts
from clusterrun.runs import store as runs
from clusterrun.runs.store import RunDir
from clusterrun.transport.pool import Connections


@dataclass(frozen=True)
class Quarantined:
    host: str
    reason: str
    at: float
    attempt: int

    def public(self) -> dict[str, Any]:
        return {"host": self.host, "reason": self.reason, "at": self.at, "attempt": self.attempt}


class CannotReplace(Exception):
    """A slot lost its host and neither a spare nor --min-nodes can fill it."""


@dataclass
class Slots:
    hosts: list[HostSpec]  # node-rank order: hosts[0] is the master
    spares: list[HostSpec]
    min_nodes: Optional[int] = None
    quarantined: list[Quarantined] = field(default_factory=list)

    @classmethod
    def initial(cls, inv: Inventory, min_nodes: Optional[int] = None) -> Slots:
        return cls(ranks.in_rank_order(inv.active), list(inv.spares), min_nodes)

    def inventory(self, inv: Inventory) -> Inventory:
        """The inventory of this attempt: its hosts, the first of them the master."""
        hosts = tuple(dataclasses.replace(h, master=i == 0) for i, h in enumerate(self.hosts))
        return dataclasses.replace(inv, hosts=hosts)

    def leave_out(self, name: str, reason: str, attempt: int) -> str:
        """Quarantine ``name`` and fill its slot; returns what happened, for the user."""
        at = next(i for i, h in enumerate(self.hosts) if h.name == name)
        self.quarantined.append(Quarantined(name, reason, time.time(), attempt))
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


def problem(host: HostReport) -> str:
    """A failed host's reason in a few words, for the quarantine record."""
    if not host.reached:
        return "is unreachable"
    failed = next((c for c in host.checks if not c.ok), None)
    return f"failed the check ({failed.name})" if failed else "failed the check"


def checked(inv: Inventory, pool: Connections, slots: Slots, *, attempt: int,
            data_path: bool, allow_busy_gpus: bool, say: Callable[[str], None],
            on_facts: Optional[Callable[[HostReport], None]] = None) -> CheckReport:
    """Preflight of the attempt's hosts. A host that fails is replaced (a spare, or fewer nodes
    with --min-nodes) and the new set checked again; when nothing can replace it, the failing
    report is returned, as a launch without spares would see it. ``on_facts``: see
    preflight.run."""
    while True:
        report = preflight.run(slots.inventory(inv), pool, data_path=data_path,
                               allow_busy_gpus=allow_busy_gpus, on_facts=on_facts)
        # Without the checks (--no-check), only a host that cannot be reached is left out.
        bad = [h for h in report.hosts if (not h.ok if data_path else not h.reached)]
        if not bad or not (slots.spares or slots.min_nodes is not None):
            return report
        try:
            for host in bad:
                pool.discard(host.spec.name)
                failed = next((c for c in host.checks if not c.ok), None)
                say(f"warning: {slots.leave_out(host.spec.name, problem(host), attempt)}"
                    + (f" ({failed.detail})" if failed else ""))
        except CannotReplace:
            return report


def lost_hosts(nodes: Sequence[Any]) -> list[tuple[str, str]]:
    """(name, why) of every node the controller lost during an attempt."""
    return [(n.plan.name, f"lost ({n.lost})") for n in nodes if n.lost is not None]


def attempt_summary(folder: RunDir, nodes: list[NodeOutcome], *, root: Optional[outcome.Failure],
                    status: int, interrupted: Optional[int]) -> tuple[dict[str, Any],
                                                                     dict[str, Any]]:
    """An attempt's summary.json content, and the check of its mirrors against the hosts'."""
    logs = verify(folder, {n.plan.name: n.end.checksums if n.end else {} for n in nodes})
    return outcome.summary(folder, nodes, root=root, status=status, interrupted=interrupted,
                           checks=logs), logs


class History:
    """The run's attempts and quarantined hosts, in its state.json (`ps`, `logs` read them) and
    on the console; each failed attempt's own summary.json in its folder."""

    def __init__(self, run: RunDir, max_restarts: int, slots: Optional[Slots]) -> None:
        self.run = run
        self.slots = slots
        run.update_state(max_restarts=max_restarts, attempts=[], quarantined=[])

    def begin(self, plan: LaunchPlan) -> None:
        with self.run.locked("state.lock"):
            state = self.run.state
            state["attempt"] = plan.attempt
            state.setdefault("attempts", []).append({
                "attempt": plan.attempt, "hosts": [n.name for n in plan.nodes],
                "exit_status": None, "root_cause": None, "started_at": time.time(),
                "ended_at": None})
            state["quarantined"] = self._quarantined()
            runs.write_json(self.run.file("state.json"), state)

    def end(self, plan: LaunchPlan, folder: RunDir, nodes: list[NodeOutcome],
            root: outcome.Failure, say: Callable[[str], None]) -> None:
        """A failed attempt that another may follow: its summary, its root cause."""
        status = outcome.exit_status(root, None, False)
        summary, _logs = attempt_summary(folder, nodes, root=root, status=status,
                                         interrupted=None)
        runs.write_json(folder.file("summary.json"), summary)
        for line in outcome.report(folder, nodes, root, None, False):
            say(line)
        attempts.end_entry(self.run, plan.attempt, exit_status=status, root_cause=root.detail,
                           ended_at=time.time())

    def close(self, plan: LaunchPlan, status: int, root: Optional[outcome.Failure]) -> None:
        attempts.end_entry(self.run, plan.attempt, exit_status=status,
                           root_cause=root.detail if root else None, ended_at=time.time())
        self.run.update_state(quarantined=self._quarantined())

    def _quarantined(self) -> list[dict[str, Any]]:
        return [q.public() for q in (self.slots.quarantined if self.slots else [])]

    def next_dir(self, plan: LaunchPlan, inventory: str) -> RunDir:
        folder = attempts.create_attempt(self.run, plan.attempt)
        runs.write_json(folder.file("plan.json"), dict(plan.public(), inventory=inventory))
        folder.update_state(id=plan.run_id, name=plan.name, state="running",
                            attempt=plan.attempt, started_at=runs.now(),
                            hosts=[n.name for n in plan.nodes], inventory=inventory)
        return folder

    def public(self) -> dict[str, Any]:
        state = self.run.state
        return {"attempts": state.get("attempts", []),
                "quarantined": state.get("quarantined", [])}
