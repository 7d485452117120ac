"""The test tiers as the README and CI name them: the fast tier (`-m "not cluster"`) leaves out
the `slow` tests, the root run (`-m "cluster or slow"`) has them, and the two together are the
whole suite, so moving a test out of the fast tier never drops it from CI. Plain `pytest` is the
fast tier and says what it left out; a test file named alone runs whole."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # three collections of the whole suite


def collection(*args: str) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                         "-p", "no:cacheprovider", *args], cwd=REPO, capture_output=True,
                        text=True, timeout=120, check=False)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    return cp


def collected(*args: str) -> set[str]:
    return {line for line in collection(*args).stdout.splitlines() if "::" in line}


def marker_expressions(text: str) -> list[str]:
    return re.findall(r"pytest[^\n]*? -m (\"[^\"]+\"|\S+)", text)


def test_the_fast_tier_and_the_root_run_are_the_whole_suite() -> None:
    everything = collected("-m", "slow or not slow")  # an expression naming `slow` drops nothing
    fast = collected("-m", "not cluster")
    root = collected("-m", "cluster or slow")
    assert fast | root == everything
    assert not fast & root
    slow = collected("-m", "slow")
    assert "tests/test_train_digits_resume.py::test_a_run_killed_after_epoch_1_resumes_to_the_" \
        "uninterrupted_parameters" in slow
    assert slow <= root and not slow & fast


def test_ci_runs_the_readmes_test_commands() -> None:
    """CI runs the README's fast tier as it is, and the README's root run in two passes (on two
    workers, then the `serial` tests alone) that together collect exactly the root run."""
    readme = marker_expressions((REPO / "README.md").read_text())
    ci = marker_expressions((REPO / ".ci" / "run").read_text())
    assert readme[:2] == ['"not cluster"', '"cluster or slow"']
    assert ci[0] == readme[0] and len(ci) == 3, ci
    first, second = (collected("-m", expression.strip('"')) for expression in ci[1:])
    assert first and second and not first & second
    assert first | second == collected("-m", "cluster or slow")


def test_plain_pytest_is_the_fast_tier_and_says_how_to_run_the_rest() -> None:
    plain = collection()
    assert {line for line in plain.stdout.splitlines() if "::" in line} \
        == collected("-m", "not cluster")
    assert 'plain `pytest` runs the fast tier only' in plain.stdout
    assert '`pytest -m "cluster or slow"`' in plain.stdout
    assert collected("tests") == collected("-m", "not cluster")  # a folder is not a test named


def test_a_cluster_test_file_named_alone_runs_whole() -> None:
    named = collection("tests/test_environments_hosts.py")
    tests = {line for line in named.stdout.splitlines() if "::" in line}
    assert "tests/test_environments_hosts.py::test_system_site_packages_keeps_the_hosts_own_" \
        "torch" in tests
    assert "plain `pytest`" not in named.stdout
    one = "tests/test_environments_hosts.py::test_two_launches_at_once_build_the_environment_once"
    assert collected(one) == {one}


def test_a_cluster_test_that_skips_fails(tmp_path: Path) -> None:
    (tmp_path / "test_skipping.py").write_text(
        "import pytest\n\n\n@pytest.mark.cluster\ndef test_cluster() -> None:\n"
        "    pytest.skip('nothing here')\n\n\ndef test_fast() -> None:\n"
        "    pytest.skip('a fast test may')\n")
    cp = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "-p", "tests.conftest", "-rfs", str(tmp_path / "test_skipping.py")],
                        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert cp.returncode == 1, cp.stdout[-2000:]
    assert "1 failed, 1 skipped" in cp.stdout
    assert "test_cluster skipped (Skipped: nothing here), but the cluster tier fails, never " \
        "skips" in cp.stdout
