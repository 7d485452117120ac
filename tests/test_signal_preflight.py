"""SIGTERM while preflight checks the hosts ends the launch at once with 143, one line and no
traceback, leaves nothing running on the hosts, and is recorded where a run exists by then:
the check before a restart. There it used to wait for preflight to finish, then end the run
as its failed attempt had (exit 1, "failed"), with nothing saying a signal came.

The hosts are local nodes (no sshd) whose `setup:` holds the probe: preflight is then waiting
for a host, as it does for a slow one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus
from tests.conftest import start_cli, write_inventory

HOLD = 15  # seconds the held probe's setup sleeps: far longer than the controller's ending


def processes_naming(text: str) -> list[int]:
    """Processes on this machine whose command line holds ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if text.encode() in handle.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def terminated(proc: subprocess.Popen[str], held: Path) -> tuple[str, str]:
    """SIGTERM once ``held`` shows preflight is waiting; the controller's output, once it has
    exited (the held probe still running then: it was not waited out)."""
    try:
        wait_for(held, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert processes_naming(str(held)), "preflight was waited out, not cut short"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, err


def left_clean(tmp_path: Path) -> None:
    """Nothing started for this test runs any more, once the held setup's sleep has ended."""
    deadline = time.monotonic() + HOLD + 30
    while processes_naming(str(tmp_path)):
        assert time.monotonic() < deadline, processes_naming(str(tmp_path))
        time.sleep(0.2)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A script that fails once it has left a mark."""
    path = tmp_path / "job" / "fail.py"
    path.parent.mkdir()
    path.write_text(f"open({str(tmp_path / 'failed')!r}, 'w').close()\nraise SystemExit(1)\n")
    return path


def test_sigterm_before_any_run_exists(home: Path, tmp_path: Path, job: Path) -> None:
    held = tmp_path / "checking"
    inv = write_inventory(tmp_path / "inv.yaml", [
        {"host": "localhost", "name": "n0", "nproc_per_node": 1,
         "setup": f"touch {held}; sleep {HOLD}"}])
    out, err = terminated(start_cli("launch", "--no-torchrun", str(inv), str(job)), held)
    assert "Traceback" not in out + err, err
    assert err.strip().splitlines()[-1] == "clusterrun: terminated (SIGTERM)", err
    assert not list((home / "runs").glob("*")) if (home / "runs").exists() else True
    left_clean(tmp_path)


def test_sigterm_in_the_check_before_a_restart_ends_the_run_stopped_143(
        home: Path, tmp_path: Path, job: Path) -> None:
    held = tmp_path / "checking"
    # Only the check after the first attempt failed waits: its probe is the first command
    # the host runs after the rank left its mark.
    inv = write_inventory(tmp_path / "inv.yaml", [
        {"host": "localhost", "name": "n0", "nproc_per_node": 1,
         "setup": f"if [ -e {tmp_path / 'failed'} ]; then touch {held}; sleep {HOLD}; fi"}])
    proc = start_cli("launch", "--no-torchrun", "--max-restarts", "1", str(inv), str(job))
    out, err = terminated(proc, held)
    assert proc.returncode == ExitStatus.SIGTERM, err
    assert "Traceback" not in out + err, err
    assert "clusterrun: SIGTERM: attempt 2 not started; the run ends here" in err, err
    (run,) = (home / "runs").iterdir()
    state = json.loads((run / "state.json").read_text())
    assert (state["state"], state["exit_status"]) == ("stopped", ExitStatus.SIGTERM), state
    assert [(a["attempt"], a["exit_status"]) for a in state["attempts"]] == [(1, 1)], state
    assert f"run {run.name} stopped (exit 143)" in err
    left_clean(tmp_path)
