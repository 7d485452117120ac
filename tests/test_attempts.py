"""A restarted run's attempts on this machine: attempt 1 is the run folder, attempt K >= 2 its
attempt-K folder. `logs`, `ps` and `stop` show and reach the right attempt. Run folders are
built by hand as a launch leaves them; no root, no hosts."""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun.console import Printer
from clusterrun.logs import follow
from clusterrun.logs import show as logview
from clusterrun.logs.view import Filter
from clusterrun.remote.shared import layout
from clusterrun.runs import attempts, remote, store
from clusterrun.transport import SshOptions
from tests.conftest import run_main

RUN_ID = "20260301-120000-train-abcd"
FIRST = ["gpu-a", "gpu-b", "gpu-c"]
SECOND = ["gpu-a", "gpu-b", "gpu-e"]  # gpu-c was lost; the spare gpu-e took its place


def write_attempt(folder: Path, hosts: list[str], k: int, *, lines: int = 2,
                  state: Optional[dict[str, Any]] = None) -> None:
    """One attempt's plan, mirrors and arrivals index (one rank per node), as a launch writes
    them."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    plan = {"run_id": RUN_ID, "name": "train", "created": time.time() - 100,
            "nnodes": len(hosts), "world_size": len(hosts),
            "nodes": [{"name": h, "host": f"10.0.{k}.{i + 1}", "node_rank": i, "nproc": 1,
                       "ranks": [i, i], "connection": {},
                       "rundir": f"/tmp/clusterrun/runs/{RUN_ID}/a{k}/{h}"}
                      for i, h in enumerate(hosts)]}
    (folder / "plan.json").write_text(json.dumps(plan))
    for i, host in enumerate(hosts):
        append_lines(folder, host, i, [f"attempt {k} line {n}" for n in range(lines)])
    if state is not None:
        (folder / "state.json").write_text(json.dumps(state))


def append_lines(folder: Path, host: str, rank: int, texts: list[str]) -> None:
    node = folder / "nodes" / host
    node.mkdir(parents=True, exist_ok=True)
    log = node / f"rank-{rank}.log"
    with log.open("ab") as handle:
        handle.write("".join(f"{t}\n" for t in texts).encode())
    with (folder / "arrivals").open("a") as handle:
        handle.write(f"{host}\trank-{rank}.log\t{log.stat().st_size}\n")


def change_state(run: store.RunDir, **fields: Any) -> None:
    """What the launch in another terminal writes into the run's state.json."""
    store.write_json(run.file("state.json"), {**run.state, **fields})


def run_state(k: int, **extra: Any) -> dict[str, Any]:
    started = time.time() - 100
    listed = [{"attempt": 1, "hosts": FIRST, "exit_status": 14,
               "root_cause": "gpu-c lost (no word for 30 s)", "started_at": started,
               "ended_at": started + 40}]
    if k >= 2:
        listed.append({"attempt": 2, "hosts": SECOND, "exit_status": None, "root_cause": None,
                       "started_at": started + 50, "ended_at": None})
    state = {"id": RUN_ID, "name": "train", "state": "running", "started_at": started,
             "attempt": k, "max_restarts": 2, "attempts": listed,
             "quarantined": [{"host": "gpu-c", "reason": "lost (no word for 30 s)",
                              "at": started + 40, "attempt": 1}]}
    return {**state, **extra}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("CLUSTERRUN_HOME", str(path))
    return path


@pytest.fixture
def restarted(home: Path) -> store.RunDir:
    """A finished run of two attempts: attempt 1 on FIRST, attempt 2 on SECOND."""
    run = home / "runs" / RUN_ID
    write_attempt(run, FIRST, 1, state=run_state(2, state="succeeded",
                                                 ended_at=time.time(), exit_status=0))
    write_attempt(run / "attempt-2", SECOND, 2, state={"state": "succeeded"})
    return store.RunDir(run)


