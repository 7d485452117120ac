"""A $CLUSTERRUN_HOME that cannot be used, and runs whose plan.json or state.json cannot be read:
one paragraph naming the path and the fix, exit 2, never a traceback, a 1970 date or a claim
to have stopped what was never reached. `stop` without RUN, and a home inside the script's
folder left out of the copy. No cluster: hand-made run folders, and a port on this machine
where nothing listens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from clusterrun.launch import sync
from tests.conftest import run_cli
from tests.other_user import NOBODY

RUN = "20260101-000000-train-0001"
OTHER = "20260101-010000-train-0002"


def paragraph(cp: subprocess.CompletedProcess[str], status: int = 2) -> str:
    """The one `clusterrun: error:` paragraph, the exit status ``status``."""
    assert cp.returncode == status, (cp.returncode, cp.stdout, cp.stderr)
    assert "Traceback" not in cp.stderr, cp.stderr
    errors = [line for line in cp.stderr.splitlines() if line.startswith("clusterrun: error: ")]
    assert len(errors) == 1, cp.stderr
    return " ".join(cp.stderr.split())


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        return int(sock.getsockname()[1])


def make_run(home: Path, run_id: str, *, state: str = "running", created: float | None = None,
             port: int | None = None) -> Path:
    """A detached run as this machine records it, on one node at 127.0.0.2 whose SSH port is
    closed (nothing is ever reached)."""
    created = time.time() if created is None else created
    run = home / "runs" / run_id
    (run / "nodes" / "node1").mkdir(parents=True)
    (run / "nodes" / "node1" / "rank-0.log").write_text("hello\n")
    (run / "arrivals").write_text("node1\trank-0.log\t6\n")
    node = {"name": "node1", "host": "127.0.0.2", "node_rank": 0, "nproc": 1, "ranks": [0, 0],
            "rundir": "/tmp/clusterrun-nowhere/run",
            "connection": {"port": port or closed_port(), "user": "nobody",
                           "known_hosts": str(home.parent / "known_hosts")}}
    (run / "plan.json").write_text(json.dumps({"run_id": run_id, "name": "train",
                                               "created": created, "nnodes": 1,
                                               "world_size": 1, "nodes": [node]}))
    (run / "state.json").write_text(json.dumps({"id": run_id, "name": "train", "state": state,
                                                "detached": True, "started_at": created}))
    return run


def cli_in(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"CLUSTERRUN_HOME": str(home)}, timeout=60, cwd=cwd)


# ------------------------------------------------------------------ $CLUSTERRUN_HOME


def bad_homes(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a-file").write_text("")
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    return {"through a file": tmp_path / "a-file" / "home",
            "a symlink loop": tmp_path / "loop-a" / "home",
            "a 300-character name": tmp_path / ("h" * 300)}


@pytest.mark.parametrize("kind", ["through a file", "a symlink loop", "a 300-character name"])
@pytest.mark.parametrize("command", ["ps", "logs", "stop", "launch"])
def test_a_home_whose_path_cannot_be_used_is_one_paragraph(kind: str, command: str,
                                                           tmp_path: Path) -> None:
    """Each used to end in a traceback from check_home (NotADirectoryError, ELOOP,
    ENAMETOOLONG)."""
    home = bad_homes(tmp_path)[kind]
    (tmp_path / "inv.yaml").write_text("hosts:\n  - host: localhost\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    args = {"ps": ["ps", "--local"], "logs": ["logs"], "stop": ["stop", RUN],
            "launch": ["launch", "inv.yaml", "train.py"]}[command]
    message = paragraph(cli_in(home, *args, cwd=tmp_path))
    assert f"cannot use {tmp_path}" in message and "CLUSTERRUN_HOME" in message
    assert "export CLUSTERRUN_HOME=" in message


def test_a_home_another_user_owns_is_refused_even_when_open(tmp_path: Path) -> None:
    """Its owner could rewrite the runs' plans (their hosts) and the command a run notifies:
    refused, as another user's closed home is."""
    if os.geteuid() == 0:
        home = tmp_path / "theirs"
        (home / "runs").mkdir(parents=True)
        home.chmod(0o777)
        os.chown(home, NOBODY, NOBODY)
        owner = "nobody"
    else:
        home, owner = Path("/tmp"), "root"  # a directory root owns, open to all
    message = paragraph(cli_in(home, "ps", "--local"))
    assert f"cannot use {home}: it belongs to {owner}" in message
    assert "chown" in message and "export CLUSTERRUN_HOME=" in message


