"""Hosts known only from ~/.ssh/config, named on the command line with no inventory file:
`exec 'gpu[1-4]' -- ...` and `launch -w 'gpu[1-3]' ...` reach them as OpenSSH would, as a
normal user, with a key of no default name, one host on another port and one behind a
ProxyJump bastion (both walled off from direct SSH, so only the config's way in works).
Without a network: tests/test_adhoc_unit.py."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterrun.sandbox import net
from tests.conftest import Cluster, copy_payload, run_cli
from tests.support import users

pytestmark = pytest.mark.cluster

# gpu1: sshd answers on port 2222 only (to this machine); gpu2: only through the bastion.
ALIASES = {"gpu1": "node5", "gpu2": "node6", "gpu3": "node7", "gpu4": "node8"}
BASTION = "node9"
PORT = 2222
TABLE = "clusterrun_adhoc_test"


@dataclass(frozen=True)
class Lab:
    user: str
    home: Path  # $HOME of whoever runs clusterrun here: its ~/.ssh is all that says how

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "SSH_AUTH_SOCK": ""}


def _nft(cluster: Cluster, name: str, rules: str) -> None:
    net.run(["ip", "netns", "exec", cluster.host(name).netns, "nft", "-f", "-"], input=rules,
            step=f"nft on {name}")


def _walls(cluster: Cluster) -> dict[str, str]:
    """gpu1: port 2222 leads to sshd, port 22 is closed to this machine; gpu2: closed to this
    machine (the bastion still reaches it)."""
    me = cluster.sb.controller_address
    ported = (f"table ip {TABLE} {{\n"
              "  chain pre { type nat hook prerouting priority -100; policy accept;\n"
              f"    tcp dport {PORT} redirect to :22; }}\n"
              "  chain input { type filter hook input priority 0; policy accept;\n"
              f"    ip saddr {me} tcp dport 22 ct status dnat accept;\n"
              f"    ip saddr {me} tcp dport 22 drop; }}\n}}\n")
    walled = (f"table ip {TABLE} {{\n"
              "  chain input { type filter hook input priority 0; policy accept;\n"
              f"    ip saddr {me} tcp dport 22 drop; }}\n}}\n")
    return {ALIASES["gpu1"]: ported, ALIASES["gpu2"]: walled}


@pytest.fixture
def lab(cluster: Cluster, tmp_path: Path) -> Iterator[Lab]:
    """A normal user on the hosts, and a $HOME here whose ~/.ssh/config alone knows them."""
    user = users.add(cluster.sb)
    home = tmp_path / "me"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    key = ssh / "lab_ed25519"  # not a name ssh or paramiko would try by themselves
    shutil.copyfile(cluster.sb.identity_file, key)
    key.chmod(0o600)
    address = {alias: cluster.host(name).address for alias, name in ALIASES.items()}
    (ssh / "config").write_text(
        f"Host gpu1\n  HostName {address['gpu1']}\n  Port {PORT}\n"
        f"Host gpu2\n  HostName {address['gpu2']}\n  ProxyJump jump\n"
        f"Host gpu3\n  HostName {address['gpu3']}\n"
        f"Host gpu4\n  HostName {address['gpu4']}\n"
        f"Host jump\n  HostName {cluster.host(BASTION).address}\n"
        f"Host gpu* jump\n  User {user}\n  IdentityFile {key}\n")
    known = cluster.sb.known_hosts.read_text()
    first = next(line for line in known.splitlines()
                 if line.split()[0] == address["gpu1"])
    (ssh / "known_hosts").write_text(known + f"[{address['gpu1']}]:{PORT} "
                                     + " ".join(first.split()[1:]) + "\n")
    walls = _walls(cluster)
    for name, rules in walls.items():
        _nft(cluster, name, rules)
    try:
        yield Lab(user, home)
    finally:
        for name in walls:
            _nft(cluster, name, f"table ip {TABLE}\ndelete table ip {TABLE}\n")
        cluster.kill_all([*ALIASES.values(), BASTION])
        users.remove(user)


def test_the_walls_are_real(cluster: Cluster, lab: Lab, home: Path, tmp_path: Path) -> None:
    """Port 22 of gpu1 and gpu2 is closed to this machine: what the tests below reach there,
    they reach the config's way (its Port, its ProxyJump)."""
    inv = cluster.inventory(tmp_path / "direct.yaml", [ALIASES["gpu1"], ALIASES["gpu2"]])
    cp = run_cli("exec", "--connect-timeout", "2", str(inv), "--", "true")
    assert cp.returncode == 4, cp.stdout + cp.stderr


def test_exec_on_a_host_list_from_ssh_config(cluster: Cluster, lab: Lab, home: Path) -> None:
    cp = run_cli("exec", "gpu[1-4]", "--", "echo $(hostname) $(id -un) ${SSH_CONNECTION:-none}",
                 env=lab.env())
    assert cp.returncode == 0, cp.stdout + cp.stderr
    said = dict(line.split(": ", 1) for line in cp.stdout.splitlines())
    assert sorted(said) == sorted(ALIASES)
    for alias, node in ALIASES.items():
        hostname, user, client, _, server, port = said[alias].split()
        assert (hostname, user) == (node, lab.user), said[alias]
        assert server == cluster.host(node).address and port == "22"
        # gpu2's connection came from the bastion, every other one from this machine.
        via = cluster.host(BASTION).address if alias == "gpu2" else cluster.sb.controller_address
        assert client == via, said[alias]
    assert "Traceback" not in cp.stderr


def test_launch_with_w_alone_from_ssh_config(cluster: Cluster, lab: Lab, home: Path,
                                             tmp_path: Path, shared_python: str) -> None:
    script = copy_payload(tmp_path, "report.py")
    test_dir = f"/tmp/clusterrun-adhoc-{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "-w", "gpu[1-3]", "--python", shared_python, "--master", "gpu3",
                 "--nproc-per-node", "1", "--env", f"TEST_DIR={test_dir}", str(script), "--x",
                 env=lab.env())
    assert cp.returncode == 0, cp.stdout + cp.stderr
    # --master: gpu3 is rank 0; the others follow in the order given.
    for rank, alias in enumerate(["gpu3", "gpu1", "gpu2"]):
        node = ALIASES[alias]
        record = json.loads(cluster.read(node, f"{test_dir}/rank-{rank}.json"))
        assert record["hostname"] == node and record["argv"] == ["--x"]
        assert record["env"]["USER"] == lab.user and record["env"]["WORLD_SIZE"] == "3"
        assert record["env"]["MASTER_ADDR"] == cluster.host(ALIASES["gpu3"]).address
        # The default workdir, in that user's home.
        assert record["cwd"].startswith(f"/home/{lab.user}/clusterrun/"), record["cwd"]
        assert f"[{alias} r{rank}] report rank {rank} on {node}" in cp.stdout
    assert cluster.wait_no_processes(list(ALIASES.values())[:3], 20) == {}
