"""`container:` against a real docker: one dockerd per namespace host (tests/support/docker.py),
found by clusterrun through DOCKER_HOST as on any host whose daemon runs, picked over the podman
the hosts also have. Real sshd, real torchrun and Gloo, assertions on what happened inside each
host's container."""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    Cluster,
    Reader,
    copy_payload,
    detach_hung_in_containers,
    run_cli,
    start_cli,
)
from tests.support import docker as engine

pytestmark = pytest.mark.cluster

# Container hosts (conftest.CONTAINER_HOSTS); docker is there only while this module runs.
HOSTS = ["node27", "node28", "node29"]
NAME = "trainer"
TRACING, PLAIN = "tracer", "plain"


@pytest.fixture(scope="module")
def trainers(cluster: Cluster) -> Iterator[list[str]]:
    """A dockerd on each of HOSTS with a running container `trainer` (host networking); the
    daemons are stopped at the end, their containers removed first, and nothing of them (no
    containerd, shim or container process) is left on the hosts."""
    engine.enable(cluster.sb, HOSTS)
    try:
        for host in HOSTS:
            engine.run(cluster.sb, host, NAME)
        yield HOSTS
    finally:
        engine.disable(cluster.sb, HOSTS)
    assert cluster.wait_no_processes(HOSTS, 10) == {}


def in_container(cluster: Cluster, host: str, *argv: str, name: str = NAME) -> str:
    return str(engine.docker(cluster.sb, host, "exec", name, *argv).stdout)


def container_processes(cluster: Cluster, host: str, name: str = NAME) -> list[str]:
    """The command lines of every process in the container, as docker lists them."""
    out = engine.docker(cluster.sb, host, "top", name, "-o", "pid,args").stdout
    return [line.split(None, 1)[1] for line in out.splitlines()[1:]]  # docker needs the pid


def test_training_with_gloo_runs_inside_each_hosts_docker_container(
        cluster: Cluster, trainers: list[str], home: Path, tmp_path: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={"container": NAME})
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(REPO / "payloads" / "train_digits.py", job / "train_digits.py")
    ckpt = f"/tmp/digits-{uuid.uuid4().hex[:8]}"
    args = [str(job / "train_digits.py"), "--epochs", "1", "--backend", "gloo",
            "--checkpoint-dir", ckpt]
    dry = run_cli("launch", "--dry-run", str(inv), *args)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count(f"  container: {NAME} (docker)") == 3, dry.stdout
    since = f"{time.time():.3f}"
    cp = run_cli("launch", str(inv), *args, timeout=240)
    until = f"{time.time():.3f}"
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    # Two `docker exec`s per host (docs/containers.md, "Costs"): the engine check's Python
    # version, then one interpreter that becomes the probe, the copy and the supervisor.
    for host in HOSTS:
        execs = engine.docker(cluster.sb, host, "events", "--since", since, "--until", until,
                              "--filter", "event=exec_start", "--format", "{{.Action}}")
        assert len(execs.stdout.splitlines()) == 2, (host, execs.stdout)
    assert cp.stderr.count("job/ docker exec: 1 of 1 files copied, all 1 verified") == 3, \
        cp.stderr
    assert re.search(r"^\[node27 r0\] .*final parameter sha256 [0-9a-f]{64}", cp.stdout, re.M), \
        cp.stdout[-2000:]
    run_id = next((home / "runs").iterdir()).name
    # Rank 0's checkpoint and every host's run directory are in that host's docker container,
    # none on the host itself.
    assert "digits_ddp.pt" in in_container(cluster, "node27", "ls", ckpt)
    for host in HOSTS:
        assert cluster.run_on(host, "sh", "-c", f"ls {ckpt} /tmp/clusterrun/runs/{run_id} "
                              "2>/dev/null || true") == ""
        assert "state.json" in in_container(cluster, host, "ls",
                                            f"/tmp/clusterrun/runs/{run_id}/{host}")
        assert in_container(cluster, host, "ls", "/.dockerenv").strip() == "/.dockerenv"
    assert cluster.wait_run_gone(HOSTS, run_id, 10) == {}
    ps = run_cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    assert json.loads(ps.stdout)[0]["state"] == "succeeded"


def test_a_killed_controller_leaves_nothing_in_any_docker_container(
        cluster: Cluster, trainers: list[str], home: Path, tmp_path: Path,
        payload: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={"container": NAME})
    proc = start_cli("launch", "--grace", "5", "--nproc-per-node", "2", "--env", "SLEEP=600",
                     str(inv), str(payload))
    assert proc.stdout is not None
    out = Reader(proc.stdout)
    out.wait_for(r"report rank \d on", count=6)
    run_id = next((home / "runs").iterdir()).name
    assert any("payload" in line or "report.py" in line
               for line in container_processes(cluster, "node28"))  # the run is there ...
    proc.kill()
    proc.wait(10)
    # ... and within the lease (30 s) nothing of it is: `docker exec -i` passes no signal on
    # when its client dies, so only the supervisor's stdin lifeline can end it.
    assert cluster.wait_run_gone(HOSTS, run_id, 30) == {}
    for host in HOSTS:
        assert container_processes(cluster, host) == ["sleep infinity"], host
    state = json.loads(in_container(cluster, "node28", "cat",
                                    f"/tmp/clusterrun/runs/{run_id}/node28/state.json"))
    assert state["state"] == "lost" and "lifeline lost" in state["reason"]


@pytest.fixture
def boxes(cluster: Cluster, trainers: list[str]) -> Iterator[list[str]]:
    """On two of the hosts, a container that may trace its processes and one that may not."""
    hosts = trainers[1:]
    for host in hosts:
        engine.run(cluster.sb, host, TRACING, options=["--cap-add", "SYS_PTRACE"])
        engine.run(cluster.sb, host, PLAIN)
    yield hosts
    for host in hosts:
        for name in (TRACING, PLAIN):
            engine.remove(cluster.sb, host, name)


def test_stacks_in_docker_containers_then_stop(cluster: Cluster, boxes: list[str], home: Path,
                                               tmp_path: Path) -> None:
    plain = cluster.inventory(tmp_path / "plain.yaml", boxes, defaults={"container": PLAIN})
    out = " ".join(run_cli("check", str(plain)).stdout.split())
    assert ("node[28-29]: stacks: warning: `clusterrun stacks` and the stall report cannot read "
            "the ranks' stacks there: the container lacks CAP_SYS_PTRACE") in out, out

    inv = cluster.inventory(tmp_path / "inv.yaml", boxes, defaults={"container": TRACING})
    script = copy_payload(tmp_path, "hang.py")
    run_id, ranks = detach_hung_in_containers(inv, script)
    assert {r["rank"]: r for r in ranks}[2]["node"] == "node29"
    assert run_cli("stop", "--grace", "2", run_id).returncode == 0
    assert cluster.wait_run_gone(boxes, run_id, 30) == {}
    for host in boxes:
        assert container_processes(cluster, host, TRACING) == ["sleep infinity"], host
