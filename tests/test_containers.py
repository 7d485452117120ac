"""`container:` without an engine: the inventory keys, what preflight makes of the engine's
answers, where `exec` runs, and what --dry-run shows. The real engine is in
tests/test_container_runs.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError, UsageError
from clusterrun.exec import placed
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.plan import build as planning
from clusterrun.plan import view as planview
from clusterrun.plan.model import Job
from clusterrun.preflight.container import judge
from clusterrun.preflight.report import CheckReport, HostReport

from .conftest import write_inventory


def test_container_keys_in_defaults_and_per_host(tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inv.yaml", [
        {"host": "10.0.0.11"},
        {"host": "10.0.0.12", "container": "other", "container_engine": "docker",
         "container_user": "1000:1000"},
        {"host": "localhost", "name": "here"},
    ], defaults={"container": "trainer", "container_engine": "podman"})
    a, b, here = inventory.load(path).hosts
    assert (a.container, a.container_engine, a.container_user) == ("trainer", "podman", None)
    assert (b.container, b.container_engine, b.container_user) == ("other", "docker", "1000:1000")
    # This machine's interpreter and state directory mean nothing inside a container.
    assert here.container == "trainer" and here.python == "python3"
    assert here.workdir == "~/clusterrun" and not here.own_files


@pytest.mark.parametrize(("key", "value", "says"), [
    ("container", "-rm", "container '-rm' is not allowed"),
    ("container", "a;reboot", "container 'a;reboot' is not allowed"),
    ("container_engine", "lxc", "must be docker or podman"),
    ("container_user", "root; id", "container_user 'root; id' is not allowed"),
])
def test_bad_container_keys_are_refused_with_their_line(tmp_path: Path, key: str, value: str,
                                                        says: str) -> None:
    path = write_inventory(tmp_path / "inv.yaml", [{"host": "10.0.0.11", key: value}])
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    assert says in err.value.message and "inv.yaml:" in err.value.message


SPEC = HostSpec("10.0.0.11", "gpu1", master=True, line=1, container="trainer")


@pytest.mark.parametrize(("output", "says"), [
    ("engine=\nerror=missing\n", "neither docker nor podman is installed"),
    ("engine=docker\nerror=inspect\ndetail=permission denied while trying to connect to the "
     "Docker daemon socket", "Add the user to the docker group"),
    ("engine=docker\nerror=inspect\ndetail=Cannot connect to the Docker daemon at unix:///var/"
     "run/docker.sock. Is the docker daemon running?", "sudo systemctl start docker"),
    ("engine=podman\nerror=inspect\ndetail=Error: no such container trainer",
     "podman run -d --name trainer --network host"),
    ("engine=podman\nstate=exited\n", "`podman start trainer`"),
    ("engine=docker\nstate=paused\n", "`docker unpause trainer`"),
    ("engine=podman\nstate=running\nerror=python\ndetail=Error: executable file `python3` not "
     "found in $PATH", "has no usable `python3`"),
])
def test_each_container_problem_names_the_host_and_the_fix(output: str, says: str) -> None:
    found = judge(SPEC, output)
    assert found.problem is not None
    assert found.problem.startswith("gpu1: ") and says in found.problem


def test_a_running_container_with_python_is_usable() -> None:
    found = judge(SPEC, "engine=podman\nstate=running\npython=3.11.2\n")
    assert found == type(found)("podman", "running", "3.11.2", None)


def test_exec_runs_in_the_inventorys_containers_unless_told_otherwise(tmp_path: Path) -> None:
    inv = Inventory(tmp_path / "inv.yaml", (SPEC, dataclasses.replace(
        SPEC, host="10.0.0.12", name="gpu2", master=False, container=None)))
    assert placed(inv, None, on_host=False) is inv
    assert [h.container for h in placed(inv, None, on_host=True).hosts] == [None, None]
    assert [h.container for h in placed(inv, "dev", on_host=False).hosts] == ["dev", "dev"]
    with pytest.raises(UsageError, match="is not allowed"):
        placed(inv, "$(id)", on_host=False)


def test_dry_run_shows_each_hosts_engine_and_container(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    specs = (dataclasses.replace(SPEC, container_engine="podman", container_user="trainer"),
             HostSpec("10.0.0.12", "gpu2", master=False, line=2))
    inv = Inventory(tmp_path / "inv.yaml", specs)
    hosts = [HostReport(spec, rank, facts={"gpus": 0, "workdir": {"path": "/root/clusterrun"}},
                        interface="eth0", address=f"10.0.0.{11 + rank}")
             for rank, spec in enumerate(specs)]
    plan = planning.build(inv, CheckReport(hosts, "10.0.0.11", 29500), Job(script, ()))
    text = "\n".join(planview.dry_run(plan))
    assert "  container: trainer (podman, user trainer)" in text
    assert text.count("container:") == 1  # gpu2 runs on the host itself
    # ps, stop and logs -f reach the same container later, from plan.json.
    assert plan.public()["nodes"][0]["connection"]["container"] == "trainer"
    assert plan.public()["nodes"][0]["connection"]["container_engine"] == "podman"
