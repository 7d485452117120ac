"""How many login shells each command costs a host, pinned so that it cannot creep back.

sshd runs every command through the user's login shell, and Debian's bash reads ~/.bashrc for
it: a host whose rc file runs `conda init` or `pyenv init` pays a Python start (or a lock) per
SSH channel. Each sandbox host's ~/.bashrc counts its logins (clusterrun/sandbox/sshd.py), so
these tests read what really ran on the hosts. A command's programs on one host share one
channel where they follow each other (transport/programs.py: the probe's interpreter runs the
copy and then becomes the supervisor; stop, status and the log fetch share one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Cluster
from tests.support import session_cluster
from tests.support.session_cluster import ok

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def direct_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """These are the direct path's logins; the warm session's (none per warm command) are
    tests/test_session_cluster.py's."""
    monkeypatch.setenv("CLUSTERRUN_SESSION", "0")

HOSTS = ["node4", "node5", "node6"]


def logins(cluster: Cluster, action: Callable[[], object]) -> dict[str, int]:
    """The logins each host had while ``action`` ran."""
    return session_cluster.logins(cluster, HOSTS, action)


def each(count: int) -> dict[str, int]:
    return dict.fromkeys(HOSTS, count)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "hello.py").write_text("import os, sys, time\nprint('hello', os.environ['RANK'])\n"
                                     "time.sleep(float(sys.argv[1]) if sys.argv[1:] else 0)\n")
    return folder / "hello.py"


def test_check_and_exec_cost_one_channel_per_host(cluster: Cluster, home: Path,
                                                   tmp_path: Path, clean: None) -> None:
    inv = str(cluster.inventory(tmp_path / "inv.yaml", HOSTS))
    # check: the probe answers every phase (facts, master, data path, every pair) on one.
    assert logins(cluster, ok("check", inv)) == each(1)
    # exec: one channel; the command itself runs in the user's shell ($SHELL -c), which reads
    # ~/.bashrc as it does under clush or pdsh (its functions and aliases are the user's).
    assert logins(cluster, ok("exec", inv, "--", "true")) == each(2)


def test_launch_costs_the_probe_and_the_manifest_read(cluster: Cluster, home: Path,
                                                      tmp_path: Path, job: Path,
                                                      clean: None) -> None:
    """Preflight's probe, and the code's manifest read that overlaps it; the copy and the
    supervisor run in those two interpreters, with no login of their own."""
    inv = str(cluster.inventory(tmp_path / "inv.yaml", HOSTS))
    launch = ok("launch", "--no-torchrun", "--nproc-per-node", "1", inv, str(job))
    assert logins(cluster, launch) == each(2)  # the code is copied
    assert logins(cluster, launch) == each(2)  # nothing changed
    assert cluster.wait_no_processes(HOSTS, 10) == {}


def test_ps_logs_and_stop_of_a_detached_run(cluster: Cluster, home: Path, tmp_path: Path,
                                            job: Path, clean: None) -> None:
    inv = str(cluster.inventory(tmp_path / "inv.yaml", HOSTS))
    assert logins(cluster, ok("launch", "--detach", "--no-torchrun", "--nproc-per-node", "1",
                              "--name", "logins", inv, str(job), "3")) == each(2)
    assert logins(cluster, ok("ps")) == each(1)  # status.py
    # logs -f: the status, the lines so far, the follow until the end, then the status and
    # the last bytes of the ended run: each in the interpreter the one before left there.
    assert logins(cluster, ok("logs", "-f", "logins")) == each(1)
    assert logins(cluster, ok("ps")) == each(0)  # ended and recorded: nothing to ask
    assert logins(cluster, ok("launch", "--detach", "--no-torchrun", "--nproc-per-node", "1",
                              "--name", "stopped", inv, str(job), "60")) == each(2)
    time.sleep(1)
    # stop: stop.py, then the status and the logs of the stopped run, in one interpreter.
    assert logins(cluster, ok("stop", "stopped")) == each(1)
    assert cluster.wait_no_processes(HOSTS, 10) == {}
