"""`hosts: slurm` and INVENTORY `slurm` without a cluster: what an allocation turns into, and
the job step each command becomes. A real Slurm: tests/test_slurm_runs.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError
from clusterrun.transport.srun import step_argv


@pytest.fixture
def allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08],login3")


def test_slurm_hosts_are_the_allocations_nodes(tmp_path: Path, allocation: None) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  nproc_per_node: 2\n  workdir: /scratch/run\nhosts: slurm\n")
    inv = inventory.load(path)
    assert [h.host for h in inv.hosts] == ["gpu07", "gpu08", "login3"]
    assert all(h.transport == "srun" and h.slurm_job == "4242" for h in inv.hosts)
    assert inv.master.host == "gpu07" and inv.hosts[1].nproc_per_node == 2
    assert inv.hosts[2].workdir == "/scratch/run" and inv.hosts[0].line == 4


def test_slurm_as_inventory_and_over_ssh(tmp_path: Path, allocation: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert [h.transport for h in inventory.load("slurm").hosts] == ["srun"] * 3
    path = tmp_path / "inv.yaml"
    path.write_text("transport: ssh\nhosts: slurm\n")
    hosts = inventory.load(path).hosts
    assert [(h.host, h.transport, h.slurm_job) for h in hosts[:1]] == [("gpu07", "ssh", None)]


def test_outside_an_allocation_says_how_to_get_one(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as err:
        inventory.load("slurm")
    assert "there is none here (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set)" in \
        err.value.message and "salloc -N3" in err.value.message


@pytest.mark.parametrize(("text", "says"), [
    ("transport: scp\nhosts: slurm\n", "transport: 'scp' must be srun"),
    ("transport: srun\nhosts:\n  - 10.0.0.1\n", "`transport:` applies to `hosts: slurm` only"),
])
def test_bad_transports(tmp_path: Path, allocation: None, text: str, says: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError, match=says):
        inventory.load(path)


def test_each_command_is_one_step_on_one_node(tmp_path: Path, allocation: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = inventory.load("slurm").hosts[1]
    argv = step_argv(spec, "exec python3 -u -c 'x'")
    assert argv[:2] == ["srun", "--jobid"] and "4242" in argv
    assert argv[argv.index("--nodelist") + 1] == "gpu08"
    assert "--overlap" in argv and "--nodes=1" in argv and "--ntasks=1" in argv
    assert argv[-3:] == ["/bin/sh", "-c", "exec python3 -u -c 'x'"]
    assert "--cpus-per-task=72" in step_argv(spec, "true", 72)
    # The controller's secrets stay here, as over SSH.
    export = next(a for a in argv if a.startswith("--export="))
    assert "ALL" not in export and "PATH" in export


def test_a_step_asks_for_the_jobs_cpus_on_its_node() -> None:
    from clusterrun.transport.srun import job_cpus

    env = {"SLURM_JOB_NODELIST": "gpu[07-08],login3", "SLURM_JOB_CPUS_PER_NODE": "72(x2),36"}
    assert job_cpus(env) == {"gpu07": 72, "gpu08": 72, "login3": 36}
    assert job_cpus({"SLURM_JOB_NODELIST": "a[1-2]", "SLURM_JOB_CPUS_PER_NODE": "8"}) == {}
    assert job_cpus({}) == {}