def test_attempt_folders_keep_the_run_id(restarted: store.RunDir) -> None:
    second = attempts.attempt_dir(restarted, 2)
    assert second.path == restarted.path / "attempt-2"
    assert (second.id, second.attempt) == (RUN_ID, 2)
    assert (restarted.id, restarted.attempt) == (RUN_ID, 1)
    assert attempts.attempt_dir(restarted, 1) == restarted
    assert attempts.top(second) == restarted
    assert attempts.count(restarted) == 2 and attempts.current(restarted) == second
    assert attempts.most(restarted) == 3


def test_the_hosts_and_this_machine_agree_on_the_layout(restarted: store.RunDir) -> None:
    """A node's rundir on a host and the attempt's folder here name the attempt alike, and a
    host finds the py-spy `stacks` shipped beside the runs from any attempt's rundir."""
    for k in (1, 3):
        rundir = layout.rundir("/srv/work", RUN_ID, k, "gpu-a")
        here = attempts.attempt_dir(restarted, k).path
        assert Path(rundir).parent.relative_to("/srv/work") \
            == here.relative_to(restarted.path.parent.parent)
        assert store.RunDir(Path(rundir).parent).attempt == k
        assert layout.tools_dir(rundir) == "/srv/work/runs/.tools"
    # A run whose own id looks like an attempt's folder is a run.
    assert store.RunDir(restarted.path.parent / "attempt-2").attempt == 1


def test_an_old_run_is_one_attempt(home: Path) -> None:
    run = store.create(home, "20250101-000000-old-0000")
    assert attempts.count(run) == 1 and attempts.current(run) == run
    assert attempts.create_attempt(run, 1) == run
    made = attempts.create_attempt(run, 2)
    assert made.path.is_dir() and (made.path.stat().st_mode & 0o777) == 0o700
    with pytest.raises(FileExistsError):  # an attempt folder is made once
        attempts.create_attempt(run, 2)


def test_logs_show_the_latest_attempt_and_say_so(restarted: store.RunDir,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "logs")
    assert code == 0, err
    assert out.splitlines() == [f"[{h} r{i}] attempt 2 line {n}"
                                for i, h in enumerate(SECOND) for n in range(2)]
    assert f"clusterrun: run {RUN_ID}: attempt 2 of 2 (earlier: --attempt 1)" in err


def test_logs_attempt_one(restarted: store.RunDir, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "logs", RUN_ID, "--attempt", "1")
    assert code == 0, err
    assert out.splitlines() == [f"[{h} r{i}] attempt 1 line {n}"
                                for i, h in enumerate(FIRST) for n in range(2)]
    assert "attempt 2 of 2" not in err


def test_logs_attempt_beyond_the_count(restarted: store.RunDir,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "logs", "--attempt", "3")
    assert code == 2 and out == ""
    assert err.startswith("clusterrun: error: ")
    assert "no attempt 3" in err and "2 attempts (1-2)" in err


