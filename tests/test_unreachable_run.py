"""`stop`, `stacks` and `top --once` on a running run whose host refuses SSH: each exits 4 and
names the host (docs/exit-status.md). The real command line and the real SSH transport, against
a port on this machine where nothing listens: no root, no sshd."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus
from tests.conftest import run_cli

RUN_ID = "20260101-000000-train-0001"


def closed_port() -> int:
    """A port nothing listens on: bound for a moment, then closed (connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A run this machine records as running, detached (no controller streams it), on one node
    whose SSH port is closed."""
    home = tmp_path / "clusterrun"
    run = home / "runs" / RUN_ID
    run.mkdir(parents=True)
    node = {"name": "node1", "host": "127.0.0.2", "node_rank": 0, "nproc": 1, "ranks": [0, 0],
            "rundir": "/tmp/clusterrun-nowhere/run",
            "connection": {"port": closed_port(), "user": "nobody",
                           "known_hosts": str(tmp_path / "known_hosts")}}
    (run / "plan.json").write_text(json.dumps({"run_id": RUN_ID, "name": "train",
                                               "created": time.time(), "nnodes": 1,
                                               "world_size": 1, "nodes": [node]}))
    (run / "state.json").write_text(json.dumps({"id": RUN_ID, "name": "train",
                                                "state": "running", "detached": True,
                                                "started_at": time.time()}))
    return home


@pytest.mark.parametrize("command", [["stop", "--grace", "1"], ["stacks"], ["top", "--once"]])
def test_a_run_whose_host_cannot_be_reached_exits_4_naming_it(home: Path,
                                                              command: list[str]) -> None:
    cp = run_cli(*command, RUN_ID, "--connect-timeout", "2",
                 env={"CLUSTERRUN_HOME": str(home)}, timeout=60)
    assert cp.returncode == ExitStatus.UNREACHABLE, cp.stdout + cp.stderr
    assert "node1" in cp.stdout + cp.stderr and "connection refused" in cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr
