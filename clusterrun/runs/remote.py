"""Reaching a run's hosts again from any shell: its status (`ps`) and stopping it (`stop`).

Each function takes one attempt's folder and reaches that attempt's hosts and remote rundirs
(hosts differ between attempts: a spare takes a failed host's place). The run's live hosts are
those of ``attempts.current(run)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from clusterrun import wire
from clusterrun.inventory import HostSpec
from clusterrun.runs import connections
from clusterrun.runs.records import NodeState, PlanNode
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions, Transport, parallel
from clusterrun.transport.pool import Connections
from clusterrun.transport.programs import call

T = TypeVar("T")

def host_specs(run: RunDir) -> list[tuple[HostSpec, PlanNode]]:
    """Each node's connection settings and plan entry, from the attempt's plan.json."""
    out = []
    for raw in run.plan.get("nodes", []):
        node = PlanNode.from_json(raw)
        if node is None:
            continue
        conn = dict(raw.get("connection") or {})
        conn.setdefault("host", node.host)
        conn.setdefault("name", node.name)
        spec = HostSpec(master=node.node_rank == 0, line=0,
                        **{k: v for k, v in conn.items() if v is not None})
        out.append((spec, node))
    return out


def _connections(ssh: SshOptions) -> Connections:
    """The command's pool for these options (runs/connections.py), else one of this step's."""
    held = connections.current()
    return held.pool(ssh, Connections) if held is not None else Connections(ssh)


def each_node(run: RunDir, ssh: SshOptions, fn: Callable[[Transport, HostSpec, PlanNode], T],
               deadline: Optional[float]) -> parallel.GroupResult[HostSpec, T]:
    """``fn(transport, spec, plan entry)`` on every node of a run at once, over the command's
    connection to it (runs/connections.py)."""
    pairs = host_specs(run)
    nodes = {spec.name: node for spec, node in pairs}

    owned = connections.current() is None  # no command holds the connections: this step does
    pool = _connections(ssh)

    def one(spec: HostSpec) -> T:
        transport = pool.get(spec)
        try:
            return fn(transport, spec, nodes[spec.name])
        except BaseException:
            pool.discard(spec.name)  # the next step of this command connects afresh
            raise

    try:
        return parallel.run(one, [spec for spec, _ in pairs], deadline)
    finally:
        if owned:
            pool.close()


def status(run: RunDir, ssh: SshOptions) -> dict[str, NodeState]:
    """Per node, the supervisor's state.json there; a host that could not be asked is
    ``unreachable``, with the reason."""
    def one(transport: Transport, spec: HostSpec, node: PlanNode) -> NodeState:
        reply = wire.parse(call(transport, spec, "status.py", {"rundir": node.rundir},
                                timeout=30))
        if not isinstance(reply, wire.Status):
            raise wire.ProtocolError(f"{spec.name}: status.py answered {reply}")
        return NodeState.from_json(reply.state or {"state": "missing"})

    results = each_node(run, ssh, one, ssh.connect_timeout + 30)
    return {r.spec.name: (r.value if r.value is not None else
                          NodeState("unknown", unreachable=True,
                                    reason=r.failure.message if r.failure else ""))
            for r in results}


@dataclass(frozen=True)
class Stopped:
    """What stop.py answered for one node: whether the run was there, its state before and
    after; or why the host could not be asked (``error``)."""

    found: bool = False
    was: Optional[str] = None
    state: Optional[NodeState] = None
    error: Optional[str] = None


def stop(run: RunDir, ssh: SshOptions, grace: float, force: bool) -> dict[str, Stopped]:
    def one(transport: Transport, spec: HostSpec, node: PlanNode) -> Stopped:
        reply = wire.parse(call(transport, spec, "stop.py",
                                {"rundir": node.rundir, "grace": grace, "force": force},
                                timeout=grace + 30))
        if not isinstance(reply, wire.StopResult):
            raise wire.ProtocolError(f"{spec.name}: stop.py answered {reply}")
        return Stopped(reply.found, reply.was,
                       NodeState.from_json(reply.state) if reply.state else None)

    results = each_node(run, ssh, one, ssh.connect_timeout + grace + 40)
    return {r.spec.name: (r.value if r.value is not None else
                          Stopped(error=r.failure.message if r.failure else "unknown"))
            for r in results}
