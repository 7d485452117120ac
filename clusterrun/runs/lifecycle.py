"""Reading a run's state as this machine recorded it (runs.journal is its one writer; a run
nobody watches is settled by logs.settle)."""

from __future__ import annotations

from typing import Optional

from clusterrun.runs import attempts, store
from clusterrun.runs.state import RunState
from clusterrun.runs.store import RunDir

__all__ = ["RunState", "live", "recorded", "watched"]


def recorded(run: RunDir) -> Optional[RunState]:
    """The run's state as this machine recorded it (the run folder's, also when given one of
    its attempts: an attempt ending is not the run ending)."""
    return RunState.parse(attempts.top(run).state.get("state"))


def live(run: RunDir) -> bool:
    """True while this machine has not seen the run end."""
    state = recorded(run)
    return state is None or not state.final


def watched(run: RunDir) -> bool:
    """An attached launch is still streaming this run (its controller holds the mirrors)."""
    state = attempts.top(run).state
    return not state.get("detached") and store.pid_alive(state.get("controller_pid"))
