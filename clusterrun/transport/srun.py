"""Reaching a node of a Slurm allocation with a job step, instead of SSH.

Each command is one step, ``srun --jobid JOB -N1 -n1 -w NODE --overlap``: Slurm starts it on the
node, tracks every process it forks, and ends them all with the job (`scancel`, the end of the
allocation). Its stdin is this process's pipe, forwarded by srun: when this process dies or
closes it, the program on the node sees EOF, the same lifeline an SSH channel gives.
"""

from __future__ import annotations

import shutil
import subprocess

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, Process
from clusterrun.transport.local import LocalProcess

# What a step gets from this process's environment: where programs and libraries are (what
# `module load` set before salloc) and who the user is; never the rest (tokens, keys), which
# over SSH would not reach the node either. Slurm adds its SLURM_* variables.
EXPORTED = "PATH,LD_LIBRARY_PATH,HOME,USER,LOGNAME,LANG"


def step_argv(spec: HostSpec, command: str) -> list[str]:
    assert spec.slurm_job is not None
    return ["srun", "--jobid", spec.slurm_job, "--nodes=1", "--ntasks=1", "--nodelist",
            spec.host, "--overlap", "--unbuffered", "--quiet", "--kill-on-bad-exit=0",
            f"--export={EXPORTED}", "--job-name=clusterrun", "/bin/sh", "-c", command]


class SrunTransport:
    """One node of a Slurm job; every command a new job step on it."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.address = spec.host

    def connect(self) -> None:
        if shutil.which("srun") is None:
            raise ConnectError(Outcome.UNREACHABLE,
                               f"{self.spec.name}: reaching the nodes of Slurm job "
                               f"{self.spec.slurm_job} needs `srun`, which is not on this "
                               "machine's PATH. Run clusterrun where Slurm's commands are (the "
                               "login node, inside the allocation), or set `transport: ssh`.")

    def run(self, command: str) -> Process:
        try:
            proc = subprocess.Popen(
                step_argv(self.spec, command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise ConnectError(Outcome.UNREACHABLE,
                               f"{self.spec.name}: cannot start srun: {exc.strerror}.") from None
        return LocalProcess(proc)

    def close(self) -> None:
        return None
