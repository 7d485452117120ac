"""Launch modes for the scripts users already have (issue 9), through the localhost transport:
no root, no sshd. The same modes on the namespace cluster: tests/test_scripts.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import REPO, run_cli

LOCALHOST = REPO / "inventories" / "localhost.yaml"


def test_a_module_runs_as_python_m_runs_it(tmp_path: Path) -> None:
    pkg = tmp_path / "proj" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        "import os, sys\n"
        "from mypkg import __name__ as pkg\n"  # the package itself is importable
        "print(f'module {__name__} of {pkg} rank {os.environ[\"RANK\"]} args {sys.argv[1:]}')\n")
    cp = run_cli("launch", "--no-torchrun", "-m", "mypkg.train", str(LOCALHOST), "--lr", "0.1",
                 cwd=tmp_path / "proj", env={"CLUSTERRUN_HOME": str(tmp_path / "home")})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    for rank in (0, 1):
        assert f"module __main__ of mypkg rank {rank} args ['--lr', '0.1']" in cp.stdout


def test_a_module_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    cp = run_cli("launch", "-m", "nosuch.train", str(LOCALHOST), cwd=tmp_path,
                 env={"CLUSTERRUN_HOME": str(tmp_path / "home")})
    assert cp.returncode == 2
    assert "-m nosuch.train: there is no package nosuch/" in cp.stderr


def test_torchrun_options_clusterrun_owns_are_refused_before_anything(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('never')\n")
    cp = run_cli("launch", "--torchrun-arg=--nnodes=3", str(LOCALHOST), str(script),
                 env={"CLUSTERRUN_HOME": str(tmp_path / "home")})
    assert cp.returncode == 2
    assert "clusterrun sets --nnodes itself" in cp.stderr
    assert not (tmp_path / "home").exists()


def test_per_process_placeholders_need_no_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('never')\n")
    cp = run_cli("launch", str(LOCALHOST), str(script), "--id", "{rank}",
                 env={"CLUSTERRUN_HOME": str(tmp_path / "home")})
    assert cp.returncode == 2 and "--no-torchrun" in cp.stderr


def test_dry_run_shows_each_process_expanded(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('never')\n")
    cp = run_cli("launch", "--dry-run", "--no-torchrun", "--local-rank-arg", str(LOCALHOST),
                 str(script), "-rn", "{rank}", "-ws", "{world_size}", "--at",
                 "tcp://{master_addr}:{master_port}", "--cfg", '{"lr": 0.1}', "{{rank}",
                 env={"CLUSTERRUN_HOME": str(tmp_path / "home")})
    assert cp.returncode == 0, cp.stderr
    lines = [line for line in cp.stdout.splitlines() if line.strip().startswith("rank ")]
    assert len(lines) == 2, cp.stdout
    for rank, line in enumerate(lines):
        assert f"rank {rank} (local 0): " in line
        assert f"--local_rank=0 -rn {rank} -ws 2 --at tcp://127.0.0.1:" in line
        assert "--cfg '{\"lr\": 0.1}' '{rank}'" in line  # JSON untouched, {{ unescaped once
    plan_hint = json.dumps({"lr": 0.1})
    assert plan_hint in cp.stdout
