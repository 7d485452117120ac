"""What preflight catches beyond reachability, judged from facts and the fake transport (no root):
every pair of hosts, names, software parity, limits, links and RDMA, and the report that
folds one problem shared by several hosts into one line.

The same checks against real sshd, nftables, MTUs and tc are in test_preflight_cluster.py.
"""

from __future__ import annotations

import errno
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterrun.preflight import checks as preflight
from clusterrun.preflight import limits, mesh, names, parity, view
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.net_facts import lookups
from clusterrun.preflight.report import Blocked, CheckReport, HostReport, Pairs
from clusterrun.remote.probe import meshtest as remote_mesh
from clusterrun.remote.probe import sysinfo
from clusterrun.transport import SshOptions
from clusterrun.transport.fake import FakeNetwork, Interface
from clusterrun.transport.pool import Connections
from tests.conftest import fake_inventory, host_spec

GiB = 1 << 30


def four_hosts(net: FakeNetwork, **per_host: dict[str, Any]) -> None:
    for n in range(1, 5):
        net.add(f"10.0.0.{n}", Interface("eth0", f"10.0.0.{n}/24"), hostname=f"node{n}",
                **per_host.get(f"node{n}", {}))


def check(net: FakeNetwork, tmp_path: Path, **top: object) -> CheckReport:
    specs = [host_spec(f"10.0.0.{n}", f"node{n}") for n in range(1, 5)]
    inv = fake_inventory(tmp_path, *specs, **top)
    with Connections(SshOptions(connect_timeout=1.0), connector=net.connect) as pool:
        return preflight.run(inv, pool)


def named(report: CheckReport, host: str, check: str) -> list[tuple[bool, str]]:
    found = next(h for h in report.hosts if h.spec.name == host)
    return [(c.ok, c.detail) for c in found.checks if c.name == check]


def test_a_worker_that_admits_only_ssh_and_the_master_port_fails_on_its_pairs(
        tmp_path: Path) -> None:
    net = FakeNetwork()
    four_hosts(net, node3={"admits": {22, 29500}})
    report = check(net, tmp_path, master_port=29500)
    assert not report.ok
    assert named(report, "node3", "data_path")[0][0]  # worker -> master alone passes
    [(ok, detail)] = named(report, "node3", "pairs")
    assert not ok
    assert "node[1-2,4] cannot connect to node3 (10.0.0.3)" in detail
    assert "ip_local_port_range" in detail
    for other in ("node1", "node2", "node4"):
        assert named(report, other, "pairs")[0][0], other
    assert report.pairs is not None
    assert sorted((b.source, b.target) for b in report.pairs.blocked) == [
        ("node1", "node3"), ("node2", "node3"), ("node4", "node3")]
    assert report.as_json()["pairs"]["tested"] == 12


def test_the_blocked_pairs_print_as_a_matrix_and_the_host_line_has_the_fix(
        tmp_path: Path) -> None:
    net = FakeNetwork()
    four_hosts(net, node3={"admits": {22, 29500}})
    report = check(net, tmp_path, master_port=29500)
    assert report.pairs is not None
    lines = view.pair_lines(report.pairs)
    assert lines[0].startswith("pairs: 3 of 12 connections between hosts failed")
    rows = {line.split()[0]: line.split()[2:] for line in lines[2:6]}
    assert rows["node1"] == ["-", "ok", "BLOCKED", "ok"]
    assert rows["node3"] == ["ok", "ok", "-", "ok"]
    problem_lines = [line for line, _warning in view.problems(report)]
    assert any(line.startswith("node3: pairs: ") for line in problem_lines)


def test_a_host_that_reaches_nobody_is_blamed_itself_not_every_other_host() -> None:
    pairs = Pairs(["a", "b", "c"], [Blocked("c", "a", "x"), Blocked("c", "b", "x")], {})
    assert set(mesh.blamed(pairs)) == {"c"}
    pairs = Pairs(["a", "b", "c"], [Blocked("a", "c", "x"), Blocked("b", "c", "x")], {})
    assert set(mesh.blamed(pairs)) == {"c"}


def test_differing_port_ranges_are_a_warning_on_the_odd_host(tmp_path: Path) -> None:
    net = FakeNetwork()
    four_hosts(net, node4={"facts": {"port_range": [1024, 65535]}},
               **{f"node{n}": {"facts": {"port_range": [32768, 60999]}} for n in (1, 2, 3)})
    report = check(net, tmp_path)
    assert report.ok
    [(ok, detail)] = named(report, "node4", "port_range")
    assert ok and detail.startswith("warning:") and "1024-65535" in detail


def test_a_master_addr_name_that_resolves_elsewhere_on_one_host_fails(tmp_path: Path) -> None:
    spec = [host_spec(f"10.0.0.{n}", f"node{n}") for n in range(1, 4)]
    reports = [HostReport(s, i, address=s.host) for i, s in enumerate(spec)]
    inv = fake_inventory(tmp_path, *spec, master_addr="head")
    answers = {"node1": {"head": {"addresses": ["10.0.0.1"]}},
               "node2": {"head": {"addresses": ["10.0.0.1"]}},
               "node3": {"head": {"addresses": ["127.0.1.1"]}}}
    names.judge(inv, reports, {n: lookups(a) for n, a in answers.items()})
    assert reports[0].ok and reports[1].ok
    [failed] = [c for c in reports[2].checks if not c.ok]
    assert "'head' resolves to 127.0.1.1 on node3 but to 10.0.0.1 on node1" in failed.detail


