"""`clusterrun exec` against the namespace cluster: pdsh-style output, folded summaries, and the
command under supervision on every host, so that --timeout, Ctrl-C and a `kill -9` of the
controller leave nothing running there (issue 8)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, run_cli, start_cli

pytestmark = pytest.mark.cluster

SUPERVISED = ["node10", "node11", "node12"]


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(SUPERVISED)


def test_exec_on_all_32_hosts_in_parallel(cluster: Cluster, tmp_path: Path) -> None:
    names = cluster.names
    assert len(names) == 32
    inv = cluster.inventory(tmp_path / "inv.yaml", names)
    start = time.monotonic()
    cp = run_cli("exec", str(inv), "--", 'sleep 1; echo "$(hostname) says hi"; echo oops >&2',
                 timeout=120)
    elapsed = time.monotonic() - start
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    for name in names:
        assert f"{name}: {name} says hi" in lines
        assert f"{name}: oops" in lines
    # Every line is whole and prefixed: nothing from two hosts mixed into one line. (There may
    # be more lines than ours: root's login shell here runs `pyenv init`, which complains when
    # 32 shells rehash at once.)
    prefixes = {line.split(": ", 1)[0] for line in lines}
    assert prefixes == set(names)
    assert all(line.count(" says hi") <= 1 for line in lines)
    assert cp.stderr.strip() == "exit 0: node[1-32] (32)"
    # Every host sleeps 1 s: one host after another takes at least 32 s.
    assert elapsed < 20, elapsed


def test_exec_failures_give_the_largest_status_and_a_folded_summary(
        cluster: Cluster, tmp_path: Path) -> None:
    names = [f"node{k}" for k in range(1, 7)]
    inv = cluster.inventory(tmp_path / "inv.yaml", names)
    cmd = "case $(hostname) in node3|node4) exit 3;; node6) echo bad >&2; exit 7;; esac; echo fine"
    cp = run_cli("exec", str(inv), "--", cmd)
    assert cp.returncode == 7, cp.stdout + cp.stderr
    assert sorted(cp.stdout.splitlines()) == sorted(
        [f"node{k}: fine" for k in (1, 2, 5)] + ["node6: bad"])
    assert cp.stderr.splitlines() == [
        "exit 0: node[1-2,5] (3)", "exit 3: node[3-4] (2)", "exit 7: node6"]


def test_exec_names_an_unreachable_host(cluster: Cluster, tmp_path: Path,
                                        partitioned: list[str]) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node7", "node8", "node9"])
    sandbox.partition(cluster.sb, "node8")
    partitioned.append("node8")
    start = time.monotonic()
    # Below one second: fabric would round it down to 0, which paramiko takes as "no timeout".
    cp = run_cli("exec", "--connect-timeout", "0.9", str(inv), "--", "hostname", timeout=30)
    assert time.monotonic() - start < 5
    assert cp.returncode == 4, cp.stderr
    assert sorted(cp.stdout.splitlines()) == ["node7: node7", "node9: node9"]
    assert "exit 0: node[7,9] (2)" in cp.stderr.splitlines()
    assert re.search(r"^unreachable: node8: timeout: no SSH answer within 0.9 s", cp.stderr,
                     re.M), cp.stderr



def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has exited meanwhile
        return b""


def _wait_sleeping(cluster: Cluster, names: list[str], timeout: float = 90) -> None:
    """Until every host runs the test's `sleep 100`."""
    deadline = time.monotonic() + timeout
    while True:
        counts = [sum(_cmdline(pid) == b"sleep\x00100\x00" for pid in cluster.pids(n))
                  for n in names]
        if all(counts):
            return
        assert time.monotonic() < deadline, counts
        time.sleep(0.3)


def test_exec_timeout_ends_the_command_on_every_host(cluster: Cluster, tmp_path: Path,
                                                     strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", SUPERVISED)
    start = time.monotonic()
    cp = run_cli("exec", "--timeout", "2", str(inv), "--", "echo started; sleep 100", timeout=60)
    assert time.monotonic() - start < 20
    assert cp.returncode == 124, cp.stderr
    assert sorted(cp.stdout.splitlines()) == [f"{n}: started" for n in SUPERVISED]
    assert cp.stderr.splitlines() == ["timed out after 2 s (exit 124): node[10-12] (3)"]
    assert cluster.wait_no_processes(SUPERVISED, 10) == {}


def test_ctrl_c_of_exec_ends_the_command_on_every_host(cluster: Cluster, tmp_path: Path,
                                                       strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", SUPERVISED)
    proc = start_cli("exec", str(inv), "--", "sleep 100")
    _wait_sleeping(cluster, SUPERVISED)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "SIGINT: stopping the command on every host" in err
    assert re.search(r"^stopped \(exit 143\): node\[10-12\] \(3\)$", err, re.M), err
    assert cluster.wait_no_processes(SUPERVISED, 10) == {}


def test_kill_9_of_exec_leaves_nothing_on_the_hosts(cluster: Cluster, tmp_path: Path,
                                                   strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", SUPERVISED)
    proc = start_cli("exec", str(inv), "--", "sleep 100", stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    _wait_sleeping(cluster, SUPERVISED)
    proc.kill()
    proc.wait(10)
    # The SSH connections close with the process: each supervisor sees EOF on its lifeline.
    assert cluster.wait_no_processes(SUPERVISED, 10) == {}
