"""Messages that point the right way: a torchrun habit, a command with no inventory before
it, a command's own options, a sandbox that is not there. Each used to point elsewhere
("did you mean --min-nodes", "Missing argument CMD", "unknown option -l", "sandbox removed")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_main

LOCALHOST = str(Path(__file__).resolve().parent.parent / "inventories" / "localhost.yaml")


def error_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one-paragraph usage error of `clusterrun ARGS`: exit 2, no traceback."""
    status, out, err = run_main(capsys, *args)
    assert status == 2, (status, out, err)
    assert err.startswith("clusterrun: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("raise SystemExit('must not run')\n")
    return path


@pytest.mark.parametrize(("word", "says"), [
    ("--node_rank=1", "each host's node rank is clusterrun's"),
    ("--node-rank=1", "the master (`master: true`, else the first host) is 0"),
    ("--master_addr=10.0.0.1", "set `master_addr:` in the inventory"),
    ("--master-addr=10.0.0.1", "`master: true` marks the master"),
    ("--rdzv-backend=c10d", "uses torchrun's static rendezvous"),
    ("--rdzv_endpoint=10.0.0.1:29400", "uses torchrun's static rendezvous"),
    ("--rdzv-id=7", "--master-port picks it"),
    ("--standalone", "one torchrun node per inventory host"),
    ("--max_restarts=3", "torchrun's in-place worker restarts are refused"),
])
@pytest.mark.parametrize("where", ["before", "after"])
def test_torchrun_options_get_what_clusterrun_does_instead(
        capsys: pytest.CaptureFixture[str], script: Path, word: str, says: str,
        where: str) -> None:
    """Not the nearest spelling of one of launch's own options (--node-rank got --no-sync,
    --master-addr --master-port), before INVENTORY or after it."""
    args = [word, LOCALHOST] if where == "before" else [LOCALHOST, word]
    err = error_of(capsys, "launch", *args, str(script))
    assert f"unknown option {word.split('=', maxsplit=1)[0]}" in err and says in err, err
    assert "did you mean" not in err, err


@pytest.mark.parametrize("word", ["--nnodes=3", "--nnodes=1:2"])
def test_nnodes_other_than_the_inventorys_count_is_refused(
        capsys: pytest.CaptureFixture[str], script: Path, word: str) -> None:
    """--nnodes got "did you mean --min-nodes"; it is taken now, and only when it agrees."""
    err = error_of(capsys, "launch", word, LOCALHOST, str(script))
    assert f"a run of {LOCALHOST} starts on 2 hosts" in err, err
    assert "clusterrun takes the node count from the inventory" in err
    assert ("--min-nodes MIN" in err) == (":" in word)


def test_torchrun_spellings_of_launch_options_are_launchs(
        capsys: pytest.CaptureFixture[str], script: Path) -> None:
    """--nproc_per_node and --master_port are launch's own options, spelled as torchrun does:
    their values are judged as theirs (a bad one, to start nothing)."""
    err = error_of(capsys, "launch", "--nproc_per_node=0", LOCALHOST, str(script))
    assert "'0' is neither a positive number nor `auto`" in err, err
    err = error_of(capsys, "launch", "--master_port=0", LOCALHOST, str(script))
    assert "--master_port" in err and "0 is not in the range" in err, err


@pytest.mark.parametrize("args", [["--", "hostname"], ["hostname"]])
def test_exec_without_hosts_says_it_needs_them(
        capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    """It said "Missing argument 'CMD...'": the command's first word had been taken for
    INVENTORY. (`-w HOSTS -- hostname` needs no INVENTORY: tests/test_adhoc_unit.py.)"""
    err = error_of(capsys, "exec", *args)
    assert "exec needs the hosts before the command ('hostname' was taken for them)" in err
    assert "clusterrun exec INVENTORY -- hostname, or clusterrun exec -w HOSTS -- hostname" \
        in err, err


def test_exec_with_an_inventory_and_no_command_asks_for_the_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, "exec", "-w", "node0", LOCALHOST)
    assert f"missing CMD: give the command to run after the inventory: clusterrun exec " \
           f"{LOCALHOST} -- CMD" in err, err


def test_exec_of_a_command_with_options_points_at_dashes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`exec inv ls -la` got "unknown option -l" and nothing more."""
    err = error_of(capsys, "exec", LOCALHOST, "ls", "-la")
    assert "unknown option -l for `clusterrun exec`" in err
    assert "If -l is the command's own, put `--` before the command: clusterrun exec " \
           "[OPTIONS] INVENTORY -- CMD" in err, err


def test_sandbox_down_with_no_sandbox_says_there_was_none(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    status, out, err = run_main(capsys, "sandbox", "down")
    assert status == 0, err
    assert out == f"no sandbox in {tmp_path / 'home' / 'sandbox'}: nothing to remove " \
                  "(`clusterrun sandbox up N` makes one)\n"
    assert "removed" not in out + err
