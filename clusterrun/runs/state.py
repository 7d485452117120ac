"""The one rule for a run's state, used by `launch`, `ps`, `logs` and `stop`.

A run is ``running`` until it ends as ``succeeded``, ``failed``, ``stopped`` or ``lost``. Once a
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


class RunState(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def final(self) -> bool:
        return self is not RunState.RUNNING

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
