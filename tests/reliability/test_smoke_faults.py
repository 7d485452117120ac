"""Scenario 6: `check --smoke` when a path between two workers is blocked.

A worker whose firewall admits only SSH and the master port (as a firewall written for "SSH and
the job's port" does) passes every check against the master; only a connection between two
ranks on an ephemeral port fails. Two ways it shows up, both bounded and both naming the pair:

- the firewall is there when `check` starts: preflight's all-pairs mesh names the pair and the
  smoke test never starts;
- the firewall arrives after preflight passed (a policy pushed between the check and the ranks'
  start): the mesh saw open paths, so it is the smoke test's own ranks that must find and name
  the blocked pairs, instead of hanging in Gloo's connect until a timeout nobody waits for.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, run_cli, start_cli
from tests.reliability.conftest import Timed

HOSTS = ["node9", "node10", "node11"]
BLOCKED = "node10"  # rank 1: others connect to it (a highest rank only connects out)
MASTER_PORT = 29541


def test_a_blocked_worker_pair_is_named_by_preflight_and_nothing_starts(
        cluster: Cluster, home: Path, tmp_path: Path, timed: Timed) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, master_port=MASTER_PORT)
    cluster.admit_only(BLOCKED, 22, MASTER_PORT)
    try:
        with timed("smoke, worker pair blocked before check: named by the mesh", 30) as t:
            cp = run_cli("check", "--smoke", str(inv), timeout=60)
            t.stop()
    finally:
        cluster.admit_all(BLOCKED)
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr
    assert f"{BLOCKED}: pairs: node[9,11] cannot connect to {BLOCKED}" in cp.stdout, cp.stdout
    assert "2 of 6 connections between hosts failed" in cp.stdout, cp.stdout
    assert not list((home / "smoke").rglob("runs/*"))  # the all-reduce never started
    assert cluster.wait_no_processes(HOSTS, 10) == {}


@pytest.mark.usefixtures("home")
def test_a_pair_blocked_after_preflight_is_named_by_the_smoke_ranks(
        cluster: Cluster, tmp_path: Path, timed: Timed) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, master_port=MASTER_PORT)
    proc = start_cli("check", "--smoke", str(inv))
    out, err = Reader(proc.stdout), Reader(proc.stderr)  # type: ignore[arg-type]
    blocked = False
    try:
        # Preflight passed (its mesh saw every pair open); the ranks are not started yet: the
        # path closes now, as a firewall policy pushed in between would close it.
        out.wait_for(r"3/3 hosts ready", timeout=30)
        cluster.admit_only(BLOCKED, 22, MASTER_PORT)
        blocked = True
        with timed("6. smoke, worker pair blocked after preflight: named by the ranks (from "
                   "the block to the exit)", 30) as t:
            proc.wait(timeout=60)
            t.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
        if blocked:
            cluster.admit_all(BLOCKED)
    out.join()
    err.join()
    assert proc.returncode == 3, out.text + err.text
    assert "Traceback" not in err.text.replace("torchrun's shutdown output (tracebacks", "")
    text = out.text + err.text
    for source in ("node9", "node11"):
        assert f"smoke:   {source} -> {BLOCKED} (" in text, text
    assert "node9 -> node11" not in text and "node11 -> node9" not in text
    assert "root cause: node9 rank 0 exited with code 3" in err.text, err.text
    assert cluster.wait_no_processes(HOSTS, 10) == {}


@pytest.mark.usefixtures("home")
def test_smoke_passes_again_once_the_path_is_open(cluster: Cluster, tmp_path: Path,
                                                  timed: Timed) -> None:
    """The same hosts, nothing blocked: the pair check in the ranks passes and the
    all-reduce runs (no false alarm from the new checks)."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, master_port=MASTER_PORT)
    started = time.monotonic()
    with timed("smoke, healthy 3 hosts (reference, no fault)", 90) as t:
        cp = run_cli("check", "--smoke", str(inv), timeout=90)
        t.stop()
    assert cp.returncode == 0, cp.stdout + cp.stderr + f" after {time.monotonic() - started:.1f}"
    assert cp.stdout.count("sum 6 ok") == 3, cp.stdout
    assert cluster.wait_no_processes(HOSTS, 10) == {}
