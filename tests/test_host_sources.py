"""Hostfiles, host ranges, -w/-x subsets and `clusterrun hosts`: no root, no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError, UsageError
from clusterrun.inventory.subset import select
from tests.conftest import run_cli

HOSTFILE = "# our nodes\ngpu01 slots=4\n\ngpu02   # no slots: auto\n10.0.0.[11-12] slots=2\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def table(inv: inventory.Inventory) -> list[tuple[str, str, object, bool]]:
    return [(h.host, h.name, h.nproc_per_node, h.master) for h in inv.hosts]


def test_hostfile_in_yaml_slots_become_nproc(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    hf = write(tmp_path / "sub", "hosts.txt", HOSTFILE)
    inv = inventory.load(write(tmp_path, "inv.yaml", "defaults: {user: me}\n"
                               "hostfile: sub/hosts.txt\n"))
    assert table(inv) == [("gpu01", "gpu01", 4, True), ("gpu02", "gpu02", "auto", False),
                          ("10.0.0.11", "10.0.0.11", 2, False),
                          ("10.0.0.12", "10.0.0.12", 2, False)]
    assert {h.user for h in inv.hosts} == {"me"}
    assert [(h.source, h.line) for h in inv.hosts][:2] == [(str(hf), 2), (str(hf), 4)]


def test_defaults_nproc_wins_over_slots(tmp_path: Path) -> None:
    write(tmp_path, "hosts.txt", HOSTFILE)
    inv = inventory.load(write(tmp_path, "inv.yaml", "defaults: {nproc_per_node: 1}\n"
                               "hostfile: hosts.txt\n"))
    assert {h.nproc_per_node for h in inv.hosts} == {1}


def test_hostfile_directly_as_inventory(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "hostfile", HOSTFILE))
    assert [h.host for h in inv.hosts] == ["gpu01", "gpu02", "10.0.0.11", "10.0.0.12"]
    assert all(h.user is None and h.port is None for h in inv.hosts)  # ~/.ssh/config decides
    assert inv.hosts[0].source is None and inv.hosts[0].line == 2


def test_hostfile_errors_keep_its_file_and_line(tmp_path: Path) -> None:
    hf = write(tmp_path, "hosts.txt", "gpu01 slots=x\ngpu02 max=3\nbad;host\ngpu01\n")
    inv = write(tmp_path, "inv.yaml", "hostfile: hosts.txt\n")
    with pytest.raises(InventoryError) as err:
        inventory.load(inv)
    text = str(err.value)
    assert f"{hf}:1: slots=x" in text and f"{hf}:2: 'max=3'" in text
    assert f"{hf}:3:" in text and "not allowed" in text
    dup = write(tmp_path, "dup.txt", "gpu01\ngpu02\ngpu01 slots=2\n")
    with pytest.raises(InventoryError, match=rf"{dup}:3: host 'gpu01' is listed twice \(also "
                       rf"{dup}:1\)"):
        inventory.load(write(tmp_path, "dup.yaml", "hostfile: dup.txt\n"))
    with pytest.raises(InventoryError, match=r"inv2.yaml:1: hostfile 'nope': no such file"):
        inventory.load(write(tmp_path, "inv2.yaml", "hostfile: nope\n"))
    with pytest.raises(InventoryError, match="either `hosts:` or `hostfile:`"):
        inventory.load(write(tmp_path, "inv3.yaml", "hostfile: hosts.txt\nhosts: [a]\n"))


def test_ranges_expand_and_are_validated(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "inv.yaml", "hosts:\n  - host: gpu[01-03]\n"
                               "    name: n[1-3]\n  - 10.0.0.[5-6]\n"))
    assert table(inv) == [("gpu01", "n1", "auto", True), ("gpu02", "n2", "auto", False),
                          ("gpu03", "n3", "auto", False), ("10.0.0.5", "10.0.0.5", "auto", False),
                          ("10.0.0.6", "10.0.0.6", "auto", False)]
    assert [h.line for h in inv.hosts] == [2, 2, 2, 4, 4]
    bad = write(tmp_path, "bad.yaml", "hosts:\n  - host: gpu[01-03]\n    name: n\n"
                "  - host: x[1-\n  - host: " + "a" * 70 + "[1-2]\n")
    with pytest.raises(InventoryError) as err:
        inventory.load(bad)
    text = str(err.value)
    assert ":3: hosts[0].name 'n': a range host stands for 3 hosts" in text
    assert ":4:" in text and "not a valid host range" in text
    assert ":5:" in text and "63" in text  # each expanded name is held to DNS lengths
    dup = write(tmp_path, "dup.yaml", "hosts:\n  - host: a[1-2]\n  - a2\n")
    with pytest.raises(InventoryError, match=r"dup.yaml:3: host 'a2' is listed twice \(also "
                       r"line 2\)"):
        inventory.load(dup)
    huge = write(tmp_path, "huge.yaml", "hosts:\n  - host: n[1-100000]\n")
    with pytest.raises(InventoryError, match="stands for more than 4096 hosts"):
        inventory.load(huge)


def test_selection(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "inv.yaml", "hosts:\n  - host: gpu[01-03]\n"
                               "    name: n[1-3]\n  - 10.0.0.[5-6]\n"))
    picked, notes = select(inv, "n[2-3],10.0.0.6")
    assert [(h.name, h.master) for h in picked.hosts] == [("n2", True), ("n3", False),
                                                          ("10.0.0.6", False)]
    assert notes == []  # the master was only the first host: no note
    picked, _ = select(inv, None, "gpu02,10.0.0.[5-6]")  # by address too
    assert [h.name for h in picked.hosts] == ["n1", "n3"] and picked.hosts[0].master
    for hosts, exclude, words in (("nope", None, ["no host named nope", "n1 (gpu01)"]),
                                  (None, "n[1-3],10.0.0.[5-6]", ["leaves no host", "n3"]),
                                  ("x[", None, ["not a NodeSet"]),
                                  (None, "*.ckpt", ["--exclude-files"])):
        with pytest.raises(UsageError) as err:
            select(inv, hosts, exclude)
        assert all(w in err.value.message for w in words), err.value.message


def test_leaving_out_a_named_master_says_so(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "inv.yaml", "master_addr: 10.0.0.2\nhosts:\n"
                               "  - host: a\n  - host: b\n    master: true\n  - host: c\n"))
    picked, notes = select(inv, None, "b")
    assert [(h.name, h.master) for h in picked.hosts] == [("a", True), ("c", False)]
    assert "leaves out the master b; a is the master" in notes[0]
    assert picked.master_addr == inventory.AUTO and "10.0.0.2" in notes[1]
    kept, notes = select(inv, "b,c")
    assert kept.master.name == "b" and notes == []


def test_hosts_command(tmp_path: Path) -> None:
    write(tmp_path, "hosts.txt", HOSTFILE)
    inv = write(tmp_path, "inv.yaml", "hostfile: hosts.txt\n")
    cp = run_cli("hosts", str(inv), timeout=60)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0].split() == ["SOURCE", "NAME", "ADDRESS", "USER", "PORT", "REACHED", "NPROC",
                                "MASTER", "SPARE"]
    assert lines[1].split() == [f"{tmp_path / 'hosts.txt'}:2", "gpu01", "gpu01", "-", "-", "ssh",
                                "4", "yes"]
    cp = run_cli("hosts", "--json", "-x", "gpu01", str(inv), timeout=60)
    assert cp.returncode == 0, cp.stderr
    rows = json.loads(cp.stdout)
    assert rows[0] == {"source": f"{tmp_path / 'hosts.txt'}:4", "name": "gpu02",
                       "address": "gpu02", "user": None, "port": None, "reached": "ssh",
                       "container": None, "nproc": "auto", "master": True, "spare": False}
    assert [r["name"] for r in rows] == ["gpu02", "10.0.0.11", "10.0.0.12"]
    local = write(tmp_path, "local.yaml", "hosts:\n  - host: localhost\n    name: a\n"
                  "  - host: localhost\n    name: b\n    master: true\n")
    cp = run_cli("hosts", "--json", "-w", "a", str(local), timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)[0]["reached"] == "local"
    assert "leaves out the master b; a is the master" in cp.stderr
    cp = run_cli("hosts", "-w", "zz", str(inv), timeout=60)
    assert cp.returncode == 2 and "no host named zz" in cp.stderr and "gpu01" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_options_on_check_launch_exec() -> None:
    for command in ("check", "launch", "exec"):
        cp = run_cli(command, "--help", timeout=60)
        assert "-w, --hosts NODESET" in cp.stdout and "-x, --exclude NODESET" in cp.stdout
    assert "--exclude-files PATTERN" in run_cli("launch", "--help", timeout=60).stdout


def test_a_directory_is_called_a_directory(tmp_path: Path) -> None:
    """`hostfile:`, `env_file:` or `identity_file:` naming a directory: said so, not "no such
    file"."""
    (tmp_path / "hosts.d").mkdir()
    for key, words in [("hostfile", "hostfile 'hosts.d' ("), ("env_file", "env_file 'hosts.d' (")]:
        where = "" if key == "hostfile" else "hosts:\n  - host: h1\n    "
        path = write(tmp_path, "inv.yaml", f"{where}{key}: hosts.d\n")
        with pytest.raises(InventoryError) as info:
            inventory.load(path)
        assert words in info.value.message and ") is a directory" in info.value.message
        assert "no such file" not in info.value.message


def test_a_selection_too_large_is_refused_without_expanding_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-w n[1-100000000]`: NodeSet would build every name (seconds, gigabytes) to find none."""
    from ClusterShell import NodeSet as nodeset

    inv = inventory.load(write(tmp_path, "inv.yaml", "hosts:\n  - n[1-3]\n"))
    real = nodeset.NodeSet

    def counted(text: str) -> object:
        assert "100000000" not in text, "expanded: " + text
        return real(text)

    monkeypatch.setattr(nodeset, "NodeSet", counted)
    for option in ("hosts", "exclude"):
        with pytest.raises(UsageError, match="stands for more than 4096 hosts"):
            select(inv, **{option: "n[1-100000000]"})
