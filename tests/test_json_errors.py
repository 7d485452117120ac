"""`--json` means one JSON document on stdout whatever happens: every command that takes it
prints `{"ok": false, "error": {"exit_status", "outcome", "message"}}` on its errors (exit 2
included), with the status it exits with, and the paragraph still on stderr. No cluster: each
error here comes before any host is contacted, or from a port on this machine where nothing
listens."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from clusterrun.cli import cli
from tests.conftest import run_cli

# Every command that takes --json, as the options that make it print one document.
JSON_COMMANDS = {"check": ["--json"], "hosts": ["--json"], "env": ["--json"], "ps": ["--json"],
                 "stacks": ["--json"], "top": ["--once", "--json"], "session": ["--json"],
                 "exec": ["--json"], "launch": ["--dry-run", "--json"], "logs": ["--json"],
                 "stop": ["--json"], "pull": ["--json"]}


def test_every_command_with_json_is_listed_here() -> None:
    takes = {name for name, command in cli.commands.items()
             if any("--json" in getattr(p, "opts", ()) for p in command.params)}
    assert takes == set(JSON_COMMANDS)


def error_document(cp: subprocess.CompletedProcess[str], status: int) -> dict[str, Any]:
    """The one JSON error on stdout, its status the process's; the paragraph on stderr."""
    assert cp.returncode == status, (cp.returncode, cp.stdout, cp.stderr)
    doc = json.loads(cp.stdout)  # one document: anything else on stdout fails here
    assert doc["ok"] is False, doc
    error = doc["error"]
    assert set(error) == {"exit_status", "outcome", "message"}
    assert error["exit_status"] == cp.returncode
    assert error["message"] and error["message"] in " ".join(cp.stderr.split())
    assert "Traceback" not in cp.stderr
    return dict(error)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Inventories that fail before any host is contacted, a home with no runs and a path
    through a file where CLUSTERRUN_HOME should be."""
    (tmp_path / "unknown-key.yaml").write_text("hosts:\n  - host: localhost\n    bogus: 1\n")
    (tmp_path / "no-lock.yaml").write_text("defaults:\n  environment: nope.lock\n"
                                           "hosts:\n  - host: localhost\n")
    (tmp_path / "ok.yaml").write_text("hosts:\n  - host: localhost\n    name: node0\n")
    (tmp_path / "a-file").write_text("")
    return {"dir": tmp_path, "empty-home": tmp_path / "home",
            "file-home": tmp_path / "a-file" / "home"}


INVENTORY_ERRORS = [  # (command, its arguments, the outcome)
    ("check", ["missing.yaml"], "inventory"),
    ("hosts", ["missing.yaml"], "inventory"),
    ("env", ["missing.yaml"], "inventory"),
    ("check", ["unknown-key.yaml"], "inventory"),
    ("hosts", ["unknown-key.yaml"], "inventory"),
    ("env", ["unknown-key.yaml"], "inventory"),
    ("check", ["-w", "nodeX", "ok.yaml"], "usage"),
    ("hosts", ["-w", "nodeX", "ok.yaml"], "usage"),
    ("env", ["-w", "nodeX", "ok.yaml"], "usage"),
    ("check", ["no-lock.yaml"], "inventory"),
    ("env", ["no-lock.yaml"], "inventory"),
    ("env", ["ok.yaml"], "usage"),  # no host has an `environment:`
    ("exec", ["missing.yaml", "--", "true"], "inventory"),
    ("exec", ["-w", "nodeX", "ok.yaml", "--", "true"], "usage"),
    ("exec", ["-f", "0", "ok.yaml", "--", "true"], "usage"),
]


@pytest.mark.parametrize(("command", "args", "outcome"), INVENTORY_ERRORS)
def test_inventory_errors_are_one_json_document(command: str, args: list[str], outcome: str,
                                                files: dict[str, Path]) -> None:
    cp = run_cli(command, *JSON_COMMANDS[command], *args, cwd=files["dir"], timeout=60,
                 env={"CLUSTERRUN_HOME": str(files["empty-home"])})
    assert error_document(cp, 2)["outcome"] == outcome


INVENTORY_COMMANDS = ("check", "hosts", "env")
USAGE_ERRORS = [(c, ["--no-such-option", *(["ok.yaml"] if c in INVENTORY_COMMANDS else [])])
                for c in sorted(JSON_COMMANDS)] + [(c, []) for c in INVENTORY_COMMANDS]


@pytest.mark.parametrize(("command", "args"), USAGE_ERRORS)
def test_usage_errors_are_one_json_document(command: str, args: list[str],
                                            files: dict[str, Path]) -> None:
    """click's own: an unknown option, a missing INVENTORY."""
    cp = run_cli(command, *JSON_COMMANDS[command], *args, cwd=files["dir"], timeout=60,
                 env={"CLUSTERRUN_HOME": str(files["empty-home"])})
    assert error_document(cp, 2)["outcome"] == "usage"


