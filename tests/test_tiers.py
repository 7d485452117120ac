"""The test tiers as the README and CI name them: the fast tier (`-m "not cluster"`) leaves out
the `slow` tests, the root run (`-m "cluster or slow"`) has them, and the two together are the
whole suite, so moving a test out of the fast tier never drops it from CI."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # three collections of the whole suite


def collected(*args: str) -> set[str]:
    cp = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                         "-p", "no:cacheprovider", *args], cwd=REPO, capture_output=True,
                        text=True, timeout=120, check=False)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    return {line for line in cp.stdout.splitlines() if "::" in line}


def marker_expressions(text: str) -> list[str]:
    return re.findall(r"pytest[^\n]*? -m (\"[^\"]+\"|\S+)", text)


def test_the_fast_tier_and_the_root_run_are_the_whole_suite() -> None:
    everything = collected()
    fast = collected("-m", "not cluster")
    root = collected("-m", "cluster or slow")
    assert fast | root == everything
    assert not fast & root
    slow = collected("-m", "slow")
    assert "tests/test_train_digits_resume.py::test_a_run_killed_after_epoch_1_resumes_to_the_" \
        "uninterrupted_parameters" in slow
    assert slow <= root and not slow & fast


def test_ci_runs_the_readmes_test_commands() -> None:
    readme = marker_expressions((REPO / "README.md").read_text())
    ci = marker_expressions((REPO / ".ci" / "run").read_text())
    assert ci == ['"not cluster"', '"cluster or slow"']
    assert readme[:2] == ci
