"""The run journal (clusterrun/runs/journal.py) is the one writer of a run's state.json,
summary.json and events.jsonl: each change writes the state and its event together, an event is
never written twice, and `--notify` hooks hear every event in order, with secrets masked, without
a failing or slow hook changing anything."""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import pytest

from clusterrun.inventory.slots import Quarantine
from clusterrun.runs import notify, store
from clusterrun.runs.journal import Journal, RunRecord, events
from clusterrun.runs.masking import Masks
from clusterrun.runs.records import Event, EventKind
from clusterrun.runs.state import RunState
from clusterrun.runs.summary import Summary
from tests.conftest import REPO, run_cli

RUN_ID = "20260101-000000-train-0001"


def started(tmp_path: Path, heard: list[dict[str, object]] | None = None) -> Journal:
    listeners = (heard.append,) if heard is not None else ()
    return Journal.start(tmp_path, RunRecord(RUN_ID, "train", ("a", "b"), "inv.yaml"),
                         {"run_id": RUN_ID, "name": "train"}, listeners)


def kinds(journal: Journal) -> list[str]:
    return [str(e["event"]) for e in events(journal.run)]


def test_a_run_ends_once_and_every_change_is_one_event(tmp_path: Path) -> None:
    heard: list[dict[str, object]] = []
    journal = started(tmp_path, heard)
    journal.attempt_begun(1, ["a", "b"], {})
    journal.first_line(1, "a", 0, "hello")
    journal.attempt_ended(1, status=3, root={"node": "b", "rank": 1, "code": 3, "detail": "x",
                                             "lost": False})
    journal.attempt_ended(1, status=143, root=None)  # a second end of the attempt: kept as is
    assert journal.finished(RunState.FAILED, status=3,
                            summary=Summary.from_json({"exit_status": 3})) is RunState.FAILED
    # `stop` (or a later `ps`) after the end changes nothing and says nothing.
    assert journal.finished(RunState.STOPPED, status=143) is RunState.FAILED
    assert kinds(journal) == ["started", "attempt_begun", "first_line", "rank_failed",
                              "attempt_ended", "finished"]
    written = events(journal.run)
    assert [e["seq"] for e in written] == [1, 2, 3, 4, 5, 6]
    assert heard == written  # the listeners heard exactly what was written, in order
    state = journal.run.state
    assert (state["state"], state["exit_status"], state["events"]) == ("failed", 3, 6)
    assert state["attempts"][0]["exit_status"] == 3
    assert state["attempts"][0]["root_cause"] == "x"
    assert json.loads(journal.run.file("summary.json").read_text()) == {"exit_status": 3}


def test_a_restart_quarantine_and_a_stall_are_recorded(tmp_path: Path) -> None:
    journal = started(tmp_path)
    journal.attempt_begun(1, ["a", "b"], {})
    journal.attempt_ended(1, status=5, root={"node": "b", "detail": "b was lost", "lost": True})
    journal.host_quarantined(Quarantine("b", "lost", time.time(), 1))
    second = journal.attempt_begun(2, ["a", "c"], {"run_id": RUN_ID, "name": "train"})
    assert second.path == journal.run.path / "attempt-2"
    assert second.state["state"] == "running" and second.plan["name"] == "train"
    assert journal.stalled(2, {"odd": [3]})
    assert not journal.stalled(2, {"odd": [3]})  # one report per stall
    assert journal.run.state["state"] == "stalled"
    assert journal.resumed(2) and not journal.resumed(2)
    journal.attempt_ended(2, status=0, root=None, summary=Summary.from_json({"attempt": 2}),
                          seen=RunState.SUCCEEDED)
    journal.finished(RunState.SUCCEEDED, status=0)
    assert kinds(journal) == ["started", "attempt_begun", "host_lost", "attempt_ended",
                              "host_quarantined", "restarted", "stalled", "resumed",
                              "attempt_ended", "finished"]
    assert second.state["state"] == "succeeded"
    assert json.loads(second.file("summary.json").read_text()) == {"attempt": 2}
    assert [q["host"] for q in journal.quarantined()] == ["b"]
    assert journal.run.state["stall"] == {"odd": [3]}