def test_node_is_checked_against_the_attempt_shown(restarted: store.RunDir,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_main(capsys, "logs", "--node", "gpu-c")
    assert code == 2 and "no node gpu-c" in err and "gpu-e" in err and "attempt 2" in err
    code, out, err = run_main(capsys, "logs", "--node", "gpu-c", "--attempt", "1")
    assert code == 0, err
    assert out.splitlines() == ["[gpu-c r2] attempt 1 line 0", "[gpu-c r2] attempt 1 line 1"]
    code, _out, err = run_main(capsys, "logs", "--node", "gpu-e", "--attempt", "1")
    assert code == 2 and "no node gpu-e" in err
    code, out, err = run_main(capsys, "logs", "--node", "gpu-e")
    assert code == 0, err
    assert out.splitlines() == ["[gpu-e r2] attempt 2 line 0", "[gpu-e r2] attempt 2 line 1"]


def test_ps_json_carries_attempts_and_quarantine(restarted: store.RunDir,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "ps", "--json", "--local")
    assert code == 0, err
    [row] = json.loads(out)
    assert row["id"] == RUN_ID and row["attempt"] == 2 and row["max_attempts"] == 3
    assert row["hosts"] == SECOND
    assert [a["attempt"] for a in row["attempts"]] == [1, 2]
    assert row["attempts"][0]["root_cause"] == "gpu-c lost (no word for 30 s)"
    assert row["quarantined"] == [{"host": "gpu-c", "reason": "lost (no word for 30 s)",
                                   "at": row["quarantined"][0]["at"], "attempt": 1}]


def test_ps_text_shows_the_attempt_and_quarantined_hosts(
        home: Path, restarted: store.RunDir, capsys: pytest.CaptureFixture[str]) -> None:
    # A second, running run on its second attempt, beside an old run that never restarted.
    running = home / "runs" / "20260301-130000-again-ef01"
    write_attempt(running, FIRST, 1, state=run_state(2, id=running.name, detached=True))
    write_attempt(running / "attempt-2", SECOND, 2)
    old = store.create(home, "20250101-000000-old-0000")
    (old.path / "plan.json").write_text(json.dumps({"name": "old", "created": 1.0,
                                                    "nodes": [{"name": "n1"}]}))
    (old.path / "state.json").write_text(json.dumps({"state": "failed", "started_at": 1.0,
                                                     "ended_at": 2.0, "exit_status": 1}))
    code, out, err = run_main(capsys, "ps", "--local")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "STARTED", "DURATION", "HOSTS"]
    by_id = {line.split()[0]: i for i, line in enumerate(lines) if line.startswith("20")}
    row = lines[by_id[running.name]]
    assert "running (attempt 2/3)" in row and row.endswith("gpu-a,gpu-b,gpu-e")
    assert lines[by_id[running.name] + 1] == \
        "  quarantined: gpu-c (lost (no word for 30 s), attempt 1)"
    assert "succeeded (attempt 2/3)" in lines[by_id[RUN_ID]]
    old_row = lines[by_id[old.id]]
    assert "attempt" not in old_row and old_row.split()[1] == "failed"
    assert by_id[old.id] + 1 == len(lines)  # nothing under a run that never restarted
    # Columns stay aligned when one state is longer than the header.
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
    starts = {m.start() for line in lines[1:] if (m := stamp.search(line))}
    assert starts == {lines[0].index("STARTED")}


def test_the_current_attempts_hosts_are_the_ones_reached(restarted: store.RunDir) -> None:
    specs = remote.host_specs(attempts.current(restarted))
    assert [spec.name for spec, _ in specs] == SECOND
    assert [spec.host for spec, _ in specs] == ["10.0.2.1", "10.0.2.2", "10.0.2.3"]
    assert [node.rundir.rsplit("/", 2)[1] for _, node in specs] == ["a2"] * 3


class _NoLogs:
    """A connection whose hosts have no logs to send (the stop test fetches none)."""

    def run(self, _command: Any) -> Any:
        raise RuntimeError("no log stream in this test")

    def close(self) -> None:
        pass


class _NoLogsPool:
    """The command's connections (runs/remote.py keeps one per host): all without logs."""

    def get(self, _spec: Any) -> _NoLogs:
        return _NoLogs()

    def discard(self, _name: str) -> None:
        pass


