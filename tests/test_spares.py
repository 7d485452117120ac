"""Spare hosts (`spare: true`) in the inventory and `hosts`, and the restart options of `launch`
refused or passed on before any host is contacted. Fast tier: no root, no sshd."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError
from clusterrun.inventory.subset import select
from clusterrun.transport.fake import FakeNetwork, Interface
from tests.conftest import run_main, write_inventory


def load_text(tmp_path: Path, text: str) -> inventory.Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return inventory.load(path)


def refused(tmp_path: Path, text: str) -> str:
    """The inventory's error message (exit 2 on the command line)."""
    with pytest.raises(InventoryError) as err:
        load_text(tmp_path, text)
    return err.value.message


def test_spare_per_host_and_in_a_range(tmp_path: Path) -> None:
    inv = load_text(tmp_path, """\
hosts:
  - host: gpu01
  - host: gpu02
    spare: false
  - host: gpu[03-04]
    spare: true
  - host: gpu05
""")
    assert [h.spare for h in inv.hosts] == [False, False, True, True, False]
    assert [h.name for h in inv.active] == ["gpu01", "gpu02", "gpu05"]
    assert [h.name for h in inv.spares] == ["gpu03", "gpu04"]
    assert [h.line for h in inv.spares] == [5, 5]
    assert inv.master.name == "gpu01" and not inv.master.spare


def test_implicit_master_skips_leading_spares(tmp_path: Path) -> None:
    inv = load_text(tmp_path, """\
hosts:
  - host: gpu-e
    spare: true
  - host: gpu-f
    spare: true
  - host: gpu-a
  - host: gpu-b
""")
    assert [h.master for h in inv.hosts] == [False, False, True, False]
    assert inv.master.name == "gpu-a"
    assert inv.master_named is False


def test_named_master_beside_spares(tmp_path: Path) -> None:
    inv = load_text(tmp_path, "hosts:\n  - host: a\n  - host: b\n    master: true\n"
                    "  - host: c\n    spare: true\n")
    assert inv.master.name == "b" and inv.master_named
    assert [h.name for h in inv.spares] == ["c"]


def test_spare_in_defaults_is_refused_with_its_line(tmp_path: Path) -> None:
    message = refused(tmp_path, "defaults:\n  user: ubuntu\n  spare: true\nhosts:\n  - host: a\n")
    assert f"{tmp_path / 'inventory.yaml'}:3: `spare:` is refused in `defaults:`" in message
    assert "unknown key" not in message  # refused for its reason, not as a typo


def test_master_and_spare_on_one_host_is_refused_with_its_line(tmp_path: Path) -> None:
    message = refused(tmp_path, "hosts:\n  - host: a\n  - host: b\n    master: true\n"
                      "    spare: true\n")
    assert message.startswith(f"{tmp_path / 'inventory.yaml'}:5: a host cannot be both "
                              "`master: true` and `spare: true`")
    # On a range every host has the problem on the same line: it is said once.
    message = refused(tmp_path, "hosts:\n  - host: a\n  - host: n[1-3]\n    master: true\n"
                      "    spare: true\n")
    assert message.count("cannot be both") == 1


def test_every_host_a_spare_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, "hosts:\n  - host: a\n    spare: true\n"
                      "  - host: b[1-2]\n    spare: true\n")
    assert f"{tmp_path / 'inventory.yaml'}:2: every host is `spare: true`" in message


def test_spare_must_be_a_boolean(tmp_path: Path) -> None:
    message = refused(tmp_path, 'hosts:\n  - host: a\n  - host: b\n    spare: "true"\n')
    assert "inventory.yaml:4: hosts[1].spare must be true or false" in message


def test_selection_picks_a_master_that_is_not_a_spare(tmp_path: Path) -> None:
    inv = load_text(tmp_path, "hosts:\n  - host: a\n  - host: s\n    spare: true\n"
                    "  - host: b\n")
    kept, notes = select(inv, exclude="a")
    assert [(h.name, h.master, h.spare) for h in kept.hosts] == [("s", False, True),
                                                                 ("b", True, False)]
    assert notes == []
    # Naming only spares (`exec -w s`) uses them as ordinary hosts, and says so.
    kept, notes = select(inv, hosts="s")
    assert [(h.name, h.master, h.spare) for h in kept.hosts] == [("s", True, False)]
    assert "only spare hosts (s)" in notes[0]


