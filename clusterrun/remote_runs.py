"""Reaching a run's hosts again from any shell: its status (`ps`), stopping it (`stop`), and
following its log files by byte offset (`logs -f`)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, TypeVar

from clusterrun import command, group
from clusterrun.inventory import HostSpec
from clusterrun.logview import LogView
from clusterrun.mirror import Mirror, receive
from clusterrun.probing import call, drain
from clusterrun.runs import RunDir, pid_alive
from clusterrun.transport import SshOptions, Transport, connect

T = TypeVar("T")

FINAL_STATES = ("succeeded", "failed", "stopped", "lost")


def host_specs(run: RunDir) -> list[tuple[HostSpec, dict[str, Any]]]:
    """Each node's connection settings and plan entry, from plan.json."""
    out = []
    for node in run.plan.get("nodes", []):
        conn = dict(node.get("connection") or {})
        conn.setdefault("host", node["host"])
        conn.setdefault("name", node["name"])
        spec = HostSpec(master=node.get("node_rank") == 0, line=0,
                        **{k: v for k, v in conn.items() if v is not None})
        out.append((spec, node))
    return out


def _each_node(run: RunDir, ssh: SshOptions, fn: Callable[[Transport, HostSpec, dict[str, Any]], T],
               deadline: Optional[float]) -> list[group.HostResult[T]]:
    """``fn(transport, spec, plan entry)`` on every node of a run at once, over a connection
    made for it and closed after."""
    pairs = host_specs(run)
    nodes = {spec.name: node for spec, node in pairs}

    def one(spec: HostSpec) -> T:
        transport = connect(spec, ssh)
        try:
            return fn(transport, spec, nodes[spec.name])
        finally:
            transport.close()

    return group.run(one, [spec for spec, _ in pairs], deadline)


def status(run: RunDir, ssh: SshOptions) -> dict[str, dict[str, Any]]:
    """Per node, the supervisor's state.json there (or why it could not be read)."""
    def one(transport: Transport, spec: HostSpec, node: dict[str, Any]) -> dict[str, Any]:
        reply = call(transport, spec, "supervisor.py",
                     {"mode": "status", "rundir": node["rundir"]}, timeout=30)
        return reply.get("state") or {"state": "missing"}

    results = _each_node(run, ssh, one, ssh.connect_timeout + 30)
    return {r.spec.name: (r.value if r.value is not None else
                          {"state": "unknown", "reason": r.failure.message if r.failure else ""})
            for r in results}


def combined_state(per_node: dict[str, dict[str, Any]]) -> Optional[str]:
    """One state for the run from its nodes' states; None while any node is still going."""
    states = [s.get("state") for s in per_node.values()]
    if any(s not in FINAL_STATES for s in states):
        return None
    for state in ("failed", "lost", "stopped"):
        if state in states:
            return state
    return "succeeded"


def stop(run: RunDir, ssh: SshOptions, grace: float, force: bool) -> dict[str, Any]:
    def one(transport: Transport, spec: HostSpec, node: dict[str, Any]) -> dict[str, Any]:
        return call(transport, spec, "supervisor.py",
                    {"mode": "stop", "rundir": node["rundir"], "grace": grace, "force": force},
                    timeout=grace + 30)

    results = _each_node(run, ssh, one, ssh.connect_timeout + grace + 40)
    return {r.spec.name: (r.value if r.value is not None else {"error": r.failure.message
                                                               if r.failure else "unknown"})
            for r in results}


def follow(run: RunDir, ssh: SshOptions, mirror: Mirror, view: Optional[LogView],
           say: Callable[[str], None], *, keep_following: bool = True) -> dict[str, dict[str, Any]]:
    """Fetch every node's files from where the mirror ends: what is there now, or with
    ``keep_following`` until each node's run has ended and everything is here. Returns each
    node's final event."""
    ends: dict[str, dict[str, Any]] = {}

    def one(transport: Transport, spec: HostSpec, node: dict[str, Any]) -> None:
        proc = transport.run(command.remote_python(spec.python, spec.setup))
        drain(proc)
        proc.write(command.program_input("supervisor.py", {
            "mode": "tail", "rundir": node["rundir"], "follow": keep_following,
            "offsets": mirror.offsets(spec.name)}))

        def on_event(event: dict[str, Any]) -> None:
            if event.get("ev") == "end":
                ends[spec.name] = event

        receive(spec.name, proc, mirror, on_event, view.feed if view is not None else None)
        proc.close()

    if view is None:
        results = _each_node(run, ssh, one, None)
    else:
        with view.ticking():
            results = _each_node(run, ssh, one, None)
    for r in results:
        if r.failure is not None:
            say(f"{r.spec.name}: cannot fetch its logs: {r.failure.message}")
    if view is not None:
        view.close()
    return ends


def wait_local(run: RunDir, view: LogView, positions: dict[tuple[str, str], int],
               offset: int) -> None:
    """Follow a run another clusterrun process is mirroring (an attached launch): read new
    entries of its arrivals index as they appear."""
    from clusterrun.logs import replay_from

    while True:
        offset = replay_from(run, view, positions, offset)
        view.tick()
        state = run.state
        gone = not state.get("ended_at") and not pid_alive(state.get("controller_pid"))
        if (state.get("ended_at") or gone) and not _growing(run, offset):
            replay_from(run, view, positions, offset)
            view.close()
            return
        time.sleep(0.2)


def _growing(run: RunDir, offset: int) -> bool:
    try:
        return run.file("arrivals").stat().st_size > offset
    except OSError:
        return False
