"""The shapes of `launch --dry-run --json`, `launch --json`, `logs --json` and `stop --json`, as
docs/commands.md's tables give them. No cluster: the launches run on the two local nodes of a
localhost inventory (no SSH, no torch: --no-torchrun), the logs and stops read runs made here."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from clusterrun.cli import cli, failure
from tests.conftest import REPO, run_cli, run_main

LOCALHOST = REPO / "inventories" / "localhost.yaml"
RUN = "20250101-100000-tick-aaaa"
SUMMARY_KEYS = {"event", "ok", "run", "state", "exit_status", "detached", "summary"}
LOG_KEYS = {"node", "rank", "stream", "time", "text"}
HOST_KEYS = {"node", "ok", "found", "was", "state", "error"}
NODE_KEYS = {"name", "host", "local", "node_rank", "nproc", "ranks", "interface", "address",
             "container", "python", "directory", "rundir", "setup", "env", "argv", "command",
             "processes"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("CLUSTERRUN_HOME", str(path))
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """Prints a line on stdout and one on stderr, then exits with $CODE (default 0)."""
    path = tmp_path / "job" / "say.py"
    path.parent.mkdir()
    path.write_text("import os, sys\nprint('hello from', os.environ['RANK'], flush=True)\n"
                    "print('then on stderr', file=sys.stderr, flush=True)\n"
                    "sys.exit(int(os.environ.get('CODE', '0')))\n")
    return path


def lines_of(stdout: str) -> list[dict[str, object]]:
    """Every stdout line through json.loads: nothing else is there."""
    return [json.loads(line) for line in stdout.splitlines()]


def test_dry_run_json_is_the_plan_with_secrets_masked(home: Path, script: Path) -> None:
    cp = run_cli("launch", "--dry-run", "--json", "--no-torchrun", "--env", "HF_TOKEN=hunter22",
                 "--env", "LR=0.1", str(LOCALHOST), str(script), "--epochs", "2",
                 env={"CLUSTERRUN_HOME": str(home)}, timeout=60)
    assert cp.returncode == 0, cp.stderr
    plan = json.loads(cp.stdout)
    assert plan["ok"] is True and plan["dry_run"] is True
    assert (plan["nnodes"], plan["world_size"], plan["args"]) == (2, 2, ["--epochs", "2"])
    assert [n["name"] for n in plan["nodes"]] == ["node0", "node1"]
    for k, node in enumerate(plan["nodes"]):
        assert set(node) == NODE_KEYS
        assert (node["node_rank"], node["ranks"], node["interface"]) == (k, [k, k], "lo")
        assert node["env"]["HF_TOKEN"] == "******" and node["env"]["LR"] == "0.1"
        assert node["env"]["GLOO_SOCKET_IFNAME"] == "lo"
        [process] = node["processes"]  # --no-torchrun: one command per rank
        assert (process["rank"], process["local_rank"]) == (k, 0)
        assert process["argv"][-2:] == ["--epochs", "2"]
    assert "hunter22" not in cp.stdout
    assert not (home / "runs").exists()  # a dry run records nothing


def test_launch_json_is_the_events_then_the_summary(home: Path, script: Path) -> None:
    cp = run_cli("launch", "--json", "--no-torchrun", "--env", "CODE=3", str(LOCALHOST),
                 str(script), env={"CLUSTERRUN_HOME": str(home)}, timeout=120)
    assert cp.returncode == 3, cp.stderr
    lines = lines_of(cp.stdout)
    *events, summary = lines
    assert set(summary) == SUMMARY_KEYS
    assert (summary["event"], summary["ok"], summary["exit_status"], summary["state"]) == \
        ("summary", False, 3, "failed")
    run = str(summary["run"])
    recorded = [json.loads(line) for line in
                (home / "runs" / run / "events.jsonl").read_text().splitlines()]
    assert events == recorded  # the same objects as the run's events.jsonl, in its order
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["started", "attempt_begun"] and kinds[-1] == "finished"
    assert "rank_failed" in kinds
    # The ranks' lines stay in the logs (a first line is in its event).
    assert "then on stderr" not in cp.stdout
    log = (home / "runs" / run / "nodes" / "node0" / "rank-0.log").read_text()
    assert log == "hello from 0\nthen on stderr\n"


def fake_run(home: Path, *, state: str = "succeeded") -> Path:
    """A finished run as a launch leaves it here: node0 has rank 0 and torchrun's own log,
    node1 rank 1 (its arrivals index with times, one older line without)."""
    path = home / "runs" / RUN
    plan = {"run_id": RUN, "name": "tick", "created": time.time() - 60, "nnodes": 2,
            "world_size": 2, "nodes": [{"name": f"node{i}", "host": "localhost", "node_rank": i,
                                        "nproc": 1, "ranks": [i, i], "connection": {}}
                                       for i in range(2)]}
    files = {("node0", "rank-0.log"): b"r0 a\nr0 b\n", ("node1", "rank-1.log"): b"r1 a\n",
             ("node0", "node.log"): b"torchrun says\n"}
    for (node, name), data in files.items():
        (path / "nodes" / node).mkdir(parents=True, exist_ok=True)
        (path / "nodes" / node / name).write_bytes(data)
    (path / "arrivals").write_text("node0\trank-0.log\t5\t1700000000.500\n"
                                   "node1\trank-1.log\t5\n"
                                   "node0\trank-0.log\t10\t1700000002.250\n"
                                   "node0\tnode.log\t14\t1700000003.000\n")
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "state.json").write_text(json.dumps({"id": RUN, "name": "tick", "state": state,
                                                 "started_at": time.time() - 60,
                                                 "ended_at": time.time() - 50}))
    return path


def test_logs_json_is_one_object_per_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fake_run(home)
    os.utime(run / "nodes" / "node1" / "rank-1.log", (1700000001.0, 1700000001.0))
    status, out, err = run_main(capsys, "logs", "--json", RUN)
    assert status == 0, err
    lines = lines_of(out)
    assert all(set(line) == LOG_KEYS for line in lines)
    assert [(x["node"], x["rank"], x["stream"], x["time"], x["text"]) for x in lines] == [
        ("node0", 0, "rank", 1700000000.5, "r0 a"),
        ("node1", 1, "rank", 1700000001.0, "r1 a"),  # no time in the index: the file's
        ("node0", 0, "rank", 1700000002.25, "r0 b"),
        ("node0", None, "node", 1700000003.0, "torchrun says")]
    status, out, _ = run_main(capsys, "logs", "--json", "--tail", "1", "--rank", "0", RUN)
    assert status == 0
    assert [(x["text"], x["time"]) for x in lines_of(out)] == [("r0 b", 1700000002.25)]


def test_logs_json_error_is_the_streams_last_line(home: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    fake_run(home)
    status, out, _ = run_main(capsys, "logs", "--json", "--rank", "7", RUN)
    assert status == 2
    [line] = lines_of(out)
    assert line["ok"] is False and "has no rank 7" in line["error"]["message"]


def test_stop_json_when_nothing_runs_and_when_the_run_ended(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_run(home)
    status, out, _ = run_main(capsys, "stop", "--json")
    assert status == 0
    assert json.loads(out) == {"ok": True, "run": None, "state": None, "hosts": [],
                               "message": "no run is running; nothing to stop"}
    status, out, _ = run_main(capsys, "stop", "--json", RUN)
    assert status == 0
    assert json.loads(out) == {"ok": True, "run": RUN, "state": "succeeded", "hosts": [],
                               "message": f"run {RUN} already succeeded; nothing to stop"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        return int(sock.getsockname()[1])


def running_run(home: Path, port: int, known_hosts: Path) -> None:
    """A detached run this machine records as running, on one node at ``port`` on 127.0.0.2,
    where nothing listens."""
    run = home / "runs" / RUN
    run.mkdir(parents=True)
    node = {"name": "node1", "host": "127.0.0.2", "node_rank": 0, "nproc": 1, "ranks": [0, 0],
            "rundir": "/tmp/clusterrun-nowhere/run",
            "connection": {"port": port, "user": "nobody", "known_hosts": str(known_hosts)}}
    (run / "plan.json").write_text(json.dumps({"run_id": RUN, "name": "tick",
                                               "created": time.time(), "nnodes": 1,
                                               "world_size": 1, "nodes": [node]}))
    (run / "state.json").write_text(json.dumps({"id": RUN, "name": "tick", "state": "running",
                                                "detached": True, "started_at": time.time()}))


def test_stop_json_names_the_host_it_could_not_reach(home: Path, tmp_path: Path) -> None:
    running_run(home, closed_port(), tmp_path / "kh")
    cp = run_cli("stop", "--json", "--connect-timeout", "2", RUN, timeout=60,
                 env={"CLUSTERRUN_HOME": str(home)})
    assert cp.returncode == 4, cp.stderr
    doc = json.loads(cp.stdout)
    assert (doc["ok"], doc["run"], doc["state"]) == (False, RUN, "running")
    [host] = doc["hosts"]
    assert set(host) == HOST_KEYS
    assert (host["node"], host["ok"], host["state"]) == ("node1", False, None)
    assert host["error"] and host["error"] in cp.stderr


@pytest.mark.parametrize(("argv", "as_json", "stream"), [
    (["launch", "--json", "inv.yaml", "train.py"], True, True),
    (["launch", "--dry-run", "--json", "inv.yaml", "train.py"], True, False),
    (["launch", "--name", "x", "--json", "inv.yaml", "train.py"], True, True),
    # The script's own arguments are not launch's options.
    (["launch", "inv.yaml", "train.py", "--json"], False, True),
    (["launch", "--json", "inv.yaml", "train.py", "--dry-run"], True, True),
    (["logs", "--json", "-f"], True, True),
    (["stop", "--json"], True, False),
    (["top", "--once", "--json"], True, False),
])
def test_which_command_lines_want_json_and_a_stream(argv: list[str], as_json: bool,
                                                    stream: bool) -> None:
    assert failure.wants_json(cli, argv) is as_json
    assert failure.is_stream(cli, argv) is stream