@pytest.mark.parametrize("command", sorted(JSON_COMMANDS))
def test_an_unusable_home_is_one_json_document(command: str, files: dict[str, Path]) -> None:
    """CLUSTERRUN_HOME running through a file: `ps`, `stacks` and `top` read it first; the
    inventory commands get as far as their first use of it (or, `hosts`, never use it)."""
    args = {"check": ["--smoke", "ok.yaml"], "hosts": ["missing.yaml"],
            "env": ["no-lock.yaml"]}.get(command, [])
    cp = run_cli(command, *JSON_COMMANDS[command], *args, cwd=files["dir"], timeout=60,
                 env={"CLUSTERRUN_HOME": str(files["file-home"])})
    error = error_document(cp, 2)
    if command in ("ps", "stacks", "top", "check"):
        assert error["outcome"] == "local files"
        assert str(files["file-home"]) in error["message"]


@pytest.mark.parametrize("command", ["stacks", "top"])
def test_no_runs_is_one_json_document(command: str, files: dict[str, Path]) -> None:
    cp = run_cli(command, *JSON_COMMANDS[command], timeout=60,
                 env={"CLUSTERRUN_HOME": str(files["empty-home"])})
    assert "no runs" in error_document(cp, 2)["message"]


def test_the_stream_of_top_ends_with_one_json_line(files: dict[str, Path]) -> None:
    cp = run_cli("top", "--json", timeout=60, env={"CLUSTERRUN_HOME": str(files["empty-home"])})
    assert cp.returncode == 2
    [line] = cp.stdout.splitlines()
    assert json.loads(line)["error"]["exit_status"] == 2


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        return int(sock.getsockname()[1])


def running_run(home: Path, run_id: str, port: int, known_hosts: Path) -> Path:
    """A detached run this machine records as running, on one node at ``port`` on 127.0.0.2."""
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    node = {"name": "node1", "host": "127.0.0.2", "node_rank": 0, "nproc": 1, "ranks": [0, 0],
            "rundir": "/tmp/clusterrun-nowhere/run",
            "connection": {"port": port, "user": "nobody", "known_hosts": str(known_hosts)}}
    (run / "plan.json").write_text(json.dumps({"run_id": run_id, "name": "train",
                                               "created": time.time(), "nnodes": 1,
                                               "world_size": 1, "nodes": [node]}))
    (run / "state.json").write_text(json.dumps({"id": run_id, "name": "train",
                                                "state": "running", "detached": True,
                                                "started_at": time.time()}))
    return run


@pytest.mark.parametrize("command", ["stacks", "top"])
def test_an_unreadable_plan_is_one_json_document(command: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = running_run(home, "20260101-000000-train-0001", closed_port(), tmp_path / "kh")
    (run / "plan.json").write_text("{not json")
    cp = run_cli(command, *JSON_COMMANDS[command], timeout=60, env={"CLUSTERRUN_HOME": str(home)})
    error = error_document(cp, 2)
    assert error["outcome"] == "local files"
    assert "run 20260101-000000-train-0001: its plan.json cannot be read" in error["message"]


def test_stacks_that_reach_no_rank_is_one_json_document_with_status_4(tmp_path: Path) -> None:
    """The host refuses SSH: exit 4, and the error is the document (no empty report first)."""
    home = tmp_path / "home"
    running_run(home, "20260101-000000-train-0001", closed_port(), tmp_path / "kh")
    cp = run_cli("stacks", "--json", "--connect-timeout", "2", timeout=60,
                 env={"CLUSTERRUN_HOME": str(home)})
    assert error_document(cp, 4)["outcome"] == "unreachable"
