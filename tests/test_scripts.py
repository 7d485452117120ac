"""The scripts users already have (issue 9), on the namespace cluster with real torch: an old
`--local_rank` script, a script that rendezvous itself from its arguments with --no-torchrun and
placeholders, and secrets from the controller's environment that reach the ranks and nowhere
else."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, Cluster, Reader, run_cli, start_cli

pytestmark = pytest.mark.cluster


def example(tmp_path: Path, name: str) -> Path:
    """A shipped example in a directory of its own (that directory is what gets synced)."""
    target = tmp_path / "job" / name
    target.parent.mkdir(exist_ok=True)
    shutil.copy(REPO / "payloads" / name, target)
    return target


def test_a_local_rank_script_runs_unmodified(cluster: Cluster, home: Path, tmp_path: Path,
                                            clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"],
                            defaults={"nproc_per_node": 2})
    script = example(tmp_path, "legacy_local_rank.py")
    cp = run_cli("launch", "--local-rank-arg", str(inv), str(script), "--steps", "2")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    lines = re.findall(r"rank (\d) --local_rank=(\d) LOCAL_RANK=(\d) host=(\S+) steps=(\d)",
                       cp.stdout)
    assert sorted(int(r) for r, *_ in lines) == [0, 1, 2, 3], cp.stdout
    for _rank, arg, env, _host, steps in lines:
        assert arg == env  # the argument every process got is its own LOCAL_RANK
        assert steps == "2"  # and the script's own arguments came after it, intact
    assert {host for *_, host, _ in lines} == {"node1", "node2"}
    assert "done: sum 12 over 4 ranks" in cp.stdout  # 4 ranks x (1 + 2)


def test_a_tcp_init_script_takes_its_rank_from_placeholders(cluster: Cluster, home: Path,
                                                           tmp_path: Path, clean: None) -> None:
    names = ["node1", "node2", "node3"]
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"nproc_per_node": 1})
    script = example(tmp_path, "tcp_init.py")
    config = '{"lr": 0.1, "tags": ["a b", "$(id)"]}'
    cp = run_cli("launch", "--no-torchrun", str(inv), str(script), "-bk", "gloo",
                 "-im", "tcp://{master_addr}:{master_port}", "-rn", "{node_rank}",
                 "-ws", "{nnodes}", "--config", config)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    for rank, host in enumerate(names):
        assert f"[{host} r{rank}] rank {rank}/3 on {host}" in cp.stdout, cp.stdout
        assert f"[{host} r{rank}] rank {rank}: sum 6 (expected 6)" in cp.stdout
    # The JSON argument arrived byte-exact (the script prints it back, keys sorted).
    assert json.dumps(json.loads(config), sort_keys=True) in cp.stdout


def test_a_failing_rank_without_torchrun_is_named_first_and_ends_every_host(
        cluster: Cluster, home: Path, tmp_path: Path, clean: None) -> None:
    names = ["node1", "node2", "node3"]
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"nproc_per_node": 1})
    script = example(tmp_path, "tcp_init.py")
    start = time.monotonic()
    cp = run_cli("launch", "--no-torchrun", "--grace", "3", str(inv), str(script), "-bk", "gloo",
                 "-im", "tcp://{master_addr}:{master_port}", "-rn", "{node_rank}",
                 "-ws", "{nnodes}", "--fail-rank", "1", "--exit-code", "3")
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert time.monotonic() - start < 60
    report = cp.stderr[cp.stderr.index("root cause:"):]
    assert report.startswith("root cause: node2 rank 1 exited with code 3"), cp.stderr
    assert cluster.wait_no_processes(names, 15) == {}
    summary = json.loads(next((home / "runs").iterdir()).joinpath("summary.json").read_text())
    assert summary["root_cause"]["node"] == "node2" and summary["root_cause"]["code"] == 3


def test_a_secret_reaches_every_rank_and_nothing_else(cluster: Cluster, home: Path,
                                                     tmp_path: Path, clean: None) -> None:
    names = ["node1", "node2"]
    canary = "wandb-" + uuid.uuid4().hex
    digest = hashlib.sha256(canary.encode()).hexdigest()[:16]
    db_canary = "db-" + uuid.uuid4().hex  # in a .env next to the script, as people keep it
    db_digest = hashlib.sha256(db_canary.encode()).hexdigest()[:16]
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"nproc_per_node": 2})
    script = tmp_path / "job" / "canary.py"
    script.parent.mkdir()
    shutil.copy(REPO / "tests" / "payloads" / "canary.py", script)
    (script.parent / ".env").write_text(f"export DB_PASS='{db_canary}'\n")
    env = {"WANDB_API_KEY": canary}  # forwarded from this shell: it matches WANDB_*
    dry = run_cli("launch", "--dry-run", str(inv), str(script), env=env)
    assert dry.returncode == 0, dry.stderr
    assert "WANDB_API_KEY=******" in dry.stdout and canary not in dry.stdout + dry.stderr
    proc = start_cli("launch", "--env", "SLEEP=4", "--env-file", str(script.parent / ".env"),
                     str(inv), str(script),
                     env={**os.environ, **env})
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    cmdlines = cluster.cmdlines_until_exit(proc, names)
    out.join()
    err.join()
    assert proc.returncode == 0, err.text
    # Every rank got it...
    assert sorted(re.findall(r"rank (\d) WANDB_API_KEY sha256 (\w+)", out.text)) == [
        (str(r), digest) for r in range(4)], out.text
    assert sorted(re.findall(r"rank (\d) DB_PASS sha256 (\w+)", out.text)) == [
        (str(r), db_digest) for r in range(4)], out.text
    # ... and it is nowhere else: no command line on any host, not the console, not a file
    # clusterrun wrote here (plan, state, summary, logs) or on the hosts (spec, state, logs,
    # the copy of the script's directory).
    assert cmdlines and not any(canary.encode() in c or db_canary.encode() in c
                                for c in cmdlines)
    assert canary not in out.text + err.text and db_canary not in out.text + err.text
    written = [p for p in home.rglob("*") if p.is_file()]
    for name in names:
        written += [p for p in (cluster.sb.root / name / "tmp" / "clusterrun").rglob("*")
                    if p.is_file()]
    assert any(p.name == "plan.json" for p in written)
    assert any(p.name == "spec.json" for p in written)
    for path in written:  # the .env itself is never copied to the hosts either
        data = path.read_bytes()
        assert canary.encode() not in data and db_canary.encode() not in data, path
