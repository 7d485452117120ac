"""What NCCL chose, per host: the parser on NCCL logs captured from public issue threads
(tests/golden/nccl/, one file per NCCL version and case), the supervisor's offset reader, the
controller's lines and flags, the environment a launch sets; and, on the namespace cluster, a
real launch whose ranks write an NCCL log as NCCL would (no GPU here)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from clusterrun import wire
from clusterrun.launch import nccl as view
from clusterrun.plan import environment
from clusterrun.remote.node import nccllog
from clusterrun.transport import bundle
from tests.conftest import Cluster, copy_payload, run_cli

GOLDEN = Path(__file__).resolve().parent / "golden" / "nccl"
WORKERS = ["node5", "node6", "node7", "node8"]


def summary(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"version": None, "interfaces": [], "networks": [], "devices": [],
                            "no_ib": False, "gdr": None, "nranks": None, "nnodes": None,
                            "init_started": [], "init_done": []}
    return {**base, **fields}


# (fixture, host whose lines are read, the exact summary)
CASES = [
    ("2.4.7-ib.log", "master_node", summary(
        version="2.4.7", interfaces=[["ib0", "192.168.11.1"]], networks=["IB"],
        devices=["mlx5_0:1/IB"])),
    # Before 2.5 `NET/Socket : Using` is every process's bootstrap, not the network.
    ("2.4.7-ib.log", "secondary_node", summary(
        version="2.4.7", interfaces=[["ib0", "192.168.11.2"]])),
    ("2.4+-socket-ring.log", "ip-172-31-0-119", summary(networks=["Socket"])),
    ("2.4+-socket-ring.log", "ip-172-31-7-247", summary(
        nranks=64, init_started=[15], init_done=[15])),
    ("2.8+-ib-gdrdma-init-complete.log", "A03-R28-I49-3-9000018", summary(
        networks=["IB"], gdr="on", nranks=16, init_started=[8, 9, 12, 14, 15],
        init_done=[8, 9, 12, 14, 15])),
    ("2.10+-socket-no-ib-ipv6.log", "oneflow-15", summary(
        interfaces=[["eno1", "192.168.1.15"]], networks=["Socket"], no_ib=True)),
    ("2.12.9-ibext-sharp.log", "ad5b8ae33076", summary(
        version="2.12.9", interfaces=[["eth0", "10.0.1.2"]], networks=["IBext"],
        devices=[f"mlx5_{i}:1/IB" for i in range(8)])),
    ("2.12.12-ib-roce.log", "gcn6", summary(
        version="2.12.12", interfaces=[["eno1np0", "172.18.62.6"]], networks=["IB"],
        devices=["mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/RoCE"])),
    ("2.13.4-ib.log", "4c217144f0b1", summary(
        version="2.13.4", interfaces=[["eth0", "10.0.1.9"]], networks=["IB"],
        devices=["mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB", "mlx5_3:1/IB"])),
    ("2.17+-mpirun-tagged-socket.log", "node2", summary(networks=["Socket"])),
    ("2.18.5-roce.log", "node2", summary(
        version="2.18.5", interfaces=[["enp24s0np0", "10.10.10.1"]], networks=["IB"],
        devices=["mlx5_4:1/RoCE"])),
    ("2.19.3-roce.log", "dgxh100-4", summary(
        version="2.19.3", interfaces=[["enp220s0np0", "11.1.128.136"]], networks=["IB"],
        devices=["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"])),
    ("2.19.3-socket-no-ib.log", "instance-8g-96c-4", summary(
        version="2.19.3", interfaces=[["ens7", "10.128.0.33"]], networks=["Socket"],
        no_ib=True, nranks=1, init_started=[0])),
    ("2.19+-bond0-init-complete.log", "hostname-test", summary(
        interfaces=[["bond0", "172.36.134.184"]], nranks=64, init_started=[32, 34, 35, 36],
        init_done=[32, 34, 35, 36])),
    ("2.19+-nnodes-one-node.log", "hw14", summary(
        nranks=8, nnodes=1, init_started=[0, 1, 2, 5])),
    ("2.19+-roce-gdr-disabled.log", "hostname1", summary(
        interfaces=[["primaryip", "10.10.10.10"]], networks=["IB"],
        devices=["mlx5_0:1/RoCE", "mlx5_1:1/RoCE"], gdr="off", nranks=16, init_started=[0])),
]


@pytest.mark.parametrize(("fixture", "host", "expected"), CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_captured_logs_parse_to_the_exact_summary(fixture: str, host: str,
                                                  expected: dict[str, Any]) -> None:
    text = (GOLDEN / fixture).read_text()
    assert nccllog.digest_text(text, host) == expected


def test_every_fixture_is_tested_and_has_its_source() -> None:
    readme = (GOLDEN / "README.md").read_text()
    files = sorted(p.name for p in GOLDEN.glob("*.log"))
    assert sorted({c[0] for c in CASES}) == files
    for name in files:
        row = next(line for line in readme.splitlines() if line.startswith(f"| {name} |"))
        assert re.search(r"https://github\.com/\S+/(issues|pull)/\d+", row), name


def test_the_world_communicator_is_the_one_of_world_size() -> None:
    lines = [
        "h:1:1 [0] NCCL INFO comm 0x1 rank 2 nranks 2 cudaDev 0 - Init COMPLETE",  # a subgroup
        "h:1:1 [0] NCCL INFO comm 0x2 rank 5 nranks 8 cudaDev 0 - Init START",
        "h:2:2 [1] NCCL INFO comm 0x3 rank 6 nranks 8 cudaDev 1 - Init COMPLETE",
    ]
    got = nccllog.digest_text("\n".join(lines), world_size=8)
    assert (got["nranks"], got["init_started"], got["init_done"]) == (8, [5, 6], [6])


def host_report(fixture: str, host: str) -> wire.NcclReport:
    raw = nccllog.digest_text((GOLDEN / fixture).read_text(), host)
    event = wire.parse({"ev": "nccl", "e": 1.5, **raw})
    assert isinstance(event, wire.NcclReport)
    return event


def test_one_line_per_host_from_captured_logs() -> None:
    gdr = host_report("2.8+-ib-gdrdma-init-complete.log", "A03-R28-I49-3-9000018")
    assert gdr.public()["init_done"] == [8, 9, 12, 14, 15]
    line = view.host_line(view.HostNccl("gpu-b", range(8, 16), gdr))
    assert line == ("nccl gpu-b: IB, GPUDirect RDMA on, 5/8 ranks init done "
                    "(not: 10, 11, 13)")
    ibext = host_report("2.12.9-ibext-sharp.log", "ad5b8ae33076")
    assert view.host_line(view.HostNccl("gpu-a", range(0, 8), ibext)) == (
        "nccl gpu-a: eth0 10.0.1.2, IBext (mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_3:1, +4 more), "
        "0/8 ranks init done (not: 0, 1, 2, 3, 4, 5, 6, 7)")
    roce = host_report("2.19+-roce-gdr-disabled.log", "hostname1")
    assert view.host_line(view.HostNccl("gpu-c", range(0, 1), roce)) == (
        "nccl gpu-c: primaryip 10.10.10.10, IB (mlx5_0:1 RoCE, mlx5_1:1 RoCE), "
        "GPUDirect RDMA off, 0/1 ranks init done (not: 0)")


def report(networks: tuple[str, ...], done: range, *, nnodes: int | None = 2,
           nranks: int = 4, no_ib: bool = False) -> wire.NcclReport:
    return wire.NcclReport(0.0, interfaces=(("eth0", "10.0.0.1"),), networks=networks,
                           devices=("mlx5_0:1/IB",) if networks == ("IB",) else (),
                           gdr="on" if networks == ("IB",) else None, nranks=nranks,
                           nnodes=nnodes, no_ib=no_ib, init_started=tuple(done),
                           init_done=tuple(done))


def test_the_controller_says_each_host_once_then_the_flags() -> None:
    said: list[str] = []
    watch = view.NcclWatch({"gpu-a": range(0, 2), "gpu-b": range(2, 4)}, said.append)
    watch.update("gpu-a", report(("IB",), range(0, 1)), now=0.0)
    assert said == []  # gpu-a's rank 1 has not finished init
    watch.update("gpu-a", report(("IB",), range(0, 2)), now=1.0)
    watch.update("gpu-a", report(("IB",), range(0, 2)), now=2.0)
    assert said == ["nccl gpu-a: eth0 10.0.0.1, IB (mlx5_0:1), GPUDirect RDMA on, "
                    "2/2 ranks init done"]
    watch.update("gpu-b", report(("Socket",), range(2, 4), no_ib=True), now=3.0)
    watch.finish()
    assert said[1:] == [
        "nccl gpu-b: eth0 10.0.0.1, Socket, 2/2 ranks init done",
        "nccl warning: gpu-b uses Socket (TCP) while gpu-a use IB: every collective runs at "
        "the speed of the TCP hosts (NCCL found no IB device on gpu-b; in a container, "
        "/dev/infiniband must be passed in)"]


def test_node_and_rank_counts_that_differ_from_the_inventory_are_flagged() -> None:
    hosts = [view.HostNccl("gpu-a", range(0, 2), report(("IB",), range(0, 2), nnodes=1,
                                                         nranks=2)),
             view.HostNccl("gpu-b", range(2, 4), report(("IB",), range(2, 4), nnodes=1,
                                                         nranks=2))]
    flags = view.cross_host_flags(hosts, world_size=4)
    assert flags[0].startswith("NCCL counted 1 node(s) on gpu-a,gpu-b, the inventory has 2")
    assert flags[1] == "NCCL's communicator on gpu-a,gpu-b has 2 ranks, the run has 4"


def test_ranks_stuck_in_init_are_named_while_running_and_at_the_end() -> None:
    said: list[str] = []
    watch = view.NcclWatch({"gpu-a": range(0, 2), "gpu-b": range(2, 4)}, said.append,
                           patience=60)
    watch.update("gpu-a", report(("IB",), range(0, 1)), now=0.0)
    watch.tick(30.0)
    assert said == []
    watch.tick(61.0)
    assert said == ["nccl gpu-a: eth0 10.0.0.1, IB (mlx5_0:1), GPUDirect RDMA on, "
                    "1/2 ranks init done (not: 1)",
                    "nccl warning: gpu-a: ranks 1 have not completed, after 61 s, NCCL init "
                    "(a firewall between hosts, a wrong interface, or a rank stuck before init)"]
    watch.finish()
    assert said[2:] == ["nccl warning: gpu-a: ranks 1 never completed NCCL init (a firewall "
                        "between hosts, a wrong interface, or a rank stuck before init)",
                        "nccl warning: no NCCL log from gpu-b: ranks 2, 3 never started NCCL"]


def test_a_run_without_nccl_says_nothing() -> None:
    said: list[str] = []
    watch = view.NcclWatch({"a": range(0, 1)}, said.append, patience=0)
    watch.tick(100.0)
    watch.finish()
    assert said == []
    assert view.summary([view.HostNccl("a", range(0, 1), None)], 1) is None


def test_the_supervisor_reads_only_new_bytes_and_reports_changes(tmp_path: Path) -> None:
    watcher = nccllog.Watcher(str(tmp_path), world_size=2)
    assert watcher.poll(0.0) is None  # no file: a gloo run
    path = tmp_path / "nccl-h.11.log"
    path.write_bytes(b"h:11:11 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
                     b"h:11:12 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 - Init COMP")
    first = watcher.poll(1.0)
    assert first is not None and first["interfaces"] == [["eth0", "10.0.0.1"]]
    assert first["init_done"] == []  # the last line is not finished yet
    with path.open("ab") as handle:
        handle.write(b"LETE\n")
    assert watcher.poll(1.5) is None  # polled at most once a second
    second = watcher.poll(2.5)
    assert second is not None and second["init_done"] == [0]
    assert watcher.poll(10.0) is None  # nothing new
    assert watcher.offsets == {"nccl-h.11.log": path.stat().st_size}


def test_the_supervisor_ships_the_parser() -> None:
    assert b'"clusterrun.remote.node.nccllog"' in bundle.program_source("run.py")


def test_launch_sets_nccl_debug_unless_the_user_did() -> None:
    assert environment.nccl_debug({}, "/w/runs/r1/a") == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/w/runs/r1/a/nccl-%h.%p.log"}
    assert environment.nccl_debug({"NCCL_DEBUG": "WARN"}, "/w") == {}
    assert environment.nccl_debug({"NCCL_DEBUG_FILE": "/tmp/x"}, "/w") == {}
    # A literal % in the path is escaped as NCCL expects; the files match the supervisor's glob.
    assert environment.nccl_debug({}, "/w/50%")["NCCL_DEBUG_FILE"] == "/w/50%%/nccl-%h.%p.log"
    name = environment.NCCL_LOG_NAME.replace("%h", "gpu-a").replace("%p", "4242")
    assert Path("/x", name).match(nccllog.FILE_GLOB)


def test_dry_run_shows_the_nccl_settings(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "CLUSTERRUN_HOME": str(tmp_path / ".clusterrun")}
    cp = run_cli("launch", "--dry-run", "inventories/localhost.yaml",
                 "payloads/train_digits.py", env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    files = re.findall(r"env: +NCCL_DEBUG_FILE=(\S+)", cp.stdout)
    runs = re.findall(r"run files: (\S+)", cp.stdout)
    assert files == [f"{r}/nccl-%h.%p.log" for r in runs] and len(files) == 2
    assert cp.stdout.count("env:       NCCL_DEBUG=INFO") == 2
    mine = run_cli("launch", "--dry-run", "--env", "NCCL_DEBUG=WARN",
                   "inventories/localhost.yaml", "payloads/train_digits.py", env=env, timeout=60)
    assert mine.returncode == 0, mine.stderr
    assert "NCCL_DEBUG_FILE" not in mine.stdout
    assert mine.stdout.count("env:       NCCL_DEBUG=WARN") == 2


# --- The namespace cluster: real sshd, real torchrun, NCCL simulated by the payload.


@pytest.mark.cluster
def test_launch_prints_what_nccl_chose_per_host(cluster: Cluster, home: Path, tmp_path: Path,
                                                 clean: None) -> None:
    script = copy_payload(tmp_path, "fake_nccl.py")
    inv = cluster.inventory(tmp_path / "inv.yaml", WORKERS)
    cp = run_cli("launch", "--nproc-per-node", "2", "--env", "NCCL_SIM_SOCKET_HOST=node7",
                 "--env", "NCCL_SIM_STUCK_RANK=7", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    for name in WORKERS:
        host = cluster.host(name)
        where = f"{host.ifname} {host.address}"
        expected = {
            "node7": f"nccl {name}: {where}, Socket, 2/2 ranks init done",
            "node8": f"nccl {name}: {where}, IB (mlx5_0:1), GPUDirect RDMA on, "
                     "1/2 ranks init done (not: 7)",
        }.get(name, f"nccl {name}: {where}, IB (mlx5_0:1), GPUDirect RDMA on, "
                    "2/2 ranks init done")
        assert cp.stderr.count(f"clusterrun: {expected}\n") == 1, cp.stderr
        assert cp.stderr.count(f"nccl {name}:") == 1
    assert ("clusterrun: nccl warning: node7 uses Socket (TCP) while node[5-6,8] use IB: "
            "every collective runs at the speed of the TCP hosts (NCCL found no IB device on "
            "node7;") in cp.stderr
    assert "clusterrun: nccl warning: node8: ranks 7 never completed NCCL init" in cp.stderr
    assert "node(s)" not in cp.stderr and "ranks, the run has" not in cp.stderr
    run_dir = next((home / "runs").iterdir())
    saved = json.loads((run_dir / "summary.json").read_text())["nccl"]
    assert sorted(saved["hosts"]) == WORKERS
    assert saved["hosts"]["node7"]["networks"] == ["Socket"]
    assert saved["hosts"]["node8"]["init_done"] == [6]
    assert any(f.startswith("node7 uses Socket") for f in saved["flags"])
    # NCCL's own files stay in the run's folder on each host, one per process.
    rundir = json.loads((run_dir / "plan.json").read_text())["nodes"][0]["rundir"]
    listing = cluster.run_on("node5", "sh", "-c", f"ls {rundir}").split()
    assert len([f for f in listing if f.startswith("nccl-node5.")]) == 2


@pytest.mark.cluster
def test_the_users_own_nccl_debug_wins(cluster: Cluster, home: Path, tmp_path: Path,
                                       clean: None) -> None:
    script = copy_payload(tmp_path, "fake_nccl.py")
    inv = cluster.inventory(tmp_path / "inv.yaml", WORKERS[:2],
                            defaults={"env": {"NCCL_DEBUG": "WARN"}})
    cp = run_cli("launch", "--env", f"RUN_TAG={uuid.uuid4().hex[:6]}", "--env", "SLEEP=0",
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    for name, rank in (("node5", 0), ("node6", 1)):
        assert (f"[{name} r{rank}] nccl env: NCCL_DEBUG=WARN NCCL_DEBUG_FILE=None"
                in cp.stdout), cp.stdout
    assert "nccl node" not in cp.stderr and "nccl warning" not in cp.stderr
