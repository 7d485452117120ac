"""`clusterrun pull`: what a run's ranks wrote, copied back from every host into
``DIR/<node>/``, resumable (only files whose bytes differ move) and verified (size and SHA-256
against the host's, after the copy).

targets.py picks the nodes and says what to ask each host; fetch.py does one node (list,
compare, move, verify); channel.py moves bytes (rsync, or the SSH channel); model.py holds the
report; view.py says it. The host side is remote/tools/outputs.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from clusterrun.errors import Outcome, SyncError
from clusterrun.inventory import HostSpec
from clusterrun.pull import fetch, targets
from clusterrun.pull.model import FAILED, UNREACHABLE, NodePull, PullReport
from clusterrun.runs import attempts, connections
from clusterrun.runs.records import PlanNode, PlanRecord
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions, parallel
from clusterrun.transport.pool import Connections


def default_dest(run: RunDir) -> Path:
    return attempts.top(run).path / "files"


def pull(run: RunDir, ssh: SshOptions, *, paths: Sequence[str] = (), to: Optional[Path] = None,
         nodes: Sequence[str] = (), ranks: Sequence[int] = (), dry_run: bool = False,
         say: Optional[Callable[[str], None]] = None) -> PullReport:
    """Pull the chosen nodes of the run's current attempt, all at once; a host that fails is in
    the report with why, never stops the others."""
    asked = targets.check_paths(paths) if paths else None
    attempt = attempts.current(run)
    plan = PlanRecord.of(attempt)
    pairs = targets.chosen(targets.plan_pairs(attempt), run.id, nodes, ranks, plan.world_size)
    dest = (to or default_dest(run)).absolute()
    report = PullReport(run.id, dest, dry_run)
    found = {spec.name: node for spec, node in pairs}
    held = connections.current()
    pool = held.pool(ssh, Connections) if held is not None else Connections(ssh)

    def one(spec: HostSpec) -> NodePull:
        node: PlanNode = found[spec.name]
        if not node.cwd:  # a plan.json edited or written by something else
            raise SyncError(f"{spec.name}: the run's plan does not say where its ranks ran; "
                            "nothing to pull from it.")
        result = NodePull(spec.name, spec.host, node.cwd, dest / spec.name)
        request = targets.listing_request(spec, node, asked, dest)
        transport = pool.get(spec)
        try:
            return fetch.pull_node(transport, spec, node, request, result, dry_run=dry_run,
                                   say=say)
        except BaseException:
            pool.discard(spec.name)
            raise

    try:
        results = parallel.run(one, [spec for spec, _ in pairs], None)
    finally:
        if held is None:
            pool.close()
    for (spec, node), res in zip(pairs, results):
        if res.value is not None:
            report.nodes.append(res.value)
            continue
        failure = res.failure
        reached = failure is None or failure.outcome.reached
        report.nodes.append(NodePull(
            spec.name, spec.host, node.cwd, dest / spec.name,
            status=FAILED if reached else UNREACHABLE,
            error=failure.message if failure else "no answer"))
    return report


def outcome(report: PullReport) -> Optional[Outcome]:
    """What the exit status says: a host not reached first, then a copy that failed."""
    if any(n.status == UNREACHABLE for n in report.nodes):
        return Outcome.UNREACHABLE
    if any(n.status == FAILED for n in report.nodes):
        return Outcome.SYNC
    return None
