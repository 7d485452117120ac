"""Scenario 5: a process that leaves the job's tree (setsid, a double fork, an emptied
environment, a new name) is still ended when the run ends: by the job's cgroup where the host
has cgroup v2, by the supervisor as child subreaper where it has not (said at launch), and by
`clusterrun stop` or the controller when the supervisor itself was SIGKILLed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, copy_payload, run_cli, start_cli
from tests.reliability.conftest import Timed

HOSTS = ["node1", "node2", "node3"]


@pytest.fixture
def pid_dir() -> Iterator[Path]:
    """Where the job's escaped daemons write their pids: a folder the hosts share with this
    machine (/var/tmp; each host has its own /tmp), removed afterwards."""
    path = Path("/var/tmp") / f"clusterrun-escape-{uuid.uuid4().hex[:8]}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _daemons(pid_dir: Path) -> dict[int, int]:
    """rank -> the pid of the daemon it started (written once it runs)."""
    found = {}
    for path in pid_dir.glob("escaped-*.pid"):
        text = path.read_text().strip()
        if text:
            found[int(path.stem.split("-")[1])] = int(text)
    return found


def _alive(pids: dict[int, int]) -> list[int]:
    left = []
    for pid in pids.values():
        try:
            if b"innocent-daemon" in Path(f"/proc/{pid}/cmdline").read_bytes():
                left.append(pid)
        except OSError:
            continue
    return left


def _start(cluster: Cluster, tmp_path: Path, pid_dir: Path,
           *options: str) -> tuple[subprocess.Popen[str], Reader, Reader]:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "escaper.py")
    proc = start_cli("launch", "--grace", "3", "--env", f"TEST_DIR={pid_dir}", *options,
                     str(inv), str(script))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    out.wait_for(r"escaped daemon \d+", count=3)
    return proc, out, err


def _host_state(cluster: Cluster, name: str, run_id: str) -> dict[str, object]:
    return dict(json.loads(cluster.read(name, f"/tmp/clusterrun/runs/{run_id}/{name}/state.json")))


@pytest.mark.usefixtures("clean")
def test_escaped_daemons_end_with_a_failed_run_through_the_cgroup(
        cluster: Cluster, home: Path, tmp_path: Path, timed: Timed, pid_dir: Path) -> None:
    proc, out, err = _start(cluster, tmp_path, pid_dir, "--env", "ESCAPE_FAIL_RANK=1")
    daemons = _daemons(pid_dir)
    assert len(daemons) == 3 and len(_alive(daemons)) == 3
    out.wait_for(r"rank 1 escaped")
    with timed("5. setsid + double-fork daemons (cgroup): gone after a rank fails", 15) as t:
        code = proc.wait(60)
        assert cluster.wait_no_processes(HOSTS, 15) == {}
        t.stop()
    out.join()
    err.join()
    assert code == 3, err.text
    assert _alive(daemons) == []
    assert "no cgroup for the job" not in err.text
    run_id = next((home / "runs").iterdir()).name
    for name in HOSTS:
        group = _host_state(cluster, name, run_id)["cgroup"]
        assert isinstance(group, str) and group.endswith(f".{name}.a0")
        assert not Path(str(group)).exists()  # removed once empty: nothing left in it


@pytest.mark.usefixtures("clean")
def test_without_a_cgroup_the_subreaper_ends_them_and_launch_says_so(
        cluster: Cluster, home: Path, tmp_path: Path, timed: Timed, pid_dir: Path) -> None:
    proc, out, err = _start(cluster, tmp_path, pid_dir, "--env", "ESCAPE_FAIL_RANK=2",
                            "--env", "CLUSTERRUN_CGROUP=0")
    daemons = _daemons(pid_dir)
    with timed("5. setsid + double-fork daemons (no cgroup, subreaper): gone after a rank "
               "fails", 15) as t:
        code = proc.wait(60)
        assert cluster.wait_no_processes(HOSTS, 15) == {}
        t.stop()
    out.join()
    err.join()
    assert code == 3
    assert _alive(daemons) == []
    notes = [line for _, line in err.lines if "no cgroup for the job" in line]
    assert len(notes) == 1, err.text
    assert "node[1-3] (CLUSTERRUN_CGROUP=0)" in notes[0]
    assert "docs/reliability.md" in notes[0]


@pytest.mark.usefixtures("clean")
def test_a_sigkilled_supervisor_leaves_nothing_after_the_run(
        cluster: Cluster, home: Path, tmp_path: Path, timed: Timed, pid_dir: Path) -> None:
    """Its ranks and their daemons are in no tree any more: the controller ends them through
    the job's cgroup on the host that still answers."""
    proc, out, err = _start(cluster, tmp_path, pid_dir)
    daemons = _daemons(pid_dir)
    supervisor = int(Path(f"/proc/{daemons[1]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert b"<clusterrun>" in Path(f"/proc/{supervisor}/cmdline").read_bytes()
    with timed("5. supervisor SIGKILLed: its ranks and escaped daemons ended by the "
               "controller", 20) as t:
        os.kill(supervisor, signal.SIGKILL)
        code = proc.wait(60)
        assert cluster.wait_no_processes(HOSTS, 10) == {}
        t.stop()
    out.join()
    err.join()
    assert code == 5, err.text
    assert _alive(daemons) == []
    assert "node2: ended what the run had left running there" in err.text


@pytest.mark.usefixtures("clean")
def test_stop_ends_a_detached_run_whose_supervisor_was_killed(
        cluster: Cluster, home: Path, tmp_path: Path, timed: Timed, pid_dir: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "escaper.py")
    cp = run_cli("launch", "--detach", "--grace", "3", "--env", f"TEST_DIR={pid_dir}",
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = next((home / "runs").iterdir()).name
    deadline = time.monotonic() + 60
    while len(_daemons(pid_dir)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    daemons = _daemons(pid_dir)
    assert len(_alive(daemons)) == 3
    supervisor = _host_state(cluster, "node3", run_id)["supervisor_pid"]
    os.kill(int(str(supervisor)), signal.SIGKILL)
    with timed("5. detached, supervisor SIGKILLed: `clusterrun stop` ends everything", 30) as t:
        stopped = run_cli("stop", run_id, timeout=90)
        assert cluster.wait_no_processes(HOSTS, 10) == {}
        t.stop()
    assert stopped.returncode == 0, stopped.stderr
    assert _alive(daemons) == []