def test_only_the_journal_writes_a_runs_state_and_summary() -> None:
    """No other module of the controller writes state.json or summary.json (the hosts' own
    state files, written by the shipped programs in remote/, are theirs)."""
    writers = []
    for path in sorted((REPO / "clusterrun").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("clusterrun/remote/") or rel == "clusterrun/runs/journal.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                    ("write_json", "open_private", "write_text", "open")) and any(
                    name in ast.unparse(node) for name in
                    ('"state.json"', '"summary.json"', "EVENTS", '"events.jsonl"')):
                writers.append(f"{rel}:{node.lineno}")
    assert writers == []


def test_secrets_are_masked_in_what_a_hook_hears() -> None:
    event = {"event": "first_line", "line": "HF_TOKEN=hf_abc123 lr=0.1 using s3cr3tvalue",
             "nested": [{"detail": "WANDB_API_KEY: k-999"}]}
    assert notify.masked(event, ("s3cr3tvalue",)) == {
        "event": "first_line", "line": "HF_TOKEN=****** lr=0.1 using ******",
        "nested": [{"detail": "WANDB_API_KEY: ******"}]}


def test_handing_an_event_over_never_waits_for_the_hook(tmp_path: Path) -> None:
    """The hook cannot end before the gate opens, and the gate opens only once both events
    are handed over: a hand-over that waited for the hook would hang here (then be killed
    after notify.TIMEOUT and said)."""
    said: list[str] = []
    out, gate = tmp_path / "heard", tmp_path / "gate"
    hook = notify.Notifier(f"cat >> {out}; until [ -e {gate} ]; do sleep 0.02; done",
                           tmp_path / "notify.log", say=said.append)
    for seq in (1, 2):
        hook({"event": "e", "seq": seq})
    heard = out.read_text().splitlines() if out.exists() else []
    assert [json.loads(line)["seq"] for line in heard] in ([], [1])  # the second waits its turn
    gate.touch()
    hook.close()
    assert [json.loads(line)["seq"] for line in out.read_text().splitlines()] == [1, 2]
    assert said == []


def test_a_failing_or_slow_hook_is_said_once_and_harms_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "TIMEOUT", 1.0)
    said: list[str] = []
    out = tmp_path / "heard"
    hook = notify.Notifier(f"cat >> {out}; sleep 5", tmp_path / "notify.log", say=said.append)
    for seq in (1, 2):
        hook({"event": "e", "seq": seq})
    hook.close()
    assert [json.loads(line)["seq"] for line in out.read_text().splitlines()] == [1, 2]
    assert len(said) == 1 and "ran longer than 1 s and was killed" in said[0], said


def test_launch_notify_hears_the_runs_events_and_a_failing_hook_changes_nothing(
        home: Path, tmp_path: Path) -> None:
    job = tmp_path / "job" / "job.py"
    job.parent.mkdir()
    job.write_text("import os\nprint('hello from', os.environ['RANK'], 'API_TOKEN=tok-777',"
                   " flush=True)\n")
    heard = tmp_path / "heard.jsonl"
    cp = run_cli("launch", "--no-torchrun", "--notify", f"cat >> {heard}; exit 9",
                 "inventories/localhost.yaml", str(job), "--env", "API_TOKEN=tok-777",
                 timeout=120, cwd=REPO)
    assert cp.returncode == 0, cp.stderr  # the hook's own failure is not the run's
    assert len(re.findall("--notify hook exited with 9", cp.stderr)) == 1, cp.stderr
    got = [json.loads(line) for line in heard.read_text().splitlines()]
    run_dir = store.all_runs(home)[0]
    # Every event, once, in the order written (the hook's copy masked).
    assert [(e["seq"], e["event"]) for e in got] == [(e["seq"], e["event"])
                                                     for e in events(run_dir)]
    assert [e["event"] for e in got if e["event"] != "first_line"] == [
        "started", "attempt_begun", "attempt_ended", "finished"]
    firsts = sorted((e["node"], e["rank"]) for e in got if e["event"] == "first_line")
    assert firsts == [("node0", 0), ("node1", 1)]
    assert "tok-777" not in heard.read_text() and "API_TOKEN=******" in heard.read_text()
    assert got[-1]["state"] == "succeeded" and got[-1]["exit_status"] == 0


