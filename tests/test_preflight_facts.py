"""The probe's reply read into typed facts (clusterrun/preflight/facts.py): every field the
checks decide on, from a reply of the shape the probe sends (the fake host's, which
test_fake_probe.py holds to the real probe's key for key), and what missing or odd fields read
as."""

from __future__ import annotations

from typing import Any

from clusterrun.preflight.answers import Blast, Connected, Listening, connections
from clusterrun.preflight.facts import HostFacts, Machine, Ptrace, Torch, Workdir
from clusterrun.preflight.gpu_facts import GpuApp, NvidiaFacts, NvidiaGpu
from clusterrun.preflight.limit_facts import IbPort, Limits, Rlimit
from clusterrun.preflight.net_facts import Interface as Iface
from clusterrun.preflight.net_facts import Link, Lookup, Names, Route, lookups
from clusterrun.transport.fake_hosts import FakeHost, Interface


def reply(**over: Any) -> dict[str, Any]:
    host = FakeHost("10.0.0.1", [Interface("lo", "127.0.0.1/8"),
                                 Interface("eth0", "10.0.0.1/24", mtu=9000, speed=100_000)],
                    hostname="gpu-1", gpus=2)
    return {**host.all_facts({"workdir": "~/clusterrun"}, "10.0.0.1"), **over}


def test_the_gpus_of_a_probe_reply() -> None:
    found = reply()
    nvidia = found["nvidia"]
    nvidia["gpus"][1].update(memory_used=40000, compute_mode="Exclusive_Process",
                             ecc_uncorrected=2, remap_pending=None)
    nvidia["apps"] = [{"gpu": 1, "gpu_uuid": nvidia["gpus"][1]["uuid"], "pid": 4242,
                       "used_memory": 39990, "process_name": "python", "uid": 1001,
                       "user": "alice", "visible": True, "mine": False}]
    nvidia["errors"] = {"remapped_rows": "nvidia-smi exited 2: no"}
    known = HostFacts.from_json(found)
    assert known.gpus == 2
    assert known.nvidia == NvidiaFacts(
        smi="/usr/bin/nvidia-smi", driver="550.54.15",
        gpus=(NvidiaGpu(0, "NVIDIA H100 80GB HBM3", "550.54.15", 1, 81559, "Default", 0, False,
                        False, False),
              NvidiaGpu(1, "NVIDIA H100 80GB HBM3", "550.54.15", 40000, 81559,
                        "Exclusive_Process", 2, False, None, False)),
        apps=(GpuApp(gpu=1, pid=4242, used_memory=39990, process_name="python", user="alice",
                     visible=True, mine=False),),
        errors={"remapped_rows": "nvidia-smi exited 2: no"})


def test_a_cpu_host_and_missing_gpu_fields() -> None:
    cpu = HostFacts.from_json(reply(gpus=0, nvidia=FakeHost("a", []).nvidia()))
    assert (cpu.gpus, cpu.nvidia) == (0, NvidiaFacts())
    # No nvidia details at all (an older probe): unknown, not "no GPUs".
    older = HostFacts.from_json({"gpus": 4})
    assert (older.gpus, older.nvidia) == (4, None)
    odd = HostFacts.from_json({"gpus": None, "nvidia": "odd"})
    assert (odd.gpus, odd.nvidia) == (0, None)
    found = NvidiaFacts.from_json({
        "smi": "/bin/nvidia-smi", "apps": [{}], "errors": None,
        "gpus": [{"name": "no index"}, {"index": 3, "memory_used": "lots", "remap_failure": 1}]})
    assert found == NvidiaFacts("/bin/nvidia-smi", None, (NvidiaGpu(3),), (GpuApp(),), {})


def test_the_limits_rdma_ports_and_environment_of_a_probe_reply() -> None:
    found = reply(env={"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "WARN"}, infiniband={
        "mlx5_0": {"1": {"state": "ACTIVE", "link_layer": "InfiniBand",
                         "rate": "200 Gb/sec (4X HDR)"}, "2": {"state": "DOWN"}},
        "mlx5_1": {}})
    known = HostFacts.from_json(found)
    assert known.limits == Limits(nofile=Rlimit(65536, 1048576), memlock=Rlimit(8 << 20, 8 << 20),
                                  stack=Rlimit(8 << 20, None), shm=32 << 30)
    assert known.infiniband == {"mlx5_0": {"1": IbPort("ACTIVE", "InfiniBand",
                                                       "200 Gb/sec (4X HDR)"),
                                           "2": IbPort("DOWN")}, "mlx5_1": {}}
    assert [p.active for p in known.infiniband["mlx5_0"].values()] == [True, False]
    assert known.env == {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "WARN"}
    # The fake host has no RDMA stack: the probe sends null, which is known to be none.
    assert HostFacts.from_json(reply()).infiniband == {}


def test_missing_or_odd_limits_are_unknown() -> None:
    # No `infiniband` key at all: not reported (unknown), unlike null (no RDMA stack).
    bare = HostFacts.from_json({})
    assert (bare.limits, bare.infiniband, bare.env) == (Limits(), None, {})
    odd = Limits.from_json({"nofile": [None, None], "memlock": [1024], "stack": "8192",
                            "shm": {"free": 1}})
    # [None, None]: unlimited; a /dev/shm without its size reads as empty, as it always did.
    assert odd == Limits(nofile=Rlimit(None, None), memlock=None, stack=None, shm=0)
    assert Limits.from_json({"shm": None}).shm is None
    assert Limits.from_json(None) == Limits()