def test_a_name_that_others_resolve_to_another_address_is_a_warning(tmp_path: Path) -> None:
    spec = [host_spec(f"10.0.0.{n}", f"node{n}") for n in range(1, 4)]
    reports = [HostReport(s, i, address=s.host,
                          facts={"names": {"hostname": s.name, "fqdn": s.name}})
               for i, s in enumerate(spec)]
    inv = fake_inventory(tmp_path, *spec)
    answers = {n: {f"node{k}": {"addresses": [f"10.0.0.{k}"]} for k in range(1, 4)}
               for n in ("node1", "node2", "node3")}
    answers["node1"]["node2"] = {"addresses": ["10.9.0.2"]}
    answers["node3"]["node2"] = {"addresses": [], "error": "not found"}  # fine: not resolvable
    names.judge(inv, reports, {n: lookups(a) for n, a in answers.items()})
    [warned] = [c for c in reports[1].checks if c.warning]
    assert "'node2' resolves on node1 to 10.9.0.2, not to 10.0.0.2" in warned.detail
    assert not any(c.warning for r in (reports[0], reports[2]) for c in r.checks)


@pytest.mark.parametrize(("addresses", "expected"), [
    (["127.0.1.1"], "resolves to 127.0.1.1"),
    (["fe80::1", "2001:db8::2"], "resolves only to IPv6"),
    (["10.0.0.2"], None),
])
def test_own_name_loopback_or_ipv6_only(addresses: list[str], expected: str | None) -> None:
    facts = {"names": {"hostname": "node2", "fqdn": "node2",
                       "resolved": {"node2": {"addresses": addresses}}}}
    found = names.local_check(host_spec("10.0.0.2", "node2"), HostFacts.from_json(facts))
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.warning and expected in found.detail


def _limits(**over: Any) -> dict[str, Any]:
    """The facts limits.py reads, as the probe sends them (no RDMA stack: `infiniband` None)."""
    base = {"nofile": [65536, 65536], "memlock": [None, None], "stack": [8 << 20, None],
            "shm": {"size": 16 * GiB, "free": 16 * GiB}}
    return {"limits": {**base, **over}, "infiniband": None}


def _known(**over: Any) -> HostFacts:
    return HostFacts.from_json(_limits(**over))


def test_limits_small_shm_open_files_unlimited_stack() -> None:
    spec = host_spec("10.0.0.1", "gpu1")
    shm = {"size": 64 << 20, "free": 64 << 20}
    [fail] = [c for c in limits.host_checks(spec, _known(shm=shm), gpu_ranks=8, world=16)
              if not c.ok]
    assert fail.name == "shm" and "64 MiB" in fail.detail and "--shm-size" in fail.detail
    [warn] = limits.host_checks(spec, _known(shm=shm), gpu_ranks=0, world=2)
    assert warn.warning and warn.name == "shm"
    [nofile] = limits.host_checks(spec, _known(nofile=[1024, 1048576]), gpu_ranks=8, world=512)
    assert nofile.warning and "8192" in nofile.detail and "ulimit -n" in nofile.detail
    [stack] = limits.host_checks(spec, _known(stack=[None, None]), gpu_ranks=8, world=16)
    assert stack.warning and "ulimit -s" in stack.detail
    [fine] = limits.host_checks(spec, _known(), gpu_ranks=8, world=16)
    assert fine.ok and not fine.warning


def _ib(state: str = "ACTIVE", rate: str = "200 Gb/sec (4X HDR)") -> dict[str, Any]:
    return {"mlx5_0": {"1": {"state": state, "link_layer": "InfiniBand", "rate": rate}}}


