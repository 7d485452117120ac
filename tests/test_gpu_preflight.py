"""GPU preflight on the namespace cluster: the fake nvidia-smi (tests/fakes/) put on a host's PATH
by the inventory's `setup:`, the way the job itself would find nvidia-smi, and a real process of
another user that the fake reports on GPU 0. The hosts share this machine's PID namespace, so
the probe finds that process's owner in /proc exactly as on a real GPU machine.

Hosts node16-node19 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node16", "node17", "node18", "node19"]
FAKE = Path(__file__).resolve().parent / "fakes" / "nvidia-smi"
TWO_GPUS = [{}, {}]


def put_fake(cluster: Cluster, host: str, state: dict[str, Any]) -> str:
    """The fake and its state in a fresh directory of the host's own /tmp; its path there. The
    host's /tmp is a directory of the sandbox on this machine's filesystem."""
    name = f"gpufake-{uuid.uuid4().hex[:8]}"
    folder = cluster.sb.root / host / "tmp" / name
    folder.mkdir(mode=0o755)
    shutil.copy(FAKE, folder / "nvidia-smi")
    (folder / "nvidia-smi").chmod(0o755)
    (folder / "nvidia-smi.json").write_text(json.dumps(state))
    (folder / "nvidia-smi.json").chmod(0o644)
    return f"/tmp/{name}"


@pytest.fixture
def nobody_sleeps(cluster: Cluster) -> Iterator[int]:
    """A process of user nobody inside node16 (its mounts, network and hostname); its pid."""
    host = cluster.host("node16")
    proc = subprocess.Popen(["nsenter", "-t", str(host.sshd_pid), "-m", "-u", "-n", "--",
                             "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             "sleep", "300"])
    try:
        # nsenter and setpriv exec (no fork without -p): the pid becomes the sleep itself.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline, "the sleep never started"
            time.sleep(0.05)
        uid = Path(f"/proc/{proc.pid}/status").read_text().split("Uid:")[1].split()[1]
        assert uid == "65534"
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
def gpu_inventory(cluster: Cluster, tmp_path: Path, nobody_sleeps: int) -> Path:
    """node16 (master): GPU 0 holds nobody's sleep; node17: another driver; node18: idle GPUs;
    node19: no nvidia-smi at all."""
    busy = {"driver_version": "550.54.15", "gpus": [{"memory.used": 1004}, {}],
            "apps": [{"gpu": 0, "pid": nobody_sleeps, "used_memory": 1000,
                      "process_name": "sleep"}]}
    states = {"node16": busy, "node17": {"driver_version": "535.161.08", "gpus": TWO_GPUS},
              "node18": {"driver_version": "550.54.15", "gpus": TWO_GPUS}}
    hosts = {name: {"setup": f"export PATH={put_fake(cluster, name, state)}:$PATH"}
             for name, state in states.items()}
    return cluster.inventory(tmp_path / "inv.yaml", HOSTS, hosts=hosts)


def checks_of(report: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    return {h["name"]: {c["name"]: c for c in h["checks"]} for h in report["hosts"]}


def test_another_users_process_on_a_gpu_fails_check_and_allow_busy_goes_on(
        cluster: Cluster, home: Path, gpu_inventory: Path, nobody_sleeps: int) -> None:
    cp = run_cli("check", str(gpu_inventory))
    assert cp.returncode == 3, cp.stdout + cp.stderr
    line = next(x for x in cp.stdout.splitlines() if "gpu_busy:" in x)
    assert (f"node16 GPU 0: 1004 MiB of 81559 MiB in use by pid {nobody_sleeps} sleep "
            "(1000 MiB) of user nobody.") in line
    assert "pick other GPUs with `gpus:`" in line and "--allow-busy-gpus" in line
    assert "1 of 4 hosts failed: node16;" in cp.stdout

    cp = run_cli("check", "--json", str(gpu_inventory))
    assert cp.returncode == 3, cp.stderr
    found = checks_of(json.loads(cp.stdout))
    assert not found["node16"]["gpu_busy"]["ok"]
    assert "user nobody" in found["node16"]["gpu_busy"]["detail"]
    assert "gpu_busy" not in found["node18"] and found["node18"]["gpus"]["detail"].startswith(
        "2 of 2 GPU(s) used (all), NVIDIA H100 80GB HBM3, driver 550.54.15")
    assert found["node19"]["gpus"] == {**found["node19"]["gpus"], "ok": True,
                                       "detail": "no NVIDIA GPU found (no nvidia-smi on the PATH)"}
    # The driver that differs from the master's: a warning on that host only.
    driver = found["node17"]["gpu_driver"]
    assert driver["ok"] and driver["detail"].startswith(
        "warning: NVIDIA driver 535.161.08 on node17 but 550.54.15 on the master node16.")
    assert not any("gpu_driver" in found[n] for n in ("node16", "node18", "node19"))

    cp = run_cli("check", "--allow-busy-gpus", str(gpu_inventory))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    line = next(x for x in cp.stdout.splitlines() if "gpu_busy:" in x)
    assert f"warning: node16 GPU 0: 1004 MiB of 81559 MiB in use by pid {nobody_sleeps}" in line
    assert line.endswith("Going on anyway (--allow-busy-gpus).")
    assert "4/4 hosts ready" in cp.stdout


def test_launch_refuses_a_busy_gpu_and_starts_nothing(
        cluster: Cluster, home: Path, gpu_inventory: Path, nobody_sleeps: int,
        payload: Path) -> None:
    count = "ls /tmp/clusterrun/runs 2>/dev/null | wc -l"
    before = {name: cluster.run_on(name, "sh", "-c", count) for name in HOSTS}
    cp = run_cli("launch", str(gpu_inventory), str(payload))
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr
    assert f"node16 GPU 0: 1004 MiB of 81559 MiB in use by pid {nobody_sleeps} sleep" in cp.stderr
    assert "user nobody" in cp.stderr
    assert not (home / "runs").exists()
    assert {name: cluster.run_on(name, "sh", "-c", count) for name in HOSTS} == before
    # Nothing was left running on the hosts but the sleep the test started.
    assert nobody_sleeps in cluster.pids("node16")
    left = cluster.wait_gone(HOSTS, lambda n: [str(p) for p in cluster.pids(n)
                                               if p != nobody_sleeps], 10)
    assert left == {}
