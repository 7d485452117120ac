"""Scenario 10: inventory edge cases.

- the same machine under two names (its address and an ~/.ssh/config alias): told from the
  probe (boot id and network namespace, since machine-id is shared by namespaces, containers
  and cloned images) and refused by preflight naming both entries; two `localhost` entries
  (the demo) stay allowed;
- YAML booleans (`host: no`, `name: yes`, `user: off`): refused, telling to quote the value;
- 300-character names: refused before any SSH.

The tests without the `cluster` fixture run in the fast tier.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from clusterrun.preflight import checks as preflight
from clusterrun.preflight import twins
from clusterrun.preflight.report import HostReport
from clusterrun.transport import SshOptions
from clusterrun.transport.fake import FakeNetwork, Interface
from clusterrun.transport.pool import Connections
from tests.conftest import (
    LISTEN_HOST,
    Cluster,
    connection_attempted,
    fake_inventory,
    host_spec,
    run_cli,
)
from tests.reliability.conftest import Timed

# ------------------------------------------------------------------ the same machine twice


def machine(boot: str, netns: int = 4026531840) -> dict:
    return {"machine": {"machine_id": "same-image-everywhere", "boot_id": boot, "netns": netns}}


def test_two_names_for_one_machine_fail_preflight_naming_both(tmp_path: Path) -> None:
    net = FakeNetwork()
    for n in (1, 2, 3):
        net.add(f"10.0.0.{n}", Interface("lo", "127.0.0.1/8"), Interface("eth0", f"10.0.0.{n}/24"),
                hostname=f"gpu-{n}", facts=machine(f"boot-{n}"))
    net.hosts["gpu-2.cluster"] = net.hosts["10.0.0.2"]  # a second name, the same machine
    specs = [host_spec("10.0.0.1", "a"), host_spec("10.0.0.2", "b"), host_spec("10.0.0.3", "c"),
             host_spec("gpu-2.cluster", "b-again")]
    with Connections(SshOptions(connect_timeout=1.0), connector=net.connect) as pool:
        report = preflight.run(fake_inventory(tmp_path, *specs), pool)
    hosts = {h.spec.name: h for h in report.hosts}
    failed = [c for c in hosts["b-again"].checks if not c.ok]
    assert [c.name for c in failed] == ["same_machine"], hosts["b-again"].checks
    assert failed[0].detail.startswith("b-again (gpu-2.cluster) and b (10.0.0.2) are the same "
                                       "machine (hostname gpu-2")
    assert "List each machine once" in failed[0].detail
    assert all(hosts[n].ok for n in "abc"), [hosts[n].checks for n in "abc"]
    assert not report.ok


def _report(name: str, facts: dict, **settings: object) -> HostReport:
    report = HostReport(host_spec(name, **settings), 0)
    report.facts = facts
    return report


def test_what_counts_as_the_same_machine() -> None:
    """machine-id alone is not an identity (namespaces, containers and cloned VM images share
    it); the kernel's boot id with the network namespace is."""
    cloned = [_report("vm1", machine("boot-a")), _report("vm2", machine("boot-b"))]
    twins.judge(cloned)
    assert all(r.ok for r in cloned)
    namespaces = [_report("ns1", machine("boot-a", 1)), _report("ns2", machine("boot-a", 2))]
    twins.judge(namespaces)
    assert all(r.ok for r in namespaces)
    containers = [_report("c1", machine("boot-a"), container="train-a"),
                  _report("c2", machine("boot-a"), container="train-b")]
    twins.judge(containers)
    assert all(r.ok for r in containers)
    old_probe = [_report("h1", {"hostname": "x"}), _report("h2", {"hostname": "x"})]
    twins.judge(old_probe)
    assert all(r.ok for r in old_probe)
    same = [_report("h1", machine("boot-a")), _report("h2", machine("boot-a"))]
    twins.judge(same)
    assert same[0].ok and not same[1].ok


