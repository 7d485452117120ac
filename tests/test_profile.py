"""`stacks --profile` names the straggler from every rank's share of time waiting in
torch.distributed: an even run names none, a rank made slow by extra compute is named, and so
is the rank of a host whose CPU is capped through its cgroup. Real torchrun and Gloo on the
namespace cluster (tests/payloads/ticker.py: compute, sleep, all_reduce, every step)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, copy_payload, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node12", "node13", "node14"]
# About 18 ms of compute and 50 ms of sleep per step, then the all_reduce.
PACE = ("WORK=600", "STEP_SLEEP=0.05")
WINDOW = "8"
MEASURED = Path(os.environ.get("CLUSTERRUN_PROFILE_LOG", "/dev/null"))


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


@pytest.fixture
def ticker(tmp_path: Path) -> Path:
    return copy_payload(tmp_path, "ticker.py", "ticker")


def detach(cluster: Cluster, tmp_path: Path, script: Path, *env: str) -> str:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    args = [x for e in (*PACE, *env) for x in ("--env", e)]
    cp = run_cli("launch", "--detach", "--nproc-per-node", "1", "--grace", "2", *args,
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    run_id = match.group(1)
    deadline = time.monotonic() + 120
    for rank, host in enumerate(HOSTS):  # every rank is in its loop
        log = f"/tmp/clusterrun/runs/{run_id}/{host}/rank-{rank}.log"
        while "step 20 " not in cluster.run_on(host, "sh", "-c", f"cat {log} 2>/dev/null; true"):
            assert time.monotonic() < deadline, f"{host} rank {rank} never got to step 20"
            time.sleep(0.5)
    return run_id


def profile(run_id: str, case: str) -> dict:
    cp = run_cli("stacks", run_id, "--profile", WINDOW, "--json", timeout=180)
    assert cp.returncode == 0, cp.stderr
    found = json.loads(cp.stdout)
    shares = {r["rank"]: r["wait_share"] for r in found["ranks"]}
    with MEASURED.open("a") as log:  # the measurements docs/observability.md quotes
        log.write(json.dumps({"case": case, "shares": shares,
                              "stragglers": found["stragglers"]}) + "\n")
    assert sorted(shares) == [0, 1, 2], found
    return found


def stop(cluster: Cluster, run_id: str) -> None:
    assert run_cli("stop", run_id).returncode == 0
    assert cluster.wait_run_gone(HOSTS, run_id, 20) == {}


def test_an_even_run_names_no_straggler(cluster: Cluster, home: Path, tmp_path: Path,
                                        ticker: Path, strays: None) -> None:
    run_id = detach(cluster, tmp_path, ticker)
    found = profile(run_id, "even")
    assert found["stragglers"] == [], found
    stop(cluster, run_id)


def test_a_rank_slowed_by_extra_compute_is_the_straggler(cluster: Cluster, home: Path,
                                                         tmp_path: Path, ticker: Path,
                                                         strays: None) -> None:
    run_id = detach(cluster, tmp_path, ticker, "SLOW_RANK=1", "SLOW_FACTOR=8")
    found = profile(run_id, "compute")
    assert found["stragglers"] == [1], found
    # The text view says the same, in words.
    cp = run_cli("stacks", run_id, "--profile", "4", timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert "straggler: rank 1" in cp.stdout, cp.stdout
    # `top --profile` shows the same, beside its own figures.
    cp = run_cli("top", run_id, "--once", "--json", "--profile", "4", timeout=120)
    assert cp.returncode == 0, cp.stderr
    sample = json.loads(cp.stdout)
    assert sample["stragglers"] == [1], sample
    shares = {r["rank"]: r["wait_share"] for r in sample["ranks"]}
    assert shares[1] < shares[0] and shares[1] < shares[2], shares
    stop(cluster, run_id)


def test_a_ddp_straggler_is_named(cluster: Cluster, home: Path, tmp_path: Path,
                                  strays: None) -> None:
    """DistributedDataParallel with no explicit collective: the gradients' all-reduce runs in
    DDP's reducer, and the ranks that wait for rank 1 (0.4 s more compute per step) sit idle
    inside backward, not in a torch.distributed frame."""
    script = copy_payload(tmp_path, "ddp_ticker.py", "ddp")
    run_id = detach(cluster, tmp_path, script, "SLOW_RANK=1", "SLOW_SECONDS=0.4")
    found = profile(run_id, "ddp")
    assert found["stragglers"] == [1], found
    shares = {r["rank"]: r["wait_share"] for r in found["ranks"]}
    assert shares[0] > 0.5 and shares[2] > 0.5 and shares[1] < 0.2, shares
    stop(cluster, run_id)


@contextlib.contextmanager
def cpu_capped(cluster: Cluster, host: str, run_id: str, percent: int) -> Iterator[None]:
    """The run's processes on ``host`` moved into a cgroup whose CPU is capped at ``percent``
    of one CPU: cpu.max where cgroup v2 has the cpu controller, else the same CFS bandwidth
    limit through cgroup v1's cpu.cfs_quota_us (this machine's hybrid layout)."""
    unified = Path("/sys/fs/cgroup/unified")
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.controllers").read_text():
        group = v2 / f"clusterrun-test-cap-{run_id[-6:]}"
        group.mkdir()
        (group / "cpu.max").write_text(f"{percent * 1000} 100000")
    else:
        assert unified.exists() or Path("/sys/fs/cgroup/cpu").exists()
        group = Path("/sys/fs/cgroup/cpu") / f"clusterrun-test-cap-{run_id[-6:]}"
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(percent * 1000))
    moved = []
    for pid in cluster.pids(host):
        with contextlib.suppress(OSError):
            if f"CLUSTERRUN_RUN_ID={run_id}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                (group / "cgroup.procs").write_text(str(pid))
                moved.append(pid)
    assert moved, f"no process of {run_id} on {host}"
    try:
        yield
    finally:
        for pid in moved:  # back where they were before the cap, if still alive
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            group.rmdir()


def test_the_rank_on_a_cpu_capped_host_is_the_straggler(cluster: Cluster, home: Path,
                                                        tmp_path: Path, ticker: Path,
                                                        strays: None) -> None:
    run_id = detach(cluster, tmp_path, ticker)
    with cpu_capped(cluster, HOSTS[2], run_id, 5):
        time.sleep(2)
        found = profile(run_id, "cpu.max")
    assert found["stragglers"] == [2], found
    stop(cluster, run_id)