def test_stop_reaches_the_current_attempt(home: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = home / "runs" / RUN_ID
    write_attempt(run, FIRST, 1, state=run_state(2, detached=True))
    write_attempt(run / "attempt-2", SECOND, 2, state={"state": "running"})
    asked: list[tuple[str, str, str]] = []

    def call(_transport: Any, spec: Any, program: str, request: dict[str, Any],
             timeout: float) -> dict[str, Any]:
        asked.append((program, spec.name, request["rundir"]))
        if program == "stop.py":
            return {"ev": "stopped", "found": True, "was": "running",
                    "state": {"state": "stopped"}}
        return {"ev": "status", "state": {"state": "stopped", "ended_at": 5.0}}

    monkeypatch.setattr(remote, "_connections", lambda _ssh: _NoLogsPool())
    monkeypatch.setattr(remote, "call", call)
    code, out, err = run_main(capsys, "stop", RUN_ID)
    assert code == 0, err
    stops = sorted((name, rundir) for program, name, rundir in asked if program == "stop.py")
    assert stops == [(h, f"/tmp/clusterrun/runs/{RUN_ID}/a2/{h}") for h in sorted(SECOND)]
    assert {name for program, name, _ in asked if program == "status.py"} == set(SECOND)
    assert f"run {RUN_ID} stopped" in out
    top = store.RunDir(run)
    assert top.state["state"] == "stopped" and top.state["exit_status"] == 143
    # Attempt 2 ended: its own state and summary, and its entry in the run's attempts list.
    second = attempts.attempt_dir(top, 2)
    assert second.state["state"] == "stopped"
    assert [n["name"] for n in json.loads(second.file("summary.json").read_text())["nodes"]] \
        == SECOND
    assert attempts.entries(top)[1]["exit_status"] == 143
    assert attempts.entries(top)[1]["ended_at"] == 5.0
    summary = json.loads(top.file("summary.json").read_text())
    assert summary["run_id"] == RUN_ID and summary["exit_status"] == 143
    assert [a["attempt"] for a in summary["attempts"]] == [1, 2]
    assert summary["quarantined"][0]["host"] == "gpu-c"


class Following:
    """Says when `logs -f` has begun following an attempt folder (logs.follow.wait_local),
    its replay of what was there done: lines appended after that are followed; appended before,
    they would be replayed, and print the same."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *folders: Path) -> None:
        self.events = {folder: threading.Event() for folder in folders}
        real = follow.wait_local

        def wait_local(run: store.RunDir, *args: Any) -> None:
            if run.path in self.events:
                self.events[run.path].set()
            real(run, *args)

        monkeypatch.setattr(follow, "wait_local", wait_local)

    def wait(self, folder: Path) -> None:
        assert self.events[folder].wait(20), f"`logs -f` never followed {folder}"


def test_follow_moves_on_to_the_next_attempt(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`logs -f` on a run a launch in another terminal streams: when it restarts, the new
    attempt's lines follow after a line on stderr that says so."""
    run_path = home / "runs" / RUN_ID
    following = Following(monkeypatch, run_path, run_path / "attempt-2")
    write_attempt(run_path, FIRST, 1, lines=1,
                  state=run_state(1, controller_pid=os.getpid(), detached=False))
    run = store.RunDir(run_path)
    out = io.StringIO()
    said: list[str] = []
    follower = threading.Thread(target=logview.show, daemon=True, kwargs={
        "run": run, "flt": Filter(), "tail": None, "follow": True, "ssh": SshOptions(),
        "printer": Printer(out, color=False), "say": said.append})
    follower.start()
    following.wait(run_path)
    append_lines(run_path, "gpu-a", 0, ["attempt 1 last words"])
    # The launch tears attempt 1 down, then starts attempt 2 on the spare.
    write_attempt(run_path / "attempt-2", SECOND, 2, lines=1)
    change_state(run, **{k: v for k, v in run_state(2).items() if k in ("attempt", "attempts")})
    following.wait(run_path / "attempt-2")
    append_lines(run_path / "attempt-2", "gpu-e", 2, ["attempt 2 more"])
    change_state(run, state="succeeded", ended_at=time.time(), exit_status=0)
    follower.join(20)
    assert not follower.is_alive()
    assert out.getvalue().splitlines() == [
        "[gpu-a r0] attempt 1 line 0", "[gpu-b r1] attempt 1 line 0",
        "[gpu-c r2] attempt 1 line 0", "[gpu-a r0] attempt 1 last words",
        "[gpu-a r0] attempt 2 line 0", "[gpu-b r1] attempt 2 line 0",
        "[gpu-e r2] attempt 2 line 0", "[gpu-e r2] attempt 2 more"]
    assert said == ["attempt 2/3 started: gpu-a, gpu-b, gpu-e "
                    "(attempt 1: gpu-c lost (no word for 30 s))"]
