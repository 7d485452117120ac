"""Hosts named on the command line (INVENTORY `gpu[01-04]`, `-w` alone), what --python,
--workdir, --nproc-per-node, --env and --master make of them, and `hosts --yaml` written and
read back: no root, no network (the CLI runs only on `localhost`, this machine).
Through real sshd, with hosts known only from ~/.ssh/config: tests/test_adhoc_hosts.py."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError, UsageError
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.inventory.adhoc import Overrides, names_a_file
from tests.conftest import run_main

REPO = Path(__file__).resolve().parent.parent


def same(inv: Inventory) -> list[HostSpec]:
    """The hosts, less where each was read (a file's line, the hostfile it came from)."""
    return [dataclasses.replace(h, line=0, source=None) for h in inv.hosts]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, so no file there can shadow a host's name."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def ssh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$HOME with an ~/.ssh/config, read the way the transport reads it."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host gpu1\n  HostName 10.9.0.1\n  User ops\n  Port 2222\n  IdentityFile ~/.ssh/lab\n"
        "Host gpu2\n  HostName 10.9.0.2\n  ProxyJump ops@bastion:2200\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_host_list_is_an_inventory_of_those_hosts(here: Path) -> None:
    inv = inventory.load("gpu[01-03],login")
    assert inv.adhoc
    assert [(h.host, h.name, h.master) for h in inv.hosts] == [
        ("gpu01", "gpu01", True), ("gpu02", "gpu02", False), ("gpu03", "gpu03", False),
        ("login", "login", False)]
    # Nothing says how each is reached: ~/.ssh/config decides, as for such an inventory host.
    for h in inv.hosts:
        assert (h.user, h.port, h.identity_file, h.proxy_jump) == (None, None, None, None)
        assert (h.python, h.workdir, h.nproc_per_node) == ("python3", "~/clusterrun", "auto")
    local = inventory.load("localhost").hosts[0]
    assert local.local and local.python == sys.executable  # this machine: clusterrun's own


@pytest.mark.parametrize("word", ["inv.yaml", "cluster.yml", "hosts.txt", "conf/inv", "./inv",
                                  "~/inv", "train.py"])
def test_a_missing_file_is_still_missing_not_a_host(here: Path, word: str) -> None:
    assert names_a_file(word)
    with pytest.raises(InventoryError) as err:
        inventory.load(word)
    assert "no such inventory file" in err.value.message or "Python script" in err.value.message
    assert "host list" not in err.value.message


def test_an_existing_file_wins_over_a_host_of_its_name(here: Path) -> None:
    (here / "gpu01").write_text("node7 slots=2\n")  # a hostfile named like a host
    inv = inventory.load("gpu01")
    assert [h.host for h in inv.hosts] == ["node7"] and not inv.adhoc


@pytest.mark.parametrize(("word", "why"), [
    ("a;b", "'a;b' is not allowed"),
    ("root@gpu01", "'@' has no place in a host list: a user belongs in ~/.ssh/config"),
    ("@gpus", "NodeSet groups (@name) are not read"),
    ("gpu[1-", "is not a valid host range"),
    ("gpu[1-100000]", "more than 4096 hosts"),
    ("x..y", "empty label"),
])
def test_neither_a_file_nor_a_host_list_says_both(
        here: Path, capsys: pytest.CaptureFixture[str], word: str, why: str) -> None:
    code, _, err = run_main(capsys, "hosts", word)
    assert code == 2
    assert f"INVENTORY {word!r} is neither an inventory file" in err and why in err, err
    assert "Traceback" not in err


def test_overrides_fill_what_a_file_would(here: Path) -> None:
    inv, notes = Overrides(python="/opt/venv/bin/python", workdir="/scratch/run",
                           nproc_per_node=2, env=(("NCCL_DEBUG", "INFO"),),
                           master="gpu03").apply(inventory.load("gpu[01-04]"))
    assert notes == []
    assert [h.name for h in inv.hosts if h.master] == ["gpu03"] and inv.master_named
    for h in inv.hosts:
        assert (h.python, h.workdir, h.nproc_per_node) == ("/opt/venv/bin/python",
                                                           "/scratch/run", 2)
        assert h.env == (("NCCL_DEBUG", "INFO"),)


def test_overrides_apply_over_an_inventory_file(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("defaults: {python: python3.11, env: {A: '1'}}\nmaster_addr: 10.0.0.11\n"
                    "hosts:\n  - {host: 10.0.0.11, master: true}\n  - {host: 10.0.0.12}\n"
                    "  - {host: 10.0.0.13, spare: true}\n")
    inv, notes = Overrides(python="/opt/py", env=(("B", "2"),),
                           master="10.0.0.12").apply(inventory.load(path))
    assert [h.python for h in inv.hosts] == ["/opt/py"] * 3
    assert inv.hosts[0].env == (("A", "1"), ("B", "2"))  # the file's, and the command line's
    assert inv.master.host == "10.0.0.12" and inv.master_addr == "auto"
    assert notes == ["master_addr 10.0.0.11 belonged to 10.0.0.11: using `auto` (the address "
                     "of 10.0.0.12)."]
    with pytest.raises(UsageError, match=r"--master 'gpu9': no such host among 10\.0\.0\."):
        Overrides(master="gpu9").apply(inventory.load(path))
    with pytest.raises(UsageError, match=r"10\.0\.0\.13 is a spare"):
        Overrides(master="10.0.0.13").apply(inventory.load(path))
    with pytest.raises(UsageError, match="--workdir ''"):
        Overrides(workdir="").apply(inventory.load(path))


def test_hosts_yaml_loads_back_to_the_same_hosts(
        here: Path, ssh_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--python", "/opt/venv/bin/python", "--nproc-per-node", "2", "--env",
            "NCCL_DEBUG=INFO", "--master", "gpu2"]
    code, out, err = run_main(capsys, "hosts", "gpu[1-3],localhost", "--yaml", *args)
    assert code == 0, err
    kept = here / "kept.yaml"
    kept.write_text(out)
    made, _ = Overrides(python="/opt/venv/bin/python", nproc_per_node=2,
                        env=(("NCCL_DEBUG", "INFO"),), master="gpu2").apply(
        inventory.load("gpu[1-3],localhost"))
    assert same(inventory.load(kept)) == same(made)
    # What ~/.ssh/config says of each host is beside it, read as the connection reads it.
    lines = out.splitlines()
    assert ("  - host: gpu1   # HostName 10.9.0.1, User ops, Port 2222, IdentityFile "
            f"{ssh_home}/.ssh/lab") in lines, out
    assert "  - host: gpu2   # HostName 10.9.0.2, ProxyJump ops@bastion:2200" in lines, out
    assert "  - host: gpu3" in lines and "  - host: localhost" in lines
    # Same again from -w alone, and the table with no file behind it.
    code, again, _ = run_main(capsys, "hosts", "-w", "gpu[1-3],localhost", "--yaml", *args)
    assert code == 0 and again.splitlines()[1:] == out.splitlines()[1:]
    code, out, _ = run_main(capsys, "hosts", "-w", "gpu[1-2]")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["command", "line", "gpu1"], out


def test_hosts_yaml_of_an_inventory_file_loads_back_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hosts.txt").write_text("gpu[01-02] slots=4\ngpu03\n")
    key = tmp_path / "id"
    key.write_text("")
    path = tmp_path / "inv.yaml"
    path.write_text(
        f"defaults: {{user: train, identity_file: {key}, setup: 'source ~/venv/bin/activate'}}\n"
        "master_port: 29400\nhostfile: hosts.txt\n")
    code, out, err = run_main(capsys, "hosts", str(path), "--yaml")
    assert code == 0, err
    (tmp_path / "kept.yaml").write_text(out)
    assert same(inventory.load(tmp_path / "kept.yaml")) == same(inventory.load(path))
    path.write_text("master_addr: 10.0.0.12\nhosts:\n  - {host: 10.0.0.11, port: 2200, "
                    "gpus: [0, 1], proxy_jump: ops@jump}\n  - {host: 10.0.0.12, name: b, "
                    "master: true, env: {X: 'a b'}}\n  - {host: 10.0.0.13, spare: true, "
                    "container: trainer, interface: ens5}\n")
    code, out, err = run_main(capsys, "hosts", str(path), "--yaml")
    assert code == 0, err
    (tmp_path / "kept.yaml").write_text(out)
    kept = inventory.load(tmp_path / "kept.yaml")
    assert same(kept) == same(inventory.load(path)) and kept.master_addr == "10.0.0.12"


def test_hosts_env_takes_values_only(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "hosts", "gpu1", "--yaml", "--env", "HF_TOKEN")
    assert code == 2 and "NAME=VALUE" in err


def test_no_inventory_and_no_w_says_how_to_name_hosts(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["hosts"], ["check"], ["env"], ["launch", "--dry-run"]):
        code, _, err = run_main(capsys, *command)
        assert code == 2 and "no hosts given: name them with INVENTORY" in err, (command, err)


@pytest.mark.parametrize("args", [
    ["localhost", "--", "echo", "ran", "here"],
    ["-w", "localhost", "--", "echo", "ran", "here"],
    ["-w", "localhost", "echo", "ran", "here"],  # pdsh's form: no INVENTORY, no --
])
def test_exec_on_hosts_named_on_the_command_line(
        here: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, out, err = run_main(capsys, "exec", *args)
    assert (code, out) == (0, "localhost: ran here\n"), err


def test_exec_with_w_keeps_an_inventory_file_as_inventory(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "exec", "-w", "node0", "missing.yaml", "--", "hostname")
    assert code == 2 and "missing.yaml: no such inventory file" in err, err
    inv = str(REPO / "inventories" / "localhost.yaml")
    code, out, err = run_main(capsys, "exec", "-w", "node1", inv, "echo", "one")
    assert (code, out) == (0, "node1: one\n"), err


def test_launch_with_w_alone_dry_run_shows_the_inventory_it_made(
        here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_HOME", str(here / "state"))
    script = here / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    code, out, err = run_main(capsys, "launch", "-w", "localhost", "--dry-run",
                              "--nproc-per-node", "2", "--workdir", str(here / "work"),
                              str(script), "--lr", "0.1")
    assert code == 0, err
    made, plan = out.split("\ndry run: ", 1)
    kept = here / "kept.yaml"
    kept.write_text(made)
    hosts = inventory.load(kept).hosts
    assert [(h.host, h.nproc_per_node, h.workdir) for h in hosts] == [
        ("localhost", 2, str(here / "work"))]
    assert "localhost (localhost, local): node_rank 0, 2 process(es)" in plan
    assert f"{script} --lr 0.1" in plan
    # An inventory file's dry run prints no inventory: it is already a file.
    inv = str(REPO / "inventories" / "localhost.yaml")
    code, out, _ = run_main(capsys, "launch", "--dry-run", inv, str(script))
    assert code == 0 and out.startswith("dry run: ")


def test_launch_with_w_keeps_an_inventory_file_as_inventory(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "train.py").write_text("print('hi')\n")
    code, _, err = run_main(capsys, "launch", "-w", "node0", "--dry-run", "missing.yaml",
                            "train.py")
    assert code == 2 and "missing.yaml: no such inventory file" in err, err


def test_check_and_env_take_w_alone(here: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_HOME", str(here / "state"))
    code, out, err = run_main(capsys, "check", "-w", "localhost", "--json")
    report = json.loads(out)
    assert [h["host"] for h in report["hosts"]] == ["localhost"], err
    assert code in (0, 3), err  # this machine may lack what a check wants; it was checked
    code, _, err = run_main(capsys, "env", "-w", "localhost")
    assert code == 2 and "-w localhost: no host has an `environment:`" in err, err
