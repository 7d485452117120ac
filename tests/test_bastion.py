"""`proxy_jump:` through a real bastion: two hosts refuse SSH from this machine and accept it
from a third; check, copy (rsync), launch, a detached run's `ps` and `stop` all go through it,
and the bastion's own host key is checked."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from clusterrun import sandbox
from clusterrun.sandbox import net
from tests.conftest import Cluster, run_cli
from tests.support import sessions

pytestmark = pytest.mark.cluster

BASTION, BEHIND = "node13", ["node14", "node15"]
TABLE = "clusterrun_bastion_test"


@pytest.fixture
def walled(cluster: Cluster) -> Iterator[None]:
    """BEHIND drop SSH from this machine (the controller); from the bastion it still works."""
    me = cluster.sb.controller_address
    rules = (f"table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n"
             f"  chain input {{ type filter hook input priority 0; policy accept;\n"
             f"    ip saddr {me} tcp dport 22 drop; }}\n}}\n")
    for name in BEHIND:
        net.run(["ip", "netns", "exec", cluster.host(name).netns, "nft", "-f", "-"],
                input=rules, step=f"wall off {name}")
    try:
        yield
    finally:
        for name in BEHIND:
            net.run(["ip", "netns", "exec", cluster.host(name).netns, "nft", "-f", "-"],
                    input=f"table inet {TABLE}\ndelete table inet {TABLE}\n",
                    step=f"open {name} again")
        cluster.kill_all([BASTION, *BEHIND])


def inventory(cluster: Cluster, path: Path, *, jump: bool = True,
              names: Sequence[str] = (BASTION, *BEHIND)) -> Path:
    via = {"proxy_jump": f"root@{cluster.host(BASTION).address}:22"} if jump else {}
    return cluster.inventory(path, names, hosts=dict.fromkeys(BEHIND, via))


def test_hosts_behind_a_bastion_are_checked_and_launched_through_it(
        cluster: Cluster, walled: None, home: Path, tmp_path: Path, payload: Path) -> None:
    direct = run_cli("check", "--connect-timeout", "2", str(inventory(cluster, tmp_path / "d.yaml",
                                                                       jump=False)))
    assert direct.returncode == 4, direct.stdout + direct.stderr  # the wall is real
    inv = inventory(cluster, tmp_path / "inv.yaml")
    check = run_cli("check", str(inv))
    assert check.returncode == 0, check.stdout + check.stderr
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "--env", f"TEST_DIR={test_dir}", str(inv), str(payload), "--x",
                 env={"CLUSTERRUN_SYNC": "rsync"})  # rsync's own ssh through the jump
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.count("rsync: 1 of 1 files copied, all 1 verified") == 3, cp.stderr
    for rank, name in enumerate([BASTION, *BEHIND]):
        record = json.loads(cluster.read(name, f"{test_dir}/rank-{rank}.json"))
        assert record["hostname"] == name and record["argv"] == ["--x"]
    # A detached run: `ps` asks the hosts behind the bastion, `stop` ends it there.
    cp = run_cli("launch", "--detach", "--env", "SLEEP=600", str(inv), str(payload))
    assert cp.returncode == 0, cp.stderr
    run_id = json.loads(run_cli("ps", "--json").stdout)[0]["id"]
    deadline = time.monotonic() + 60
    while not all(cluster.run_processes(n, run_id) for n in BEHIND):
        assert time.monotonic() < deadline, "the detached ranks never started"
        time.sleep(0.5)
    stop = run_cli("stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    # The session's own tunnels through the bastion (an sshd session there for each host
    # behind it, with no process of their own) stay with the session: it ends first.
    sessions.stop_ours()
    assert cluster.wait_no_processes([BASTION, *BEHIND], 30) == {}
    assert json.loads(run_cli("ps", "--json").stdout)[0]["state"] == "stopped"


def test_a_changed_bastion_key_is_refused(cluster: Cluster, walled: None, home: Path,
                                          tmp_path: Path) -> None:
    sandbox.regenerate_host_key(cluster.sb, BASTION)
    try:
        cp = run_cli("check", str(inventory(cluster, tmp_path / "inv.yaml")))
    finally:
        sandbox.restore_host_key(cluster.sb, BASTION)
    assert cp.returncode == 4, cp.stdout + cp.stderr
    text = " ".join((cp.stdout + cp.stderr).split())
    # The hosts behind it are refused because of the bastion's key, and say so.
    address = cluster.host(BASTION).address
    for name in BEHIND:
        assert (f"{name}'s proxy_jump {address}: the host key of {address} has CHANGED"
                in text)
    assert "Traceback" not in text


def test_proxyjump_from_ssh_config_is_used_and_its_key_checked(
        cluster: Cluster, walled: None, home: Path, tmp_path: Path) -> None:
    bastion = cluster.host(BASTION).address
    ssh_dir = tmp_path / "user" / ".ssh"
    ssh_dir.mkdir(parents=True)
    (ssh_dir / "config").write_text("".join(
        f"Host {cluster.host(n).address}\n  ProxyJump root@{bastion}\n" for n in BEHIND))
    # Only the hosts behind the bastion: with the bastion in the inventory, its own entry
    # would fail on its changed key whether or not the hop's key is checked.
    inv = inventory(cluster, tmp_path / "inv.yaml", jump=False, names=BEHIND)
    env = {"HOME": str(tmp_path / "user")}  # paramiko reads ~/.ssh/config through $HOME
    cp = run_cli("check", str(inv), env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    # fabric would accept any key for a hop it makes from ~/.ssh/config; clusterrun does not.
    # A warm session's held connection had its keys checked when it was made (as an OpenSSH
    # ControlMaster's): the check below is a new connection's.
    sessions.stop_ours()
    sandbox.regenerate_host_key(cluster.sb, BASTION)
    try:
        cp = run_cli("check", str(inv), env=env)
    finally:
        sandbox.restore_host_key(cluster.sb, BASTION)
    assert cp.returncode == 4, cp.stdout + cp.stderr
    text = " ".join((cp.stdout + cp.stderr).split())
    # Each host behind it is refused because of the bastion's key, and says whose key it is
    # (the fix removes the bastion's entry, not the host's).
    for name in BEHIND:
        assert (f"{name}'s ProxyJump {bastion} (from ~/.ssh/config): the host key of {bastion} "
                "has CHANGED" in text), text
        assert f"the host key of {cluster.host(name).address} " not in text, text
    assert "Traceback" not in text
