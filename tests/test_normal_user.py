"""A normal (non-root) user on the hosts, over real SSH: the user most clusters have. `launch`
(attached, Ctrl-C, detached), `top`, `stacks` and `stop` work as that user, every rank runs as
that user, and nothing of the run is left on any host.

The hosts' Python is one that user may run (tests/other_user.py: the machine's /usr/bin/python3
holding this venv's torch), since the venv's own may sit under a home of mode 700; the workdir is
the default, `~/clusterrun`, in the user's real home.
"""

from __future__ import annotations

import json
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus
from tests.conftest import Cluster, Reader, _cmdline, copy_payload, run_cli, start_cli
from tests.support import users

pytestmark = pytest.mark.cluster

HOSTS = ["node24", "node25", "node26"]


@pytest.fixture
def user(cluster: Cluster) -> Iterator[str]:
    name = users.add(cluster.sb)
    try:
        yield name
    finally:
        cluster.kill_all(HOSTS)
        users.remove(name)


def inventory(cluster: Cluster, tmp_path: Path, user: str, python: str) -> Path:
    return cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={
        "user": user, "python": python, "workdir": "~/clusterrun"})


def owners(cluster: Cluster, host: str, pids: list[int]) -> set[str]:
    return {cluster.run_on(host, "stat", "-c", "%U", f"/proc/{pid}").strip() for pid in pids}


def test_a_normal_user_launches_and_every_rank_runs_as_that_user(
        cluster: Cluster, home: Path, tmp_path: Path, user: str, shared_python: str) -> None:
    inv = inventory(cluster, tmp_path, user, shared_python)
    script = copy_payload(tmp_path, "report.py")
    test_dir = f"/tmp/clusterrun-{user}-{uuid.uuid4().hex[:6]}"
    cp = run_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}", str(inv),
                 str(script))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    for index, host in enumerate(HOSTS):
        for rank in (2 * index, 2 * index + 1):
            record = json.loads(cluster.read(host, f"{test_dir}/rank-{rank}.json"))
            assert record["hostname"] == host
            assert record["env"]["USER"] == user and record["env"]["WORLD_SIZE"] == "6"
            assert record["cwd"].startswith(f"/home/{user}/clusterrun/"), record["cwd"]
            assert f"[{host} r{rank}] report rank {rank} on {host}" in cp.stdout
        owner = cluster.run_on(host, "stat", "-c", "%U", f"{test_dir}/rank-{2 * index}.json")
        assert owner.strip() == user
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_ctrl_c_of_a_normal_users_run_leaves_nothing(
        cluster: Cluster, home: Path, tmp_path: Path, user: str, shared_python: str) -> None:
    inv = inventory(cluster, tmp_path, user, shared_python)
    script = copy_payload(tmp_path, "hang.py")
    launch = start_cli("launch", "--nproc-per-node", "2", "--grace", "2", "--env", "HANG=sleep",
                       "--env", "HANG_RANK=3", str(inv), str(script))
    assert launch.stdout is not None
    said = Reader(launch.stdout)
    said.wait_for(r"rank \d step 2", count=6, timeout=120)  # every rank is in the job
    ranks = {h: [p for p in cluster.pids(h) if "hang.py" in _cmdline(p)] for h in HOSTS}
    assert all(len(p) >= 2 for p in ranks.values()), ranks  # torchrun and its two ranks
    assert {h: owners(cluster, h, p) for h, p in ranks.items()} == {h: {user} for h in HOSTS}
    launch.send_signal(signal.SIGINT)
    assert launch.wait(60) == ExitStatus.SIGINT, said.text
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_top_stacks_and_stop_of_a_normal_users_detached_run(
        cluster: Cluster, home: Path, tmp_path: Path, user: str, shared_python: str) -> None:
    inv = inventory(cluster, tmp_path, user, shared_python)
    script = copy_payload(tmp_path, "hang.py")
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "2", "--env",
                 "HANG=sleep", "--env", "HANG_RANK=4", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    run_id = match.group(1)

    found: dict = {}
    for _ in range(60):  # until every rank is in the job and rank 4 sleeps
        shown = run_cli("stacks", "--json", run_id)
        found = json.loads(shown.stdout) if shown.returncode == 0 else {"ranks": []}
        if len(found["ranks"]) == 6 and "sleep_outside_collectives" in _functions(found, 4):
            break
    assert len(found["ranks"]) == 6, found
    assert _functions(found, 4)[-1] == "sleep_outside_collectives"
    assert "all_reduce" in _functions(found, 0)

    top = run_cli("top", run_id, "--once", "--json", "--interval", "1", timeout=120)
    assert top.returncode == 0, top.stdout + top.stderr
    sample = json.loads(top.stdout)
    assert sorted(r["rank"] for r in sample["ranks"]) == list(range(6))
    for rank in sample["ranks"]:  # top's pids are the ranks, and they are that user's
        assert owners(cluster, rank["node"], [rank["pid"]]) == {user}, rank
    by_rank = {r["rank"]: r for r in found["ranks"]}
    assert {r["rank"]: r["pid"] for r in sample["ranks"]} == {
        k: v["pid"] for k, v in by_rank.items()}

    stopped = run_cli("stop", "--grace", "2", run_id)
    assert stopped.returncode == 0, stopped.stderr
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def _functions(found: dict, rank: int) -> list[str]:
    for entry in found["ranks"]:
        if entry["rank"] == rank:
            main = next(t for t in entry["threads"] if t["name"] == "MainThread")
            return [f["function"] for f in main["frames"]]
    return []
