"""What preflight catches beyond SSH and the master's port, on the namespace cluster: a worker
whose firewall admits only SSH and the master port, an MTU that differs, a host whose own name
resolves to loopback, and Python packages that differ on one host.

Each fault is made for real inside a host's namespaces (nftables, `ip link`, the host's own
/etc/hosts, a `setup:` that changes its sys.path) and undone afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node20", "node21", "node22"]
MASTER_PORT = 29517


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every host sees (the hosts' /tmp is each their own)."""
    path = Path("/var/tmp") / f"clusterrun-test-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_json(inv: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    cp = run_cli("check", "--json", *args, str(inv), timeout=120)
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp, json.loads(cp.stdout)


def checks_of(report: dict, host: str) -> dict[str, dict]:
    found = next(h for h in report["hosts"] if h["name"] == host)
    return {c["name"]: c for c in found["checks"]}


@pytest.mark.usefixtures("home")
def test_a_worker_admitting_only_ssh_and_the_master_port_fails_naming_the_pairs(
        cluster: Cluster, tmp_path: Path, payload: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, master_port=MASTER_PORT)
    cluster.admit_only("node22", 22, MASTER_PORT)
    try:
        cp, report = check_json(inv)
        assert cp.returncode == 3, cp.stdout + cp.stderr
        node22 = checks_of(report, "node22")
        # What the check proved before: the worker reaches the master on both ports...
        assert node22["data_path"]["ok"], node22["data_path"]
        # ...and what it proves now: nobody reaches the worker on an ephemeral port.
        assert not node22["pairs"]["ok"]
        assert "node[20-21] cannot connect to node22" in node22["pairs"]["detail"]
        assert "ip_local_port_range" in node22["pairs"]["detail"]
        assert checks_of(report, "node20")["pairs"]["ok"]
        assert checks_of(report, "node21")["pairs"]["ok"]
        assert sorted((b["from"], b["to"]) for b in report["pairs"]["blocked"]) == [
            ("node20", "node22"), ("node21", "node22")]

        started = time.monotonic()
        cp = run_cli("check", str(inv), timeout=120)
        took = time.monotonic() - started
        assert cp.returncode == 3
        # One connect timeout (5 s) for the blocked pairs, not one per pair.
        assert took < 20, took
        assert "pairs: 2 of 6 connections between hosts failed" in cp.stdout
        assert "node22: pairs: node[20-21] cannot connect to node22" in cp.stdout

        cp = run_cli("launch", str(inv), str(payload), timeout=120)
        assert cp.returncode == 3, cp.stdout + cp.stderr
        assert "preflight failed; nothing was started" in cp.stderr
    finally:
        cluster.admit_all("node22")
    cp, report = check_json(inv)
    assert cp.returncode == 0, cp.stdout


@pytest.mark.usefixtures("home")
def test_an_odd_mtu_and_a_name_on_loopback_are_named(cluster: Cluster, tmp_path: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    nic = cluster.host("node21").ifname
    hosts_file = cluster.sb.root / "node22" / "hosts"
    saved = hosts_file.read_text()
    cluster.run_on("node21", "ip", "link", "set", nic, "mtu", "1400")
    try:
        # Written in place: the host's /etc/hosts is a bind mount of this file.
        hosts_file.write_text("127.0.1.1 node22\n" + saved)
        cp = run_cli("check", str(inv), timeout=120)
        assert cp.returncode == 0, cp.stdout + cp.stderr  # warnings, not failures
        assert f"node21: mtu: warning: MTU 1400 on {nic} of node21, but 1500" in cp.stdout
        assert "node22: names: warning: node22's own name 'node22' resolves to 127.0.1.1" \
            in cp.stdout
    finally:
        cluster.run_on("node21", "ip", "link", "set", nic, "mtu", "1500")
        hosts_file.write_text(saved)


@pytest.mark.usefixtures("home")
def test_a_package_version_that_differs_on_one_host_is_named(
        cluster: Cluster, tmp_path: Path, shared_dir: Path) -> None:
    for folder, version in (("a", "1.0"), ("b", "2.0")):
        (shared_dir / folder / f"tokenizer_kit-{version}.dist-info").mkdir(parents=True)
    (shared_dir / "b" / "only_on_b-0.1.dist-info").mkdir()
    setup = {name: {"setup": f"export PYTHONPATH={shared_dir / 'a'}"} for name in HOSTS}
    setup["node22"] = {"setup": f"export PYTHONPATH={shared_dir / 'b'}"}
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, hosts=setup)
    cp, report = check_json(inv)
    assert cp.returncode == 0, cp.stdout
    detail = checks_of(report, "node22")["packages"]["detail"]
    assert detail.startswith("warning: Python packages on node22 differ from node20's")
    assert "tokenizer-kit 2.0 (1.0 on node20)" in detail
    assert "only-on-b 0.1 (not installed on node20)" in detail
    assert not checks_of(report, "node21")["packages"]["detail"].startswith("warning")


def test_sandbox_hosts_have_their_own_hosts_file(cluster: Cluster) -> None:
    """What the loopback test relies on: the file under the sandbox root is the host's."""
    assert "node22" in cluster.read("node22", "/etc/hosts")
    assert sandbox.exec_in(cluster.sb, "node22", ["hostname"], capture_output=True,
                           text=True, check=True).stdout.strip() == "node22"


@pytest.fixture
def fake_infiniband(cluster: Cluster, shared_dir: Path) -> Iterator[str]:
    """node22 gets an ACTIVE mlx5_0 port: /sys/class/infiniband appears in its mount
    namespace through a read-only overlay on /sys/class (sysfs allows no mkdir), the rest of
    /sys/class as it was."""
    port = shared_dir / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    cluster.run_on("node22", "mount", "-t", "overlay", "overlay", "-o",
                   f"lowerdir={shared_dir / 'class'}:/sys/class", "/sys/class")
    try:
        yield "node22"
    finally:
        cluster.run_on("node22", "umount", "/sys/class")


@pytest.mark.usefixtures("home")
def test_rdma_ports_memlock_and_nccl_ib_hca_are_checked_where_the_job_runs(
        cluster: Cluster, tmp_path: Path, fake_infiniband: str) -> None:
    assert "mlx5_0" in cluster.run_on(fake_infiniband, "ls", "/sys/class/infiniband")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS,
                            defaults={"env": {"NCCL_IB_HCA": "=mlx5_1"}})
    cp, report = check_json(inv)
    assert cp.returncode == 3, report
    node22 = checks_of(report, "node22")
    assert not node22["nccl_ib_hca"]["ok"]
    assert "names 'mlx5_1', which node22 does not have (its RDMA devices: mlx5_0)" in \
        node22["nccl_ib_hca"]["detail"]
    # The sandbox's locked-memory limit (a few MiB, and no privilege here to raise it) is the
    # classic container default that breaks RDMA registration.
    assert not node22["memlock"]["ok"] and "ulimit -l unlimited" in node22["memlock"]["detail"]
    assert node22["infiniband"]["warning"]
    assert "node22 has an active RDMA port but node[20-21] have none" in \
        node22["infiniband"]["detail"]
    for other in ("node20", "node21"):  # no RDMA there: nothing to lock, a name is only a hint
        found = checks_of(report, other)
        assert "memlock" not in found and found["nccl_ib_hca"]["warning"]

    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    cp, report = check_json(inv)
    assert "nccl_ib_hca" not in checks_of(report, "node22")
    assert [h["name"] for h in report["hosts"] if not h["ok"]] == ["node22"]
