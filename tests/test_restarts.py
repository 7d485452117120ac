"""`launch --max-restarts N` with spare hosts, on the namespace cluster, with real torch (issue 13).

A crashed host (every process in its namespace killed, its sshd too) is quarantined and its
node rank goes to a spare; the run resumes from its checkpoint and ends with the parameters of
an uninterrupted run. A script that always fails is tried exactly N+1 times. Ctrl-C during a
restart ends everything, with no further attempt.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Cluster, Reader, run_cli, start_cli
from tests.support import faults

pytestmark = pytest.mark.cluster

HOSTS = ["node1", "node2", "node3"]
SPARE = "node4"
CRASHED = "node3"


def digits_job(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(REPO / "payloads" / "train_digits.py", job / "train_digits.py")
    return job / "train_digits.py"


def sha256_of(text: str) -> str:
    found = re.findall(r"final parameter sha256 ([0-9a-f]{64})", text)
    assert len(found) == 1, text[-3000:]
    return found[0]


def run_dir(home: Path) -> Path:
    [run] = [p for p in (home / "runs").iterdir() if p.is_dir()]
    return run


@pytest.fixture
def revive(cluster: Cluster) -> Iterator[list[str]]:
    """Hosts a test crashes are brought back afterwards (a fresh sshd), for the next tests."""
    crashed: list[str] = []
    try:
        yield crashed
    finally:
        for name in crashed:
            cluster.sb = faults.revive(cluster.sb.root, name)


@pytest.mark.usefixtures("clean")
def test_a_crashed_worker_is_replaced_by_the_spare_and_the_model_is_the_same(
        cluster: Cluster, tmp_path: Path, home: Path, revive: list[str]) -> None:
    script = digits_job(tmp_path)
    ckpt = f"/tmp/digits-{uuid.uuid4().hex[:8]}"
    args = [str(script), "--epochs", "4", "--seed", "0", "--checkpoint-dir"]
    plain = cluster.inventory(tmp_path / "plain.yaml", HOSTS)
    cp = run_cli("launch", str(plain), *args, ckpt + "-plain", timeout=300)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    uninterrupted = sha256_of(cp.stdout)
    shutil.rmtree(home / "runs")

    inv = cluster.inventory(tmp_path / "inv.yaml", [*HOSTS, SPARE],
                            hosts={SPARE: {"spare": True}})
    proc = start_cli("launch", "--max-restarts", "1", str(inv), *args, ckpt)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    try:
        out.wait_for(r"^\[node1 r0\] epoch 1/4 ", timeout=240)
        assert SPARE not in out.text  # a spare is kept out of the first attempt
        faults.crash(cluster.sb, CRASHED)
        revive.append(CRASHED)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out.join()
    err.join()
    assert code == 0, out.text[-2000:] + err.text[-3000:]
    assert re.search(r"attempt 2/2: node3 lost \(.*\); replaced by spare node4", err.text), \
        err.text[-3000:]
    assert "resumed from" in out.text and "after epoch 1" in out.text
    assert re.search(r"^\[node4 r2\] ", out.text, re.M)  # the spare took node3's node rank
    assert sha256_of(out.text) == uninterrupted
    assert f"run {run_dir(home).name} succeeded (exit 0) after 2 attempts" in err.text

    run = run_dir(home)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_status"] == 0 and summary["attempt"] == 2
    [quarantined] = summary["quarantined"]
    assert quarantined["host"] == CRASHED and quarantined["attempt"] == 1
    assert "lost" in quarantined["reason"]
    assert [a["exit_status"] for a in summary["attempts"]] == [5, 0]
    # The log holds both attempts: the first in the run folder, the second in attempt-2/.
    assert (run / "nodes" / CRASHED).is_dir()
    assert "epoch 1/4" in (run / "nodes" / "node1" / "rank-0.log").read_text()
    second = (run / "attempt-2" / "nodes" / "node1" / "rank-0.log").read_text()
    assert "resumed from" in second and "epoch 4/4" in second
    assert (run / "attempt-2" / "nodes" / SPARE).is_dir()
    cp = run_cli("logs", "--attempt", "1", run.name, timeout=60)
    assert cp.returncode == 0 and "epoch 1/4" in cp.stdout and "resumed" not in cp.stdout
    cp = run_cli("ps", "--local", timeout=60)
    assert "quarantined: node3" in cp.stdout
    left = cluster.wait_no_processes([*HOSTS[:2], SPARE], 15)
    assert left == {}, left


@pytest.mark.usefixtures("clean")
def test_a_script_that_always_fails_is_tried_exactly_n_plus_1_times(
        cluster: Cluster, tmp_path: Path, home: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "fail.py").write_text(
        "import os, sys\n"
        "print('attempt', os.environ['CLUSTERRUN_RESTART_COUNT'], 'rank', os.environ['RANK'])\n"
        "sys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2])
    cp = run_cli("launch", "--max-restarts", "2", str(inv), str(job / "fail.py"), timeout=300)
    assert cp.returncode == 3, cp.stderr[-3000:]
    assert re.findall(r"^\[node2 r1\] attempt (\d) rank 1$", cp.stdout, re.M) == ["0", "1", "2"]
    assert cp.stderr.count("root cause: node2 rank 1 exited with code 3") == 3
    assert "attempt 3/3: restarting after node2 rank 1 exited with code 3" in cp.stderr
    assert "attempt 4" not in cp.stderr
    assert "failed (exit 3) after 3 attempts" in cp.stderr
    summary = json.loads((run_dir(home) / "summary.json").read_text())
    assert [a["exit_status"] for a in summary["attempts"]] == [3, 3, 3]
    assert summary["quarantined"] == []  # a failing rank on a healthy host is the job's


@pytest.mark.usefixtures("clean")
def test_ctrl_c_during_attempt_2_ends_everything(cluster: Cluster, tmp_path: Path,
                                                 home: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "flaky.py").write_text(
        "import os, sys, time\n"
        "count = int(os.environ['CLUSTERRUN_RESTART_COUNT'])\n"
        "print('attempt', count, 'rank', os.environ['RANK'], flush=True)\n"
        "if count == 0 and os.environ['RANK'] == '1':\n"
        "    sys.exit(4)\n"
        "time.sleep(600)\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2])
    proc = start_cli("launch", "--max-restarts", "3", str(inv), str(job / "flaky.py"))
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    try:
        out.wait_for(r"attempt 1 rank 0", timeout=180)
        out.wait_for(r"attempt 1 rank 1", timeout=60)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out.join()
    err.join()
    assert code == 130, err.text[-3000:]
    assert "attempt 3/" not in err.text and "attempt 2 rank" not in out.text
    assert "Traceback" not in err.text
    started = time.monotonic()
    left = cluster.wait_no_processes(HOSTS[:2], 20)
    assert left == {}, left
    assert time.monotonic() - started < 20
    state = json.loads((run_dir(home) / "state.json").read_text())
    assert state["attempt"] == 2 and state["state"] == "stopped"
    cp = subprocess.run(["true"], check=True)  # the shell is usable: no terminal left broken
    assert cp.returncode == 0
