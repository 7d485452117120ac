"""Scenario 1: a rank dies (a non-zero exit, SIGKILL as from the OOM killer, a segfault) on one
host of three → the run is torn down on every host within 15 s, and the root cause names the
host, the rank and its exit code or signal, never a peer that merely got SIGTERM. Once attached
(torchrun passes SIGTERM to the dying rank's neighbour on the same host), once detached (no
controller: the gang's hub on the master ends it, and `ps` and `logs` tell the root cause)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, copy_payload, run_cli, start_cli
from tests.reliability.conftest import Timed

HOSTS = ["node1", "node2", "node3"]
TEARDOWN = 15.0


# fault -> (FAULT, exit status, how the root cause says it)
FAULTS = {
    "exit-code": ("exit:7", 7, "exited with code 7"),
    "sigkill": ("kill", 137, "was killed by signal 9 (SIGKILL)"),
    "segfault": ("segv", 139, "was killed by signal 11 (SIGSEGV)"),
}


@dataclass
class Rig:
    """The test's cluster, inventory (HOSTS), payload, $CLUSTERRUN_HOME, and the file where the
    dying rank notes the moment of its fault (/var/tmp: seen by every host and by this test)."""

    cluster: Cluster
    inv: Path
    payload: Path
    home: Path
    mark: Path


@pytest.fixture
def rig(cluster: Cluster, home: Path, tmp_path: Path) -> Iterator[Rig]:
    """The hosts are cleaned afterwards whatever happened."""
    mark = Path("/var/tmp") / f"clusterrun-fault-{uuid.uuid4().hex[:8]}"
    yield Rig(cluster, cluster.inventory(tmp_path / "inv.yaml", HOSTS),
              copy_payload(tmp_path, "faulty.py"), home, mark)
    mark.unlink(missing_ok=True)
    cluster.kill_all(HOSTS)


def wait_file(path: Path, timeout: float, err: Reader | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, (f"{path} did not appear within {timeout} s"
                                             + (f"; stderr:\n{err.text}" if err else ""))
        time.sleep(0.02)


def fault_env(fault: str, mark: Path) -> list[str]:
    env = {"FAULT": FAULTS[fault][0], "FAULT_RANK": "3", "FAULT_AFTER": "1",
           "FAULT_MARK": str(mark), "TEST_DIR": f"/tmp/clusterrun-faulty/{mark.name}"}
    return [x for key, value in env.items() for x in ("--env", f"{key}={value}")]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_dying_rank_ends_the_run_on_every_host(rig: Rig, timed: Timed, fault: str) -> None:
    _, status, how = FAULTS[fault]
    proc = start_cli("launch", "--nproc-per-node", "2", *fault_env(fault, rig.mark),
                     str(rig.inv), str(rig.payload))
    out, err = Reader(proc.stdout), Reader(proc.stderr)  # type: ignore[arg-type]
    wait_file(rig.mark, 120, err)
    with timed(f"rank {fault} (3 hosts x 2 ranks): every host torn down", TEARDOWN) as t:
        code = proc.wait(TEARDOWN + 5)
        left = rig.cluster.wait_no_processes(HOSTS, TEARDOWN - t.seconds)
        t.stop()
        assert left == {}, left
    out.join()
    err.join()
    assert code == status, err.text
    assert "Traceback" not in err.text
    causes = [line for line in err.text.splitlines() if "root cause" in line]
    assert causes == [f"clusterrun: root cause: node2 rank 3 {how}"], err.text
    # The other nodes are told apart from the root cause: stopped because node2 failed.
    assert "clusterrun: node[1,3]: stopped after node2 failed" in err.text, err.text
    run_dir = next((rig.home / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    root = summary["root_cause"]
    assert (root["node"], root["rank"], root["code"]) == ("node2", 3, status), root
    assert root["signal"] == (status - 128 if status > 128 else None)
    # Rank 2 shares node2 with the dying rank and got torchrun's SIGTERM: not a cause.
    node2 = next(n for n in summary["nodes"] if n["name"] == "node2")
    assert node2["state"] == "failed" and node2["exit_code"] == status, node2


def test_a_dying_rank_ends_a_detached_run_everywhere(rig: Rig, timed: Timed) -> None:
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", *fault_env("sigkill", rig.mark),
                 str(rig.inv), str(rig.payload))
    assert cp.returncode == 0, cp.stderr
    found = re.search(r"run (\S+) started on", cp.stderr)
    assert found, cp.stderr
    run_id = found.group(1)
    wait_file(rig.mark, 120)
    with timed("rank sigkill, detached (3 hosts x 2 ranks): every host torn down",
               TEARDOWN) as t:
        left = rig.cluster.wait_no_processes(HOSTS, TEARDOWN)
        t.stop()
        assert left == {}, left
    cause = "node2 rank 3 was killed by signal 9 (SIGKILL)"
    ps = run_cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    entry = next(r for r in json.loads(ps.stdout) if r["id"] == run_id)
    assert (entry["state"], entry["exit_status"]) == ("failed", 137), entry
    root = entry["root_cause"]
    assert (root["node"], root["rank"], root["signal"], root["detail"]) == (
        "node2", 3, 9, cause), entry
    logs = run_cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    assert "[node2 r3] rank 3 fault kill" in logs.stdout
    assert f"clusterrun: root cause: {cause}" in logs.stderr, logs.stderr
    assert "Traceback" not in ps.stderr + logs.stderr
