"""Scenario 3: sshd fails on a host mid-run (3 hosts x 2 ranks).

- Its listener killed: the connections it already accepted live in their own processes
  (OpenSSH forks one per connection), so the run goes on and succeeds; only new connections are
  refused until it is restarted.
- The per-connection sshd of clusterrun's connection killed: the supervisor's channel is gone,
  so that host is lost, the run ends everywhere (exit 5) and the report names it.

Either way the host's listener is brought back afterwards (a fresh sshd, as after a reboot).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from clusterrun.sandbox import net
from tests.conftest import Cluster, Reader, copy_payload, start_cli
from tests.support import faults, sessions

HOSTS = ["node6", "node7", "node8"]
VICTIM = "node8"
RUNS_FOR = 12.0  # how long every rank stays up
Timed = Callable[[str, float], AbstractContextManager[Any]]


@pytest.fixture
def hosts(cluster: Cluster) -> Iterator[Cluster]:
    """VICTIM gets a listening sshd again afterwards, whatever the test did to it."""
    try:
        yield cluster
    finally:
        cluster.sb = faults.revive(cluster.sb.root, VICTIM)
        cluster.kill_all(HOSTS)


def sshd_sessions(cluster: Cluster, name: str) -> list[int]:
    """The host's per-connection sshd processes (not its listener)."""
    found = []
    for pid in net.netns_pids(cluster.host(name).netns):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "sshd" and pid != cluster.host(name).sshd_pid:
            found.append(pid)
    return found


def launch(cluster: Cluster, tmp_path: Path) -> tuple[Any, Reader, Reader]:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    payload = copy_payload(tmp_path, "faulty.py")
    proc = start_cli("launch", "--nproc-per-node", "2", "--grace", "3", "--lease", "10",
                     "--env", f"SLEEP={RUNS_FOR}",
                     "--env", f"TEST_DIR=/tmp/clusterrun-faulty/{uuid.uuid4().hex}",
                     str(inv), str(payload))
    out, err = Reader(proc.stdout), Reader(proc.stderr)  # type: ignore[arg-type]
    try:
        out.wait_for(r"faulty rank \d on", count=6)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nstderr:\n{err.text}") from None
    return proc, out, err


def test_a_killed_sshd_listener_does_not_end_the_run(hosts: Cluster, home: Path,
                                                     tmp_path: Path, timed: Timed) -> None:
    proc, out, err = launch(hosts, tmp_path)
    assert sshd_sessions(hosts, VICTIM)  # clusterrun's connection, served by its own sshd
    os.kill(hosts.host(VICTIM).sshd_pid, signal.SIGKILL)
    with timed(f"sshd listener killed: the run goes on and succeeds (ranks up {RUNS_FOR:g} s)",
               RUNS_FOR + 20) as t:
        code = proc.wait(RUNS_FOR + 20)
        t.stop()
    out.join()
    err.join()
    assert code == 0, err.text
    assert out.text.count(" done") == 6, out.text  # every rank ran to its end
    assert "root cause" not in err.text and "Traceback" not in err.text
    run = next((home / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert [n["state"] for n in summary["nodes"]] == ["succeeded"] * 3, summary
    assert summary["logs"]["differ"] == [], summary["logs"]
    # The listener is really gone: the host's namespace holds no sshd any more, once a warm
    # session's connection (which outlives the run by design) has ended too.
    sessions.stop_ours()
    assert hosts.wait_gone([VICTIM], lambda n: [str(p) for p in sshd_sessions(hosts, n)],
                           10) == {}
    assert hosts.host(VICTIM).sshd_pid not in net.netns_pids(hosts.host(VICTIM).netns)


def test_a_killed_connection_sshd_loses_the_host(hosts: Cluster, home: Path, tmp_path: Path,
                                                 timed: Timed) -> None:
    proc, out, err = launch(hosts, tmp_path)
    sessions = sshd_sessions(hosts, VICTIM)
    assert sessions
    for pid in sessions:
        os.kill(pid, signal.SIGKILL)
    with timed("per-connection sshd killed: host lost, every host torn down", 15) as t:
        code = proc.wait(15)
        left = hosts.wait_no_processes(HOSTS, 15 - t.seconds)
        t.stop()
        assert left == {}, left
    out.join()
    err.join()
    assert code == 5, err.text
    causes = [line for line in err.text.splitlines() if "root cause:" in line]
    assert len(causes) == 1 and causes[0].startswith(
        f"clusterrun: root cause: {VICTIM} was lost: its connection closed"), err.text
    assert "clusterrun: node[6-7]: stopped after node8 was lost" in err.text, err.text
    assert "Traceback" not in err.text
    # Its supervisor saw its stdin close and ended the run there itself.
    run = next((home / "runs").iterdir()).name
    state = json.loads(hosts.read(VICTIM, f"/tmp/clusterrun/runs/{run}/{VICTIM}/state.json"))
    assert state["state"] == "lost" and "lifeline lost" in state["reason"], state
