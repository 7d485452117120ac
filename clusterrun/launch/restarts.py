"""How an attempt ended, and the restart policy: a pure function from that to what comes next.

An attempt that failed on its own (a rank exited non-zero, a host was lost) is followed by
another while `--max-restarts` allows, unless the user interrupted it. The hosts lost during it
are left out of the next one (inventory/slots.py gives their slots to spares); a rank that
failed on a host that still passes the check is the job's failure, so the same hosts run again.
A stall that `--on-stall stop` ended blames one host: a spare, if one is left, takes its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from clusterrun.errors import Result
from clusterrun.launch import outcome
from clusterrun.launch.outcome import NodeOutcome
from clusterrun.plan.model import LaunchPlan
from clusterrun.runs import state as runstate
from clusterrun.runs.state import RunState
from clusterrun.runs.store import RunDir
from clusterrun.wire import RootCause


@dataclass(frozen=True)
class AttemptResult:
    """How one attempt of a watched run ended."""

    plan: LaunchPlan
    folder: RunDir
    nodes: tuple[NodeOutcome, ...]
    root: Optional[RootCause]  # the first failure in time that the teardown did not cause
    interrupted: Optional[int] = None  # the user's signal (Ctrl-C, SIGTERM)

    @classmethod
    def of(cls, plan: LaunchPlan, folder: RunDir, nodes: list[NodeOutcome],
           interrupted: Optional[int]) -> AttemptResult:
        found = outcome.failures(nodes)
        return cls(plan, folder, tuple(nodes), found[0] if found else None, interrupted)

    @property
    def stopped(self) -> bool:
        return any(n.state == "stopped" for n in self.nodes)

    @property
    def state(self) -> RunState:
        return runstate.from_outcome(
            root_lost=None if self.root is None else self.root.lost,
            interrupted=self.interrupted is not None, stopped=self.stopped)

    @property
    def result(self) -> Result:
        return runstate.result(self.state, self.root, self.interrupted)

    @property
    def status(self) -> int:
        return runstate.exit_status(self.state, self.root, self.interrupted)


@dataclass(frozen=True)
class Restart:
    """Start attempt ``attempt`` after leaving out the hosts lost in the last one."""

    attempt: int
    leave_out: tuple[tuple[str, str], ...]  # (host, why)


def next_step(result: AttemptResult, max_restarts: int, *,
              spare: bool = False) -> Optional[Restart]:
    """The next attempt after ``result``, or None: the run ends with it. ``spare``: a spare
    is left to take the place of the host a stopped stall blamed (without one, the same hosts
    run again, as after a rank's failure)."""
    if result.root is None or result.interrupted is not None \
            or result.plan.attempt > max_restarts:
        return None
    lost = tuple((n.plan.name, f"lost ({n.lost})") for n in result.nodes if n.lost is not None)
    root = result.root
    blamed = root.blamed_node if root.stalled else None  # None too: no stack was seen
    if blamed is not None and spare and blamed not in (name for name, _why in lost):
        lost += ((blamed, "blamed by the stall watchdog"),)
    return Restart(result.plan.attempt + 1, lost)