def test_hosts_command_shows_spares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_inventory(tmp_path / "inv.yaml", [
        {"host": "gpu-e", "spare": True}, {"host": "gpu-a"}, {"host": "gpu-b"}])
    code, out, err = run_main(capsys, "hosts", "--json", str(path))
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["name"], r["master"], r["spare"]) for r in rows] == [
        ("gpu-e", False, True), ("gpu-a", True, False), ("gpu-b", False, False)]
    code, out, err = run_main(capsys, "hosts", str(path))
    assert code == 0, err
    head, spare_row, master_row, _ = out.splitlines()
    assert head.split()[-2:] == ["MASTER", "SPARE"]
    # Cells are aligned under their headings: the marker's column tells which one it is.
    assert spare_row[head.index("SPARE"):].strip() == "yes"
    assert master_row[head.index("MASTER"):].strip() == "yes"


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An inventory of three hosts and one spare, and a script; nothing answers on the hosts."""
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    inv = write_inventory(tmp_path / "inv.yaml", [
        {"host": "10.0.0.1"}, {"host": "10.0.0.2"}, {"host": "10.0.0.3"},
        {"host": "10.0.0.4", "spare": True}])
    return inv, script


@pytest.mark.parametrize(("flags", "words"), [
    (["--max-restarts", "1", "--detach"],
     "restarts need the attached controller: a detached run has no process left to restart it. "
     "Run it attached (inside tmux, screen or nohup) to use --max-restarts."),
    (["--min-nodes", "2"], "--min-nodes only matters when a run restarts"),
    (["--max-restarts", "0", "--min-nodes", "2"], "--min-nodes only matters when a run restarts"),
    (["--max-restarts", "1", "--min-nodes", "4"],
     "--min-nodes 4 is more than the 3 hosts a run starts on"),
    (["--max-restarts", "1", "-x", "10.0.0.3", "--min-nodes", "3"],
     "--min-nodes 3 is more than the 2 hosts a run starts on"),
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--max-restarts", "1", "--min-nodes", "0"], "--min-nodes"),
])
def test_restart_options_refused_before_any_host(
        job: tuple[Path, Path], fake_net: FakeNetwork, capsys: pytest.CaptureFixture[str],
        flags: list[str], words: str) -> None:
    inv, script = job
    code, out, err = run_main(capsys, "launch", *flags, str(inv), str(script))
    assert code == 2, (out, err)
    assert err.startswith("clusterrun: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and words in " ".join(err.split())
    assert fake_net.transports == []


def test_restart_options_reach_the_launcher(
        job: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    inv, script = job
    seen: list[Any] = []

    def run(inv: inventory.Inventory, job: Any, **kwargs: Any) -> int:
        seen.append((inv, kwargs["opts"]))
        return 0

    monkeypatch.setattr("clusterrun.launch.launcher.run", run)
    code, _, err = run_main(capsys, "launch", "--max-restarts", "2", "--min-nodes", "3",
                            str(inv), str(script))
    assert code == 0, err
    given, opts = seen[0]
    assert (opts.max_restarts, opts.min_nodes) == (2, 3)
    assert [h.host for h in given.spares] == ["10.0.0.4"]
    code, _, err = run_main(capsys, "launch", "--detach", str(inv), str(script))
    assert code == 0, err
    assert (seen[1][1].max_restarts, seen[1][1].min_nodes, seen[1][1].detach) == (0, None, True)


def test_dry_run_lists_the_spares(job: tuple[Path, Path], fake_net: FakeNetwork,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    inv, script = job
    for n in range(1, 5):
        fake_net.add(f"10.0.0.{n}", Interface("lo", "127.0.0.1/8"),
                     Interface("eth0", f"10.0.0.{n}/24"), hostname=f"gpu-{n}")
    code, out, err = run_main(capsys, "launch", "--dry-run", "--max-restarts", "1", str(inv),
                              str(script))
    assert code == 0, err
    assert "10.0.0.4 (10.0.0.4" not in out  # no node plan for the spare
    assert ("spares (nothing starts there; with --max-restarts one takes the node rank of a "
            "failed host): 10.0.0.4") in out
