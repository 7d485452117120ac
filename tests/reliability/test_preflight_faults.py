"""Scenario 7: hosts that cannot be trusted or that never answer, in `check`, `exec` and `launch`.

- one of 16 hosts drops SYNs to its SSH port (nft): every command ends in about one connect
  timeout plus its own work, naming the host as a timeout;
- a tarpit (a listener that accepts TCP and never sends an SSH banner) behind an inventory
  `port:`: the same bound, named as a timeout with the TCP connection open;
- an unknown host key: refused with the key's SHA256 fingerprint as `ssh-keygen -lf` prints it;
- a changed host key: refused even with --accept-new-host-keys; known_hosts is left unchanged.

Nothing may run on the host refused: no process appears there but its sshd.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, run_cli
from tests.reliability.conftest import Timed

HOSTS16 = [f"node{k}" for k in range(9, 25)]
DROPPING = "node24"
TARPIT = "node12"
TARPIT_PORT = 2222
UNKNOWN = "node13"
CHANGED = "node14"
TABLE = "clusterrun_reliability_syn"
CONNECT = 3  # --connect-timeout used where the bound is asserted


def commands(inv: Path, payload: Path, *extra: str) -> dict[str, list[str]]:
    return {"check": ["check", *extra, str(inv)],
            "exec": ["exec", *extra, str(inv), "--", "hostname"],
            "launch": ["launch", *extra, str(inv), str(payload)]}


def fingerprint(pubkey: Path) -> str:
    """What OpenSSH itself prints as the key's fingerprint (SHA256:...)."""
    out = subprocess.run(["ssh-keygen", "-lf", str(pubkey)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]


@pytest.fixture
def syn_drop(cluster: Cluster) -> Iterator[str]:
    netns = cluster.host(DROPPING).netns
    rules = (f"table inet {TABLE} {{\n  chain input {{\n"
             "    type filter hook input priority 0;\n    tcp dport 22 drop\n  }\n}\n")
    subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules, text=True,
                   check=True)
    try:
        yield DROPPING
    finally:
        subprocess.run(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", TABLE],
                       check=True)


TARPIT_CODE = """
import socket, sys
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.listen(128)
print("listening", flush=True)
held = []
while True:
    conn, _ = sock.accept()
    held.append(conn)  # accepted, never answered, never closed
"""


@pytest.fixture
def tarpit(cluster: Cluster) -> Iterator[int]:
    host = cluster.host(TARPIT)
    proc = subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-c",
                             TARPIT_CODE, host.address, str(TARPIT_PORT)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        yield TARPIT_PORT
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.usefixtures("home", "syn_drop")
def test_one_of_16_hosts_dropping_syns_costs_one_connect_timeout(
        cluster: Cluster, tmp_path: Path, payload: Path, timed: Timed) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS16)
    for command, argv in commands(inv, payload, "--connect-timeout", str(CONNECT)).items():
        # The connect timeout, then the 15 other hosts' own work: 16 probes (or hostnames)
        # on a loaded 2-core machine.
        with timed(f"1 of 16 hosts drops SYNs: {command} --connect-timeout {CONNECT}",
                   CONNECT + 17) as t:
            cp = run_cli(*argv, timeout=120)
            t.stop()
        assert cp.returncode == 4, (command, cp.stdout, cp.stderr)
        text = cp.stdout + cp.stderr
        assert "Traceback" not in text
        assert f"{DROPPING}" in text and f"no SSH answer within {CONNECT} s" in text, text
        assert "connect timeout" in text
        if command == "exec":
            assert cp.stdout.count("node") >= 15  # the other hosts did answer
    with timed("1 of 16 hosts drops SYNs: check with the default 10 s connect timeout", 27) as t:
        cp = run_cli("check", str(inv), timeout=120)
        t.stop()
    assert cp.returncode == 4 and "no SSH answer within 10 s" in cp.stdout, cp.stdout
    assert cluster.wait_no_processes([DROPPING], 5) == {}


