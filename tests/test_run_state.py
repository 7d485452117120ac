"""The one run-state rule (runs.state) and how it is recorded (runs.lifecycle): a run that has
ended keeps the state it ended with, whatever is observed later and in whatever order."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from clusterrun.runs import lifecycle, store
from clusterrun.runs.journal import Journal
from clusterrun.runs.state import RunState, combine, from_outcome, merge

FINAL = [s for s in RunState if s.final]


@pytest.mark.parametrize("first", FINAL)
@pytest.mark.parametrize("later", list(RunState))
def test_an_ended_run_is_never_overwritten(first: RunState, later: RunState) -> None:
    assert merge(first, later) is first


@pytest.mark.parametrize("seen", list(RunState))
def test_a_running_run_takes_whatever_is_seen(seen: RunState) -> None:
    assert merge(None, seen) is seen
    assert merge(RunState.RUNNING, seen) is seen


def test_every_order_of_observations_ends_in_the_first_final_one() -> None:
    for order in itertools.permutations(list(RunState)):
        state = None
        for seen in order:
            state = merge(state, seen)
        assert state is next(s for s in order if s.final)


def test_nodes_combine_worst_first_and_running_while_any_goes_on() -> None:
    S = RunState
    assert combine({"a": S.SUCCEEDED, "b": S.SUCCEEDED}) is S.SUCCEEDED
    assert combine({"a": S.FAILED, "b": S.STOPPED}) is S.FAILED
    assert combine({"a": S.STOPPED, "b": S.LOST}) is S.LOST
    assert combine({"a": S.FAILED, "b": S.RUNNING}) is S.RUNNING
    assert combine({"a": S.SUCCEEDED, "b": None}) is S.RUNNING  # its state is unknown yet
    # A host that cannot be asked is lost once every other host has ended (a crashed host)...
    assert combine({"a": S.STOPPED, "b": None}, unreachable=["b"]) is S.LOST
    # ... but says nothing while the others are still going.
    assert combine({"a": S.RUNNING, "b": None}, unreachable=["b"]) is S.RUNNING


def test_a_watched_run_ends_as_its_outcome_says() -> None:
    assert from_outcome(root_lost=None, interrupted=False, stopped=False) is RunState.SUCCEEDED
    assert from_outcome(root_lost=False, interrupted=False, stopped=True) is RunState.FAILED
    assert from_outcome(root_lost=True, interrupted=False, stopped=True) is RunState.LOST
    assert from_outcome(root_lost=None, interrupted=False, stopped=True) is RunState.STOPPED
    # Ctrl-C is a stop, as its exit status 130 says, whatever failed meanwhile.
    assert from_outcome(root_lost=False, interrupted=True, stopped=True) is RunState.STOPPED


def test_recording_keeps_the_first_end_and_its_fields(tmp_path: Path) -> None:
    run = store.create(tmp_path, "20260101-000000-x-0000")
    assert lifecycle.live(run)
    journal = Journal(run)
    assert journal.finished(RunState.FAILED, status=3, ended_at=10.0) is RunState.FAILED
    # `stop` (or a later ps) after the end changes nothing.
    assert journal.finished(RunState.STOPPED, status=143, ended_at=20.0) is RunState.FAILED
    state = run.state
    assert (state["state"], state["exit_status"], state["ended_at"]) == ("failed", 3, 10.0)
    assert not lifecycle.live(run)


def test_every_state_written_is_one_the_rule_knows() -> None:
    # Nothing writes "starting" or "stopping" any more: the five states are the whole rule.
    # `stalled` is a running run that made no progress for the stall timeout: not an end.
    assert {s.value for s in RunState} == {"running", "stalled", "succeeded", "failed",
                                           "stopped", "lost"}
    assert not RunState.STALLED.final
    assert RunState.parse("starting") is None