def test_a_relative_home_is_the_current_directorys(tmp_path: Path) -> None:
    make_run(tmp_path / "state", RUN, state="succeeded")
    cp = run_cli("ps", "--json", "--local", env={"CLUSTERRUN_HOME": "state"}, cwd=tmp_path,
                 timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert [row["id"] for row in json.loads(cp.stdout)] == [RUN]


# ------------------------------------------------------------------ unreadable runs


BREAKAGES = {  # what is done to the file, and the words that name it
    "not JSON": (lambda p: p.write_text("{\"nodes\": [tru"), "it is not JSON"),
    "missing": (lambda p: p.unlink(), "it is missing"),
    "a list": (lambda p: p.write_text("[]"), "it holds a JSON list, not an object"),
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
@pytest.mark.parametrize("name", ["plan.json", "state.json"])
def test_ps_lists_the_other_runs_and_names_the_unreadable_one(home: Path, name: str,
                                                             breakage: str) -> None:
    """It used to show `unknown` started in 1970 and nothing more."""
    make_run(home, OTHER, state="succeeded")
    broken = make_run(home, RUN, state="succeeded", created=time.time() - 60)
    break_it, words = BREAKAGES[breakage]
    break_it(broken / name)
    cp = cli_in(home, "ps", "--local")
    assert cp.returncode == 0, cp.stderr
    assert "1970" not in cp.stdout and "Traceback" not in cp.stderr
    rows = {line.split()[0]: line for line in cp.stdout.splitlines()[1:] if line[:1] != " "}
    assert set(rows) == {RUN, OTHER}
    assert "succeeded" in rows[OTHER] and "unreadable" in rows[RUN]
    assert f"run {RUN}: its {name} cannot be read: {words}" in cp.stdout
    listed = {row["id"]: row for row in json.loads(cli_in(home, "ps", "--json", "--local").stdout)}
    assert listed[OTHER]["problem"] is None and listed[RUN]["started_at"] is None
    assert listed[RUN]["problem"].startswith(f"its {name} cannot be read: {words}")


@pytest.mark.parametrize("name", ["plan.json", "state.json"])
@pytest.mark.parametrize("command", [["logs"], ["stop"], ["stacks"], ["top", "--once"]])
def test_a_run_that_cannot_be_read_is_named_with_exit_2(home: Path, name: str,
                                                        command: list[str]) -> None:
    """`logs` printed nothing with exit 0; `stop` said "run ... stopped", exit 0, and wrote a
    state.json; now each names the file and contacts nothing."""
    run = make_run(home, RUN)
    (run / name).write_text("{not json")
    message = paragraph(cli_in(home, *command, RUN))
    assert f"run {RUN}: its {name} cannot be read: it is not JSON" in message
    assert str(run) in message
    assert (run / name).read_text() == "{not json"  # nothing written over it


def test_stop_of_a_plan_without_hosts_claims_nothing(home: Path) -> None:
    run = make_run(home, RUN)
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps({**plan, "nodes": []}))
    message = paragraph(cli_in(home, "stop", RUN))
    assert "names no hosts" in message and "stopped." in message
    assert "stopped" not in cli_in(home, "stop", RUN).stdout
    assert json.loads((run / "state.json").read_text())["state"] == "running"


def test_stop_that_reaches_no_host_says_so_and_exits_4(home: Path) -> None:
    run = make_run(home, RUN)
    cp = cli_in(home, "stop", "--connect-timeout", "2", RUN)
    assert cp.returncode == 4, cp.stdout + cp.stderr
    assert f"run {RUN}: NOT stopped on node1" in cp.stderr
    assert "stopped" not in cp.stdout.replace("NOT stopped", "")
    assert json.loads((run / "state.json").read_text())["state"] == "running"


# ------------------------------------------------------------------ stop without RUN


def test_stop_without_run_and_none_running_says_so(home: Path) -> None:
    make_run(home, RUN, state="succeeded")
    cp = cli_in(home, "stop")
    assert cp.returncode == 0, cp.stderr
    assert "no run is running; nothing to stop" in cp.stdout


def test_stop_without_run_lists_several_running_and_exits_2(home: Path) -> None:
    make_run(home, RUN, created=time.time() - 60)
    make_run(home, OTHER)
    make_run(home, "20260101-020000-done-0003", state="failed")
    message = paragraph(cli_in(home, "stop"))
    assert "2 runs are running" in message and RUN in message and OTHER in message
    assert "0003" not in message and "clusterrun stop RUN" in message


def test_stop_without_run_stops_the_only_running_one(home: Path) -> None:
    """The one run still running is the one stopped (its host refuses: exit 4, named)."""
    make_run(home, RUN, state="succeeded", created=time.time() - 60)
    make_run(home, OTHER)
    cp = cli_in(home, "stop", "--connect-timeout", "2")
    assert cp.returncode == 4, cp.stdout + cp.stderr
    assert f"stopping run {OTHER}, the only one running" in cp.stderr
    assert f"run {OTHER}: NOT stopped on node1" in cp.stderr


# ------------------------------------------------------------------ the copy


@pytest.mark.parametrize("inside", [".clusterrun", "out/state"])
def test_a_home_inside_the_scripts_folder_is_left_out_of_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: str) -> None:
    src = tmp_path / "job"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "data" / "x.txt").write_text("x\n")
    make_run(src / inside, RUN, state="succeeded")
    monkeypatch.setenv("CLUSTERRUN_HOME", str(src / inside))
    copied: dict[str, Any] = sync.manifest(src, sync.patterns(src, ()))
    assert sorted(copied) == ["data/x.txt", "train.py"]
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "elsewhere"))
    assert sync.home_excludes(src) == ()
