"""`launch --no-torchrun` starts the script itself, so preflight does not require torch on the
hosts: a lock or an interpreter without torch launches with the checks on. Plain launch (and
`check`) still require it. On local nodes whose `python:` has no torch at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus
from clusterrun.inventory import HostSpec
from clusterrun.preflight import decide
from clusterrun.preflight.facts import HostFacts
from tests.conftest import run_cli, write_inventory


@pytest.fixture
def no_torch(tmp_path: Path) -> Path:
    """An interpreter that cannot import torch: this one's base, without site-packages."""
    python = tmp_path / "python-without-torch"
    python.write_text(f'#!/bin/sh\nexec {sys._base_executable} -S "$@"\n')  # type: ignore[attr-defined]
    python.chmod(0o755)
    found = subprocess.run([str(python), "-c", "import torch"], capture_output=True, check=False)
    assert found.returncode != 0, "torch is importable without site-packages"
    return python


@pytest.fixture
def inventory(tmp_path: Path, no_torch: Path) -> Path:
    return write_inventory(tmp_path / "inv.yaml", [
        {"host": "localhost", "name": "n0", "python": str(no_torch), "nproc_per_node": 1}])


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job" / "job.py"
    path.parent.mkdir()
    path.write_text("import os\n"
                    "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    return path


def test_no_torchrun_launches_where_torch_is_missing(home: Path, inventory: Path,
                                                     job: Path) -> None:
    cp = run_cli("launch", "--no-torchrun", str(inventory), str(job), timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "[n0 r0] rank 0 of 1" in cp.stdout
    assert "torch is not installed" not in cp.stderr


@pytest.mark.parametrize(("needed", "ok", "detail"), [
    (False, True, "not installed (not needed: --no-torchrun starts the script without torchrun)"),
    (True, False, "torch is not installed for /usr/bin/python3 on n0"),
])
def test_the_torch_check_says_whether_torch_is_needed(needed: bool, ok: bool,
                                                      detail: str) -> None:
    spec = HostSpec("localhost", "n0", master=True, line=1)
    facts = HostFacts.from_json({"python": "3.11.2", "python_path": "/usr/bin/python3",
                                 "torch": None})
    torch = {c.name: c for c in decide.host_checks(spec, facts, torch_needed=needed)}["torch"]
    assert (torch.ok, torch.detail.startswith(detail)) == (ok, True), torch


def test_torchrun_still_requires_torch(home: Path, inventory: Path, job: Path) -> None:
    cp = run_cli("launch", str(inventory), str(job), timeout=120)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    assert "torch is not installed for" in cp.stderr and "on n0" in cp.stderr
