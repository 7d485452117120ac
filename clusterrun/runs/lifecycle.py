"""Reading a run's state as this machine recorded it (runs.journal is its one writer; a run
nobody watches is settled by logs.settle)."""

from __future__ import annotations

from typing import Optional

from clusterrun.runs import attempts, store
from clusterrun.runs.records import RunStatus
from clusterrun.runs.state import RunState
from clusterrun.runs.store import RunDir

__all__ = ["RunState", "live", "recorded", "watched"]


def recorded(run: RunDir) -> Optional[RunState]:
    """The run's state as this machine recorded it (the run folder's, also when given one of
    its attempts: an attempt ending is not the run ending)."""
    return RunStatus.of(attempts.top(run)).state


def live(run: RunDir) -> bool:
    """True while this machine has not seen the run end."""
    state = recorded(run)
    return state is None or not state.final


def watched(run: RunDir) -> bool:
    """An attached launch is still streaming this run (its controller holds the mirrors)."""
    status = RunStatus.of(attempts.top(run))
    return not status.detached and store.pid_alive(status.controller_pid)
