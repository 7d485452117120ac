"""A real Slurm in the sandbox (tests/support/slurm.py), what the `hosts: slurm` tests build
on: job steps run in their node's namespaces, see EOF when their srun's stdin closes, and end
with their job, on every node."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from clusterrun import sandbox
from clusterrun.errors import SandboxError
from tests.conftest import SLURM_HOSTS, Cluster, wait_no_job_processes
from tests.support import slurm as sandbox_slurm
from tests.support.slurm import SlurmCluster

# Each test here builds a Slurm of its own; slurmstepd's cgroups are the machine's, so it runs
# alone, not beside a worker whose session cluster runs Slurm too (CI's serial pass).
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

A, B, C, D = SLURM_HOSTS


@contextlib.contextmanager
def allocation(slurm: SlurmCluster, nodes: Sequence[str]) -> Iterator[str]:
    """A job holding these nodes, with no command (salloc --no-shell): yields its id."""
    cp = subprocess.run(slurm.salloc_argv(len(nodes), nodes, []), env=slurm.env(),
                        capture_output=True, text=True, timeout=30, check=True)
    job = re.search(r"Granted job allocation (\d+)", cp.stderr)
    assert job, cp.stderr
    try:
        yield job.group(1)
    finally:
        sandbox_slurm.scancel(slurm, job.group(1))


def step(slurm: SlurmCluster, job: str, node: str, script: str,
         stdin: int | None = None) -> subprocess.Popen[str]:
    """A job step on one node, as clusterrun starts one: from this machine, outside salloc."""
    return subprocess.Popen(slurm.srun_argv(job, node, ["/bin/sh", "-c", script]),
                            env=slurm.env(), stdin=stdin, stdout=subprocess.PIPE, text=True)


def test_srun_in_an_allocation_runs_on_each_of_its_nodes(slurm_nodes: SlurmCluster) -> None:
    argv = slurm_nodes.salloc_argv(3, [A, B, C], ["srun", "hostname"])
    cp = subprocess.run(argv, env=slurm_nodes.env(), capture_output=True, text=True,
                        timeout=30, check=False)
    assert cp.returncode == 0, cp.stderr
    assert sorted(cp.stdout.split()) == [A, B, C]


def test_a_step_runs_in_its_nodes_namespaces(cluster: Cluster,
                                             slurm_nodes: SlurmCluster) -> None:
    marker = uuid.uuid4().hex
    cluster.run_on(B, "sh", "-c", f"echo {marker} > /tmp/slurm-marker")
    with allocation(slurm_nodes, [A, B, C]) as job:
        # ls -1: srun --unbuffered gives the task a pseudo-terminal as its stdout.
        proc = step(slurm_nodes, job, B, "hostname; ls -1 /sys/class/net; cat /tmp/slurm-marker; "
                    'echo "$SLURM_JOB_ID $SLURMD_NODENAME"')
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    hostname, *rest = out.splitlines()
    assert hostname == B
    assert cluster.host(B).ifname in rest
    assert cluster.host(A).ifname not in rest
    assert rest[-2:] == [marker, f"{job} {B}"]  # B's own /tmp; the job's own step


def test_stdin_eof_reaches_the_step_and_a_killed_srun_ends_it(
        cluster: Cluster, slurm_nodes: SlurmCluster) -> None:
    """The lifeline clusterrun keeps with a step, as with an SSH session: closing srun's stdin
    is EOF on the node; srun killed (its helper process is not) cancels the step."""
    cluster.run_on(C, "rm", "-f", "/tmp/slurm-eof")
    with allocation(slurm_nodes, [C]) as job:
        proc = step(slurm_nodes, job, C, "echo ready; cat >/dev/null; touch /tmp/slurm-eof",
                    stdin=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert cluster.run_on(C, "ls", "/tmp/slurm-eof")

        proc = step(slurm_nodes, job, C, "echo ready; exec sleep 1000", stdin=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.kill()
        proc.wait(timeout=10)
        assert wait_no_job_processes(cluster, [C], 10) == {}


def test_scancel_ends_every_step_on_every_node(cluster: Cluster,
                                                slurm_nodes: SlurmCluster) -> None:
    script = "sleep 1000 & sleep 1000; wait"  # a child of the task too
    with allocation(slurm_nodes, [A, B, D]) as job:
        steps = [step(slurm_nodes, job, node, script) for node in (A, B, D, B)]  # two on B
        deadline = time.monotonic() + 30
        while sum(len(sandbox_slurm.pids(cluster.sb, n)) for n in (A, B, D)) < 4 * 4:
            assert time.monotonic() < deadline, [sandbox_slurm.pids(cluster.sb, n)
                                                 for n in (A, B, D)]
            time.sleep(0.05)  # slurmstepd, sh and two sleeps per step
        assert len(sandbox_slurm.squeue(slurm_nodes, steps=True)) == 4
        sandbox_slurm.scancel(slurm_nodes, job)
        assert wait_no_job_processes(cluster, [A, B, D], 10) == {}
        for proc in steps:
            proc.wait(timeout=10)
    # COMPLETING is Slurm's own step between scancel and gone: slurmctld holds the job until
    # every node's slurmd has said its steps ended, which takes a moment on a loaded machine.
    deadline = time.monotonic() + 30
    while (left := sandbox_slurm.squeue(slurm_nodes)) and time.monotonic() < deadline:
        assert all(j["state"] == "COMPLETING" for j in left), left
        time.sleep(0.2)
    assert sandbox_slurm.squeue(slurm_nodes) == []


def test_enabling_again_returns_the_same_slurm(cluster: Cluster, slurm: SlurmCluster) -> None:
    assert sandbox_slurm.enable(cluster.sb, SLURM_HOSTS) == slurm
    assert sandbox_slurm.load(cluster.sb) == slurm
    with pytest.raises(SandboxError, match="already runs"):
        sandbox_slurm.enable(cluster.sb, [A])
    with pytest.raises(SandboxError, match="cannot allocate"):
        slurm.salloc_argv(2, ["node1", A], ["true"])


def test_sandbox_down_ends_slurm(tmp_path: Path) -> None:
    root = tmp_path / "sandbox"
    sb = sandbox.up(2, root)
    try:
        slurm = sandbox_slurm.enable(sb, ["node1", "node2"])
        cp = subprocess.run(slurm.salloc_argv(2, None, ["srun", "hostname"]), env=slurm.env(),
                            capture_output=True, text=True, timeout=30, check=False)
        assert sorted(cp.stdout.split()) == ["node1", "node2"], cp.stderr
    finally:
        sandbox.down(root)
    left = [pid for pid in Path("/proc").iterdir() if pid.name.isdigit()
            and str(root).encode() in _cmdline(pid)]
    assert left == []
    assert not root.exists()
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert f"cr-{sb.prefix}-" not in spaces.stdout


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
