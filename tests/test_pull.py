"""`clusterrun pull` on the namespace cluster: a 3-host DDP run's per-rank checkpoints come back
into DIR/<node>/ with the hosts' bytes (rsync over OpenSSH, and the SSH channel); a second pull
moves only the one new file; a host that is down is named and the others are still pulled; a
detached run is pulled while it runs."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun import sandbox
from tests.conftest import Cluster, copy_payload, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node20", "node21", "node22"]


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def pull(run_id: str, *args: str, env: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any], str]:
    cp = run_cli("pull", run_id, "--json", *args, env=env)
    return cp.returncode, json.loads(cp.stdout), cp.stderr


def by_node(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in report["nodes"]}


def moved(report: dict[str, Any]) -> dict[str, list[str]]:
    return {n["node"]: sorted(f["path"] for f in n["files"] if f["moved"])
            for n in report["nodes"]}


def host_sha(cluster: Cluster, host: str, path: str) -> str:
    return cluster.run_on(host, "sha256sum", path).split()[0]


def local_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_a_ddp_run_again_after_one_more_file_and_with_a_host_down(
        cluster: Cluster, home: Path, tmp_path: Path, strays: None,
        partitioned: list[str]) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "checkpointer.py")
    cp = run_cli("launch", "--nproc-per-node", "1", str(inv), str(script), timeout=240)
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) succeeded", cp.stderr).group(1)  # type: ignore[union-attr]
    dest = tmp_path / "pulled"

    code, report, err = pull(run_id, "--to", str(dest))
    assert code == 0, err
    nodes = by_node(report)
    for rank, host in enumerate(HOSTS):
        node = nodes[host]
        assert node["status"] == "pulled" and node["method"] == "rsync", node
        want = [f"checkpoints/rank-{rank}.pt"] + (["metrics.json"] if rank == 0 else [])
        assert sorted(f["path"] for f in node["files"]) == want  # not the script, nor logs
        assert moved(report)[host] == want
        for rel in want:  # the copy here holds the host's bytes
            assert local_sha(dest / host / rel) == host_sha(cluster, host,
                                                            f"{node['root']}/{rel}")
    root21 = nodes["node21"]["root"]

    # One more file on one host: only it moves, as rsync itself reports.
    cluster.run_on("node21", "sh", "-c", f"echo one more > {root21}/checkpoints/extra.txt")
    code, report, err = pull(run_id, "--to", str(dest))
    assert code == 0, err
    assert moved(report) == {"node20": [], "node21": ["checkpoints/extra.txt"], "node22": []}
    assert [n["moved"] for n in report["nodes"]] == [0, 1, 0]
    assert (dest / "node21" / "checkpoints" / "extra.txt").read_text() == "one more\n"

    # The same over the SSH channel, where a host has no rsync.
    cluster.run_on("node21", "sh", "-c", f"echo changed > {root21}/checkpoints/extra.txt")
    code, report, err = pull(run_id, "--to", str(dest), env={"CLUSTERRUN_SYNC": "stream"})
    assert code == 0, err
    assert {n["method"] for n in report["nodes"]} == {"ssh"}
    assert moved(report) == {"node20": [], "node21": ["checkpoints/extra.txt"], "node22": []}
    assert (dest / "node21" / "checkpoints" / "extra.txt").read_text() == "changed\n"

    # A host down: named, the others pulled, exit status 4.
    root20 = nodes["node20"]["root"]
    cluster.run_on("node20", "sh", "-c", f"echo late > {root20}/late.txt")
    sandbox.partition(cluster.sb, "node22")
    partitioned.append("node22")
    started = time.monotonic()
    code, report, err = pull(run_id, "--to", str(dest), "--connect-timeout", "3")
    assert code == 4, err
    assert time.monotonic() - started < 60
    status = {n["node"]: n["status"] for n in report["nodes"]}
    assert status == {"node20": "pulled", "node21": "pulled", "node22": "unreachable"}
    assert "node22" in err and "The other nodes (node20, node21) were pulled" in err
    assert "Traceback" not in err
    assert moved(report)["node20"] == ["late.txt"]
    assert (dest / "node20" / "late.txt").read_text() == "late\n"


def test_a_detached_run_is_pulled_while_it_runs(cluster: Cluster, home: Path, tmp_path: Path,
                                                strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2])
    script = copy_payload(tmp_path, "checkpointer.py")
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "2", "--env",
                 "HOLD=300", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 120
        while True:  # until rank 3 (node21's second) has written its checkpoint
            code, report, err = pull(run_id, "--rank", "3", "--dry-run")
            assert code == 0, err
            if any(f["path"] == "checkpoints/rank-3.pt" for f in report["nodes"][0]["files"]):
                break
            assert time.monotonic() < deadline, report
            time.sleep(1)
        assert [n["node"] for n in report["nodes"]] == ["node21"]
        code, report, err = pull(run_id, "--rank", "3")
        assert code == 0, err
        files = home / "runs" / run_id / "files"
        assert (files / "node21" / "checkpoints" / "rank-3.pt").is_file()
        assert not (files / "node20").exists()
        ps = json.loads(run_cli("ps", "--json").stdout)
        assert {r["id"]: r for r in ps}[run_id]["state"] == "running"  # pulled while it ran
    finally:
        run_cli("stop", run_id, "--grace", "2")
