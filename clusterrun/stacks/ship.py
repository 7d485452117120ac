"""py-spy shipped at launch, so the stall watchdog sees from the start.

A run whose watchdog is on reads its ranks' stacks on the hosts: each supervisor to tell a
busy rank from one spinning in a collective, and a detached run's hub for its report. A host
with no py-spy of its own gets this machine's (clusterrun depends on py-spy), as `clusterrun
stacks` would ship it, before the supervisors start. Which hosts need it comes from the probe
(remote/probe/sysinfo.py ``ptrace``: its own py-spy, its CPU, the copies already under its workdir),
so a warm launch, where every host has its copy, costs nothing more. A copy that cannot be made
is said and the run goes on: the watchdog there counts growing CPU as progress, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

from clusterrun import pyspy
from clusterrun.inventory import HostSpec
from clusterrun.plan.model import LaunchPlan
from clusterrun.remote.shared.layout import tools_dir
from clusterrun.transport import Transport, parallel
from clusterrun.transport.programs import call

SECONDS = 120.0  # for all hosts: 8 MB each, at once


def copy_name(binary: pyspy.Binary) -> str:
    """The shipped copy's name under the tools folder, by content (remote/tools/stackdump.py's
    too)."""
    return f"py-spy-{binary.sha[:16]}"


def needs(facts: Mapping[str, Any], binary: pyspy.Binary) -> bool:
    """Whether a host with these facts needs ``binary`` shipped: it has no py-spy of its own nor
    this copy, and can run it. A host whose probe said nothing of py-spy is left alone."""
    ptrace = facts.get("ptrace")
    if not isinstance(ptrace, dict) or "machine" not in ptrace or ptrace.get("pyspy"):
        return False
    return (binary.fits("Linux", str(ptrace["machine"]))  # hosts are Linux (DESIGN)
            and copy_name(binary) not in (ptrace.get("shipped") or ()))


def ship(plan: LaunchPlan, transports: Mapping[str, Transport], specs: Mapping[str, HostSpec],
         facts: Mapping[str, Mapping[str, Any]], say: Callable[[str], None], *,
         binary: Optional[pyspy.Binary] = None) -> list[str]:
    """This machine's py-spy to every host of a watched run that needs it (``needs``); the
    hosts it went to. Failures are said, not raised."""
    binary = binary or pyspy.local()
    if plan.stall_timeout <= 0 or binary is None:
        return []
    nodes = {n.name: n for n in plan.nodes if not n.local and needs(facts.get(n.name) or {},
                                                                       binary)}
    if not nodes:
        return []

    def one(spec: HostSpec) -> str:
        path = f"{tools_dir(nodes[spec.name].rundir)}/{copy_name(binary)}"
        call(transports[spec.name], spec, "toolcache.py", {"path": path, "size": binary.size},
             timeout=SECONDS, site=False, payload=pyspy.chunks(binary))
        return path

    results = parallel.run(one, [specs[name] for name in nodes], SECONDS + 10)
    for failed in results.failed:
        why = parallel.strip_name(failed.failure.message, failed.name) if failed.failure \
            else "no answer"
        say(f"{failed.name}: py-spy could not be shipped ({why}); until `clusterrun stacks` "
            "ships it, the stall watchdog there cannot read its ranks' stacks")
    return sorted(results.values())
