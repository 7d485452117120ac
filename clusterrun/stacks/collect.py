"""Collecting a live run's stacks from its hosts: one `stackdump.py` per node, all at once."""

from __future__ import annotations

from typing import Any, Optional

from clusterrun import pyspy
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import layout
from clusterrun.runs import attempts
from clusterrun.runs import remote as remote_runs
from clusterrun.runs.records import PlanNode, PlanRecord
from clusterrun.runs.store import RunDir
from clusterrun.stacks.model import Collected, from_reply
from clusterrun.transport import SshOptions, Transport
from clusterrun.transport.programs import call

TIMEOUT = 30.0  # per host: py-spy itself answers in well under a second per rank


def _request(node: PlanNode, ranks: Optional[list[int]],
             binary: Optional[pyspy.Binary]) -> dict[str, Any]:
    return {"rundir": node.rundir, "python": node.python,
            "tools": layout.tools_dir(node.rundir),  # a shipped py-spy, for every run there
            "ranks": ranks,
            "pyspy": {"sha": binary.sha, "size": binary.size} if binary else None}


def unfit(name: str, binary: pyspy.Binary, reply: dict[str, Any]) -> str:
    """Why this machine's py-spy is not shipped to a host without one, and the fix."""
    there = " ".join(str(reply.get(k) or "unknown") for k in ("system", "machine"))
    return (f"{name}: py-spy is not installed there, and this machine's ({binary.path}) is "
            f"{binary.describe()}, which a {there} host cannot run; install py-spy in the "
            f"host's Python environment ({pyspy.INSTALL})")


def ask(transport: Transport, spec: HostSpec, node: PlanNode,
        ranks: Optional[list[int]] = None, profile: Optional[float] = None) -> dict[str, Any]:
    """One node's answer (remote/tools/stackdump.py), shipping py-spy if the host has none. With
    ``profile`` (seconds) every rank is sampled through that window first (--profile)."""
    binary = pyspy.local()
    request = _request(node, ranks, binary)
    if profile:
        request["profile"] = profile
    reply = call(transport, spec, "stackdump.py", request, timeout=TIMEOUT + (profile or 0),
                 site=False)
    if not reply.get("need_pyspy"):
        return reply
    if binary is None:
        reply["problem"] = (f"{spec.name}: py-spy is not installed there nor here (pip has none "
                            "for this machine's platform, or it was uninstalled); install it in "
                            f"the host's Python environment ({pyspy.INSTALL}), or on this "
                            "machine and clusterrun ships it")
        return reply
    if not binary.fits(reply.get("system"), reply.get("machine")):
        reply["problem"] = unfit(spec.name, binary, reply)
        return reply
    request["send"] = True
    reply = call(transport, spec, "stackdump.py", request, timeout=TIMEOUT + 60 + (profile or 0),
                 site=False, payload=pyspy.chunks(binary))
    if reply.get("need_pyspy"):  # sent, and still it cannot run there (a noexec filesystem)
        reply["problem"] = (f"{spec.name}: the py-spy sent to {request['tools']} cannot run "
                            "there; install py-spy in the host's Python environment (pip "
                            "install py-spy)")
    return reply


def _nodes_for(run: RunDir, nodes: Optional[set[str]],
               ranks: Optional[set[int]]) -> Optional[set[str]]:
    """The nodes to ask: those named, and those holding the ranks asked for."""
    if nodes is None and ranks is None:
        return None
    keep = set(nodes or ())
    if ranks is not None:
        for node in PlanRecord.of(run).nodes:
            if any(node.holds(r) for r in ranks) and (nodes is None or node.name in nodes):
                keep.add(node.name)
        if nodes is not None:
            keep &= set(nodes)
    return keep


def collect(run: RunDir, ssh: SshOptions, *, nodes: Optional[set[str]] = None,
            ranks: Optional[set[int]] = None, profile: Optional[float] = None) -> Collected:
    """Every rank's stacks on the current attempt's hosts (or those of ``nodes``/``ranks``).
    A host that gave none is in ``problems`` with the reason; ranks are sorted by number."""
    attempt = attempts.current(run)
    wanted = _nodes_for(attempt, nodes, ranks)
    rank_list = sorted(ranks) if ranks is not None else None

    def one(transport: Transport, spec: HostSpec, node: PlanNode) -> dict[str, Any]:
        if wanted is not None and spec.name not in wanted:
            return {"skipped": True}
        return ask(transport, spec, node, rank_list, profile)

    results = remote_runs.each_node(attempt, ssh, one,
                                    ssh.connect_timeout + TIMEOUT + 90 + 2 * (profile or 0))
    out = Collected(run=run.id, partial=wanted is not None)
    for result in results:
        name = result.spec.name
        reply = result.value
        if reply is None:
            out.problems[name] = result.failure.message if result.failure else "no answer"
            continue
        if reply.get("skipped"):
            continue
        if reply.get("problem"):
            out.problems[name] = reply["problem"]
        elif not reply.get("found"):
            out.problems[name] = f"{name}: no trace of the run there"
        elif not reply.get("ranks") and reply.get("state") != "running":
            out.problems[name] = f"{name}: the run is {reply.get('state')} there"
        for entry in reply.get("ranks") or []:
            out.ranks.append(from_reply(name, entry))
        out.flight.extend(dict(f, node=name) for f in reply.get("flight") or [])
    out.ranks.sort(key=lambda r: r.rank)
    if profile:
        # Only --profile needs these (statistics, the run's journal): a plain `stacks` starts
        # without their imports.
        from clusterrun.stacks.profile import stragglers

        out.stragglers = stragglers(out.ranks)
        if not out.partial:  # a profile of some hosts or ranks says nothing about the run
            _record(run, attempt.attempt, out)
    return out


def _record(run: RunDir, k: int, found: Collected) -> None:
    """Stragglers named by a whole profile go into the run's events (once while they stay)."""
    from clusterrun.runs.journal import Journal
    from clusterrun.stacks.profile import judged

    # A host that gave nothing, or a rank py-spy barely sampled, leaves the run unjudged.
    if found.problems or not found.ranks or not all(judged(r) for r in found.ranks):
        return
    shares = {str(r.rank): r.wait_share for r in found.ranks if r.wait_share is not None}
    with Journal.of(run) as journal:
        journal.stragglers(k, found.stragglers or [], shares)
