"""The warm session in the cluster tests (docs/session.md): the `session_on` fixture (a
plugin of tests/conftest.py) and what the tests of tests/test_session_*.py ask the daemon and
the hosts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, Reader, copy_payload, run_cli, start_cli

# Longer than any wait below: a run must end by its lifeline's EOF, not by a missed lease.
LEASE = 60


@pytest.fixture
def session_on(cluster: Cluster, home: Path, monkeypatch: pytest.MonkeyPatch,
               request: pytest.FixtureRequest) -> Iterator[None]:
    """The session on for this test; afterwards its daemon stopped and the hosts of the
    test's module (its HOSTS) cleaned of what the test left."""
    monkeypatch.setenv("CLUSTERRUN_SESSION", "1")
    # Each command through the daemon, the first included (tests/test_session_cold.py has the
    # default: the first goes direct and hands its hosts over).
    monkeypatch.setenv("CLUSTERRUN_SESSION_COLD", "wait")
    yield
    status = session_status()
    run_cli("session", "stop", timeout=30)
    if status.get("pid"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(status["pid"], signal.SIGKILL)
    cluster.kill_all(request.module.HOSTS)


def session_status() -> dict[str, Any]:
    cp = run_cli("session", "--json", timeout=30)
    assert cp.returncode == 0, cp.stderr
    return dict(json.loads(cp.stdout))


def agents() -> dict[str, int]:
    return {h["name"]: h["agent_pid"] for h in session_status().get("hosts", [])}


def logins(cluster: Cluster, names: list[str], action: Callable[[], object]) -> dict[str, int]:
    before = {n: sandbox.logins(cluster.sb, n) for n in names}
    action()
    return {n: sandbox.logins(cluster.sb, n) - before[n] for n in names}


def ok(*args: str) -> Callable[[], object]:
    def run() -> object:
        cp = run_cli(*args)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        return cp
    return run


def start_attached(cluster: Cluster, tmp_path: Path, names: list[str]) -> tuple[Any, Reader]:
    inv = cluster.inventory(tmp_path / "inv.yaml", names)
    payload = copy_payload(tmp_path, "faulty.py")
    proc = start_cli("launch", "--nproc-per-node", "1", "--grace", "3", "--lease", str(LEASE),
                     "--env", f"TEST_DIR=/tmp/clusterrun-faulty/{tmp_path.name}", str(inv),
                     str(payload), start_new_session=True)
    out = Reader(proc.stdout)  # type: ignore[arg-type]
    Reader(proc.stderr)  # type: ignore[arg-type]
    out.wait_for(r"faulty rank \d on", count=len(names))
    return proc, out
