"""Scenario 9: the disk under a host's run directory fills up mid-run (a 16 MiB tmpfs there,
ranks printing as fast as they can). The policy (docs/reliability.md): the supervisor stops the
run while a margin is left, the root cause names the host and the directory, the exit status
is 6, and no line a rank printed is lost on the host or on the controller."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, copy_payload, run_cli, start_cli
from tests.reliability.conftest import Timed

HOSTS = ["node4", "node5", "node6"]
FULL = "node5"


@pytest.fixture
def small_disk(cluster: Cluster) -> Iterator[str]:
    """A directory that is a 16 MiB tmpfs in FULL's mount namespace only."""
    path = f"/var/tmp/clusterrun-small-{uuid.uuid4().hex[:8]}"
    Path(path).mkdir()
    sshd = str(cluster.host(FULL).sshd_pid)
    subprocess.run(["nsenter", "-t", sshd, "-m", "mount", "-t", "tmpfs", "-o", "size=16m",
                    "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["nsenter", "-t", sshd, "-m", "umount", "--lazy", path], check=False)
        Path(path).rmdir()


def _numbers(text: str, rank: int) -> list[int]:
    return [int(m) for m in re.findall(rf"^r{rank} (\d+) ", text, re.MULTILINE)]


def test_a_full_disk_stops_the_run_naming_the_host_and_loses_no_line(
        cluster: Cluster, home: Path, tmp_path: Path, small_disk: str, timed: Timed) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, hosts={FULL: {"workdir": small_disk}})
    script = copy_payload(tmp_path, "spam.py")
    proc = start_cli("launch", "--grace", "3", "--env", "LINES=100000000", "--env", "PAD=200",
                     str(inv), str(script))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    out.wait_for(r"^\[node5 r1\] r1 \d+ ")
    with timed("9. remote disk full (16 MiB tmpfs): surfaced, naming the host", 10) as t:
        err.wait_for(r"node5: disk nearly full under .*; stopping every node",
                     timeout=30)
        t.stop()
    with timed("9. remote disk full: every host torn down", 20) as t:
        code = proc.wait(60)
        assert cluster.wait_no_processes(HOSTS, 15) == {}
        t.stop()
    out.join()
    err.join()
    assert code == 6, err.text
    assert "clusterrun: root cause: node5: disk nearly full under" in err.text
    assert "set `workdir:` to a larger disk" in err.text
    assert re.search(r"logs: \d+ files, identical on the hosts and in", err.text), err.text
    run_id = next((home / "runs").iterdir()).name
    # No silent truncation: the full host's rank wrote its lines without a gap, and its host's
    # copy and the controller's mirror hold the same ones.
    mirror = (home / "runs" / run_id / "nodes" / FULL / "rank-1.log").read_text()
    host = cluster.read(FULL, f"{small_disk}/runs/{run_id}/{FULL}/rank-1.log")
    numbers = _numbers(mirror, 1)
    assert len(numbers) > 1000 and numbers == list(range(len(numbers)))
    assert host == mirror
    assert "No space left on device" not in mirror
    state = json.loads(cluster.read(FULL, f"{small_disk}/runs/{run_id}/{FULL}/state.json"))
    assert state["state"] == "failed" and state["exit_code"] == 6
    assert state["reason"].startswith("node5: disk nearly full under")


def test_detached_the_full_disk_is_the_root_cause_ps_shows(
        cluster: Cluster, home: Path, tmp_path: Path, small_disk: str, timed: Timed) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, hosts={FULL: {"workdir": small_disk}})
    script = copy_payload(tmp_path, "spam.py")
    cp = run_cli("launch", "--detach", "--grace", "3", "--env", "LINES=100000000",
                 "--env", "PAD=200", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = next((home / "runs").iterdir()).name
    with timed("9. remote disk full, detached: the run ends everywhere (after the launch "
               "returned)", 30) as t:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run = next(r for r in json.loads(run_cli("ps", "--json").stdout)
                       if r["id"] == run_id)
            if run["state"] != "running":
                break
            time.sleep(0.5)
        assert cluster.wait_no_processes(HOSTS, 15) == {}
        t.stop()
    assert run["state"] == "failed" and run["exit_status"] == 6, run
    assert run["root_cause"]["node"] == FULL
    assert "nearly full" in run["root_cause"]["detail"]