@pytest.mark.usefixtures("home")
def test_a_tarpit_that_never_sends_a_banner_is_a_named_timeout(
        cluster: Cluster, tmp_path: Path, payload: Path, tarpit: int, timed: Timed) -> None:
    names = ["node9", "node10", "node11", TARPIT]
    inv = cluster.inventory(tmp_path / "inv.yaml", names, hosts={TARPIT: {"port": tarpit}})
    for command, argv in commands(inv, payload, "--connect-timeout", str(CONNECT)).items():
        with timed(f"tarpit (TCP open, no banner): {command} --connect-timeout {CONNECT}",
                   CONNECT + 12) as t:
            cp = run_cli(*argv, timeout=120)
            t.stop()
        assert cp.returncode == 4, (command, cp.stdout, cp.stderr)
        text = cp.stdout + cp.stderr
        assert "Traceback" not in text
        assert f"{TARPIT} (root@{cluster.host(TARPIT).address}:{tarpit})" in text or (
            command == "exec" and f"{TARPIT}: timeout" in text), text
        assert f"no SSH answer within {CONNECT} s" in text
        # Not "the host is down": the TCP connection did open.
        assert "the TCP connection opened but the SSH handshake did not finish" in text, text
    # What ran on the tarpit host: nothing but its sshd (and the tarpit itself).
    left = [c for c in cluster.wait_no_processes([TARPIT], 1).get(TARPIT, [])
            if "held.append" not in c and "ip netns exec" not in c]
    assert left == []


def _known_hosts_without(cluster: Cluster, tmp_path: Path, name: str) -> Path:
    skip = cluster.host(name).address
    path = tmp_path / "known_hosts"
    path.write_text("".join(line for line in cluster.sb.known_hosts.read_text().splitlines(
        keepends=True) if line.split()[0] != skip))
    return path


@pytest.mark.usefixtures("home")
def test_an_unknown_host_key_is_refused_with_its_fingerprint(
        cluster: Cluster, tmp_path: Path, payload: Path, timed: Timed) -> None:
    names = ["node9", "node10", UNKNOWN]
    known = _known_hosts_without(cluster, tmp_path, UNKNOWN)
    before = known.read_bytes()
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"known_hosts": str(known)})
    expected = fingerprint(cluster.sb.root / UNKNOWN / "ssh_host_ed25519_key.pub")
    assert expected.startswith("SHA256:")
    for command, argv in commands(inv, payload).items():
        with timed(f"unknown host key: {command} refuses", 20) as t:
            cp = run_cli(*argv, timeout=60)
            t.stop()
        assert cp.returncode == 4, (command, cp.stdout, cp.stderr)
        text = cp.stdout + cp.stderr
        assert f"the host key of {cluster.host(UNKNOWN).address} is not in {known}" in text, text
        assert f"ssh-ed25519 {expected})" in text, text
        assert "--accept-new-host-keys" in text
        assert known.read_bytes() == before
    assert cluster.wait_no_processes([UNKNOWN], 5) == {}


@pytest.mark.usefixtures("home")
def test_a_changed_host_key_is_refused_even_with_accept_new(
        cluster: Cluster, tmp_path: Path, payload: Path, timed: Timed) -> None:
    names = ["node9", "node10", CHANGED]
    known = tmp_path / "known_hosts"
    known.write_bytes(cluster.sb.known_hosts.read_bytes())
    before = known.read_bytes()
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"known_hosts": str(known)})
    old = fingerprint(cluster.sb.root / CHANGED / "ssh_host_ed25519_key.pub")
    sandbox.regenerate_host_key(cluster.sb, CHANGED)
    try:
        new = fingerprint(cluster.sb.root / CHANGED / "ssh_host_ed25519_key.pub")
        assert new != old
        for command, argv in commands(inv, payload, "--accept-new-host-keys").items():
            with timed(f"changed host key: {command} --accept-new-host-keys refuses", 20) as t:
                cp = run_cli(*argv, timeout=60)
                t.stop()
            assert cp.returncode == 4, (command, cp.stdout, cp.stderr)
            text = cp.stdout + cp.stderr
            assert f"the host key of {cluster.host(CHANGED).address} has CHANGED" in text, text
            assert new in text and old in text
            assert known.read_bytes() == before
            assert cluster.wait_no_processes([CHANGED], 5) == {}
    finally:
        sandbox.restore_host_key(cluster.sb, CHANGED)
    cp = run_cli("exec", str(inv), "--", "hostname", timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr
