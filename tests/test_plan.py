"""Planning is pure: node ranks, per-host interfaces and environment, the exact command."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import UsageError
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.plan import build as planning
from clusterrun.plan import secrets
from clusterrun.plan.model import Job
from clusterrun.preflight.report import CheckReport, HostReport


def report(tmp_path: Path, gpus: int = 0) -> tuple[Inventory, CheckReport]:
    specs = (
        HostSpec("10.0.0.12", "b", master=False, line=3, env=(("A", "1"),)),
        HostSpec("10.0.0.11", "a", master=True, line=2, gpus=(2, 3), nproc_per_node="auto"),
        HostSpec("10.0.0.13", "c", master=False, line=4, nproc_per_node=3),
    )
    inv = Inventory(tmp_path / "inv.yaml", specs)
    ifaces = {"a": ("eth0", [{"name": "eth0"}, {"name": "eth01"}]),
              "b": ("ens5", [{"name": "ens5"}, {"name": "virbr0"}]),
              "c": ("enp3s0", [{"name": "enp3s0"}])}
    hosts = []
    for rank, spec in enumerate([specs[1], specs[0], specs[2]]):
        name, listing = ifaces[spec.name]
        hosts.append(HostReport(spec, rank, facts={"interfaces": listing, "gpus": gpus,
                                                   "workdir": {"path": "/home/u/clusterrun"}},
                                interface=name, address=f"10.0.0.{11 + rank}"))
    return inv, CheckReport(hosts, "10.0.0.11", 29511)


def test_master_first_then_inventory_order_with_per_host_processes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    inv, rep = report(tmp_path, gpus=4)
    plan = planning.build(inv, rep, Job(script, ("--lr", "0.1")))
    assert [n.name for n in plan.nodes] == ["a", "b", "c"]
    assert [n.node_rank for n in plan.nodes] == [0, 1, 2]
    # a: its two listed GPUs; b: auto = the 4 GPUs it has; c: 3 from the inventory.
    assert [n.nproc for n in plan.nodes] == [2, 4, 3]
    assert [list(n.ranks) for n in plan.nodes] == [[0, 1], [2, 3, 4, 5], [6, 7, 8]]
    assert plan.world_size == 9
    a = plan.nodes[0]
    assert a.argv[:3] == ("python3", "-m", "torch.distributed.run")
    assert a.argv[-4:] == ("-u", f"{a.cwd}/train.py", "--lr", "0.1")
    assert "--node-rank" in a.argv and a.argv[a.argv.index("--node-rank") + 1] == "0"
    assert a.argv[a.argv.index("--master-addr") + 1] == "10.0.0.11"


def test_each_host_gets_its_own_interface_and_environment(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    inv, rep = report(tmp_path)
    plan = planning.build(inv, rep, Job(script), env=planning.EnvSources(
        extra={"A": "2", "HF_TOKEN": "t0ken"}, environ={}))
    env = {n.name: dict(n.env) for n in plan.nodes}
    assert env["b"]["GLOO_SOCKET_IFNAME"] == "ens5" and env["b"]["NCCL_SOCKET_IFNAME"] == "ens5"
    assert env["c"]["GLOO_SOCKET_IFNAME"] == "enp3s0"
    # eth0 is a prefix of eth01 on host a: NCCL gets the exact-match form, Gloo the plain name.
    assert env["a"]["NCCL_SOCKET_IFNAME"] == "=eth0" and env["a"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["a"]["CUDA_VISIBLE_DEVICES"] == "2,3" and "CUDA_VISIBLE_DEVICES" not in env["b"]
    assert env["b"]["A"] == "2"  # --env wins over the inventory
    public = plan.public()
    assert public["nodes"][1]["env"]["HF_TOKEN"] == secrets.MASK
    assert "t0ken" not in repr(public)
    assert all(n.cwd.startswith("/home/u/clusterrun/code/") for n in plan.nodes)
    assert len({n.rundir for n in plan.nodes}) == 3


def test_secret_names_are_recognised() -> None:
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "api_key"):
        assert secrets.is_secret(name)
    for name in ("NCCL_DEBUG", "OMP_NUM_THREADS", "PATH"):
        assert not secrets.is_secret(name)


@pytest.mark.parametrize("pair", ["NOEQUALS", "1BAD=x", "=x", "A B=c"])
def test_bad_env_pairs_are_usage_errors(pair: str) -> None:
    with pytest.raises(UsageError):
        planning.parse_env([pair])


def test_env_values_keep_every_byte() -> None:
    assert planning.parse_env(["A=", "B=x=y", "C=$(id) 'q'"]) == {"A": "", "B": "x=y",
                                                                "C": "$(id) 'q'"}
