"""Reaching a node of a Slurm allocation with a job step, instead of SSH.

Each command is one step, ``srun --jobid JOB -N1 -n1 -w NODE --overlap``: Slurm starts it on the
node, tracks every process it forks, and ends them all with the job (`scancel`, the end of the
allocation). Its stdin is this process's pipe, forwarded by srun, which runs in a session of
its own: when this process dies or closes the pipe, srun lives on and the program on the node
sees EOF (within milliseconds), the same lifeline an SSH channel gives. Should srun itself be
killed with its helper, the step gets neither EOF nor a signal; the supervisor's lease (no
heartbeat from here) ends it then. `--unbuffered` gives the step a pseudo-terminal as stdout,
in raw mode: the supervisor's frames pass byte for byte, and the ranks write to files anyway.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from typing import Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, Process
from clusterrun.transport.local import LocalProcess

# What a step gets from this process's environment: where programs and libraries are (what
# `module load` set before salloc) and who the user is; never the rest (tokens, keys), which
# over SSH would not reach the node either. Slurm adds its SLURM_* variables.
EXPORTED = "PATH,LD_LIBRARY_PATH,HOME,USER,LOGNAME,LANG"


def job_cpus(environ: Mapping[str, str]) -> dict[str, int]:
    """The job's CPUs on each of its nodes: SLURM_JOB_CPUS_PER_NODE (``72(x2),36``) follows
    SLURM_JOB_NODELIST's order. Empty outside the job's own environment."""
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    counts: list[int] = []
    for part in environ.get("SLURM_JOB_CPUS_PER_NODE", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return {}
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    try:
        nodes = list(NodeSet(environ.get("SLURM_JOB_NODELIST", "")))
    except NodeSetException:
        return {}
    return dict(zip(nodes, counts)) if len(nodes) == len(counts) else {}


def step_argv(spec: HostSpec, command: str, cpus: Optional[int] = None) -> list[str]:
    """One task on one node. A step gets one CPU unless told otherwise, and where Slurm binds
    tasks to their CPUs (task/affinity, task/cgroup) torchrun and every rank would share it:
    the step asks for all the job's CPUs on the node (``--overlap`` lets steps share them)."""
    assert spec.slurm_job is not None
    return ["srun", "--jobid", spec.slurm_job, "--nodes=1", "--ntasks=1", "--nodelist",
            spec.host, "--overlap", *([f"--cpus-per-task={cpus}"] if cpus else []),
            "--unbuffered", "--quiet", "--kill-on-bad-exit=0", f"--export={EXPORTED}",
            "--job-name=clusterrun", "/bin/sh", "-c", command]


# What srun prints when it cannot start the step at all (the job has ended, the node is not in
# it or not answering, the step is refused): nothing ran on the node, so the node is unreachable
# (exit 4), not a failed probe or program (3). A task that ran and failed says other words
# ("task 0: Exited with exit code 1").
STEP_NOT_STARTED = re.compile(
    rb"srun: error: (Unable to create step|Unable to confirm allocation|Unable to allocate"
    rb"|Task launch for .* failed|Application launch failed|Invalid job id|Invalid node name"
    rb"|.*Job/step already completing or completed|.*Requested node configuration)")
STDERR_KEPT = 8192
STDERR_SECONDS = 2.0


class SrunProcess(LocalProcess):
    """A job step's srun: as LocalProcess, and an exit that says srun never started the step
    raises ConnectError (unreachable) with srun's own words, for every caller alike."""

    def __init__(self, proc: subprocess.Popen[bytes], spec: HostSpec) -> None:
        super().__init__(proc)
        self._spec = spec
        self._answered = False
        self._stderr = bytearray()
        self._stderr_done = threading.Event()

    def recv(self, size: int) -> bytes:
        data = super().recv(size)
        self._answered = self._answered or bool(data)
        return data

    def recv_stderr(self, size: int) -> bytes:
        try:
            data = super().recv_stderr(size)
        except OSError:
            self._stderr_done.set()
            raise
        if not data:
            self._stderr_done.set()
        if len(self._stderr) < STDERR_KEPT:
            self._stderr.extend(data[:STDERR_KEPT - len(self._stderr)])
        return data

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        code = super().wait(timeout)
        if code and not self._answered:
            # The caller's stderr reader may still be on its way to srun's last words.
            self._stderr_done.wait(STDERR_SECONDS)
            err = bytes(self._stderr)
            match = STEP_NOT_STARTED.search(err)
            if match is not None:
                line = err[match.start():].split(b"\n", 1)[0].decode("utf-8", "replace")
                raise ConnectError(Outcome.UNREACHABLE, (
                    f"{self._spec.name}: Slurm did not start a job step on {self._spec.host} "
                    f"(job {self._spec.slurm_job}): {line.strip()}. Is the node in this "
                    f"allocation, and the job still running (squeue -j {self._spec.slurm_job})?"))
        return code


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
            cpus = job_cpus(os.environ).get(self.spec.host)
            proc = subprocess.Popen(
                step_argv(self.spec, command, cpus), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise ConnectError(Outcome.UNREACHABLE,
                               f"{self.spec.name}: cannot start srun: {exc.strerror}.") from None
        return SrunProcess(proc, self.spec)

    def close(self) -> None:
        return None