def test_a_straggler_is_an_event_while_it_is_new(tmp_path: Path) -> None:
    journal = started(tmp_path)
    assert not journal.stragglers(1, [], {"0": 0.3, "1": 0.3})  # an even run: nothing to say
    assert journal.stragglers(1, [2], {"0": 0.7, "1": 0.7, "2": 0.05})
    assert not journal.stragglers(1, [2], {"0": 0.7, "1": 0.7, "2": 0.04})  # the same one
    assert journal.stragglers(1, [], {"0": 0.3, "1": 0.3, "2": 0.3})  # even again
    found = [e for e in events(journal.run) if e["event"] == "straggler"]
    assert [e["ranks"] for e in found] == [[2], []]
    assert found[0]["wait_share"]["2"] == 0.05


# The job of the stall test: each step waits for what the hook has heard, never for a time, so
# a loaded machine makes the test slower, never a different sequence. A wait gives up after a
# minute (the test then fails on the events).
STALLING_JOB = """\
import os, sys, time
heard = sys.argv[1]
def heard_of(event):
    try:
        with open(heard) as handle:
            return '"%s"' % event in handle.read()
    except FileNotFoundError:
        return False
print("rank", os.environ["RANK"], "up", flush=True)
deadline = time.monotonic() + 60
while not heard_of("stalled") and time.monotonic() < deadline:
    time.sleep(0.25)  # quiet and idle: a stall
deadline = time.monotonic() + 60
while not heard_of("resumed") and time.monotonic() < deadline:
    print("moving again", flush=True)  # progress until the recovery is heard: no second stall
    time.sleep(0.5)
"""


