"""The one rule for a run's state, used by `launch`, `ps`, `logs` and `stop`.

A run is ``running`` (or ``stalled``: going, but no rank has made progress for the stall timeout,
until it moves again) until it ends as ``succeeded``, ``failed``, ``stopped`` or ``lost``. Once a
run has ended, its state never changes again: whoever saw the end first recorded the truth at
the time (a later `stop` of a failed run does not make it "stopped", a host that answers again
does not make a lost run "running"). A run's state from its nodes' states: while any node is
still going it is running; after that the worst outcome wins, failed > lost > stopped >
succeeded, unless the run's recorded root cause says which it was.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Optional

from clusterrun import errors
from clusterrun.errors import Outcome, Result
from clusterrun.wire import RootCause


class RunState(str, enum.Enum):
    RUNNING = "running"
    STALLED = "stalled"  # still going: no rank has made progress for the stall timeout
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def final(self) -> bool:
        return self not in (RunState.RUNNING, RunState.STALLED)

    @classmethod
    def parse(cls, value: object) -> Optional[RunState]:
        """A state as stored in a state file (ours or a host's); None for anything else."""
        try:
            return cls(value)
        except ValueError:
            return None


# Worst first: the outcome that explains a run best when its nodes disagree.
_SEVERITY = (RunState.FAILED, RunState.LOST, RunState.STOPPED, RunState.SUCCEEDED)


def merge(recorded: Optional[RunState], seen: RunState) -> RunState:
    """The state to record when ``seen`` is observed for a run recorded as ``recorded``."""
    if recorded is not None and recorded.final:
        return recorded
    return seen


def combine(nodes: Mapping[str, Optional[RunState]], *,
            unreachable: Iterable[str] = ()) -> RunState:
    """The run's state from its nodes'. A node whose state is None is not known to have ended
    (still going, or its state file could not be read). Nodes in ``unreachable`` could not be
    asked: if every node that answered has ended, they count as lost (a crashed host, a
    partition), else the run may still be going."""
    gone = set(unreachable)
    answered = {name: state for name, state in nodes.items() if name not in gone}
    if any(state is None or not state.final for state in answered.values()):
        return RunState.RUNNING
    states = set(answered.values())
    if gone:
        states.add(RunState.LOST)
    for state in _SEVERITY:
        if state in states:
            return state
    return RunState.RUNNING  # no nodes at all: nothing has ended


def from_outcome(*, root_lost: Optional[bool], interrupted: bool, stopped: bool) -> RunState:
    """The state of a run its controller watched to the end. ``root_lost``: the root cause was
    a lost node (True), a failed rank (False), or there was none (None). A run the user
    interrupted is stopped, as its exit status (130/143) says."""
    if interrupted:
        return RunState.STOPPED
    if root_lost is not None:
        return RunState.LOST if root_lost else RunState.FAILED
    return RunState.STOPPED if stopped else RunState.SUCCEEDED


def result(state: RunState, root: Optional[RootCause],
           interrupted: Optional[int] = None) -> Result:
    """What a run that ended as ``state`` comes to: the user's signal, else its root cause (a
    rank's own status, or a lost node), else its state. A failed run with no recorded root
    cause (its hosts kept none) is a job failure without a status of its own: 1."""
    cause: Optional[Outcome]
    if root is not None:
        cause = (Outcome.NODE_LOST if root.lost else Outcome.STALLED if root.stalled
                 else Outcome.JOB_FAILED)
    else:
        cause = {RunState.LOST: Outcome.NODE_LOST,
                 RunState.FAILED: Outcome.JOB_FAILED}.get(state)
    return Result(interrupted=interrupted, cause=cause, code=(root.code if root else None) or 0,
                  stopped=state is RunState.STOPPED)


def exit_status(state: RunState, root: Optional[RootCause],
                interrupted: Optional[int] = None) -> int:
    """The exit status of a run that ended as ``state`` (recorded in its state and summary)."""
    return errors.exit_status(result(state, root, interrupted))
