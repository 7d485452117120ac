"""The namespace sandbox is a real cluster: every assertion looks at what the hosts really do.

These tests fail (never skip) when the sandbox cannot be built: CI must notice.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clusterrun import sandbox
from clusterrun.errors import SandboxError
from clusterrun.sandbox import net as sandbox_net
from clusterrun.sandbox import sshd as sandbox_sshd

pytestmark = pytest.mark.cluster


def ssh(sb: sandbox.Sandbox, address: str, *command: str, connect_timeout: int = 5,
        known_hosts: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real OpenSSH client, strict host keys, nothing from the user's ~/.ssh."""
    argv = [
        "ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts or sb.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
        "-o", f"ConnectTimeout={connect_timeout}", "-i", str(sb.identity_file),
        f"root@{address}", *command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def inside(sb: sandbox.Sandbox, host: str, *argv: str) -> str:
    cp = sandbox.exec_in(sb, host, argv, capture_output=True, text=True, timeout=30, check=True)
    return str(cp.stdout)


def leftovers(prefix: str) -> dict[str, list[str]]:
    """Every trace of a sandbox in the kernel and the process table."""
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    procs = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if f"/run/clusterrun-sandbox/{prefix}".encode() in cmdline:
                procs.append(entry.name)
    return {
        "netns": [line for line in spaces.stdout.splitlines() if prefix in line],
        "links": [line.split(":")[1] for line in links.stdout.splitlines() if prefix in line],
        "processes": procs,
        "mountpoint": [str(p) for p in [sandbox_net.RUN_DIR / prefix] if p.exists()],
    }


def settled_pids(sb: sandbox.Sandbox, host: str, expected: list[int]) -> list[int]:
    """pids() once it equals expected, or after 5 s: sshd session processes end a few ms
    after the client has returned."""
    deadline = time.monotonic() + 5
    while (found := sandbox.pids(sb, host)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


NOTHING: dict[str, list[str]] = {"netns": [], "links": [], "processes": [], "mountpoint": []}


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sandbox.Sandbox]:
    root = tmp_path_factory.mktemp("sandbox4")
    built = sandbox.up(4, root, decoy=True)
    yield built
    sandbox.down(root)
    assert leftovers(built.prefix) == NOTHING


def test_state_inventory_and_known_hosts(sb: sandbox.Sandbox) -> None:
    assert sandbox.load(sb.root) == sb
    assert (sb.root.stat().st_mode & 0o777) == 0o700
    assert [h.name for h in sb.hosts] == ["node1", "node2", "node3", "node4"]
    assert [h.ifname for h in sb.hosts] == ["eth0", "ens5", "enp3s0", "eno1"]
    subnet = ipaddress.IPv4Network(sb.subnet)
    assert subnet.prefixlen == 24
    assert subnet.subnet_of(ipaddress.IPv4Network("10.0.0.0/8"))
    assert sb.controller_address == str(subnet[1])
    assert [h.address for h in sb.hosts] == [str(subnet[k]) for k in (11, 12, 13, 14)]
    names = [sb.bridge] + [h.veth for h in sb.hosts] + [h.netns for h in sb.hosts]
    assert all(len(name) <= 15 and sb.prefix in name for name in names)

    text = sb.inventory.read_text()
    assert text.startswith("# clusterrun sandbox: 4 hosts in network namespaces")
    inv = yaml.safe_load(text)
    assert inv == {
        "defaults": {"user": "root", "identity_file": str(sb.identity_file),
                     "known_hosts": str(sb.known_hosts), "python": sys.executable,
                     "workdir": "/tmp/clusterrun"},
        "hosts": [{"host": h.address, "name": h.name} for h in sb.hosts],
    }
    assert (sb.known_hosts.stat().st_mode & 0o777) == 0o600
    lines = sb.known_hosts.read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [[h.address, "ssh-ed25519"] for h in sb.hosts]


def test_each_host_answers_ssh_with_its_own_hostname(sb: sandbox.Sandbox) -> None:
    for host in sb.hosts:
        cp = ssh(sb, host.address, "hostname")
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.strip() == host.name
        assert inside(sb, host.name, "hostname").strip() == host.name


def test_logins_tell_sshd_s_shells_from_those_a_command_starts(sb: sandbox.Sandbox) -> None:
    host = sb.hosts[0]
    before = (sandbox.logins(sb, host.name), sandbox.logins(sb, host.name, from_sshd=True))
    # sshd's shell reads ~/.bashrc (a login); so does the bash it starts, as bash does for
    # `exec`'s $SHELL -c, since SSH_CLIENT is set and SHLVL says it is the first shell.
    done = ssh(sb, host.address, "SHLVL=0 bash -c true; true")  # not exec()ed in place
    assert done.returncode == 0, done.stderr
    after = (sandbox.logins(sb, host.name), sandbox.logins(sb, host.name, from_sshd=True))
    assert (after[0] - before[0], after[1] - before[1]) == (2, 1)
    lines = (sb.root / host.name / sandbox_sshd.LOGINS).read_text().splitlines()
    assert [line.split()[1:] for line in lines[-2:]] == [["sshd"], ["bash"]]


def test_each_host_sees_its_own_nic_and_the_decoy(sb: sandbox.Sandbox) -> None:
    for host in sb.hosts:
        addrs = {}
        for line in inside(sb, host.name, "ip", "-o", "-4", "addr", "show").splitlines():
            fields = line.split()
            addrs[fields[1]] = fields[3]
        assert addrs == {"lo": "127.0.0.1/8", host.ifname: f"{host.address}/24",
                         "virbr0": "192.168.122.1/24"}
        links = inside(sb, host.name, "ip", "-o", "link", "show")
        names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
        assert names == {"lo", host.ifname, "virbr0", "virbr0-nic"}
        assert f"{host.ifname}@" in links
        assert "state UP" in links


def test_tmp_is_private_to_each_host(sb: sandbox.Sandbox) -> None:
    name = f"clusterrun-sandbox-test-{uuid.uuid4().hex}"
    cp = ssh(sb, sb.hosts[0].address, f"echo from-node1 > /tmp/{name}")
    assert cp.returncode == 0, cp.stderr
    # exec_in enters the same mount namespace as the SSH session.
    assert inside(sb, "node1", "cat", f"/tmp/{name}") == "from-node1\n"
    assert sandbox.exec_in(sb, "node2", ["test", "-e", f"/tmp/{name}"]).returncode == 1
    assert not (Path("/tmp") / name).exists()
    assert (sb.root / "node1" / "tmp" / name).exists()
    mode = inside(sb, "node2", "stat", "-c", "%a", "/tmp").strip()
    assert mode == "1777"


def test_names_resolve_fast_from_the_hosts_file(sb: sandbox.Sandbox) -> None:
    started = time.monotonic()
    out = inside(sb, "node1", "getent", "hosts", "node3")
    assert out.split() == [sb.hosts[2].address, "node3"]
    assert time.monotonic() - started < 1.0
    # What torch does: look its own hostname up.
    started = time.monotonic()
    code = "import socket; print(socket.gethostbyname(socket.gethostname()))"
    assert inside(sb, "node2", sys.executable, "-c", code).strip() == sb.hosts[1].address
    assert time.monotonic() - started < 2.0
    # An unknown name fails at once instead of waiting for the machine's unreachable resolver.
    started = time.monotonic()
    unknown = sandbox.exec_in(sb, "node4", ["getent", "hosts", "no-such-host.invalid"])
    assert unknown.returncode != 0
    assert time.monotonic() - started < 2.0


def test_partition_cuts_a_host_off_and_heal_restores_it(sb: sandbox.Sandbox) -> None:
    node3 = sb.hosts[2]
    sandbox.partition(sb, "node3")
    try:
        cp = ssh(sb, node3.address, "hostname", connect_timeout=2)
        assert cp.returncode == 255
        assert "timed out" in cp.stderr
        # From another host too, and loopback inside the partitioned host still works.
        probe = "import socket,sys; socket.create_connection((sys.argv[1], 22), 1)"
        other = sandbox.exec_in(sb, "node1", [sys.executable, "-c", probe, node3.address],
                                capture_output=True, text=True)
        assert other.returncode != 0
        assert "timed out" in other.stderr
        assert inside(sb, "node3", "getent", "hosts", "localhost").split()[0] == "127.0.0.1"
    finally:
        sandbox.heal(sb, "node3")
    cp = ssh(sb, node3.address, "hostname")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "node3"
    sandbox.heal(sb, "node3")  # healing a healthy host is a no-op


def test_pids_lists_what_runs_on_a_host(sb: sandbox.Sandbox) -> None:
    node2 = sb.hosts[1]
    assert settled_pids(sb, "node2", []) == []
    cp = ssh(sb, node2.address, "sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    assert cp.returncode == 0, cp.stderr
    pid = int(cp.stdout.strip())
    try:
        # The SSH session has ended; its sleep lives on, as an orphan would on a real host.
        assert settled_pids(sb, "node2", [pid]) == [pid]
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
        assert pid not in sandbox.pids(sb, "node1")
        assert node2.sshd_pid not in sandbox.pids(sb, "node2")
    finally:
        os.kill(pid, 9)


def test_changed_host_key_is_refused_until_restored(sb: sandbox.Sandbox) -> None:
    node4 = sb.hosts[3]
    sandbox.regenerate_host_key(sb, "node4")
    try:
        cp = ssh(sb, node4.address, "hostname")
        assert cp.returncode == 255
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in cp.stderr
        # Same sshd, same namespaces: the host keeps its identity apart from the key.
        assert node4.sshd_pid in sandbox_net.netns_pids(node4.netns)
        assert inside(sb, "node4", "hostname").strip() == "node4"
    finally:
        sandbox.restore_host_key(sb, "node4")
    cp = ssh(sb, node4.address, "hostname")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "node4"
    assert settled_pids(sb, "node4", []) == []


def test_add_network_gives_every_host_a_second_reachable_nic(sb: sandbox.Sandbox) -> None:
    added = sandbox.add_network(sb)
    reloaded = sandbox.load(sb.root)
    (network,) = reloaded.networks
    assert added == {nic.host: nic.address for nic in network.nics}
    assert set(added) == {h.name for h in sb.hosts}
    new_subnet = ipaddress.ip_network(network.subnet)
    assert not new_subnet.overlaps(ipaddress.ip_network(sb.subnet))
    assert all(ipaddress.ip_address(a) in new_subnet for a in added.values())
    ifnames = [nic.ifname for nic in network.nics]
    assert ifnames == ["ib0", "ens6", "enp3s1", "eno2"]
    for host, nic in zip(sb.hosts, network.nics):
        out = inside(sb, host.name, "ip", "-o", "-4", "addr", "show", "dev", nic.ifname)
        assert f"{nic.address}/24" in out
    # Another host reaches node1's new address over its own new NIC: a refused connection
    # to a closed port proves the packet arrived and node1 answered.
    route = inside(sb, "node2", "ip", "route", "get", added["node1"])
    assert f"dev {network.nics[1].ifname}" in route
    probe = ("import socket,sys\n"
             "try: socket.create_connection((sys.argv[1], 9), 2)\n"
             "except ConnectionRefusedError: print('refused')\n")
    assert inside(sb, "node2", sys.executable, "-c", probe, added["node1"]).strip() == "refused"
    with pytest.raises(SandboxError, match="one interface name per host"):
        sandbox.add_network(sb, ifnames=["x0"])
    with pytest.raises(SandboxError, match="cannot be a new interface"):
        sandbox.add_network(sb, ifnames=["eth0", "ens5", "ib9", "ib8"])


def test_32_hosts_come_up_fast_and_go_away_completely(tmp_path: Path) -> None:
    root = tmp_path / "sb32"
    started = time.monotonic()
    sb = sandbox.up(32, root)
    elapsed = time.monotonic() - started
    try:
        print(f"32 hosts up in {elapsed:.2f} s")
        assert elapsed < 20
        assert len({h.ifname for h in sb.hosts}) == 32
        assert len({h.address for h in sb.hosts}) == 32
        for host in sb.hosts:
            assert inside(sb, host.name, "hostname").strip() == host.name
        last = sb.hosts[-1]
        cp = ssh(sb, last.address, "hostname")
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.strip() == "node32"
        sandbox.add_network(sb)
        sandbox.partition(sb, "node5")
    finally:
        sandbox.down(root)
    assert leftovers(sb.prefix) == NOTHING
    assert not root.exists()
    sandbox.down(root)  # idempotent


def test_failed_up_removes_what_it_built(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    prefixes: list[str] = []
    real_new_prefix = sandbox_net.new_prefix

    def recording_new_prefix() -> str:
        prefixes.append(real_new_prefix())
        return prefixes[-1]

    monkeypatch.setattr(sandbox_net, "new_prefix", recording_new_prefix)
    # sshd fails after the namespaces, bridge and veths exist: the latest possible step.
    monkeypatch.setattr(sandbox_sshd, "SSHD", shutil.which("false"))
    root = tmp_path / "broken"
    with pytest.raises(SandboxError) as info:
        sandbox.up(2, root)
    message = info.value.message
    assert message.startswith("sandbox up failed: start sshd on node")
    assert "everything it had built was removed" in message
    assert leftovers(prefixes[0]) == NOTHING
    assert not root.exists()


def test_up_refuses_a_directory_that_holds_something_else(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SandboxError, match="not an empty directory"):
        sandbox.up(1, tmp_path)
    sandbox.down(tmp_path)  # no sandbox state: leaves the directory alone
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    with pytest.raises(SandboxError, match="no sandbox at"):
        sandbox.load(tmp_path)


def test_require_support_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox.require_support()  # this machine must be able to run the cluster tests
    monkeypatch.setattr(sandbox_sshd, "SSHD", "/nonexistent/sshd")
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError) as info:
        sandbox.require_support()
    message = info.value.message
    for needle in ("root", "sudo", "apt-get install openssh-server", "apt-get install iproute2",
                   "unshare", "nsenter", "apt-get install util-linux",
                   "apt-get install openssh-client"):
        assert needle in message
    assert "\n" not in message
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(SandboxError, match=re.escape("needs Linux")):
        sandbox.require_support()


def test_a_python_under_tmp_is_shared_with_the_hosts() -> None:
    """The hosts' own /tmp would hide a venv in a checkout under /tmp (as CI may have)."""
    assert sandbox_sshd.shared_under_tmp("/tmp/ci/.venv/bin/python") == ["/tmp/ci/.venv"]
    assert sandbox_sshd.shared_under_tmp("/usr/bin/python3") == []