def test_rdma_memlock_and_nccl_ib_hca(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_IB_HCA", raising=False)
    spec = host_spec("10.0.0.1", "gpu1")
    facts = {**_limits(memlock=[64 << 10, 64 << 10]), "infiniband": _ib()}
    found = {c.name: c for c in limits.host_checks(spec, HostFacts.from_json(facts), gpu_ranks=8,
                                                    world=16)}
    assert not found["memlock"].ok and "ulimit -l unlimited" in found["memlock"].detail
    assert found["infiniband"].ok and "mlx5_0:1 InfiniBand 200 Gb/sec" in \
        found["infiniband"].detail
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_1:1")
    found = {c.name: c for c in limits.host_checks(
        spec, HostFacts.from_json({**_limits(), "infiniband": _ib()}), gpu_ranks=8, world=16)}
    assert not found["nccl_ib_hca"].ok and "'mlx5_1'" in found["nccl_ib_hca"].detail
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5")  # a prefix, as NCCL matches it
    found = {c.name: c for c in limits.host_checks(
        spec, HostFacts.from_json({**_limits(), "infiniband": _ib()}), gpu_ranks=8, world=16)}
    assert "nccl_ib_hca" not in found
    found = {c.name: c for c in limits.host_checks(
        spec, HostFacts.from_json({**_limits(), "infiniband": _ib(state="DOWN")}), gpu_ranks=8,
        world=16)}
    assert found["infiniband"].warning and "no ACTIVE port" in found["infiniband"].detail


def _probed(name: str, **facts: Any) -> HostReport:
    report = HostReport(host_spec(f"10.0.0.{name[-1]}", name, master=name == "node1"),
                        int(name[-1]) - 1, facts=facts, interface="eth0")
    return report


def test_parity_names_the_packages_that_differ_and_the_odd_mtu_and_link() -> None:
    base = {"packages": {"numpy": "1.26.4", "torch": "2.4.0"}, "nccl": "2.21.5",
            "torch": {"version": "2.4.0", "cuda": "12.4"},
            "links": {"eth0": {"mtu": 1500, "speed": 100000}}}
    hosts = [_probed(f"node{n}", **base) for n in range(1, 5)]
    hosts[2].facts = {**base, "packages": {"numpy": "2.0.1", "torch": "2.4.0", "extra": "1"},
                      "links": {"eth0": {"mtu": 9000, "speed": 1000}}, "nccl": "2.18.1"}
    parity.compare(hosts)
    odd = {c.name: c for c in hosts[2].checks}
    assert "numpy 2.0.1 (1.26.4 on node1)" in odd["packages"].detail
    assert "extra 1 (not installed on node1)" in odd["packages"].detail
    assert odd["mtu"].warning and odd["mtu"].group == \
        "warning: MTU 9000, others 1500; set the same MTU everywhere"
    assert odd["link"].warning and "1000 Mbit/s" in odd["link"].detail
    assert not odd["nccl"].ok and "2.18.1" in odd["nccl"].detail and "2.21.5" in \
        odd["nccl"].detail
    for other in (hosts[1], hosts[3]):
        assert all(c.ok and not c.warning for c in other.checks), other.checks


def test_the_report_folds_hosts_that_share_a_problem() -> None:
    base = {"links": {"eth0": {"mtu": 1500, "speed": None}}, "nccl": None,
            "packages": {"numpy": "1.26.4"}}
    hosts = [_probed(f"node{n}", **base) for n in range(1, 6)]
    for odd in (hosts[2], hosts[4]):
        odd.facts = {**base, "links": {"eth0": {"mtu": 9000, "speed": None}}}
    parity.compare(hosts)
    report = CheckReport(hosts, "10.0.0.1", 29500)
    assert view.problems(report) == [
        ("node[3,5]: mtu: warning: MTU 9000, others 1500; set the same MTU everywhere", True)]


def test_host_side_readers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
    assert sysinfo.infiniband(str(tmp_path / "ib")) == {"mlx5_0": {"1": {
        "state": "ACTIVE", "link_layer": "InfiniBand", "rate": "100 Gb/sec (4X EDR)"}}}
    assert sysinfo.infiniband(str(tmp_path / "none")) is None
    site = tmp_path / "site"
    for item in ("Foo_Bar-1.2.dist-info", "baz-0.3-py3.11.egg-info", "notapackage"):
        (site / item).mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    assert sysinfo.packages() == {"foo-bar": "1.2", "baz": "0.3"}
    assert sysinfo.nccl_version({"nvidia-nccl-cu12": "2.21.5"}, None) == "2.21.5"


def test_torch_is_found_by_its_files_and_its_metadata_only_where_it_is_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's version.py first; without one, importlib.metadata only where a torch dist-info
    is on sys.path (importing it costs every torch-less host ~15 ms): no torch is None."""
    bare, listed, built = tmp_path / "bare", tmp_path / "listed", tmp_path / "built"
    (bare / "numpy-2.3.4.dist-info").mkdir(parents=True)
    (listed / "torch-2.5.1.dist-info").mkdir(parents=True)
    (listed / "torch-2.5.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1\n")
    (built / "torch").mkdir(parents=True)
    (built / "torch" / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda = None\n")
    monkeypatch.setattr("sys.path", [str(tmp_path / "absent"), str(bare)])
    assert sysinfo.torch_info() is None
    monkeypatch.setattr("sys.path", [str(bare), str(listed)])
    assert sysinfo.torch_info() == {"version": "2.5.1", "cuda": None, "path": None}
    monkeypatch.setattr("sys.path", [str(built), str(listed)])
    assert sysinfo.torch_info() == {"version": "2.13.0+cpu", "cuda": None,
                                    "path": str(built / "torch" / "version.py")}


def test_connect_many_reports_each_target_at_once() -> None:
    listener = remote_mesh.EphemeralListener("127.0.0.1")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    found = remote_mesh.connect_many([["up", "127.0.0.1", listener.port],
                                      ["down", "127.0.0.1", dead_port]], "127.0.0.1", 2.0)
    assert found["up"]["ok"]
    assert not found["down"]["ok"] and errno.errorcode[errno.ECONNREFUSED] in \
        found["down"]["error"]