@pytest.mark.slow  # waits out a stall (5 s) and a recovery: about 15 s of the fast tier's minute
def test_a_detached_runs_watcher_tells_the_hook_of_its_stall_and_end(home: Path,
                                                                      tmp_path: Path) -> None:
    """`launch --detach --notify`: with no terminal open, the watcher the launch leaves records
    the run's first lines, its stall and its recovery (the hub's), and its end."""
    job = tmp_path / "job" / "job.py"
    job.parent.mkdir()
    job.write_text(STALLING_JOB)
    heard = tmp_path / "heard.jsonl"
    # Stalled after 5 quiet seconds; the ranks move again once the hook has heard the stall,
    # and end once it has heard the recovery.
    cp = run_cli("launch", "--detach", "--no-torchrun", "--stall-timeout", "5", "--notify",
                 f"cat >> {heard}", "inventories/localhost.yaml", str(job), str(heard),
                 timeout=120, cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and '"finished"' not in (
            heard.read_text() if heard.exists() else ""):
        time.sleep(0.5)
    kinds = [json.loads(line)["event"] for line in heard.read_text().splitlines()]
    assert [k for k in kinds if k != "first_line"] == [
        "started", "attempt_begun", "detached", "stalled", "resumed", "attempt_ended",
        "finished"], kinds
    assert kinds.count("first_line") == 2


def test_every_writer_of_a_run_masks_its_secrets_and_no_file_holds_them(tmp_path: Path) -> None:
    """The launch keeps the secrets' masks in the run's folder, so a later writer (the
    watcher of a detached run, `ps`, `stacks --profile`) masks what the job said alike; the
    values themselves are in no file of the run."""
    token = "hf_" + "q7" * 12
    masks = Masks.of_env([("HF_TOKEN", token), ("LR", "0.1"), ("DB_PASS", "abc")])
    journal = Journal.start(tmp_path, RunRecord(RUN_ID, "train", ("a",), "inv.yaml"),
                            {"run_id": RUN_ID}, masks=masks)
    heard: list[dict[str, object]] = []
    later = Journal(journal.run, (heard.append,))  # another process: only the folder
    later.attempt_begun(1, ["a"], {})
    later.first_line(1, "a", 0, f"logged in with {token}; lr 0.1")
    later.stalled(1, {"ranks": [{"last": [f"got {token}x", "abc"]}]})
    later.attempt_ended(1, status=1, root={"node": "a", "rank": 0, "code": 1, "lost": False,
                                           "detail": f"rank 0 said {token}"})
    later.finished(RunState.FAILED, status=1,
                   summary=Summary.from_json({"root_cause": {"detail": token}}))
    first = next(e for e in events(journal.run) if e["event"] == "first_line")
    assert first["line"] == "logged in with ******; lr 0.1"
    assert journal.run.state["stall"] == {"ranks": [{"last": ["got ******x", "abc"]}]}
    assert heard == events(journal.run)[1:]
    for path in journal.run.path.rglob("*"):
        assert token not in path.read_text(), path
    assert "******" in journal.run.file("summary.json").read_text()
    assert journal.run.file("masks.json").stat().st_mode & 0o777 == 0o600


def test_masks_take_the_longest_value_and_leave_short_ones() -> None:
    masks = Masks.of(["secret-long-value", "secret", "ab"])
    assert masks.text("x secret-long-value y secret z ab") == "x ****** y ****** z ab"
    assert masks.text("") == "" and Masks().text("API_KEY: v1") == "API_KEY: ******"


def test_every_end_of_a_run_closes_its_attempt(tmp_path: Path) -> None:
    """A run that ends before its attempt had a summary (its copy or its detached start
    failed) closes the attempt's entry as a run that ran to its end does."""
    journal = started(tmp_path)
    journal.attempt_begun(1, ["a", "b"], {})
    assert journal.ended(1, RunState.FAILED, status=6, reason="copying the code failed") \
        is RunState.FAILED
    assert kinds(journal) == ["started", "attempt_begun", "attempt_ended", "finished"]
    [entry] = journal.attempts()
    assert entry["exit_status"] == 6 and entry["ended_at"] is not None
    assert journal.run.state["reason"] == "copying the code failed"
    assert not journal.run.file("summary.json").exists()


def test_a_run_ends_only_through_the_journals_one_end() -> None:
    """Nothing outside the journal records a run's end but ``Journal.ended``: the attempt
    and the run are closed together (an attempt that another follows ends on its own)."""
    callers = []
    for path in sorted((REPO / "clusterrun").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "clusterrun/runs/journal.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "finished":
                callers.append(f"{rel}:{node.lineno}")
    assert callers == []


def test_the_events_table_in_the_docs_is_the_event_kinds() -> None:
    """docs/observability.md's table of events and EventKind cannot drift: each kind has a
    row, and each row names kinds that exist; the journal writes no kind by a bare string."""
    text = (REPO / "docs" / "observability.md").read_text()
    table = text[text.index("| event | when | fields |"):].split("\n\n", 1)[0]
    documented = [name for row in table.splitlines()[2:]
                  for name in re.findall(r"`(\w+)`", row.split("|")[1])]
    assert sorted(documented) == sorted(k.value for k in EventKind)
    source = (REPO / "clusterrun" / "runs" / "journal.py").read_text()
    assert not re.search(r"\.event\(\s*\"", source)
    assert Event.from_json(Event(EventKind.FIRST_LINE, "r", 3, 1.5, {"line": "x"}).to_json()) \
        == Event(EventKind.FIRST_LINE, "r", 3, 1.5, {"line": "x"})
