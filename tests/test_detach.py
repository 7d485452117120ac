"""Detached runs keep gang semantics with no controller: the master's supervisor is the gang's
hub, every worker's supervisor its peer (issue 8). A failed rank or a crashed host ends the run
on every host within seconds, and the root cause is recorded on the hosts, where `ps` and
`logs` find it later."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node5", "node6"]


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def _detach(inv: Path, payload: Path, *env: str) -> str:
    args = [x for e in env for x in ("--env", e)]
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "3", *args,
                 str(inv), str(payload))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    return match.group(1)


def _wait_file(cluster: Cluster, host: str, path: str, timeout: float) -> float:
    """When ``path`` appeared on the host (this machine's monotonic clock, polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.run_on(host, "sh", "-c", f"test -e {path} && echo yes || true").strip():
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"{host}:{path} did not appear within {timeout} s")


def _ps(run_id: str) -> dict:
    cp = run_cli("ps", "--json")
    assert cp.returncode == 0, cp.stderr
    return {row["id"]: row for row in json.loads(cp.stdout)}[run_id]


def _host_state(cluster: Cluster, host: str, run_id: str) -> dict:
    return json.loads(cluster.read(host, f"/tmp/clusterrun/runs/{run_id}/{host}/state.json"))


def test_a_failed_rank_ends_a_detached_run_everywhere(cluster: Cluster, home: Path,
                                                      tmp_path: Path, payload: Path,
                                                      strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    run_id = _detach(inv, payload, "FAIL_RANK=1", "FAIL_CODE=3", "FAIL_AFTER=2", "SLEEP=600")
    # The controller is gone: the launch returned. Rank 1 (on the master) fails on its own.
    failed = _wait_file(cluster, "node5", f"/tmp/clusterrun/runs/{run_id}/node5/rank-1.exit", 90)
    left = cluster.wait_no_processes(HOSTS, 15)
    assert left == {}, left
    assert time.monotonic() - failed < 15
    master, worker = (_host_state(cluster, h, run_id) for h in HOSTS)
    assert (master["state"], master["exit_code"]) == ("failed", 3)
    assert worker["state"] == "stopped" and worker["cause"] == "peer_failed"
    for state in (master, worker):
        root = state["root_cause"]
        assert (root["node"], root["rank"], root["code"]) == ("node5", 1, 3), state
    assert _ps(run_id)["state"] == "failed"
    logs = run_cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    assert "[node5 r1] rank 1 failing with 3" in logs.stdout
    assert "[node6 r3] report rank 3 on node6" in logs.stdout


def test_a_crashed_host_ends_a_detached_run_everywhere(cluster: Cluster, home: Path,
                                                       tmp_path: Path, payload: Path,
                                                       strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    run_id = _detach(inv, payload, "SLEEP=600")
    deadline = time.monotonic() + 90
    while sum(len(cluster.run_processes(h, run_id)) for h in HOSTS) < 6:  # 2 torchrun + 4 ranks
        assert time.monotonic() < deadline, "the run should be up"
        time.sleep(0.5)
    # node6 crashes: every process in it dies at once, its SSH sessions included.
    cluster.kill_all(["node6"])
    crashed = time.monotonic()
    left = cluster.wait_no_processes(HOSTS, 15)
    assert left == {}, left
    assert time.monotonic() - crashed < 15
    master = _host_state(cluster, "node5", run_id)
    assert master["state"] == "stopped" and master["cause"] == "peer_lost"
    assert master["root_cause"]["node"] == "node6" and master["root_cause"]["lost"]
    assert _ps(run_id)["state"] == "lost"
