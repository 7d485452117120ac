"""`launch --max-restarts 1` into containers (podman in the namespace hosts): the first attempt
fails, the second runs in the same containers and succeeds, and nothing of either is left."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import Cluster, Containers, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node30", "node31"]  # container hosts no other container test uses
NAME = "restarter"
FLAKY = (  # every attempt's ranks say where they ran; rank 1 fails the first attempt only
    "import json, os, socket, sys, time\n"
    "count, rank = os.environ['CLUSTERRUN_RESTART_COUNT'], os.environ['RANK']\n"
    "out = os.environ['TEST_DIR']\n"
    "os.makedirs(out, exist_ok=True)\n"
    "with open(f'{out}/attempt-{count}-rank-{rank}.json', 'w') as f:\n"
    "    json.dump({'hostname': socket.gethostname(),\n"
    "               'in_container': os.path.exists('/run/.containerenv')}, f)\n"
    "print('attempt', count, 'rank', rank, flush=True)\n"
    "if count == '0' and rank == '1':\n"
    "    time.sleep(2)  # rank 0 has written its file before the teardown\n"
    "    sys.exit(3)\n")


def test_a_restart_runs_the_second_attempt_in_the_same_containers(
        cluster: Cluster, podman_hosts: Containers, home: Path, tmp_path: Path) -> None:
    for host in HOSTS:
        podman_hosts.run(host, NAME)
    job = tmp_path / "job"
    job.mkdir()
    (job / "flaky.py").write_text(FLAKY)
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={"container": NAME})
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "--max-restarts", "1", "--env", f"TEST_DIR={test_dir}", str(inv),
                 str(job / "flaky.py"), timeout=240)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "attempt 2/2: restarting after node31 rank 1 exited with code 3" in cp.stderr
    assert "after 2 attempts" in cp.stderr
    run_id = next((home / "runs").iterdir()).name
    for rank, host in enumerate(HOSTS):
        for count in ("0", "1"):
            text = podman_hosts.podman(host, "exec", NAME, "cat",
                                       f"{test_dir}/attempt-{count}-rank-{rank}.json").stdout
            assert json.loads(text)["in_container"] is True
            assert f"[{host} r{rank}] attempt {count} rank {rank}" in cp.stdout
        # Both attempts' files are the container's, none is on the host itself.
        assert cluster.run_on(host, "sh", "-c", f"ls {test_dir} 2>/dev/null || true") == ""
        listed = podman_hosts.podman(host, "exec", NAME, "ls",
                                     f"/tmp/clusterrun/runs/{run_id}").stdout.split()
        assert host in listed and "attempt-2" in listed
    summary = json.loads((home / "runs" / run_id / "summary.json").read_text())
    assert [a["exit_status"] for a in summary["attempts"]] == [3, 0]
    assert cluster.wait_run_gone(HOSTS, run_id, 15) == {}
