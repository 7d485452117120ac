"""Preflight's phases against the in-memory fake transport: no root, no sshd, no network.

What only real SSH and real interfaces can prove (host keys, banners, nftables partitions, the
kernel's routing) is in test_check.py against the namespace cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus, Outcome
from clusterrun.preflight import checks as preflight
from clusterrun.preflight import view
from clusterrun.preflight.report import CheckReport, HostReport
from clusterrun.transport import SshOptions
from clusterrun.transport.fake import FakeNetwork, Interface, Reply
from clusterrun.transport.pool import Connections
from tests.conftest import fake_inventory, host_spec, run_main, write_inventory

DECOYS = (Interface("virbr0", "192.168.122.1/24"), Interface("docker0", "172.17.0.1/16"))


def three_hosts(net: FakeNetwork) -> None:
    """A master and two workers with different NIC names, each with the same decoys and a
    second NIC on a storage network."""
    for n, nic in ((1, "eth0"), (2, "ens5"), (3, "enp3s0")):
        net.add(f"10.0.0.{n}", Interface("lo", "127.0.0.1/8"), Interface(nic, f"10.0.0.{n}/24"),
                Interface("eth9", f"10.9.0.{n}/24"), *DECOYS, hostname=f"gpu-{n}")


def check(net: FakeNetwork, tmp_path: Path, *names: str, **top: object) -> CheckReport:
    specs = [host_spec(f"10.0.0.{n}", name) for n, name in enumerate(names, start=1)]
    inv = fake_inventory(tmp_path, *specs, **top)
    with Connections(SshOptions(connect_timeout=1.0), connector=net.connect) as pool:
        return preflight.run(inv, pool)


def by_name(report: CheckReport) -> dict[str, HostReport]:
    return {h.spec.name: h for h in report.hosts}


def checks(host: HostReport) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.detail) for c in host.checks}


def test_each_host_gets_its_own_nic_and_decoys_are_never_chosen(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    report = check(net, tmp_path, "a", "b", "c")
    assert report.ok, [h.checks for h in report.hosts]
    hosts = by_name(report)
    assert report.master_addr == "10.0.0.1"
    assert {n: (h.interface, h.address) for n, h in hosts.items()} == {
        "a": ("eth0", "10.0.0.1"), "b": ("ens5", "10.0.0.2"), "c": ("enp3s0", "10.0.0.3")}
    assert report.master_port is not None and report.lifeline_port is not None
    assert "holds 10.0.0.1" in checks(hosts["a"])["interface"][1]
    for name in "bc":
        ok, detail = checks(hosts[name])["data_path"]
        assert ok and f"10.0.0.1:{report.master_port}" in detail


def test_master_port_in_use_fails_the_master_and_the_workers_are_not_tested(
        tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.1"].ports_in_use.add(29400)
    report = check(net, tmp_path, "a", "b", "c", master_port=29400)
    hosts = by_name(report)
    ok, detail = checks(hosts["a"])["master_port"]
    assert not ok and "port 29400 on a" in detail and "Another job may hold it" in detail
    for name in "bc":
        ok, detail = checks(hosts[name])["data_path"]
        assert not ok and "not tested" in detail and "29400" in detail
    assert not report.ok and not report.unreachable  # exit 3: nothing unreachable


def test_low_master_port_as_a_normal_user_says_it_needs_root(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    report = check(net, tmp_path, "a", "b", master_port=80)
    ok, detail = checks(by_name(report)["a"])["master_port"]
    assert not ok and "below 1024 need root" in detail and "user" in detail


def test_a_worker_whose_connect_fails_is_named_and_the_others_pass(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.3"].connect_error = "Connection timed out"
    report = check(net, tmp_path, "a", "b", "c")
    hosts = by_name(report)
    ok, detail = checks(hosts["c"])["data_path"]
    assert not ok
    assert "c cannot open a TCP connection to 10.0.0.1:" in detail
    assert "from enp3s0 (10.0.0.3)" in detail and "Connection timed out" in detail
    assert hosts["a"].ok and hosts["b"].ok and not report.unreachable


def test_a_firewalled_master_port_fails_every_worker(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.1"].firewalled.add(29401)
    report = check(net, tmp_path, "a", "b", "c", master_port=29401)
    for name in "bc":
        ok, detail = checks(by_name(report)[name])["data_path"]
        assert not ok and "timed out" in detail and "firewall" in detail


def test_an_unreachable_worker_is_unreachable_and_the_rest_is_still_checked(
        tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.2"].unreachable = Outcome.REFUSED
    report = check(net, tmp_path, "a", "b", "c")
    hosts = by_name(report)
    assert [h.spec.name for h in report.unreachable] == ["b"]
    assert hosts["b"].outcome is Outcome.REFUSED
    assert Outcome.REFUSED.status is ExitStatus.UNREACHABLE
    assert hosts["a"].ok and hosts["c"].ok  # the data path of c was still proved


def test_an_unreachable_master_leaves_workers_without_an_interface(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.1"].unreachable = Outcome.AUTH
    report = check(net, tmp_path, "a", "b")
    ok, detail = checks(by_name(report)["b"])["interface"]
    assert not ok and "the master a could not be probed" in detail
    assert [h.spec.name for h in report.unreachable] == ["a"]


@pytest.mark.usefixtures("quick_probes")
def test_ssh_connects_but_the_probe_is_silent_is_a_probe_timeout_not_unreachable(
        tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.2"].probe = "silent"
    report = check(net, tmp_path, "a", "b", "c")
    hosts = by_name(report)
    assert hosts["b"].outcome is Outcome.PROBE_TIMEOUT
    assert hosts["b"].reached and not report.unreachable
    assert Outcome.PROBE_TIMEOUT.status is ExitStatus.PREFLIGHT
    assert "no answer within" in checks(hosts["b"])["probe"][1]
    assert hosts["c"].ok


@pytest.mark.usefixtures("quick_probes")
def test_a_probe_silent_after_its_facts_is_a_probe_timeout(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.3"].silent_ops.add("connect")
    report = check(net, tmp_path, "a", "b", "c")
    assert by_name(report)["c"].outcome is Outcome.PROBE_TIMEOUT
    assert not report.unreachable and by_name(report)["b"].ok


@pytest.mark.usefixtures("quick_probes")
def test_a_connect_that_hangs_past_the_deadline_is_unreachable(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.2"].connect_delay = 3.0
    report = check(net, tmp_path, "a", "b", "c")
    assert [h.spec.name for h in report.unreachable] == ["b"]
    assert by_name(report)["b"].outcome is Outcome.CONNECT_TIMEOUT
    assert by_name(report)["c"].ok


def test_missing_interpreter_is_a_probe_failure_that_says_so(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.2"].probe = "exits"
    net.hosts["10.0.0.2"].probe_exit = 127
    net.hosts["10.0.0.2"].probe_stderr = b"sh: 1: exec: python3: not found\n"
    report = check(net, tmp_path, "a", "b")
    host = by_name(report)["b"]
    assert host.outcome is Outcome.PROBE_FAILED and host.reached
    detail = checks(host)["probe"][1]
    assert "interpreter `python3` was not found" in detail and "not found" in detail


def test_torch_mismatch_fails_the_worker_against_the_master(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.2"].torch = "2.3.1"
    report = check(net, tmp_path, "a", "b", "c")
    ok, detail = checks(by_name(report)["b"])["torch"]
    assert not ok and "torch 2.3.1 on b but 2.4.0 on the master a" in detail
    assert by_name(report)["c"].ok


def test_a_plain_host_passes_each_host_check_on_what_it_read(tmp_path: Path) -> None:
    """The fake answers what the probe does, so every check runs, on the values read."""
    net = FakeNetwork()
    three_hosts(net)
    net.hosts["10.0.0.2"].gpus = 2
    report = check(net, tmp_path, "a", "b", "c")
    assert report.ok and not view.problems(report), view.problems(report)
    a, b = checks(by_name(report)["a"]), checks(by_name(report)["b"])
    assert a["workdir"] == (True, "/home/user/clusterrun (created and written, 200.0 GiB free)")
    assert a["gpus"] == (True, "no NVIDIA GPU found (no nvidia-smi on the PATH)")
    assert b["gpus"] == (True, "2 of 2 GPU(s) used (all), NVIDIA H100 80GB HBM3, driver "
                               "550.54.15")
    assert a["limits"] == (True, "/dev/shm 32.0 GiB, open files 65536")
    assert b["packages"] == (True, "the same 10 Python packages as a")
    assert a["dns"] == (True, "gpu-1 -> 10.0.0.1")


def test_each_host_check_judges_what_the_fake_host_reads(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    a, b, c = (net.hosts[f"10.0.0.{n}"] for n in (1, 2, 3))
    a.facts["names"] = {"hostname": "gpu-1", "fqdn": "gpu-1", "resolved": {"gpu-1": {
        "addresses": ["127.0.1.1"], "error": None, "seconds": 0.001}}}
    b.interfaces[1] = Interface("ens5", "10.0.0.2/24", mtu=9000)
    b.gpus = 2
    busy = b.nvidia()
    busy["gpus"][1]["memory_used"] = 40000
    busy["apps"] = [{"gpu": 1, "gpu_uuid": busy["gpus"][1]["uuid"], "pid": 4242,
                     "used_memory": 39990, "process_name": "python", "uid": 1001,
                     "user": "alice", "visible": True, "mine": False}]
    b.facts["nvidia"] = busy
    c.disk_free = 4 << 20
    c.facts["ptrace"] = {"scope": 2, "root": False, "cap_sys_ptrace": False, "pyspy": None}
    c.facts["packages"] = {**c.packages(), "numpy": "2.0.1"}
    limits = c.all_facts({}, "")["limits"]
    c.facts["limits"] = {**limits, "shm": {"size": 64 << 20, "free": 64 << 20}}
    hosts = by_name(check(net, tmp_path, "a", "b", "c"))
    found = {n: {k: v for k, v in checks(h).items() if not v[0] or v[1].startswith("warning:")}
             for n, h in hosts.items()}
    assert sorted(found["a"]) == ["names"] and "resolves to 127.0.1.1" in found["a"]["names"][1]
    assert sorted(found["b"]) == ["gpu_busy", "mtu"], found["b"]
    assert "GPU 1: 40000 MiB of 81559 MiB in use by pid 4242 python" in found["b"]["gpu_busy"][1]
    assert "MTU 9000 on ens5 of b, but 1500" in found["b"]["mtu"][1]
    assert sorted(found["c"]) == ["packages", "shm", "stacks", "workdir"], found["c"]
    assert not found["c"]["workdir"][0] and "has only 4.0 MiB free" in found["c"]["workdir"][1]
    assert "numpy 2.0.1 (1.26.4 on a)" in found["c"]["packages"][1]
    assert "/dev/shm on c is 64 MiB" in found["c"]["shm"][1]
    assert "ptrace_scope is 2" in found["c"]["stacks"][1]


def test_explicit_interface_that_is_down_lists_the_real_ones(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    net.add("10.0.0.2", Interface("ens5", "10.0.0.2/24"), Interface("ib0", "10.8.0.2/24", up=False))
    inv = fake_inventory(tmp_path, host_spec("10.0.0.1", "a"),
                         host_spec("10.0.0.2", "b", interface="ib0"))
    with Connections(SshOptions(), connector=net.connect) as pool:
        report = preflight.run(inv, pool)
    ok, detail = checks(by_name(report)["b"])["interface"]
    assert not ok and "'ib0' is down" in detail and "ens5 (10.0.0.2/24)" in detail


def test_all_local_inventory_uses_loopback(tmp_path: Path) -> None:
    net = FakeNetwork()
    net.add("localhost", Interface("lo", "127.0.0.1/8"), Interface("eth0", "10.0.0.5/24"),
            *DECOYS)
    inv = fake_inventory(tmp_path, host_spec("localhost", "node0"),
                         host_spec("localhost", "node1"))
    with Connections(SshOptions(), connector=net.connect) as pool:
        report = preflight.run(inv, pool)
    assert report.ok, [h.checks for h in report.hosts]
    assert report.master_addr == "127.0.0.1"
    assert {(h.interface, h.address) for h in report.hosts} == {("lo", "127.0.0.1")}


def test_connections_are_made_once_per_host_reused_and_closed(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    specs = [host_spec(f"10.0.0.{n}", name) for n, name in ((1, "a"), (2, "b"))]
    inv = fake_inventory(tmp_path, *specs)
    with Connections(SshOptions(), connector=net.connect) as pool:
        preflight.run(inv, pool)
        assert pool.connected("a") and pool.connected("b")
        assert len(net.transports) == 2  # preflight opened one connection per host
        assert pool.get(inv.hosts[1]) is pool.transports["b"]  # sync and start reuse it
        assert len(net.transports) == 2
        assert not any(t.closed for t in net.transports)
        # Every probe was told to exit when preflight was done with it.
        assert all(len(t.commands) == 1 for t in net.transports)
    assert all(t.closed for t in net.transports)


def test_a_host_that_failed_to_connect_is_tried_again(tmp_path: Path) -> None:
    net = FakeNetwork()
    three_hosts(net)
    spec = host_spec("10.0.0.2", "b")
    net.hosts["10.0.0.2"].unreachable = Outcome.CONNECT_TIMEOUT
    with Connections(SshOptions(), connector=net.connect) as pool:
        with pytest.raises(Exception) as failed:
            pool.get(spec)
        assert getattr(failed.value, "outcome", None) is Outcome.CONNECT_TIMEOUT
        assert not pool.connected("b")
        net.hosts["10.0.0.2"].unreachable = None
        assert pool.get(spec) is pool.transports["b"]


# -- the real command line on the fake network -----------------------------------------------


def inventory_file(tmp_path: Path, count: int = 3) -> Path:
    return write_inventory(tmp_path / "inv.yaml", [
        {"host": f"10.0.0.{n}", "name": f"node{n}"} for n in range(1, count + 1)])


def test_check_exits_0_when_every_host_passes(tmp_path: Path, fake_net: FakeNetwork,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    three_hosts(fake_net)
    code, out, _err = run_main(capsys, "check", str(inventory_file(tmp_path)))
    assert code == ExitStatus.SUCCESS, out
    assert "node2" in out and "ens5" in out


def test_check_exits_3_for_a_failed_check(tmp_path: Path, fake_net: FakeNetwork,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    three_hosts(fake_net)
    fake_net.hosts["10.0.0.3"].connect_error = "Connection refused"
    code, out, _err = run_main(capsys, "check", str(inventory_file(tmp_path)))
    assert code == ExitStatus.PREFLIGHT, out


@pytest.mark.usefixtures("quick_probes")
def test_check_exits_3_not_4_for_a_silent_probe(tmp_path: Path, fake_net: FakeNetwork,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    three_hosts(fake_net)
    fake_net.hosts["10.0.0.2"].probe = "silent"
    code, out, _err = run_main(capsys, "check", str(inventory_file(tmp_path)))
    assert code == ExitStatus.PREFLIGHT, out
    assert "no answer within" in out


def test_check_exits_4_for_an_unreachable_host(tmp_path: Path, fake_net: FakeNetwork,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    three_hosts(fake_net)
    fake_net.hosts["10.0.0.2"].unreachable = Outcome.HOST_KEY
    code, out, _err = run_main(capsys, "check", "--json", str(inventory_file(tmp_path)))
    assert code == ExitStatus.UNREACHABLE, out
    assert "host key" in out


def test_launch_exits_6_when_copying_the_code_fails(
        tmp_path: Path, fake_net: FakeNetwork, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """The host was checked, then its disk refused the code: SYNC, not a bug (1)."""

    three_hosts(fake_net)
    for host in fake_net.hosts.values():
        host.programs["files.py"] = lambda _request: Reply(
            stderr=b"OSError: [Errno 28] No space left on device\n", code=1)
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hello')\n")
    code, _out, err = run_main(capsys, "launch", str(inventory_file(tmp_path, 2)), str(script))
    assert code == ExitStatus.SYNC, err
    assert "No space left on device" in err and "nothing was started" in err
    assert "Traceback" not in err


def test_a_failed_sync_is_recorded_as_a_failed_run(
        tmp_path: Path, fake_net: FakeNetwork, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    from clusterrun.runs import store

    three_hosts(fake_net)
    for host in fake_net.hosts.values():
        host.programs["files.py"] = lambda _request: Reply(stderr=b"disk full\n", code=1)
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hello')\n")
    code, _out, err = run_main(capsys, "launch", str(inventory_file(tmp_path, 2)), str(script))
    assert code == ExitStatus.SYNC, err
    [run] = store.all_runs(home)
    assert run.state.get("state") == "failed" and run.state.get("exit_status") == 6, run.state
