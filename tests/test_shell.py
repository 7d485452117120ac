"""The one place shell strings are built: whatever a value holds, a real shell sees it as one
literal word, and nothing in it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun.transport import shell

HOSTILE = ["$(touch {marker})", "`touch {marker}`", "; touch {marker} #", "a'b\"c",
           "line1\nline2", "", "-rf", "λ→✓", "$HOME", "*", "\\", " spaced ", "|| touch {marker}"]


@pytest.mark.parametrize("sh", ["/bin/sh", "bash"])
def test_join_round_trips_through_a_real_shell(tmp_path: Path, sh: str) -> None:
    marker = tmp_path / "pwned"
    words = [w.format(marker=marker) for w in HOSTILE]
    script = shell.join([sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))",
                         *words])
    out = subprocess.run([sh, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == words
    assert not marker.exists()


def test_setup_runs_first_and_its_stdout_is_kept_off_the_program_output(tmp_path: Path) -> None:
    marker = tmp_path / "setup-ran"
    script = shell.with_setup(f"echo setup-noise; touch {marker}", "echo program")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == "program\n"
    assert "setup-noise" in out.stderr
    assert marker.exists()


def test_a_failing_setup_stops_with_its_own_exit_status() -> None:
    script = shell.with_setup("false", "echo should-not-run")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=False)
    assert out.returncode == shell.SETUP_FAILED
    assert out.stdout == ""
    assert "setup: failed" in out.stderr


def test_remote_python_runs_the_shipped_program_from_stdin() -> None:
    cmd = shell.remote_python(sys.executable, None)
    request = {"root": "/nonexistent-dir", "files": ["x"], "mkdir": False}
    out = subprocess.run(["/bin/sh", "-c", cmd], input=shell.program_input("files.py", request),
                         capture_output=True, check=True)
    reply = json.loads(out.stdout)
    assert reply == {"root": "/nonexistent-dir", "manifest": {}}
    assert "files.py" not in cmd and "manifest" not in cmd  # the program is not on argv

