"""What a new user types wrong, and what clusterrun says: one `clusterrun: error:` paragraph
with the fix and exit 2, never a traceback or click's own format. No root and no cluster needed
(as root, the unusable-$CLUSTERRUN_HOME cases run the command as `nobody`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.other_user import NOBODY, OtherUser


def error_of(cp: subprocess.CompletedProcess[str]) -> str:
    """The one-paragraph error: exit 2, nothing but `clusterrun: error: ...` on stderr."""
    assert cp.returncode == 2, (cp.returncode, cp.stdout, cp.stderr)
    assert cp.stderr.startswith("clusterrun: error: "), cp.stderr
    assert "Traceback" not in cp.stderr and "Usage:" not in cp.stderr, cp.stderr
    return " ".join(cp.stderr.split())


@pytest.fixture
def job(shared: Path) -> tuple[Path, Path]:
    """A local two-node inventory and a script, readable by anyone."""
    inv = shared / "inv.yaml"
    inv.write_text("hosts:\n  - host: localhost\n    name: node0\n"
                   "  - host: localhost\n    name: node1\n")
    script = shared / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    for path in (inv, script.parent, script):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return inv, script


def as_other_user(other_user: OtherUser, *args: str, home: Path
                  ) -> subprocess.CompletedProcess[str]:
    """The real CLI as a user who is not this directory's owner (as root: `nobody`)."""
    return other_user.run(*args, home=str(home.parent), env={"CLUSTERRUN_HOME": str(home)},
                          timeout=60)


def _unusable_home(shared: Path, kind: str) -> Path:
    home = shared / kind
    (home / "runs").mkdir(parents=True)
    if kind == "mode-000":
        if os.geteuid() == 0:
            os.chown(home, NOBODY, NOBODY)
        home.chmod(0)
    else:  # another user's: root's, 0700
        home.chmod(0o700)
    return home


# Root ignores modes, so as root the command runs as `nobody`; only root can make a directory
# that belongs to another user.
KINDS = ["mode-000", "another-users"] if os.geteuid() == 0 else ["mode-000"]


@pytest.mark.parametrize("command", ["ps", "logs", "stop", "launch", "check-smoke"])
def test_unusable_home_is_one_paragraph_with_the_fix(
        command: str, shared: Path, job: tuple[Path, Path], other_user: OtherUser) -> None:
    """`ps`, `logs`, `stop` and `launch` used to end in a PermissionError traceback (and
    `check --smoke` after checking every host)."""
    inv, script = job
    args = {"ps": ["ps", "--local"], "logs": ["logs"], "stop": ["stop", "tick"],
            "launch": ["launch", str(inv), str(script)],
            "check-smoke": ["check", "--smoke", str(inv)]}[command]
    for kind in KINDS:
        home = _unusable_home(shared, kind)
        message = error_of(as_other_user(other_user, *args, home=home))
        assert str(home) in message, kind
        assert "CLUSTERRUN_HOME" in message and "export CLUSTERRUN_HOME=" in message, kind


def test_a_closed_run_directory_inside_a_usable_home(shared: Path,
                                                      other_user: OtherUser) -> None:
    home = shared / "home"
    run = fake_run(home, "20250101-100000-tick-aaaa", "tick", time.time())
    if os.geteuid() == 0:
        for path in (home, home / "runs"):
            os.chown(path, NOBODY, NOBODY)
    run.chmod(0)
    message = error_of(as_other_user(other_user, "ps", "--local", home=home))
    assert str(run) in message and "CLUSTERRUN_HOME" in message


# ------------------------------------------------------------------ options


@pytest.mark.parametrize(("args", "words"), [
    (["--dryrun", "{inv}", "{script}"], ["unknown option --dryrun", "--dry-run"]),
    (["--exclude_files", "x", "{inv}", "{script}"],
     ["unknown option --exclude_files", "--exclude-files"]),
    (["--exclude_files=x", "{inv}", "{script}"],
     ["unknown option --exclude_files", "--exclude-files"]),
    (["{inv}", "--dry-run", "{script}"], ["--dry-run", "after INVENTORY"]),
    (["{inv}", "--dryrun", "{script}"], ["unknown option --dryrun", "--dry-run"]),
], ids=["typo", "underscores", "underscores-equals", "after-inventory",
        "typo-after-inventory"])
def test_mistyped_or_misplaced_launch_options(args: list[str], words: list[str],
                                              job: tuple[Path, Path]) -> None:
    """They used to be taken as the inventory or script path ("no such inventory file")."""
    inv, script = job
    argv = [a.format(inv=inv, script=script) for a in args]
    message = error_of(run_cli("launch", *argv, timeout=30))
    for word in [*words, "options go before INVENTORY"]:
        assert word in message, (word, message)
    assert "no such" not in message


def test_unknown_option_of_other_commands(job: tuple[Path, Path]) -> None:
    inv, _ = job
    message = error_of(run_cli("check", "--jsn", str(inv), timeout=30))
    assert "unknown option --jsn" in message and "--json" in message
    message = error_of(run_cli("logs", "--tial", "3", timeout=30))
    assert "unknown option --tial" in message and "--tail" in message


