"""Scenario 2: a host crashes mid-run (every process in its namespace killed, sshd included) or
is partitioned (nft drops every packet) → it is declared lost within the lease, the others are
torn down, the report names it (exit 5); and a partitioned host's own supervisor ends its ranks
when its lease runs out, so nothing of the run is left there when the network heals."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, Reader, copy_payload, start_cli
from tests.reliability.conftest import Timed
from tests.support import faults

HOSTS = ["node4", "node5", "node6"]
VICTIM = "node6"
LEASE = 10.0
GRACE = 3.0


@pytest.fixture
def hosts(cluster: Cluster) -> Iterator[Cluster]:
    """The hosts as they were afterwards: VICTIM healed and revived (a fresh sshd, as after a
    reboot) whatever the test did to it, nothing left running anywhere."""
    try:
        yield cluster
    finally:
        sandbox.heal(cluster.sb, VICTIM)
        cluster.sb = faults.revive(cluster.sb.root, VICTIM)
        cluster.kill_all(HOSTS)


def launch(cluster: Cluster, tmp_path: Path) -> tuple[Any, Reader, Reader]:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    payload = copy_payload(tmp_path, "faulty.py")
    proc = start_cli("launch", "--nproc-per-node", "2", "--lease", str(LEASE), "--grace",
                     str(GRACE), "--env", f"TEST_DIR=/tmp/clusterrun-faulty/{uuid.uuid4().hex}",
                     str(inv), str(payload))
    out, err = Reader(proc.stdout), Reader(proc.stderr)  # type: ignore[arg-type]
    try:
        out.wait_for(r"faulty rank \d on", count=6)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nstderr:\n{err.text}") from None
    return proc, out, err


def torn_down(hosts: Cluster, proc: Any, err: Reader, timed: Timed, fault: str) -> int:
    """Times the two promises after a fault: the host declared lost within the lease, then
    the others' ranks ended (SIGTERM, torchrun's own shutdown, grace at most)."""
    with timed(f"{fault}: declared lost (lease 10 s)", LEASE + 2) as t:
        err.wait_for(f"{VICTIM} was lost: .*; stopping every node", timeout=LEASE + 2)
        t.stop()
    with timed(f"{fault}: the other hosts torn down after the loss", GRACE + 7) as t:
        code = int(proc.wait(GRACE + 7))
        left = hosts.wait_no_processes(HOSTS[:2], GRACE + 7 - t.seconds)
        t.stop()
        assert left == {}, left
    return code


def run_id(home: Path) -> str:
    return next((home / "runs").iterdir()).name


def test_a_crashed_host_is_lost_and_the_rest_torn_down(hosts: Cluster, home: Path,
                                                       tmp_path: Path, timed: Timed) -> None:
    proc, out, err = launch(hosts, tmp_path)
    faults.crash(hosts.sb, VICTIM)
    code = torn_down(hosts, proc, err, timed, "host crash")
    out.join()
    err.join()
    assert code == 5, err.text
    causes = [line for line in err.text.splitlines() if "root cause:" in line]
    assert len(causes) == 1 and causes[0].startswith(
        f"clusterrun: root cause: {VICTIM} was lost: "), err.text
    assert "clusterrun: node[4-5]: stopped after node6 was lost" in err.text, err.text
    assert "Traceback" not in err.text
    summary = json.loads((home / "runs" / run_id(home) / "summary.json").read_text())
    assert summary["root_cause"]["node"] == VICTIM and summary["root_cause"]["lost"]


def test_a_partitioned_host_is_lost_and_ends_its_own_run(hosts: Cluster, home: Path,
                                                         tmp_path: Path, timed: Timed) -> None:
    """A partition closes nothing: only missed heartbeats reveal it, to both sides."""
    proc, out, err = launch(hosts, tmp_path)
    run = run_id(home)
    assert hosts.run_processes(VICTIM, run, supervisors=True)
    sandbox.partition(hosts.sb, VICTIM)
    cut = time.monotonic()
    code = torn_down(hosts, proc, err, timed, "host partitioned")
    out.join()
    err.join()
    assert time.monotonic() - cut > LEASE - 1, err.text  # heartbeats, not a closed connection
    assert code == 5, err.text
    causes = [line for line in err.text.splitlines() if "root cause:" in line]
    assert causes == [f"clusterrun: root cause: {VICTIM} was lost: no word from it for 10 s "
                      "(host down or network partitioned; its supervisor ends the run there "
                      "when its lease runs out)"], err.text
    assert "clusterrun: node[4-5]: stopped after node6 was lost" in err.text, err.text
    # Still cut off: its supervisor ends the run there on its own (lease, then grace).
    with timed("host partitioned: its own supervisor ends its ranks (lease 10 s + grace 3 s)",
               LEASE + GRACE + 5) as t:
        t.start = cut  # measured from the cut
        left_there = hosts.wait_gone(
            [VICTIM], lambda n: hosts.run_processes(n, run, supervisors=True),
            LEASE + GRACE + 5 - t.seconds)
        t.stop()
        assert left_there == {}, left_there
    sandbox.heal(hosts.sb, VICTIM)
    assert hosts.run_processes(VICTIM, run, supervisors=True) == []  # right after healing
    state = json.loads(hosts.read(VICTIM, f"/tmp/clusterrun/runs/{run}/{VICTIM}/state.json"))
    assert state["state"] == "lost" and "no heartbeat" in state["reason"], state
