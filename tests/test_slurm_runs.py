"""`hosts: slurm` against a real Slurm: slurmctld and one slurmd per namespace host, real
`salloc` and `srun` job steps, real torchrun; assertions on what ran on the nodes."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, Reader, clusterrun_argv, slurm_inventory
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.cluster

NODES = ["node23", "node24", "node25"]


def in_allocation(slurm: SlurmCluster, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """`salloc -N3 -w NODES clusterrun ARGS...`, as a user types it."""
    return subprocess.Popen(slurm.salloc_argv(3, NODES, clusterrun_argv(*args)),
                            env=slurm.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def test_a_launch_inside_an_allocation_runs_as_job_steps(
        cluster: Cluster, slurm_nodes: SlurmCluster, home: Path, tmp_path: Path,
        payload: Path) -> None:
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    proc = in_allocation(slurm_nodes, "launch", "--nproc-per-node", "2", "--env",
                         f"TEST_DIR={test_dir}", str(inv), str(payload), "--lr", "0.1")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert err.count("job/ srun: 1 of 1 files copied, all 1 verified") == 3, err
    jobs = set()
    for node_rank, node in enumerate(NODES):
        for rank in (2 * node_rank, 2 * node_rank + 1):
            rec = json.loads(cluster.read(node, f"{test_dir}/rank-{rank}.json"))
            assert rec["hostname"] == node  # three different nodes, in Slurm's order
            assert rec["env"]["GROUP_RANK"] == str(node_rank)
            assert rec["env"]["GLOO_SOCKET_IFNAME"] == cluster.host(node).ifname
            assert rec["env"]["MASTER_ADDR"] == cluster.host(NODES[0]).address
            jobs.add(rec["env"]["SLURM_JOB_ID"])  # a process of one of the job's steps
            assert f"[{node} r{rank}] report rank {rank} on {node}" in out
    assert len(jobs) == 1
    run_id = next((home / "runs").iterdir()).name
    assert cluster.wait_run_gone(NODES, run_id, 10) == {}


def test_a_failing_rank_ends_the_other_steps_and_is_named_first(
        cluster: Cluster, slurm_nodes: SlurmCluster, home: Path, tmp_path: Path,
        payload: Path) -> None:
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    proc = in_allocation(slurm_nodes, "launch", "--nproc-per-node", "2", "--env",
                         f"TEST_DIR={test_dir}", "--env", "FAIL_RANK=3", "--env", "FAIL_CODE=3",
                         "--env", "FAIL_AFTER=2", "--env", "SLEEP=600", str(inv), str(payload))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    causes = [line for line in err.splitlines() if "root cause" in line]
    assert causes[0] == "clusterrun: root cause: node24 rank 3 exited with code 3", err
    run_id = next((home / "runs").iterdir()).name
    assert cluster.wait_run_gone(NODES, run_id, 15) == {}
    for node in ("node23", "node25"):  # stopped by clusterrun, not by a collective's timeout
        assert ".term" in cluster.run_on(node, "sh", "-c", f"ls {test_dir}")


def test_scancel_ends_the_run_on_every_node(cluster: Cluster, slurm_nodes: SlurmCluster,
                                            home: Path, tmp_path: Path, payload: Path) -> None:
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    proc = in_allocation(slurm_nodes, "launch", "--env", f"TEST_DIR={test_dir}", "--env",
                         "SLEEP=600", str(inv), str(payload))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    out.wait_for(r"report rank \d on", count=3)
    run_id = next((home / "runs").iterdir()).name
    job = json.loads(cluster.read(NODES[1], f"{test_dir}/rank-1.json"))["env"]["SLURM_JOB_ID"]
    subprocess.run(["scancel", job], env=slurm_nodes.env(), check=True, timeout=30)
    proc.wait(60)
    out.join()
    err.join()
    assert cluster.wait_run_gone(NODES, run_id, 20) == {}
    assert proc.returncode != 0
    assert "Traceback" not in err.text


def test_a_detached_run_is_listed_and_stopped_through_job_steps(
        cluster: Cluster, slurm_nodes: SlurmCluster, home: Path, tmp_path: Path,
        payload: Path) -> None:
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    me = " ".join(clusterrun_argv())
    # One allocation, as an interactive salloc shell would hold it: launch detached, look at
    # it from `ps`, end it with `stop`, all while the job exists.
    script = (f"set -e; {me} launch --detach --env SLEEP=600 {inv} {payload}; sleep 8; "
              f"squeue -h -s -j $SLURM_JOB_ID -o '%i %j %N' > {tmp_path}/steps.txt; "
              f"{me} ps --json > {tmp_path}/ps.json; "
              f"{me} stop $({me} ps --json | python3 -c "
              "'import json,sys; print(json.load(sys.stdin)[0][\"id\"])')")
    cp = subprocess.run(slurm_nodes.salloc_argv(3, NODES, ["/bin/sh", "-c", script]),
                        env=slurm_nodes.env(), capture_output=True, text=True, timeout=180,
                        check=False)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    listed = json.loads((tmp_path / "ps.json").read_text())[0]
    assert listed["state"] == "running" and listed["hosts"] == NODES
    assert "stopped" in cp.stdout + cp.stderr
    # The supervisors' steps stayed open after `launch --detach` returned: where Slurm tracks
    # a step's processes by cgroup, the run would otherwise end with them.
    steps = (tmp_path / "steps.txt").read_text().split("\n")
    assert sorted(line.split()[2] for line in steps if " clusterrun " in line) == NODES
    assert cluster.wait_run_gone(NODES, listed["id"], 20) == {}


def test_a_node_srun_cannot_start_a_step_on_is_unreachable(
        cluster: Cluster, slurm_nodes: SlurmCluster, home: Path, tmp_path: Path) -> None:
    """Exit 4, as for a host SSH cannot reach, not 3: nothing ran there. The allocation has
    two nodes; the node list clusterrun reads names a third, outside the job."""
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    script = 'SLURM_JOB_NODELIST="node[23-25]" exec "$@"'
    cp = subprocess.run(slurm_nodes.salloc_argv(2, NODES[:2], [
        "/bin/sh", "-c", script, "sh", *clusterrun_argv("check", str(inv))]),
        env=slurm_nodes.env(), capture_output=True, text=True, timeout=180, check=False)
    assert cp.returncode == 4, cp.stdout + cp.stderr
    assert "node25  rank 2  UNREACHABLE" in cp.stdout, cp.stdout
    out = " ".join(cp.stdout.split())
    assert "node25: Slurm did not start a job step on node25 (job " in out, out
    assert "srun: error:" in out and "squeue -j " in out
    assert "1 of 3 hosts failed: node25;" in out
    assert "Traceback" not in cp.stdout + cp.stderr


FLAKY = (  # every attempt's ranks say where they ran; rank 1 fails the first attempt only
    "import json, os, socket, sys, time\n"
    "count, rank = os.environ['CLUSTERRUN_RESTART_COUNT'], os.environ['RANK']\n"
    "out = os.environ['TEST_DIR']\n"
    "os.makedirs(out, exist_ok=True)\n"
    "with open(f'{out}/attempt-{count}-rank-{rank}.json', 'w') as f:\n"
    "    json.dump({'hostname': socket.gethostname(), 'job': os.environ.get('SLURM_JOB_ID'),\n"
    "               'step': os.environ.get('SLURM_STEP_ID')}, f)\n"
    "print('attempt', count, 'rank', rank, flush=True)\n"
    "if count == '0' and rank == '1':\n"
    "    time.sleep(2)  # rank 0 has written its file before the teardown\n"
    "    sys.exit(3)\n")


def test_a_restart_runs_the_second_attempt_as_job_steps_too(
        cluster: Cluster, slurm_nodes: SlurmCluster, home: Path, tmp_path: Path) -> None:
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    job = tmp_path / "job"
    job.mkdir()
    (job / "flaky.py").write_text(FLAKY)
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    nodes = NODES[:2]
    cp = subprocess.run(slurm_nodes.salloc_argv(2, nodes, clusterrun_argv(
        "launch", "--max-restarts", "1", "--env", f"TEST_DIR={test_dir}", str(inv),
        str(job / "flaky.py"))), env=slurm_nodes.env(), capture_output=True, text=True,
        timeout=240, check=False)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "attempt 2/2: restarting after node24 rank 1 exited with code 3" in cp.stderr
    assert "after 2 attempts" in cp.stderr
    jobs = set()
    for rank, node in enumerate(nodes):
        for count in ("0", "1"):
            rec = json.loads(cluster.read(node, f"{test_dir}/attempt-{count}-rank-{rank}.json"))
            assert rec["hostname"] == node and rec["step"] is not None  # in a job step
            jobs.add(rec["job"])
            assert f"[{node} r{rank}] attempt {count} rank {rank}" in cp.stdout
    assert len(jobs) == 1  # both attempts inside the one allocation
    run_id = next((home / "runs").iterdir()).name
    summary = json.loads((home / "runs" / run_id / "summary.json").read_text())
    assert [a["exit_status"] for a in summary["attempts"]] == [3, 0]
    assert cluster.wait_run_gone(nodes, run_id, 15) == {}
