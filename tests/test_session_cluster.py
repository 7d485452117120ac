"""The warm session on the namespace cluster (CLUSTERRUN_SESSION=1): a warm command logs in
nowhere, a launch runs through it, and the lifeline holds whichever end dies: the CLI
SIGKILLed mid-run, or the daemon SIGKILLed; `session stop` leaves no agent on any host."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, run_cli
from tests.support.session_cluster import (
    agents,
    logins,
    ok,
    session_status,
    start_attached,
)

pytestmark = pytest.mark.cluster

HOSTS = [f"node{k}" for k in range(8, 16)]  # clear of the container hosts


def test_a_warm_command_logs_in_nowhere(cluster: Cluster, tmp_path: Path,
                                        session_on: None) -> None:
    inv = str(cluster.inventory(tmp_path / "inv.yaml", HOSTS))
    cold = logins(cluster, HOSTS, ok("exec", inv, "--", "hostname"))
    held = agents()
    assert set(held) == set(HOSTS) and all(held.values())
    warm = logins(cluster, HOSTS, ok("exec", inv, "--", "hostname"))
    # Cold: the agent's login, then exec's command in the user's shell (as under clush);
    # warm: that shell alone: no SSH login.
    assert warm == {n: cold[n] - 1 for n in HOSTS}, (cold, warm)
    assert agents() == held  # the same agents, on the same connections
    assert logins(cluster, HOSTS, ok("check", inv)) == dict.fromkeys(HOSTS, 0)
    cp = run_cli("exec", inv, "--no-session", "--", "true")
    assert cp.returncode == 0, cp.stderr


def test_a_ddp_launch_runs_through_the_session(cluster: Cluster, tmp_path: Path,
                                               session_on: None) -> None:
    names = HOSTS[:3]
    inv = str(cluster.inventory(tmp_path / "inv.yaml", names))
    (tmp_path / "ddp").mkdir()
    script = tmp_path / "ddp" / "tiny.py"
    script.write_text(TINY_DDP)
    cp = run_cli("launch", "--nproc-per-node", "1", inv, str(script))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("sum 3.0") == 3, cp.stdout
    assert set(agents()) == set(names)
    again = logins(cluster, names, ok("launch", "--nproc-per-node", "1", inv, str(script)))
    assert again == dict.fromkeys(names, 0)
    assert cluster.wait_no_processes(names, 10) == {}  # a live daemon's agents left out


# Leaves by os._exit: gloo's threads can abort the interpreter's own exit on a loaded machine
# ("terminate called without an active exception"), which is torch's, not the session's.
TINY_DDP = """import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(4, 1))
for _ in range(3):
    model(torch.randn(8, 4)).pow(2).mean().backward()
total = torch.ones(1)
dist.all_reduce(total)
print("rank", dist.get_rank(), "sum", float(total), flush=True)
os._exit(0)
"""


def test_a_killed_cli_leaves_nothing_on_any_host(cluster: Cluster, tmp_path: Path,
                                                 session_on: None) -> None:
    names = HOSTS[:3]
    proc, _ = start_attached(cluster, tmp_path, names)
    held = agents()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    # The daemon ends the dead client's requests (EOF): each supervisor ends its node.
    assert cluster.wait_no_processes(names, 15) == {}
    assert agents() == held


def test_a_killed_daemon_ends_the_run_it_carried(cluster: Cluster, tmp_path: Path,
                                                 session_on: None) -> None:
    names = HOSTS[:3]
    proc, _ = start_attached(cluster, tmp_path, names)
    daemon = session_status()["pid"]
    os.kill(daemon, signal.SIGKILL)
    # Its connections drop: each agent sees EOF and exits, and so every supervisor's stdin
    # ends. Nothing stays, the agents included.
    assert cluster.wait_no_processes(names, 15) == {}
    with contextlib.suppress(Exception):
        proc.wait(30)
    if proc.poll() is None:
        proc.kill()


def test_session_stop_leaves_no_agent(cluster: Cluster, tmp_path: Path,
                                      session_on: None) -> None:
    inv = str(cluster.inventory(tmp_path / "inv.yaml", HOSTS))
    ok("exec", inv, "--", "true")()
    assert set(agents()) == set(HOSTS)
    cp = run_cli("session", "stop", timeout=30)
    assert cp.returncode == 0 and "session stopped" in cp.stdout, cp.stdout + cp.stderr
    assert cluster.wait_no_processes(HOSTS, 10) == {}
    assert not session_status()["running"]
    started = time.monotonic()
    ok("exec", inv, "--", "true")()  # a new daemon on demand
    assert time.monotonic() - started < 60


def test_a_killed_agent_is_replaced_on_the_next_command(cluster: Cluster, tmp_path: Path,
                                                        session_on: None) -> None:
    names = HOSTS[:2]
    inv = str(cluster.inventory(tmp_path / "inv.yaml", names))
    ok("exec", inv, "--", "true")()
    held = agents()
    cluster.run_on(names[0], "kill", "-KILL", str(held[names[0]]))
    cp = run_cli("exec", inv, "--", "hostname")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr and "session" not in cp.stderr, cp.stderr
    now = agents()
    assert now[names[0]] != held[names[0]] and now[names[1]] == held[names[1]]


def test_a_network_cut_between_two_commands_shows_within_the_connect_timeout(
        cluster: Cluster, tmp_path: Path, session_on: None, partitioned: list[str]) -> None:
    """The held connection looks alive until something crosses it: the next command's ping
    finds out within its connect timeout, and the host is reported as without the session."""
    names = HOSTS[:2]
    inv = str(cluster.inventory(tmp_path / "inv.yaml", names))
    ok("exec", inv, "--", "true")()
    sandbox.partition(cluster.sb, names[0])
    partitioned.append(names[0])
    started = time.monotonic()
    cp = run_cli("exec", "--connect-timeout", "1", inv, "--", "hostname", timeout=60)
    assert time.monotonic() - started < 8, cp.stderr
    assert cp.returncode == 4, cp.stderr
    assert cp.stdout.splitlines() == [f"{names[1]}: {names[1]}"], cp.stdout
    assert re.search(rf"^unreachable: {names[0]}: timeout: no SSH answer within 1 s", cp.stderr,
                     re.M), \
        cp.stderr
