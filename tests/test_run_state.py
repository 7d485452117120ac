"""The one run-state rule (runs.state) and how it is recorded (runs.lifecycle): a run that has
ended keeps the state it ended with, whatever is observed later and in whatever order."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusterrun.errors import ExitStatus, Outcome
from clusterrun.launch.restarts import AttemptResult, next_step
from clusterrun.runs import lifecycle, ps, store
from clusterrun.runs.journal import Journal, RunRecord
from clusterrun.runs.state import RunState, combine, exit_status, from_outcome, merge, result
from clusterrun.runs.summary import Summary
from clusterrun.wire import RootCause

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


STALL_DETAIL = ("node2: stalled, odd one out: rank 3 on node2 (pid 77) in sleep (job.py:3); "
                "last line: 'step 2'")


def test_a_stopped_stall_is_the_stalled_outcome_not_a_rank_that_exits_7() -> None:
    """`--on-stall stop` fails the blamed node with 7 and no rank (remote/node/stallwatch.py): the
    run comes to Outcome.STALLED; a rank that exits 7 is the job's own failure."""
    stall = RootCause("node2", None, 7, STALL_DETAIL)
    rank7 = RootCause("node2", 3, 7, "node2 rank 3 exited with code 7")
    assert stall.stalled and stall.blamed_rank == 3
    assert not rank7.stalled and rank7.blamed_rank is None
    assert result(RunState.FAILED, stall).cause is Outcome.STALLED
    assert result(RunState.FAILED, rank7).cause is Outcome.JOB_FAILED
    assert exit_status(RunState.FAILED, stall) == ExitStatus.STALLED
    # No rank stood out: the master is blamed, no rank.
    master = RootCause("node0", None, 7, "node0: stalled, stall: no rank made progress for 3 s")
    assert master.stalled and master.blamed_rank is None


def test_a_stopped_stall_is_recorded_stalled_with_the_blamed_host_and_rank(
        tmp_path: Path) -> None:
    journal = Journal.start(tmp_path, RunRecord("20260101-000000-x-0000", "x",
                                                ("node0", "node2"), "inv.yaml"), {})
    run = journal.run
    journal.attempt_begun(1, ["node0", "node2"], {})
    stall = RootCause("node2", None, 7, STALL_DETAIL)
    journal.ended(1, RunState.FAILED, status=7, root=stall.public(),
                  summary=Summary.from_json({"exit_status": 7}))
    state = run.state
    blamed = {"node": "node2", "rank": 3}
    assert (state["state"], state["outcome"], state["stalled"]) == ("failed", "stalled", blamed)
    summary = store.read_json(run.file("summary.json"))
    assert (summary["outcome"], summary["stalled"]) == ("stalled", blamed)
    row = next(r for r in ps.ps_rows(tmp_path) if r["id"] == run.id)
    assert (row["outcome"], row["stalled"]) == ("stalled", blamed)
    assert ps.state_text(row) == "stalled (stopped)"


def test_a_stopped_stall_with_a_spare_left_leaves_the_blamed_host_out() -> None:
    plan = SimpleNamespace(attempt=1)
    nodes = (SimpleNamespace(plan=SimpleNamespace(name="node0"), lost=None),
             SimpleNamespace(plan=SimpleNamespace(name="node2"), lost=None))
    stalled = AttemptResult(plan, None, nodes, RootCause("node2", None, 7,  # type: ignore[arg-type]
                                                         STALL_DETAIL))
    step = next_step(stalled, 1, spare=True)
    assert step is not None and step.leave_out == (("node2", "blamed by the stall watchdog"),)
    step = next_step(stalled, 1, spare=False)  # no spare: the same hosts again
    assert step is not None and step.leave_out == ()
    failed = AttemptResult(plan, None, nodes, RootCause("node2", 3, 7, "rank 3"))  # type: ignore[arg-type]
    assert next_step(failed, 1, spare=True).leave_out == ()  # type: ignore[union-attr]


def test_a_stall_stopped_on_a_host_whose_links_fail_leaves_that_host_out() -> None:
    """No rank stood out and node2's links failed the re-test: the stop fails node2 with the
    links' detail ("node2: stalled, its links fail: ..."), and a restart with a spare left
    leaves node2 out, not the master."""
    from clusterrun.remote.shared import linkrule, stallreport

    hosts = ["node0", "node1", "node2"]
    cut = [(o, "node2", "timed out after 5 s") for o in hosts[:2]] + [
        ("node2", o, "timed out after 5 s") for o in hosts[:2]]
    more, links, _ = linkrule.judge(hosts, cut, {"node2": "10.79.0.2"})
    host, detail = stallreport.stop(more, {"odd": [], "links": links})
    assert host == "node2" and detail.startswith("stalled, its links fail: node[0-1] cannot")
    stall = RootCause(host, None, 7, f"{host}: {detail}")  # as the stopped host words it
    assert stall.stalled and stall.blamed_node == "node2" and stall.blamed_rank is None
    plan = SimpleNamespace(attempt=1)
    nodes = tuple(SimpleNamespace(plan=SimpleNamespace(name=h), lost=None) for h in hosts)
    step = next_step(AttemptResult(plan, None, nodes, stall), 1, spare=True)  # type: ignore[arg-type]
    assert step is not None and step.leave_out == (("node2", "blamed by the stall watchdog"),)
    step = next_step(AttemptResult(plan, None, nodes, stall), 1, spare=False)  # type: ignore[arg-type]
    assert step is not None and step.leave_out == ()


def test_a_stopped_stall_where_no_stack_could_be_read_blames_no_host(tmp_path: Path) -> None:
    """No rank's stack could be read: the master ends the run (some host must), but the stall
    is recorded with no host and says what could not be seen, and a restart with a spare left
    keeps the master."""
    from clusterrun.remote.shared import stallreport

    lines, record = stallreport.build(
        [{"rank": 0, "node": "node0", "pid": 5, "error": "no py-spy on this host"},
         {"rank": 1, "node": "node2", "pid": 6, "error": "no py-spy on this host"}], 15)
    assert record["blind"] and stallreport.odd_node(record) is None
    # As the stopping node words its failure (remote/node/stallwatch.py Watch.stop): "<node>:
    # <detail>".
    stall = RootCause("node0", None, 7, f"node0: {stallreport.stop_detail(lines)}")
    assert stall.stalled and stall.blamed_node is None and stall.blamed_rank is None
    assert result(RunState.FAILED, stall).cause is Outcome.STALLED
    journal = Journal.start(tmp_path, RunRecord("20260101-000000-x-0000", "x",
                                                ("node0", "node2"), "inv.yaml"), {})
    journal.attempt_begun(1, ["node0", "node2"], {})
    journal.ended(1, RunState.FAILED, status=7, root=stall.public(),
                  summary=Summary.from_json({"exit_status": 7}))
    blamed = journal.run.state["stalled"]
    assert blamed["node"] is None and blamed["rank"] is None, blamed
    assert blamed["why"] == ("no rank made progress for 15 s; no rank's stack could be read, "
                                "so no rank or host can be named as the cause")
    assert store.read_json(journal.run.file("summary.json"))["stalled"] == blamed
    plan = SimpleNamespace(attempt=1)
    nodes = (SimpleNamespace(plan=SimpleNamespace(name="node0"), lost=None),
             SimpleNamespace(plan=SimpleNamespace(name="node2"), lost=None))
    step = next_step(AttemptResult(plan, None, nodes, stall), 1, spare=True)  # type: ignore[arg-type]
    assert step is not None and step.leave_out == ()
