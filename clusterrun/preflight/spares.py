"""Preflight of an attempt's hosts with spares: a host that fails is left out (a spare takes
its slot, or the run shrinks with --min-nodes) and the new set is checked again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Optional

from clusterrun.inventory import Inventory
from clusterrun.inventory.slots import CannotReplace, Slots
from clusterrun.preflight import checks as preflight
from clusterrun.preflight.report import CheckReport, HostReport
from clusterrun.transport.pool import Connections


def problem(host: HostReport) -> str:
    """A failed host's reason in a few words, for the quarantine record."""
    if not host.reached:
        return "is unreachable"
    failed = next((c for c in host.checks if not c.ok), None)
    return f"failed the check ({failed.name})" if failed else "failed the check"


def check(inv: Inventory, pool: Connections, slots: Slots, *, attempt: int, data_path: bool,
          allow_busy_gpus: bool, say: Callable[[str], None], torch_needed: bool = True,
          on_facts: Optional[Callable[[HostReport], None]] = None,
          after_facts: Optional[Callable[[Sequence[HostReport]], bool]] = None) -> CheckReport:
    """Preflight of the attempt's hosts. A host that fails is replaced and the new set checked
    again; when nothing can replace it, the failing report is returned, as a launch without
    spares would see it (``slots.quarantined`` lists the hosts left out). ``torch_needed``,
    ``on_facts``, ``after_facts``: see preflight.run."""
    while True:
        report = preflight.run(slots.inventory(inv), pool, data_path=data_path,
                               allow_busy_gpus=allow_busy_gpus, torch_needed=torch_needed,
                               on_facts=on_facts,
                               after_facts=after_facts)
        # Without the checks (--no-check), only a host that cannot be reached is left out.
        bad = [h for h in report.hosts if (not h.ok if data_path else not h.reached)]
        if report.stopped or not bad or not slots.replaceable:
            return report
        try:
            for host in bad:
                pool.discard(host.spec.name)
                failed = next((c for c in host.checks if not c.ok), None)
                say(f"warning: {slots.leave_out(host.spec.name, problem(host), attempt)}"
                    + (f" ({failed.detail})" if failed else ""))
        except CannotReplace:
            return report