def test_two_localhost_nodes_stay_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          timed: Timed) -> None:
    """The demo's inventory: this machine twice, on purpose. The real probe runs here."""
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: localhost\n    name: lo1\n  - host: localhost\n"
                   "    name: lo2\n")
    with timed("two localhost nodes: check passes", 30) as t:
        cp = run_cli("check", "--json", str(inv), timeout=60)
        t.stop()
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "same_machine" not in cp.stdout


def test_one_machine_by_address_and_by_alias_is_refused_on_the_cluster(
        cluster: Cluster, home: Path, tmp_path: Path, payload: Path, timed: Timed) -> None:
    names = ["node18", "node19"]
    alias = "twin-of-node19"
    ssh_alias = tmp_path / "userhome"  # a $HOME whose ~/.ssh/config gives node19 a 2nd name
    (ssh_alias / ".ssh").mkdir(parents=True, mode=0o700)
    (ssh_alias / ".ssh" / "config").write_text(
        f"Host {alias}\n  HostName {cluster.host('node19').address}\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", names)
    text = inv.read_text()
    inv.write_text(text + f"- host: {alias}\n  name: node19-again\n")
    env = {"HOME": str(ssh_alias)}
    with timed("the same machine under two names: check refuses", 20) as t:
        cp = run_cli("check", str(inv), env=env, timeout=60)
        t.stop()
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert (f"node19-again: same_machine: node19-again ({alias}) and node19 "
            f"({cluster.host('node19').address}) are the same machine (hostname node19") in (
        cp.stdout), cp.stdout
    cp = run_cli("launch", str(inv), str(payload), env=env, timeout=60)
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "preflight failed; nothing was started" in cp.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    assert cluster.wait_no_processes(names, 10) == {}
    # Different machines under the same settings pass: the check is about identity.
    inv = cluster.inventory(tmp_path / "inv2.yaml", names)
    cp = run_cli("check", str(inv), env=env, timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr


# ------------------------------------------------------------------ YAML booleans, long names


@pytest.mark.parametrize(("line", "key", "shown"), [
    ("host: no", "host", "False"), ("name: yes", "name", "True"), ("user: off", "user", "False"),
    ("host: on", "host", "True"),
])
def test_yaml_booleans_are_refused_telling_to_quote_them(
        tmp_path: Path, listener: socket.socket, line: str, key: str, *, shown: str,
        timed: Timed) -> None:
    port = listener.getsockname()[1]
    entry = line if key == "host" else f"host: {LISTEN_HOST}\n    {line}"
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  - host: {LISTEN_HOST}\n    port: {port}\n    name: first\n"
                   f"  - {entry}\n    port: {port}\n")
    with timed(f"YAML boolean `{line}`: refused", 5) as t:
        cp = run_cli("check", "--connect-timeout", "2", str(inv), timeout=30)
        t.stop()
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert cp.stderr.startswith(f"clusterrun: error: {inv}:"), cp.stderr
    assert f"as a boolean ({shown}); quote it: {key}: \"...\"." in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr
    assert not connection_attempted(listener)


@pytest.mark.parametrize("field", ["host", "name"])
def test_300_character_names_are_refused_before_any_ssh(
        tmp_path: Path, listener: socket.socket, field: str, timed: Timed) -> None:
    port = listener.getsockname()[1]
    long = "a." * 150
    entry = f"host: {long}" if field == "host" else f"host: {LISTEN_HOST}\n    name: {long}"
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  - host: {LISTEN_HOST}\n    port: {port}\n    name: first\n"
                   f"  - {entry}\n    port: {port}\n")
    with timed(f"300-character {field}: refused before SSH", 5) as t:
        cp = run_cli("check", "--connect-timeout", "2", str(inv), timeout=30)
        t.stop()
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert cp.stderr.startswith(f"clusterrun: error: {inv}:"), cp.stderr
    assert "300 characters" in cp.stderr or "at most 63" in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr and "idna" not in cp.stderr
    assert not connection_attempted(listener)