def test_the_interfaces_workdir_and_lookup_of_a_probe_reply() -> None:
    known = HostFacts.from_json(reply())
    assert known.interfaces == (Iface("lo", True, ("127.0.0.1/8",)),
                                Iface("eth0", True, ("10.0.0.1/24",)))
    assert [i.ipv4 for i in known.interfaces] == ["127.0.0.1", "10.0.0.1"]
    assert known.links == {"lo": Link(65536, None), "eth0": Link(9000, 100_000)}
    assert known.ssh_server_address == "10.0.0.1"
    assert known.dns == Lookup(("10.0.0.1",), None, 0.001, "gpu-1")
    assert known.workdir == Workdir(True, "/home/user/clusterrun", 200 << 30,
                                    "/home/user/clusterrun", reply()["workdir"])
    assert (known.hostname, known.user, known.python, known.python_path) == (
        "gpu-1", "user", "3.11.7", "/usr/bin/python3")
    assert known.torch == Torch("2.4.0", None, says_cuda=True)


def test_odd_interfaces_routes_and_workdirs() -> None:
    odd = HostFacts.from_json({"interfaces": [{"up": True}, {"name": "eth0", "addrs": None},
                                              "eth1", {"name": "ib0", "addrs": ["fe80::1/64"]}],
                               "dns": None, "workdir": {"path": "/w", "errno": "EROFS"},
                               "torch": {"version": "2.4.0"}})
    # Entries without a name are dropped; no address list is none; down unless it says up.
    assert odd.interfaces == (Iface("eth0"), Iface("ib0", False, ("fe80::1/64",)))
    assert odd.interfaces[1].ipv4 is None and odd.interfaces[1].holds("fe80::1")
    assert odd.dns == Lookup() and odd.torch == Torch("2.4.0", None, says_cuda=False)
    assert not odd.workdir.ok and odd.workdir.found == {"path": "/w", "errno": "EROFS"}
    assert HostFacts.from_json({"torch": None}).torch is None  # not installed
    # The probe's route answers: to an address on a subnet, one it holds, and none.
    assert Route.from_json({"dev": "eth0", "src": "10.0.0.2", "local": False}) == Route(
        "eth0", "10.0.0.2")
    assert Route.from_json({"dev": "eth0", "src": "10.0.0.1", "local": True}).local
    assert Route.from_json({"dev": None, "src": None, "error": "no route"}) == Route(
        error="no route")
    assert Route.from_json(None) == Route()


def test_names_software_identity_and_ptrace_of_a_probe_reply() -> None:
    found = reply()
    known = HostFacts.from_json(found)
    assert known.names == Names("gpu-1", "gpu-1", {"gpu-1": Lookup(("10.0.0.1",), None, 0.001)})
    assert known.port_range == (32768, 60999)
    assert known.packages == FakeHost("a", []).packages()
    assert (known.nccl, known.says_nccl) == (None, True)  # a CPU build of torch: no NCCL
    assert known.machine == Machine(found["machine"]["boot_id"], 4026531840)
    assert known.ptrace == Ptrace(1, False, False, None, found["ptrace"]["machine"])


def test_missing_names_software_identity_and_ptrace_are_unknown() -> None:
    bare = HostFacts.from_json({"names": {"hostname": "n1"}, "machine": {"machine_id": "ab"},
                                "port_range": None, "packages": ["numpy"]})
    assert bare.names == Names("n1", None, None)  # what they resolve to: not said
    assert (bare.port_range, bare.packages, bare.says_nccl, bare.ptrace) == (
        None, None, False, None)
    assert bare.machine == Machine("ab", None)  # no network namespace: not told apart
    # The probe's `resolve` answer: name -> what it resolved to there.
    assert lookups({"head": {"addresses": ["10.0.0.1"], "error": None, "seconds": 0.01},
                    "gone": {"addresses": [], "error": "not found"}, "odd": None}) == {
        "head": Lookup(("10.0.0.1",), None, 0.01), "gone": Lookup((), "not found"),
        "odd": Lookup()}


def test_the_probes_answers_to_ports_connections_and_transfers() -> None:
    # As probe.py, meshtest.py and throughput.py answer: opened, or why not.
    assert Listening.from_json({"ok": True, "port": 29500}) == Listening(True, 29500)
    assert Listening.from_json({"ok": False, "port": 80, "errno": 13,
                                "error": "Permission denied"}) == Listening(
        False, 80, 13, "Permission denied")
    assert Listening.from_json({"ok": False, "error": "Cannot assign"}) == Listening(
        error="Cannot assign")
    assert Connected.from_json({"ok": True, "seconds": 0.001}) == Connected(True)
    assert connections({"node2": {"ok": False, "error": "timed out after 5 s"},
                        "node3": {"ok": True, "seconds": 0.002}}) == {
        "node2": Connected(False, "timed out after 5 s"), "node3": Connected(True)}
    assert connections(None) == {}
    assert Blast.from_json({"ok": True, "bytes": 60_000_000, "sent": 60_000_000,
                            "seconds": 1}) == Blast(True, 60_000_000, 1.0)
    assert Blast.from_json({"ok": False, "stage": "connect", "error": "refused"}) == Blast(
        stage="connect", error="refused")
