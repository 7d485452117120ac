"""Shell completion: click's scripts for bash, zsh and fish, and clusterrun's candidates for run
ids (newest first), a run's node names and inventory files; fast, from this machine's files
only, and silent when $CLUSTERRUN_HOME is unusable. One test drives a real bash through the
script clusterrun prints, as a user's Tab press does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterrun.cli import cli
from clusterrun.cli.complete import COMPLETE_VAR, Bash
from clusterrun.runs.journal import Journal, RunRecord

OLD, NEW = "20250101-100000-train-aaaa", "20250102-090000-eval-bbbb"


def make_run(home: Path, run_id: str, created: float, nodes: list[str]) -> None:
    """A run's folder as a launch makes it (its journal writes plan.json and state.json)."""
    plan = {"run_id": run_id, "name": run_id.split("-")[2], "created": created,
            "nnodes": len(nodes), "world_size": len(nodes),
            "nodes": [{"name": n, "host": n, "node_rank": i, "nproc": 1, "ranks": [i, i],
                       "connection": {}} for i, n in enumerate(nodes)]}
    Journal.start(home, RunRecord(id=run_id, name=plan["name"], hosts=tuple(nodes),
                                  inventory="inv.yaml", started_at=created), plan)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two runs; the newer one's id sorts first by time, not by name."""
    path = tmp_path / "home"
    now = time.time()
    make_run(path, OLD, now - 7200, ["gpu-a", "gpu-b"])
    make_run(path, NEW, now - 60, ["node1", "node2", "node3"])
    monkeypatch.setenv("CLUSTERRUN_HOME", str(path))
    return path


def candidates(*words: str) -> list[str]:
    """What clusterrun offers for the last of ``words`` (the one being typed)."""
    comp = Bash(cli, {}, "clusterrun", COMPLETE_VAR)
    os.environ.update(COMP_WORDS=" ".join(["clusterrun", *words]), COMP_CWORD=str(len(words)))
    try:
        args, incomplete = comp.get_completion_args()
    finally:
        del os.environ["COMP_WORDS"], os.environ["COMP_CWORD"]
    return [item.value for item in comp.get_completions(args, incomplete)]


@pytest.mark.parametrize("command", ["logs", "stop", "top", "stacks"])
def test_run_ids_newest_first(home: Path, command: str) -> None:
    assert candidates(command, "") == [NEW, OLD]
    assert candidates(command, "20250101") == [OLD]


def test_node_names_of_the_run_named_or_the_newest(home: Path) -> None:
    assert candidates("logs", OLD, "--node", "") == ["gpu-a", "gpu-b"]
    assert candidates("logs", "--node", "") == ["node1", "node2", "node3"]
    assert candidates("stacks", "--node", "node1,") == ["node1,node1", "node1,node2",
                                                         "node1,node3"]
    assert candidates("logs", "no-such-run", "--node", "") == []


def test_inventory_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cluster.yaml").write_text("hosts: []\n")
    (tmp_path / "old.yml").write_text("hosts: []\n")
    (tmp_path / "hostfile").write_text("gpu1 slots=8\ngpu2 slots=8\n")
    (tmp_path / "notes.txt").write_text("not: a hostfile\n")
    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "big.yaml").write_text("hosts: []\n")
    monkeypatch.chdir(tmp_path)
    for command in ("launch", "check", "exec", "hosts", "env"):
        assert candidates(command, "") == ["cluster.yaml", "conf/", "hostfile", "old.yml"]
    assert candidates("launch", "conf/") == ["conf/big.yaml"]
    assert candidates("launch", "c") == ["cluster.yaml", "conf/"]
    assert candidates("check", f"{tmp_path}/h") == [f"{tmp_path}/hostfile"]


def test_a_script_and_its_arguments_are_left_to_the_shells_file_completion(home: Path) -> None:
    comp = Bash(cli, {}, "clusterrun", COMPLETE_VAR)
    for args, incomplete in [(["launch", "inv.yaml"], "tr"), (["launch", "inv.yaml", "t.py"], ""),
                             (["launch", "--env-file"], "")]:
        assert [(i.type, i.value) for i in comp.get_completions(args, incomplete)] == \
            [("file", incomplete)]


def test_commands_and_options_come_from_click(home: Path) -> None:
    assert "launch" in candidates("la") and candidates("la") == ["launch"]
    assert "--json" in candidates("logs", "--j")


@pytest.mark.parametrize("bad", ["through-a-file/home", "missing/home", ""])
def test_an_unusable_home_gives_no_candidates_and_no_traceback(tmp_path: Path, bad: str) -> None:
    (tmp_path / "through-a-file").write_text("")
    if bad == "":  # a run folder whose files are not JSON
        bad = "home"
        (tmp_path / "home" / "runs" / OLD).mkdir(parents=True)
        (tmp_path / "home" / "runs" / OLD / "plan.json").write_text("{not json")
    env = {**os.environ, "CLUSTERRUN_HOME": str(tmp_path / bad), COMPLETE_VAR: "bash_complete",
           "COMP_WORDS": "clusterrun logs --node ", "COMP_CWORD": "3"}
    cp = subprocess.run([sys.executable, "-m", "clusterrun"], env=env, capture_output=True,
                        text=True, timeout=60, check=False)
    assert (cp.returncode, cp.stdout.strip(), cp.stderr) == (0, "", "")


@pytest.mark.parametrize(("shell", "keeps_order"), [
    ("bash", "complete -o nosort"), ("zsh", "-V unsorted"), ("fish", "--keep-order")])
def test_each_shells_script_keeps_the_order(shell: str, keeps_order: str) -> None:
    cp = subprocess.run([sys.executable, "-m", "clusterrun"], capture_output=True, text=True,
                        env={**os.environ, COMPLETE_VAR: f"{shell}_source"}, timeout=60,
                        check=False)
    assert cp.returncode == 0, cp.stderr
    assert keeps_order in cp.stdout and "_clusterrun_completion" in cp.stdout


def test_a_real_bash_completes_a_run_id(home: Path, tmp_path: Path) -> None:
    """As a user has it: `eval "$(_CLUSTERRUN_COMPLETE=bash_source clusterrun)"`, then Tab
    after `clusterrun logs 2025`: the function bash calls fills COMPREPLY, newest first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "clusterrun"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m clusterrun "$@"\n')
    launcher.chmod(0o755)
    script = ('eval "$(_CLUSTERRUN_COMPLETE=bash_source clusterrun)"\n'
              'COMP_WORDS=(clusterrun logs 2025); COMP_CWORD=2\n'
              '_clusterrun_completion clusterrun\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n'
              'COMP_WORDS=(clusterrun logs 20250101-100000-train-aaaa --node ""); COMP_CWORD=4\n'
              'COMPREPLY=(); _clusterrun_completion clusterrun\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    cp = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True,
                        text=True, timeout=60, check=False,
                        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == [NEW, OLD, "gpu-a", "gpu-b"]
    assert cp.stderr == ""
