"""Settling a run that nobody watches (detached, or its controller was killed): whichever
command looks first (`ps`, `logs`, `stop`) asks the hosts of its current attempt; if every node
has ended, it fetches the rest of that attempt's logs, verifies them against the hosts'
checksums, and records the summary and how the run ended through the run's journal."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Callable, Optional

from clusterrun.logs import follow as following
from clusterrun.logs.mirror import Mirror, verify
from clusterrun.runs import attempts, lifecycle, remote
from clusterrun.runs.journal import Journal
from clusterrun.runs.records import Json, NodeState, PlanRecord
from clusterrun.runs.state import RunState, combine, exit_status
from clusterrun.runs.store import RunDir, now
from clusterrun.runs.summary import SETTLED, NodeSummary, Summary
from clusterrun.transport import SshOptions
from clusterrun.wire import RootCause

Say = Callable[[str], None]


def settle(run: RunDir, ssh: SshOptions, say: Optional[Say] = None,
           journal: Optional[Journal] = None) -> RunState:
    """For a run this machine last saw going, with no controller watching it: its state now,
    recorded as final (with its summaries) once every node has ended. ``journal``: the run's
    journal as the command built it (default: one built here, if anything is recorded)."""
    run = attempts.top(run)  # the run's state and locks live in the run folder
    if not lifecycle.live(run) or lifecycle.watched(run):
        return lifecycle.recorded(run) or RunState.RUNNING
    lock = run.lock_fd("mirror.lock")
    if lock is None:  # another clusterrun process is writing the mirrors right now
        return RunState.RUNNING
    try:
        return _settle(run, attempts.current(run), ssh, say or (lambda _text: None), journal)
    finally:
        os.close(lock)


def _settle(run: RunDir, attempt: RunDir, ssh: SshOptions, say: Say,
            given: Optional[Journal]) -> RunState:
    per_node = remote.status(attempt, ssh)
    # A host that could not be asked (crashed, partitioned, sshd gone) has no state.
    unreachable = [name for name, s in per_node.items() if s.unreachable]
    states = {name: s.run_state for name, s in per_node.items()}
    state = combine(states, unreachable=unreachable)
    if not state.final:
        with _journal(run, given, say) as journal:
            record_stall(journal, attempt.attempt, per_node.values())
        return lifecycle.recorded(run) or state
    root = _root_cause(per_node)
    if root is not None:
        state = RunState.LOST if root.lost else RunState.FAILED
    mirror = Mirror(attempt)
    try:
        following.follow(attempt, ssh, mirror, None, say, keep_following=False)
    finally:
        mirror.close()
    checks = verify(attempt, {name: dict(s.checksums) for name, s in per_node.items()
                              if name not in unreachable})
    status = exit_status(state, root)
    ended = max((s.ended_at or 0.0 for s in per_node.values()), default=0.0) or now()
    summary = _summary(attempt, per_node, unreachable, root=root, status=status, checks=checks)
    with _journal(run, given, say) as journal:
        return journal.ended(attempt.attempt, state, status=status, summary=summary,
                             root=root.public() if root else None, ended_at=ended)


@contextmanager
def _journal(run: RunDir, given: Optional[Journal], say: Say) -> Iterator[Journal]:
    if given is not None:
        yield given
        return
    with Journal.of(run, say) as journal:
        yield journal


def record_stall(journal: Journal, k: int, states: Iterable[NodeState]) -> None:
    """Attempt k is stalled while a host's state says so (the master's supervisor keeps
    its report there: remote/node/stallhub.py), and running again once none does."""
    found = [s.stall or {} for s in states if s.run_state is RunState.STALLED]
    if found:
        journal.stalled(k, dict(found[0]))
    elif lifecycle.recorded(journal.run) is RunState.STALLED:
        journal.resumed(k)


class Stalls:
    """The hosts' run states as `logs -f` hears them change (``follow``'s ``on_state``): a
    detached run's stall is recorded as it comes and goes, with no `ps` needed."""

    def __init__(self, journal: Journal, k: int) -> None:
        self.journal = journal
        self.k = k
        self.states: dict[str, NodeState] = {}
        self._lock = threading.Lock()  # one follower thread per host

    def __call__(self, node: str, state: Json) -> None:
        with self._lock:
            self.states[node] = NodeState.from_json(state)
            record_stall(self.journal, self.k, list(self.states.values()))


def _root_cause(per_node: dict[str, NodeState]) -> Optional[RootCause]:
    """The root cause as the hosts recorded it: the master's supervisor keeps a detached run's
    (first failure in its own arrival order, so no two hosts' clocks are compared)."""
    return next((s.root_cause for s in per_node.values() if s.root_cause is not None), None)


def _summary(run: RunDir, per_node: dict[str, NodeState], unreachable: list[str], *,
             root: Optional[RootCause], status: int, checks: Json) -> Summary:
    """The summary (runs/summary.py) of a run (one attempt's folder) whose controller was not
    there at the end: each node as its host's state file says."""
    plan = PlanRecord.of(run)
    nodes = []
    for name, state in per_node.items():
        node = plan.node(name)
        lost = name in unreachable
        ranks = node.ranks if node is not None else None
        nodes.append(NodeSummary(
            name, node.node_rank if node is not None else None,
            list(ranks) if ranks is not None else None,
            "lost" if lost else state.state, None if lost else state.exit_code,
            state.reason or (state.error if lost else None),
            {str(r): c for r, c in sorted(state.rank_exits.items())}))
    return Summary(run.id, status, None, root, tuple(nodes), checks,
                   settled_by=SETTLED, environment=plan.environment)
