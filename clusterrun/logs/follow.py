"""Following a run's log files on its hosts by byte offset (`logs -f`, and fetching a finished
detached run's logs), or a run another clusterrun process is mirroring."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from clusterrun import wire
from clusterrun.inventory import HostSpec
from clusterrun.logs.mirror import Mirror, receive
from clusterrun.logs.replay import replay_from
from clusterrun.logs.view import LogView
from clusterrun.remote.shared import nodestate, protocol
from clusterrun.runs import attempts, lifecycle
from clusterrun.runs.records import PlanNode, RunStatus
from clusterrun.runs.remote import each_node
from clusterrun.runs.store import RunDir, pid_alive
from clusterrun.transport import SshOptions, Transport
from clusterrun.transport.programs import park, start


class _Chained(Exception):
    """The end of a chained program's stream (shell.NEXT): not a failure."""


def follow(run: RunDir, ssh: SshOptions, mirror: Mirror, view: Optional[LogView],
           say: Callable[[str], None], *, keep_following: bool = True,
           on_state: Optional[Callable[[str, dict[str, Any]], None]] = None
           ) -> dict[str, dict[str, Any]]:
    """Fetch every node's files from where the mirror ends: what is there now, or with
    ``keep_following`` until each node's run has ended and everything is here. Returns each
    node's final event. ``on_state(node, state)`` hears a node's run state as it changes
    while it is followed (a detached run's hub says when the run stalls)."""
    ends: dict[str, dict[str, Any]] = {}

    def one(transport: Transport, spec: HostSpec, node: PlanNode) -> None:
        # In the interpreter the command's status or stop left there, when there is one, and
        # left for the next program after it (programs.start): one login for the command.
        started = start(transport, spec, "tail.py", {
            "rundir": node.rundir, "follow": keep_following,
            "offsets": mirror.offsets(spec.name)}, chain=True)

        def on_event(raw: dict[str, Any]) -> None:
            if raw.get(protocol.KIND) == protocol.NEXT:  # tail.py has ended; its interpreter waits
                raise _Chained
            event = wire.parse(raw)
            if isinstance(event, wire.End):
                ends[spec.name] = _as_state(event)
            elif isinstance(event, wire.Status) and on_state is not None and event.state:
                on_state(spec.name, event.state)

        try:
            receive(spec.name, started.proc, mirror, on_event,
                    view.feed if view is not None else None)
        except _Chained:
            park(transport, started)
            return
        started.proc.close()

    if view is None:
        results = each_node(run, ssh, one, None)
    else:
        with view.ticking():
            results = each_node(run, ssh, one, None)
    for r in results:
        if r.failure is not None:
            say(f"{r.spec.name}: cannot fetch its logs: {r.failure.message}")
    if view is not None:
        view.close()
    return ends


def _as_state(end: wire.End) -> dict[str, Any]:
    """A node's final event in the shape of its state.json (what `logs` and `ps` read)."""
    return {nodestate.STATE: end.state, nodestate.EXIT_CODE: end.exit_code,
            nodestate.REASON: end.reason, nodestate.CAUSE: end.cause,
            nodestate.RANKS: {str(r): c for r, c in end.ranks.items()},
            nodestate.CHECKSUMS: end.checksums,
            nodestate.ROOT_CAUSE: end.root_cause.public() if end.root_cause else None}


def wait_local(run: RunDir, view: LogView, positions: dict[tuple[str, str], int],
               offset: int) -> None:
    """Follow one attempt of a run another clusterrun process is mirroring (an attached
    launch): read new entries of the attempt's arrivals index as they appear, until the
    attempt is over (the run ended, its launch is gone, or it moved on to a later attempt)."""
    top = attempts.top(run)
    while True:
        offset = replay_from(run, view, positions, offset)
        view.tick()
        status = RunStatus.of(top)
        gone = not status.ended_at and not pid_alive(status.controller_pid)
        # The launch starts attempt K+1 only after attempt K's teardown: it has ended then.
        over = status.ended_at or gone or status.attempt > run.attempt
        if over and not _growing(run, offset):
            replay_from(run, view, positions, offset)
            view.close()
            return
        time.sleep(0.2)


def while_held(run: RunDir, view: LogView, positions: dict[tuple[str, str], int],
               offset: int, take: Callable[[], bool]) -> tuple[bool, int]:
    """Follow one attempt of a run nobody watches while another clusterrun process holds its
    mirror lock (a `ps` or `logs` fetching for a moment, another `logs -f`): show what that
    process mirrors until ``take()`` gets the lock (True) or the run has ended (False), with
    the index offset reached. Whoever holds the lock settles the run when it ends."""
    top = attempts.top(run)
    while True:
        offset = replay_from(run, view, positions, offset)
        view.tick()
        if take():
            return True, offset
        if not lifecycle.live(top) and not _growing(run, offset):
            return False, replay_from(run, view, positions, offset)
        time.sleep(0.2)


def _growing(run: RunDir, offset: int) -> bool:
    try:
        return run.file("arrivals").stat().st_size > offset
    except OSError:
        return False
