"""A non-root user on the namespace hosts, reached over real SSH, whose home directory is
missing or read-only there: `check` names the host, the path and the fix (`workdir:`), exit 3,
and a `workdir:` the user can write makes it pass. (test_host_paths.py: the same words through
the local transport, without root.)"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus
from tests.conftest import Cluster, run_cli
from tests.support import sessions

pytestmark = pytest.mark.cluster

HOST = "node5"
# The machine's own Python: the venv's may sit under a home other users cannot enter. The probe
# needs only the standard library; torch is then missing, a check of its own.
PYTHON = "/usr/bin/python3"


@pytest.fixture
def user(cluster: Cluster) -> Iterator[str]:
    """A user of this machine (so of every namespace host) without a home, that logs in with
    the sandbox's key (each host's sshd gives it to every user): `*` is no password, not a
    locked account, which sshd without PAM would refuse."""
    name = f"crt{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-d", f"/nonexistent-{name}", "-s", "/bin/sh", "-p", "*",
                    name], check=True)
    try:
        yield name
    finally:
        sessions.stop_ours()  # a warm session's agent runs as the user until it ends
        subprocess.run(["userdel", name], check=False)


def check_as(cluster: Cluster, tmp_path: Path, user: str, **defaults: str
             ) -> subprocess.CompletedProcess[str]:
    # The default workdir, ~/clusterrun (the sandbox's inventory sets /tmp/clusterrun).
    inv = cluster.inventory(tmp_path / "inv.yaml", [HOST], defaults={
        "user": user, "python": PYTHON, "workdir": "~/clusterrun", **defaults})
    return run_cli("check", str(inv), timeout=120)


def test_a_user_without_a_home_on_the_host(cluster: Cluster, tmp_path: Path, home: Path,
                                           user: str) -> None:
    cp = check_as(cluster, tmp_path, user)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    out = " ".join(cp.stdout.split())
    assert (f"{HOST}: workdir: cannot use workdir /nonexistent-{user}/clusterrun on {HOST}: the "
            f"home directory /nonexistent-{user} of {user} does not exist there. Set `workdir:` "
            f"in the inventory to a directory {user} can create and write there") in out, out
    assert "FileNotFoundError" not in out and "Traceback" not in cp.stdout + cp.stderr
    assert "CLUSTERRUN_HOME" not in out  # that is for hosts on this machine only

    # The fix the message gives: the workdir check passes (torch is another matter here).
    cp = check_as(cluster, tmp_path, user, workdir=f"/tmp/clusterrun-{user}")
    assert "workdir" not in cp.stdout, cp.stdout  # only the failed checks are listed
    assert cluster.run_on(HOST, "stat", "-c", "%U %a", f"/tmp/clusterrun-{user}").split() == [
        user, "700"]


def test_a_read_only_home_on_the_host(cluster: Cluster, tmp_path: Path, home: Path,
                                      user: str) -> None:
    ro_home = f"/tmp/home-{user}"  # the host's own /tmp
    cluster.run_on(HOST, "mkdir", "-p", ro_home)
    cluster.run_on(HOST, "chown", user, ro_home)
    subprocess.run(["usermod", "-d", ro_home, user], check=True)
    cluster.run_on(HOST, "mount", "--bind", ro_home, ro_home)
    try:
        cluster.run_on(HOST, "mount", "-o", "remount,bind,ro", ro_home)
        cp = check_as(cluster, tmp_path, user)
    finally:
        cluster.run_on(HOST, "umount", ro_home)
        cluster.run_on(HOST, "rm", "-rf", ro_home)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    out = " ".join(cp.stdout.split())
    assert (f"{HOST}: workdir: cannot use workdir {ro_home}/clusterrun on {HOST}: {ro_home} is "
            "on a read-only filesystem. Set `workdir:`") in out, out