def test_directories_and_unreadable_files(job: tuple[Path, Path], shared: Path,
                                          other_user: OtherUser) -> None:
    inv, script = job
    message = error_of(run_cli("launch", str(inv), str(script.parent), timeout=30))
    assert f"{script.parent} is a directory" in message and "script" in message
    for command in (["check"], ["launch"], ["exec"]):
        tail = {"check": [], "launch": [str(script)], "exec": ["--", "true"]}[command[0]]
        message = error_of(run_cli(*command, str(shared), *tail, timeout=30))
        assert f"{shared} is a directory" in message and "inv.yaml" in message
    inv.chmod(0)
    try:
        if os.geteuid() == 0:
            cp = as_other_user(other_user, "check", str(inv), home=shared / "home")
        else:
            cp = run_cli("check", str(inv), timeout=30)
        message = error_of(cp)
        assert f"{inv}: cannot read the inventory" in message and "ermission denied" in message
    finally:
        inv.chmod(0o644)


def test_nproc_per_node_auto(job: tuple[Path, Path], tmp_path: Path) -> None:
    """Documented (`auto` = GPUs or 1), but used to be refused."""
    _, script = job
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults:\n  nproc_per_node: 3\nhosts:\n  - host: localhost\n")
    env = {"CLUSTERRUN_HOME": str(tmp_path / "home"), "CUDA_VISIBLE_DEVICES": ""}
    cp = run_cli("launch", "--dry-run", str(inv), str(script), env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "3 process(es)" in cp.stdout
    cp = run_cli("launch", "--dry-run", "--nproc-per-node", "auto", str(inv), str(script),
                 env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "1 process(es)" in cp.stdout  # no GPUs here: 1
    for bad in ("0", "two"):
        message = error_of(run_cli("launch", "--nproc-per-node", bad, str(inv), str(script),
                                   env=env, timeout=30))
        assert "--nproc-per-node" in message and "auto" in message


# ------------------------------------------------------------------ runs by name, logs filters


def fake_run(home: Path, run_id: str, name: str, created: float, lines: int = 3) -> Path:
    """A finished two-node, two-rank run as a launch leaves it on this machine."""
    path = home / "runs" / run_id
    plan = {"run_id": run_id, "name": name, "created": created, "nnodes": 2, "world_size": 2,
            "nodes": [{"name": f"node{i}", "host": "localhost", "node_rank": i, "nproc": 1,
                       "ranks": [i, i], "connection": {}} for i in range(2)]}
    arrivals = []
    for i in range(2):
        folder = path / "nodes" / f"node{i}"
        folder.mkdir(parents=True)
        data = "".join(f"{name} r{i} line {n}\n" for n in range(lines)).encode()
        (folder / f"rank-{i}.log").write_bytes(data)
        arrivals.append(f"node{i}\trank-{i}.log\t{len(data)}\n")
    (path / "arrivals").write_text("".join(arrivals))
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "state.json").write_text(json.dumps({"id": run_id, "name": name, "state": "succeeded",
                                                 "started_at": created,
                                                 "ended_at": created + 1}))
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    now = time.time()
    fake_run(home, "20250101-100000-tick-aaaa", "tick", now - 300)
    fake_run(home, "20250101-110000-tock-bbbb", "tock", now - 200)
    fake_run(home, "20250101-120000-tock-cccc", "tock", now - 100)
    return home


def cli_in(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"CLUSTERRUN_HOME": str(home)}, timeout=30)


def test_runs_are_found_by_name(home: Path) -> None:
    cp = cli_in(home, "logs", "tick")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines()[0] == "[node0 r0] tick r0 line 0"
    assert cp.stderr == ""
    cp = cli_in(home, "stop", "tick")
    assert cp.returncode == 0, cp.stderr
    assert "20250101-100000-tick-aaaa" in cp.stdout


def test_a_name_of_several_runs_means_the_newest_and_says_so(home: Path) -> None:
    cp = cli_in(home, "logs", "tock")
    assert cp.returncode == 0, cp.stderr
    assert "20250101-120000-tock-cccc" in cp.stderr and "2 runs" in cp.stderr
    assert "20250101-110000-tock-bbbb" in cp.stderr  # the other one, to pick it instead
    assert cp.stdout.splitlines()[0] == "[node0 r0] tock r0 line 0"
    message = error_of(cli_in(home, "logs", "nosuch"))
    assert "no run 'nosuch'" in message and "clusterrun ps" in message


def test_logs_rank_that_the_run_does_not_have(home: Path) -> None:
    """Used to print nothing and exit 0."""
    message = error_of(cli_in(home, "logs", "tick", "--rank", "7"))
    assert "no rank 7" in message and "ranks 0-1" in message
    cp = cli_in(home, "logs", "tick", "--rank", "1")
    assert cp.returncode == 0
    assert [line.split("]")[0] for line in cp.stdout.splitlines()] == ["[node1 r1"] * 3


def test_tail_takes_the_last_lines_of_every_node(tmp_path: Path) -> None:
    """A run whose logs were fetched from its hosts at once (a detached run, or one whose
    controller died) has one chunk per file in its arrivals index: --tail used to show only the
    node whose chunk landed last."""
    home = tmp_path / "home"
    fake_run(home, "20250101-100000-tick-aaaa", "tick", time.time(), lines=20)
    cp = cli_in(home, "logs", "tick", "--tail", "4")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == ["[node0 r0] tick r0 line 18", "[node1 r1] tick r1 line 18",
                                      "[node0 r0] tick r0 line 19", "[node1 r1] tick r1 line 19"]
    cp = cli_in(home, "logs", "tick", "--tail", "3", "--node", "node0")
    assert [line.rsplit(" ", 1)[1] for line in cp.stdout.splitlines()] == ["17", "18", "19"]
    assert cli_in(home, "logs", "tick", "--tail", "0").stdout == ""
