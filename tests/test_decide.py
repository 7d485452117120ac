"""preflight/decide.py: what preflight concludes from the facts the hosts report. Pure
functions, so every rule is tested with plain dictionaries; the choice of interface on a host
with decoys also through the probe's own route(), which gives pick_interface its answer."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from clusterrun.inventory import HostSpec, Inventory
from clusterrun.preflight import decide
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.net_facts import Route
from clusterrun.preflight.report import Check, HostReport
from tests.conftest import REPO, fake_inventory, host_spec

PROBE = REPO / "clusterrun" / "remote" / "probe" / "probe.py"


def master_addr(inv: Inventory, facts: dict[str, Any]) -> Optional[str]:
    """decide.master_addr_from_facts on the facts as a probe would send them."""
    return decide.master_addr_from_facts(inv, inv.master, HostFacts.from_json(facts))


def pick(spec: HostSpec, facts: dict[str, Any], master_addr: str,
         route: Optional[dict[str, Any]]) -> tuple[Optional[str], Optional[str], Check]:
    """decide.pick_interface on the facts and the route answer as a probe would send them."""
    return decide.pick_interface(spec, HostFacts.from_json(facts), master_addr,
                                 None if route is None else Route.from_json(route))


def iface(name: str, *addrs: str, up: bool = True) -> dict[str, Any]:
    return {"name": name, "up": up, "addrs": list(addrs)}


MASTER_FACTS = {
    "interfaces": [iface("lo", "127.0.0.1/8", "::1/128"), iface("eth0", "10.0.0.1/24"),
                   iface("virbr0", "192.168.122.1/24"), iface("docker0", "172.17.0.1/16"),
                   iface("ib0", "fe80::1/64"), iface("eth1", "10.1.0.1/24", up=False)],
    "ssh_server_address": "10.0.0.1",
}


# -- master_addr ---------------------------------------------------------------------------


def test_master_addr_from_the_inventory_wins(tmp_path: Path) -> None:
    inv = fake_inventory(tmp_path, host_spec("10.0.0.1"), host_spec("10.0.0.2"),
                         master_addr="10.5.5.5")
    assert master_addr(inv, MASTER_FACTS) == "10.5.5.5"


def test_master_addr_of_an_all_local_inventory_is_loopback(tmp_path: Path) -> None:
    inv = fake_inventory(tmp_path, host_spec("localhost", "n0"), host_spec("127.0.0.1", "n1"))
    assert master_addr(inv, MASTER_FACTS) == "127.0.0.1"


def test_master_addr_is_the_address_of_the_masters_named_interface(tmp_path: Path) -> None:
    inv = fake_inventory(tmp_path, host_spec("gpu-a", interface="virbr0"), host_spec("gpu-b"))
    assert master_addr(inv, MASTER_FACTS) == "192.168.122.1"


def test_master_addr_falls_back_when_the_named_interface_is_down_or_has_no_ipv4(
        tmp_path: Path) -> None:
    for name in ("eth1", "ib0", "nosuch"):
        inv = fake_inventory(tmp_path, host_spec("gpu-a", interface=name), host_spec("gpu-b"))
        # The address the controller reached it on, since the master holds it.
        assert master_addr(inv, MASTER_FACTS) == "10.0.0.1"


def test_master_addr_is_the_ssh_address_only_when_the_master_holds_it(tmp_path: Path) -> None:
    inv = fake_inventory(tmp_path, host_spec("gpu-a"), host_spec("gpu-b"))
    assert master_addr(inv, MASTER_FACTS) == "10.0.0.1"
    natted = {**MASTER_FACTS, "ssh_server_address": "203.0.113.7"}  # reached through NAT
    assert master_addr(inv, natted) is None
    assert master_addr(inv, {"interfaces": []}) is None


def test_master_addr_without_ssh_is_what_its_own_name_resolves_to(tmp_path: Path) -> None:
    inv = fake_inventory(tmp_path, host_spec("gpu-a", transport="srun", slurm_job="7"),
                         host_spec("gpu-b", transport="srun", slurm_job="7"))
    step = {k: v for k, v in MASTER_FACTS.items() if k != "ssh_server_address"}  # srun: none
    named = {**step, "dns": {"hostname": "gpu-a", "addresses": ["127.0.1.1", "10.0.0.1"]}}
    assert master_addr(inv, named) == "10.0.0.1"
    elsewhere = {**step, "dns": {"hostname": "gpu-a", "addresses": ["10.9.9.9"]}}
    assert master_addr(inv, elsewhere) is None  # not its own


# -- pick_interface ------------------------------------------------------------------------


def test_explicit_interface_is_used_with_its_ipv4() -> None:
    spec = host_spec("gpu-a", interface="eth0")
    name, addr, check = pick(spec, MASTER_FACTS, "10.0.0.1", None)
    assert (name, addr, check.ok) == ("eth0", "10.0.0.1", True)
    assert "from the inventory" in check.detail


def test_explicit_interface_missing_down_or_without_ipv4_lists_the_real_ones() -> None:
    for wanted, problem in (("eth7", "does not exist there"), ("eth1", "is down"),
                            ("ib0", "has no IPv4 address")):
        spec = host_spec("gpu-a", interface=wanted)
        name, addr, check = pick(spec, MASTER_FACTS, "10.0.0.1", None)
        assert (name, addr, check.ok) == (None, None, False)
        assert f"interface {wanted!r} {problem} on gpu-a" in check.detail
        assert "eth0 (10.0.0.1/24)" in check.detail and "eth1 (10.1.0.1/24 DOWN)" in check.detail
        assert "ib0 (no IPv4)" in check.detail


def test_auto_takes_the_device_that_routes_to_the_master() -> None:
    route = {"dev": "ens5", "src": "10.0.0.2", "local": False}
    name, addr, check = pick(host_spec("gpu-b"), MASTER_FACTS, "10.0.0.1", route)
    assert (name, addr, check.ok) == ("ens5", "10.0.0.2", True)
    assert "routes to 10.0.0.1" in check.detail


def test_on_the_master_the_device_holding_the_address_is_the_answer() -> None:
    route = {"dev": "eth0", "src": "10.0.0.1", "local": True}
    name, _addr, check = pick(host_spec("gpu-a"), MASTER_FACTS, "10.0.0.1", route)
    assert name == "eth0" and "holds 10.0.0.1" in check.detail


def test_a_route_through_lo_to_a_non_loopback_master_is_refused() -> None:
    route = {"dev": "lo", "src": "10.0.0.1", "local": False}
    name, addr, check = pick(host_spec("gpu-a"), MASTER_FACTS, "10.0.0.1", route)
    assert (name, addr, check.ok) == (None, None, False)
    assert "goes through lo" in check.detail and "Set `interface:`" in check.detail


def test_lo_is_right_for_a_loopback_master() -> None:
    route = {"dev": "lo", "src": "127.0.0.1", "local": True}
    name, addr, check = pick(host_spec("localhost"), MASTER_FACTS, "127.0.0.1", route)
    assert (name, addr, check.ok) == ("lo", "127.0.0.1", True)


def test_no_route_says_why() -> None:
    for route in (None, {}, {"dev": None, "src": None,
                             "error": "no route to 10.0.0.1 (Network is unreachable)"}):
        name, _addr, check = pick(host_spec("gpu-b"), MASTER_FACTS, "10.0.0.1", route)
        assert name is None and not check.ok
        assert "no interface on gpu-b reaches master_addr 10.0.0.1" in check.detail
    assert "Network is unreachable" in check.detail


# A host as the real probe lists it (sorted by name): the cluster's NIC eth0 on 10.0.0.0/24,
# and decoys that also hold IPv4 addresses (docker0 sorts first, virbr0 last) plus a second NIC
# on another subnet. The kernel's answers below are what `ip -o route get` prints.
DECOYED = [iface("docker0", "172.17.0.1/16"), iface("enp3s0", "10.1.0.3/24"),
           iface("eth0", "10.0.0.3/24"), iface("lo", "127.0.0.1/8"),
           iface("virbr0", "192.168.122.1/24")]
KERNEL = {"10.0.0.3": "local 10.0.0.3 dev lo table local src 10.0.0.3 uid 0 \\    cache <local>",
          "10.0.0.1": "10.0.0.1 dev eth0 src 10.0.0.3 uid 0 \\    cache"}


class _Udp:
    """The UDP socket probe.route connects to learn the source address the kernel picks."""

    def __init__(self, *_args: Any) -> None:
        pass

    def connect(self, _addr: tuple[str, int]) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return ("10.0.0.3", 40000)

    def close(self) -> None:
        pass


def decide_on_a_decoyed_host(master_addr: str, *, ip: bool = True
                             ) -> tuple[Optional[str], Optional[str], bool]:
    """The whole decision for a host with decoys: the host's own route answer (the real
    probe's route(), its functions without its server, fed the kernel's answers) and what
    pick_interface makes of it."""
    probe: dict[str, Any] = {"__name__": "probe_under_test"}
    exec(compile(PROBE.read_text().replace("\nserve()\n", "\n"), str(PROBE), "exec"), probe)
    probe["interfaces"] = lambda: DECOYED
    # Without `ip` on the host, the device is the one holding the source address picked.
    probe["run"] = lambda argv, timeout=10: KERNEL.get(argv[-1]) if ip else None
    probe["socket"] = SimpleNamespace(socket=_Udp, AF_INET=socket.AF_INET,
                                      AF_INET6=socket.AF_INET6, SOCK_DGRAM=socket.SOCK_DGRAM)
    route = probe["route"](master_addr)
    name, addr, check = pick(host_spec("gpu-c"), {"interfaces": DECOYED}, master_addr, route)
    return name, addr, check.ok


def test_on_a_master_with_decoys_the_device_holding_the_address_is_chosen() -> None:
    """The kernel's route to the master's own address is `lo`; docker0, virbr0 and enp3s0
    hold addresses too, and only eth0 holds master_addr."""
    assert decide_on_a_decoyed_host("10.0.0.3") == ("eth0", "10.0.0.3", True)


def test_on_a_worker_with_decoys_the_device_routing_to_the_master_is_chosen() -> None:
    assert decide_on_a_decoyed_host("10.0.0.1") == ("eth0", "10.0.0.3", True)
    assert decide_on_a_decoyed_host("10.0.0.1", ip=False) == ("eth0", "10.0.0.3", True)


# -- host checks and version parity --------------------------------------------------------


def facts(**over: Any) -> dict[str, Any]:
    base = {"python": "3.11.7", "python_path": "/usr/bin/python3",
            "torch": {"version": "2.4.0"}, "gpus": 2,
            "workdir": {"path": "/home/u/clusterrun", "ok": True, "error": None},
            "dns": {"hostname": "gpu-a", "seconds": 0.01, "addresses": ["10.0.0.1"]},
            "interfaces": MASTER_FACTS["interfaces"]}
    return {**base, **over}


def verdicts(spec_facts: dict[str, Any], **spec: Any) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.detail)
            for c in decide.host_checks(host_spec("gpu-a", **spec),
                                        HostFacts.from_json(spec_facts))}


def test_host_checks_pass_and_warn() -> None:
    found = verdicts(facts())
    assert all(ok for ok, _ in found.values()), found
    assert found["dns"][1] == "gpu-a -> 10.0.0.1"
    slow = verdicts(facts(dns={"hostname": "gpu-a", "seconds": 5.0}))
    assert slow["dns"][0] and slow["dns"][1].startswith("warning:")
    assert "gpus" not in found  # GPU checks: clusterrun/preflight/gpus.py, test_gpu_checks.py


def test_host_checks_fail_without_torch_or_a_writable_workdir() -> None:
    found = verdicts(facts(torch=None, workdir={"path": "/proc/forbidden", "ok": False,
                                                "error": "No such file or directory"}))
    assert not found["torch"][0] and "pip install torch" in found["torch"][1]
    assert not found["workdir"][0] and "/proc/forbidden" in found["workdir"][1]


def report(name: str, python: str, torch: str, master: bool = False) -> HostReport:
    return HostReport(host_spec(name, master=master), 0,
                      facts={"python": python, "torch": {"version": torch}})


def test_versions_are_compared_with_the_masters() -> None:
    hosts = [report("w1", "3.10.2", "2.4.0"), report("m", "3.11.7", "2.4.0", master=True),
             report("w2", "3.11.1", "2.3.1"), HostReport(host_spec("gone"), 3)]
    decide.compare_versions(hosts)
    w1, m, w2, gone = ({c.name: c for c in h.checks} for h in hosts)
    assert not w1["python"].ok and "Python 3.10.2 on w1 but 3.11.7 on the master m" in \
        w1["python"].detail
    assert "torch" not in w1 and not m
    assert "python" not in w2  # the same minor version is enough
    assert not w2["torch"].ok and "torch 2.3.1 on w2 but 2.4.0 on the master m" in \
        w2["torch"].detail
    assert not gone  # a host that was never probed is not compared


def test_without_a_probed_master_the_first_host_is_the_reference() -> None:
    hosts = [report("a", "3.11.7", "2.4.0"), report("b", "3.12.0", "2.4.0")]
    decide.compare_versions(hosts)
    assert "3.11.7 on a:" in hosts[1].checks[0].detail and not hosts[0].checks
