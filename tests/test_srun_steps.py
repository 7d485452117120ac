"""A Slurm node that srun cannot start a job step on is unreachable (exit 4, like a host SSH
cannot reach), not a failed probe (3): nothing ran there. An srun stand-in on PATH plays Slurm
here (no root, no Slurm); test_slurm_runs.py has the real one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus, Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError
from clusterrun.transport.programs import call
from clusterrun.transport.srun import SrunTransport
from tests.conftest import run_cli

REFUSED = ("srun: error: Unable to create step for job 7: Requested node configuration is not "
           "available")
# Runs the step's command as srun would on the node, except on n2, where the step is refused.
FAKE_SRUN = f"""#!/bin/sh
node=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodelist) node="$2"; shift 2;;
    --job-name=*) shift; break;;
    *) shift;;
  esac
done
if [ "$node" = "n2" ]; then
  echo "{REFUSED}" >&2
  exit 1
fi
exec "$@"
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """The environment of a command inside job 7 on nodes n1 and n2."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "n[1-2]", "CLUSTERRUN_HOME": str(tmp_path / "home")}


def test_check_says_the_node_without_a_step_is_unreachable(tmp_path: Path,
                                                           fake_slurm: dict[str, str]) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"defaults:\n  python: {sys.executable}\n  workdir: {tmp_path / 'w'}\n"
                   "master_addr: 127.0.0.1\nhosts: slurm\n")
    cp = run_cli("check", str(inv), env=fake_slurm, timeout=120)
    assert cp.returncode == ExitStatus.UNREACHABLE, cp.stdout + cp.stderr
    assert "n2  rank 1  UNREACHABLE" in cp.stdout
    assert (f"n2: Slurm did not start a job step on n2 (job 7): {REFUSED}. Is the node in this "
            "allocation, and the job still running (squeue -j 7)?") in cp.stdout
    assert "n1  rank 0  ok" in cp.stdout  # the node in the job was probed as usual
    assert "1 of 2 hosts failed: n2;" in cp.stdout
    assert "Traceback" not in cp.stdout + cp.stderr


def test_every_program_on_such_a_node_fails_as_unreachable(
        fake_slurm: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in fake_slurm.items():
        monkeypatch.setenv(key, value)
    spec = HostSpec(host="n2", name="n2", master=False, line=1, python=sys.executable,
                    transport="srun", slurm_job="7")
    with pytest.raises(ConnectError) as caught:
        call(SrunTransport(spec), spec, "files.py", {"root": "/tmp", "files": []}, timeout=30)
    assert caught.value.outcome is Outcome.UNREACHABLE
    assert caught.value.exit_status == ExitStatus.UNREACHABLE
    assert REFUSED in caught.value.message
    # The same step started on n1 runs the program: its failure words are the program's own.
    ok = HostSpec(host="n1", name="n1", master=True, line=1, python=sys.executable,
                  transport="srun", slurm_job="7")
    assert call(SrunTransport(ok), ok, "files.py", {"root": "/tmp", "files": []},
                timeout=30)["manifest"] == {}
