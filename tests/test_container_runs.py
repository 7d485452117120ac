"""`container:` against a real engine: podman inside the namespace hosts, real sshd, real
torchrun, and assertions on what happened inside each host's container."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, Containers, Reader, run_cli, start_cli
from tests.support import containers as engine

pytestmark = pytest.mark.cluster

HOSTS = ["node27", "node28", "node29"]
NAME = "trainer"


@pytest.fixture(scope="module")
def trainers(cluster: Cluster, containers: Containers) -> Iterator[list[str]]:
    """A running container named `trainer` on each of HOSTS, with host networking."""
    for host in HOSTS:
        engine.remove(cluster.sb, host, NAME)
        engine.run(cluster.sb, host, NAME)
    yield HOSTS
    for host in HOSTS:
        engine.remove(cluster.sb, host, NAME)


def in_container(cluster: Cluster, host: str, *argv: str, check: bool = True) -> str:
    cp = engine.podman(cluster.sb, host, "exec", NAME, *argv, check=check)
    return str(cp.stdout)


def inventory(cluster: Cluster, tmp_path: Path, **hosts: dict[str, str]) -> Path:
    return cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={"container": NAME},
                             hosts=hosts)


def test_ranks_run_inside_each_hosts_container(cluster: Cluster, trainers: list[str],
                                               home: Path, tmp_path: Path,
                                               payload: Path) -> None:
    inv = inventory(cluster, tmp_path)
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    dry = run_cli("launch", "--dry-run", str(inv), str(payload))
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count(f"  container: {NAME} (podman)") == 3
    cp = run_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}", str(inv),
                 str(payload), "--lr", "0.1")
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.count("job/ podman exec: 1 of 1 files copied, all 1 verified") == 3, cp.stderr
    run_id = next((home / "runs").iterdir()).name
    for node_rank, host in enumerate(HOSTS):
        ifname = cluster.host(host).ifname
        for rank in (2 * node_rank, 2 * node_rank + 1):
            rec = json.loads(in_container(cluster, host, "cat", f"{test_dir}/rank-{rank}.json"))
            assert rec["in_container"] is True
            assert rec["env"]["GLOO_SOCKET_IFNAME"] == ifname  # its host's own NIC ...
            assert ifname in rec["interfaces"]  # ... seen from inside the container
            assert rec["env"]["MASTER_ADDR"] == cluster.host(HOSTS[0]).address
            assert rec["argv"] == ["--lr", "0.1"]
            assert f"[{host} r{rank}] report rank {rank}" in cp.stdout
        # The rank files and the run directory are the container's, not the host's.
        assert cluster.run_on(host, "sh", "-c", f"ls {test_dir} /tmp/clusterrun/runs/{run_id} "
                              "2>/dev/null || true") == ""
        assert "state.json" in in_container(cluster, host, "ls",
                                            f"/tmp/clusterrun/runs/{run_id}/{host}")
    assert cluster.wait_run_gone(HOSTS, run_id, 10) == {}
    # The plan remembers the container: `logs` replays, `ps` asks inside it.
    logs = run_cli("logs", run_id)
    assert logs.returncode == 0 and "report rank 5" in logs.stdout
    ps = run_cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    assert json.loads(ps.stdout)[0]["state"] == "succeeded"


def test_a_failing_rank_in_one_container_ends_the_others(cluster: Cluster, trainers: list[str],
                                                         home: Path, tmp_path: Path,
                                                         payload: Path) -> None:
    inv = inventory(cluster, tmp_path)
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    proc = start_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}",
                     "--env", "FAIL_RANK=3", "--env", "FAIL_CODE=3", "--env", "FAIL_AFTER=2",
                     "--env", "SLEEP=600", str(inv), str(payload))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    out.wait_for(r"rank 3 failing with 3")
    code = proc.wait(60)
    out.join()
    err.join()
    assert code == 3, err.text
    causes = [line for _, line in err.lines if "root cause" in line]
    assert causes and causes[0] == "clusterrun: root cause: node28 rank 3 exited with code 3"
    run_id = next((home / "runs").iterdir()).name
    assert cluster.wait_run_gone(HOSTS, run_id, 15) == {}
    # The others were ended by clusterrun (SIGTERM), inside their containers.
    for host in ("node27", "node29"):
        assert ".term" in in_container(cluster, host, "ls", test_dir)


def test_a_killed_controller_leaves_nothing_in_any_container(cluster: Cluster,
                                                             trainers: list[str], home: Path,
                                                             tmp_path: Path,
                                                             payload: Path) -> None:
    inv = inventory(cluster, tmp_path)
    proc = start_cli("launch", "--grace", "5", "--nproc-per-node", "2", "--env", "SLEEP=600",
                     str(inv), str(payload))
    out = Reader(proc.stdout)
    out.wait_for(r"report rank \d on", count=6)
    run_id = next((home / "runs").iterdir()).name
    assert cluster.wait_run_gone(HOSTS, run_id, 0) != {}  # the run is there ...
    proc.kill()
    proc.wait(10)
    # ... and within the lease (30 s) nothing of it is: no signal reaches a process that
    # `podman exec` started, so this is the supervisor's own lifeline at work.
    assert cluster.wait_run_gone(HOSTS, run_id, 30) == {}
    state = json.loads(in_container(cluster, "node28", "cat",
                                    f"/tmp/clusterrun/runs/{run_id}/node28/state.json"))
    assert state["state"] == "lost" and "lifeline lost" in state["reason"]


@contextlib.contextmanager
def engines_hidden(cluster: Cluster, host: str) -> Iterator[None]:
    """No docker or podman on the host's PATH, as on a machine without them: every one of them
    (a machine may have two docker clients, /usr/bin's and /usr/local/bin's)."""
    tools = cluster.run_on(host, "sh", "-c", "for t in $(which -a podman docker); do "
                           "readlink -f $t; done | sort -u").split()  # /bin is /usr/bin
    for tool in tools:
        cluster.run_on(host, "mount", "--bind", "/dev/null", tool)
    try:
        yield
    finally:
        for tool in tools:
            cluster.run_on(host, "umount", tool)


def test_each_container_problem_is_a_clear_preflight_failure(cluster: Cluster,
                                                             trainers: list[str], home: Path,
                                                             tmp_path: Path) -> None:
    engine.run(cluster.sb, "node28", "bare", python=False)
    engine.stop(cluster.sb, "node29", NAME)
    try:
        inv = inventory(cluster, tmp_path, node28={"container": "bare"})
        with engines_hidden(cluster, "node27"):
            cp = run_cli("check", str(inv))
    finally:
        engine.remove(cluster.sb, "node28", "bare")
        engine.podman(cluster.sb, "node29", "start", NAME)
    assert cp.returncode == 3, cp.stdout + cp.stderr
    text = " ".join((cp.stdout + cp.stderr).split())  # the table wraps long messages
    assert ("node27: `container: trainer` needs a container engine, and neither docker nor "
            "podman is installed there") in text
    assert "node28: container 'bare' has no usable `" in text  # the inventory's `python:`
    assert "Use an image with Python 3 and torch" in text
    assert ("node29: container 'trainer' is exited, not running. Start it with `podman start "
            "trainer`") in text
    assert "Traceback" not in text
    assert cluster.wait_run_gone(HOSTS, "no-run", 0) == {}  # no probe or engine client stays


def test_no_sync_needs_the_code_in_the_container_already(cluster: Cluster, trainers: list[str],
                                                         home: Path, tmp_path: Path,
                                                         payload: Path) -> None:
    inv = inventory(cluster, tmp_path)
    cp = run_cli("launch", "--no-sync", str(inv), str(payload))
    assert cp.returncode == 3, cp.stderr
    assert (f"node28: --no-sync, but {payload} is not in container 'trainer' there. "
            "Put the code there") in cp.stderr
    assert "Traceback" not in cp.stderr
    # Put in each container at the same path (as a volume would), it runs from there.
    for host in HOSTS:
        containers_write(cluster, host, payload)
    cp = run_cli("launch", "--no-sync", "--env", "TEST_DIR=/tmp/no-sync", str(inv), str(payload))
    assert cp.returncode == 0, cp.stderr
    assert "files copied" not in cp.stderr
    record = json.loads(in_container(cluster, "node29", "cat", "/tmp/no-sync/rank-2.json"))
    assert record["cwd"] == str(payload.parent)


def containers_write(cluster: Cluster, host: str, path: Path) -> None:
    """This machine's file at the same path in the host's container."""
    write = ("import os, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True); "
             "open(sys.argv[1], 'w').write(sys.argv[2])")
    in_container(cluster, host, "python3", "-c", write, str(path), path.read_text())


def test_exec_runs_in_the_container_unless_told_otherwise(cluster: Cluster,
                                                          trainers: list[str], home: Path,
                                                          tmp_path: Path) -> None:
    inv = inventory(cluster, tmp_path)
    probe = "test -e /run/.containerenv && echo inside || echo outside"
    inside = run_cli("exec", str(inv), "--", probe)
    assert inside.returncode == 0, inside.stderr
    assert sorted(inside.stdout.splitlines()) == [f"{h}: inside" for h in HOSTS]
    outside = run_cli("exec", str(inv), "--on-host", "--", probe)
    assert sorted(outside.stdout.splitlines()) == [f"{h}: outside" for h in HOSTS]
    # --on-host is where the engine is: the containers clusterrun runs in are there.
    listed = run_cli("exec", str(inv), "-w", HOSTS[0], "--on-host", "--", "podman", "ps",
                     "--format", "{{.Names}}")
    assert f"{HOSTS[0]}: {NAME}" in listed.stdout.splitlines()
    missing = run_cli("exec", str(inv), "--container", "nosuch", "--", "true")
    assert missing.returncode != 0 and "nosuch" in missing.stderr
    assert "Traceback" not in missing.stderr
