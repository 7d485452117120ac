"""`clusterrun launch --dry-run` on the localhost inventory (the local transport, no sshd),
compared line by line with a checked-in plan: any change to commands, environment, ranks or
quoting shows up here as a diff.

After a deliberate change: CLUSTERRUN_UPDATE_GOLDEN=1 pytest tests/test_dry_run_golden.py
rewrites the golden file and fails, saying so: review the diff of tests/golden/ like code, commit
it, and run the test again without the variable. A run with the variable set never passes.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

GOLDEN = Path(__file__).resolve().parent / "golden" / "dry_run_localhost.txt"


def normalise(text: str, home: Path) -> str:
    """Stable across machines and runs: run ids, ports and paths become placeholders."""
    for python in {sys.executable, os.path.realpath(sys.executable)}:
        text = text.replace(python, "<python>")
    text = text.replace(str(home), "<home>").replace(str(REPO), "<repo>")
    text = re.sub(r"\b\d{8}-\d{6}-([\w.-]+)-[0-9a-f]{4}\b", r"<run-id:\1>", text)
    text = re.sub(r"(127\.0\.0\.1:|--master-port )\d+", r"\1<port>", text)
    return text


def test_dry_run_plan_matches_the_golden_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "CLUSTERRUN_HOME": str(home / ".clusterrun")}
    cp = run_cli("launch", "--dry-run", "--env", "WANDB_API_KEY=s3cret", "--env",
                 "NCCL_DEBUG=INFO", "inventories/localhost.yaml", "payloads/train_digits.py",
                 "--epochs", "2", "--note", "it's a $HOME; rm -rf /", env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "s3cret" not in cp.stdout + cp.stderr
    got = normalise(cp.stdout, home)
    runs = home / ".clusterrun" / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # a dry run records no run
    if os.environ.get("CLUSTERRUN_UPDATE_GOLDEN"):
        update(got)
    assert got.splitlines() == GOLDEN.read_text().splitlines()


def update(got: str) -> None:
    """Rewriting the golden file is an act of its own, never a pass: a run that compared the
    plan with the file it had just written would prove nothing."""
    if GOLDEN.exists() and GOLDEN.read_text().splitlines() == got.splitlines():
        pytest.fail(f"CLUSTERRUN_UPDATE_GOLDEN is set: {GOLDEN} already matches the plan and was "
                    "left as it is. Run the test without the variable to check the plan.")
    GOLDEN.write_text(got)
    pytest.fail(f"CLUSTERRUN_UPDATE_GOLDEN is set: {GOLDEN} was rewritten. Review the diff "
                "(git diff tests/golden/) like code, commit it, and run the test again without "
                "the variable.")
