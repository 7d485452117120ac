"""A run's state.json as a type (clusterrun/runs/records.py ``RunStatus``): what the journal
writes reads back as the same file, keys in their places and keys it does not name kept, so the
shape docs/observability.md describes does not move when the writer goes through the type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterrun.inventory.slots import Quarantine
from clusterrun.runs import store
from clusterrun.runs.journal import Journal, RunRecord
from clusterrun.runs.records import AttemptRecord, NodeState, PlanNode, PlanRecord, RunStatus
from clusterrun.runs.state import RunState
from clusterrun.runs.summary import KEYS, NodeSummary, Summary
from clusterrun.wire import RootCause

RUN_ID = "20260101-000000-train-0001"


def text(status: RunStatus) -> str:
    return json.dumps(status.to_json(), indent=2) + "\n"  # as store.write_json writes it


def test_a_state_the_journal_wrote_reads_back_as_the_same_file(tmp_path: Path) -> None:
    journal = Journal.start(tmp_path, RunRecord(RUN_ID, "train", ("a", "b"), "inv.yaml",
                                                detached=True, max_restarts=1),
                            {"run_id": RUN_ID, "name": "train"})
    journal.attempt_begun(1, ["a", "b"], {"name": "train"})
    journal.host_quarantined(Quarantine("b", "lost (no word for 30 s)", 5.0, 1))
    journal.attempt_ended(1, status=1, root={"node": "b", "rank": None, "code": None,
                                             "detail": "b lost", "lost": True})
    second = journal.attempt_begun(2, ["a", "c"], {"name": "train"})
    assert journal.stalled(2, {"odd": [3]}) and journal.resumed(2)
    assert journal.stragglers(2, [1], {"0": 0.5, "1": 0.01})
    journal.ended(2, RunState.SUCCEEDED, status=0, summary=Summary.from_json({"exit_status": 0}))
    for folder in (journal.run, second):
        status = RunStatus.of(folder)
        assert text(status) == folder.file("state.json").read_text()
    # The keys in the order the journal has always written them.
    assert list(json.loads(journal.run.file("state.json").read_text())) == [
        "id", "name", "hosts", "inventory", "detached", "controller_pid", "max_restarts",
        "notify", "started_at", "state", "attempts", "quarantined", "events", "attempt", "stall",
        "stragglers", "exit_status", "ended_at"]
    assert list(json.loads(second.file("state.json").read_text())) == [
        "id", "name", "state", "attempt", "started_at", "hosts", "inventory", "exit_status",
        "ended_at"]
    status = RunStatus.of(journal.run)
    assert (status.id, status.hosts, status.state, status.attempt) \
        == (RUN_ID, ("a", "b"), RunState.SUCCEEDED, 2)
    assert [(a.attempt, a.exit_status, a.root_cause) for a in status.attempts] \
        == [(1, 1, "b lost"), (2, 0, None)]
    assert status.stall == {"odd": [3]} and status.stragglers == (1,)
    assert status.events == len(journal.run.file("events.jsonl").read_text().splitlines())
    assert [q["host"] for q in status.quarantined] == ["b"]


def test_a_change_keeps_each_key_in_its_place_and_keys_it_does_not_name() -> None:
    read = RunStatus.from_json({"state": "running", "from_a_newer_version": [1], "attempt": 2})
    changed = read.with_(state="failed", exit_status=3, attempt=1)
    assert list(changed.to_json()) == ["state", "from_a_newer_version", "attempt", "exit_status"]
    assert changed.to_json()["attempt"] == 1  # set, although 1 is what an absent key means
    assert (changed.state, changed.exit_status, changed.attempt) == (RunState.FAILED, 3, 1)
    assert read.state is RunState.RUNNING  # a change is a new status


def test_a_status_made_here_writes_what_it_says() -> None:
    made = RunStatus(id=RUN_ID, state=RunState.RUNNING, hosts=("a",), attempt=2,
                     attempts=(AttemptRecord(2, ("a",), 7.0),))
    assert made.to_json() == {"id": RUN_ID, "hosts": ["a"], "state": "running", "attempt": 2,
                              "attempts": [{"attempt": 2, "hosts": ["a"], "started_at": 7.0,
                                            "exit_status": None, "root_cause": None,
                                            "ended_at": None}]}
    assert RunStatus.from_json(made.to_json()) == made
    assert RunStatus.from_json(None) == RunStatus() and RunStatus().to_json() == {}
    run = store.RunDir(Path("/nonexistent") / "runs" / RUN_ID)
    assert RunStatus.of(run) == RunStatus()


def test_a_hosts_state_as_status_py_answers_it() -> None:
    node = NodeState.from_json({
        "state": "failed", "exit_code": 1, "reason": "rank 3 exited with 1",
        "ranks": {"2": 0, "3": 1}, "ended_at": 12, "checksums": {"node.log": [3, "ab"]},
        "root_cause": {"node": "gpu-b", "rank": 3, "code": 1, "detail": "gpu-b: rank 3"},
        "supervisor_pid": 77})
    assert (node.run_state, node.exit_code, node.ended_at) == (RunState.FAILED, 1, 12.0)
    assert node.rank_exits == {"2": 0, "3": 1} and node.checksums == {"node.log": [3, "ab"]}
    assert node.root_cause is not None and (node.root_cause.node, node.root_cause.rank) \
        == ("gpu-b", 3)
    assert not node.unreachable and node.stall is None
    stalled = NodeState.from_json({"state": "stalled", "stall": {"lines": ["x"]}})
    assert stalled.run_state is RunState.STALLED and stalled.stall == {"lines": ["x"]}
    assert NodeState.from_json({"state": "missing"}).run_state is None
    assert NodeState.from_json(None) == NodeState()


def test_a_summary_names_every_key_and_the_journal_writes_them_in_their_order(
        tmp_path: Path) -> None:
    """summary.json as the journal writes it at the end of a restarted run that a stopped
    stall ended, with an `environment:` lock: the attempt's keys, then what the launch and
    the journal add, always in this order (docs/observability.md, docs/restarts.md,
    docs/troubleshooting.md and docs/environments.md name them); read back, the same file."""
    journal = Journal.start(tmp_path, RunRecord(RUN_ID, "train", ("a", "b"), "inv.yaml",
                                                max_restarts=1), {"run_id": RUN_ID})
    journal.attempt_begun(1, ["a", "b"], {})
    journal.attempt_ended(1, status=1, root=None)
    journal.host_quarantined(Quarantine("b", "lost (no word for 30 s)", 5.0, 1))
    second = journal.attempt_begun(2, ["a", "c"], {"name": "train"})
    assert journal.stalled(2, {"odd": [3]})
    stall = RootCause("c", None, 7, "c: stalled, stall: odd one out: rank 3 on c")
    attempt = Summary(RUN_ID, 7, None, stall,
                      (NodeSummary("a", 0, [0, 1], "stopped", 143, None, {"0": 143}),),
                      {"files": 2, "identical": 2, "differ": []}).with_(environment="e3b0c442")
    journal.ended(2, RunState.FAILED, status=7, root=stall.public(), summary=attempt)
    written = json.loads(journal.run.file("summary.json").read_text())
    assert list(written) == [
        "run_id", "exit_status", "interrupted", "root_cause", "nodes", "logs", "nccl",
        "settled_by", "environment", "outcome", "stalled", "attempt", "attempts", "quarantined",
        "stall"]
    assert list(written) == list(KEYS)  # a key the type names and never writes fails here
    assert list(json.loads(second.file("summary.json").read_text())) == [
        "run_id", "exit_status", "interrupted", "root_cause", "nodes", "logs", "nccl",
        "settled_by", "environment", "outcome", "stalled"]
    assert list(written["nodes"][0]) == ["name", "node_rank", "ranks", "state", "exit_code",
                                         "signal", "reason", "outcome", "rank_exits"]
    summary = Summary.of(journal.run)
    assert summary is not None
    assert json.dumps(summary.to_json(), indent=2) + "\n" \
        == journal.run.file("summary.json").read_text()
    assert (summary.environment, summary.outcome, summary.attempt) == ("e3b0c442", "stalled", 2)
    assert summary.stalled == {"node": "c", "rank": 3} and summary.stall == {"odd": [3]}
    assert [a.attempt for a in summary.attempts or ()] == [1, 2]
    assert [q["host"] for q in summary.quarantined or ()] == ["b"]
    assert summary.root_cause is not None and summary.root_cause.node == "c"
    # A summary made here, read back, is the same summary.
    assert Summary.from_json(attempt.to_json()) == attempt
    with pytest.raises(TypeError, match="no key environ"):
        attempt.with_(environ="x")


def test_a_plan_reads_as_the_fields_its_readers_use(tmp_path: Path) -> None:
    run = store.RunDir(tmp_path / RUN_ID)
    run.path.mkdir()
    store.write_json(run.file("plan.json"), {
        "run_id": RUN_ID, "name": "train", "created": 12.5, "world_size": 4,
        "environment": "e3b0c442", "nodes": [
            {"name": "a", "host": "10.0.0.1", "node_rank": 0, "ranks": [0, 1],
             "address": "192.168.0.1", "rundir": "/w/runs/x/a", "python": "/w/envs/1/bin/python",
             "interface": "eth1", "cwd": "/w/code/job-1"},
            {"name": "b", "host": "10.0.0.2", "node_rank": 1, "ranks": [2, 3]},
            {"host": "nameless"}]})
    plan = PlanRecord.of(run)
    assert (plan.name, plan.created, plan.world_size, plan.environment) \
        == ("train", 12.5, 4, "e3b0c442")
    assert plan.node_names == {"a", "b"}
    assert plan.node("a") == PlanNode("a", "10.0.0.1", 0, (0, 1), "192.168.0.1", "/w/runs/x/a",
                                      "/w/envs/1/bin/python", "eth1", "/w/code/job-1")
    b = plan.node("b")
    assert b is not None and (b.address, b.ranks) == (None, (2, 3)) and plan.node("c") is None
    assert (b.rundir, b.python, b.interface, b.cwd) == ("", None, None, "")
    assert PlanRecord.of(store.RunDir(tmp_path / "none")) == PlanRecord()
    assert b.holds(2) and b.holds(3) and not b.holds(1) and not b.holds(4)


def test_a_settled_summary_records_the_environment_the_plan_ran(tmp_path: Path) -> None:
    """A run nobody watched to its end is settled later (`ps`, `logs`): its summary still says
    which `environment:` lock the hosts ran, as the launch's own does."""
    from clusterrun.logs import settle

    run = store.RunDir(tmp_path / RUN_ID)
    run.path.mkdir()
    store.write_json(run.file("plan.json"), {"run_id": RUN_ID, "environment": "e3b0c442",
                                            "nodes": [{"name": "a", "ranks": [0, 1]}]})
    summary = settle._summary(run, {"a": NodeState.from_json({"state": "succeeded",
                                                              "exit_code": 0})},
                              [], root=None, status=0, checks={})
    assert summary.to_json()["environment"] == "e3b0c442"
