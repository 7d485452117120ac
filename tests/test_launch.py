"""`clusterrun launch` against the namespace cluster: real sshd, real torchrun, and assertions on
what happened on the hosts (files the ranks wrote there, processes left there)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from clusterrun.plan.build import payload_dir
from tests.conftest import Cluster, Reader, run_cli, start_cli

pytestmark = pytest.mark.cluster

HOSTS3 = ["node1", "node2", "node3"]


def rank_records(cluster: Cluster, names: list[str], test_dir: str) -> dict[int, dict]:
    records = {}
    for name in names:
        listing = cluster.run_on(name, "sh", "-c", f"ls {test_dir} 2>/dev/null || true")
        for file in listing.split():
            if file.endswith(".json"):
                data = json.loads(cluster.read(name, f"{test_dir}/{file}"))
                data["host"] = name
                records[int(data["env"]["RANK"])] = data
    return records


def test_three_hosts_two_processes(cluster: Cluster, home: Path, tmp_path: Path,
                                   payload: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3)
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}", str(inv),
                 str(payload), "--lr", "0.1")
    assert cp.returncode == 0, cp.stderr
    records = rank_records(cluster, HOSTS3, test_dir)
    assert sorted(records) == [0, 1, 2, 3, 4, 5]
    for rank, rec in records.items():
        node_rank = rank // 2
        host = HOSTS3[node_rank]
        ifname = cluster.host(host).ifname
        env = rec["env"]
        assert rec["host"] == host and rec["hostname"] == host  # ran on its own host
        assert env["WORLD_SIZE"] == "6"
        assert env["GROUP_RANK"] == str(node_rank)  # torchrun's name for the node rank
        assert env["LOCAL_RANK"] == str(rank % 2)
        assert env["GLOO_SOCKET_IFNAME"] == ifname
        assert env["NCCL_SOCKET_IFNAME"] == ifname
        assert env["MASTER_ADDR"] == cluster.host("node1").address
        assert rec["argv"] == ["--lr", "0.1"]
        assert f"[{host} r{rank}] report rank {rank} on {host}" in cp.stdout
    assert [cluster.host(h).ifname for h in HOSTS3] == ["eth0", "ens5", "enp3s0"]
    # The master is node 0 and the run is summarised locally.
    run_dir = next((home / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_status"] == 0
    assert [n["node_rank"] for n in summary["nodes"]] == [0, 1, 2]
    assert summary["logs"]["differ"] == [] and summary["logs"]["identical"] >= 6
    assert cluster.wait_no_processes(HOSTS3, 10) == {}


HOSTILE = ["--msg=$(touch /tmp/pwned)", "; touch /tmp/pwned #", "`touch /tmp/pwned`",
           "a'b\"c", "line1\nline2", "", "-rf", "λ→✓", "$HOME", "*", "\\", "  spaced  "]


def test_hostile_arguments_and_env_arrive_byte_exact(cluster: Cluster, home: Path,
                                                     tmp_path: Path, payload: Path,
                                                     clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"],
                            defaults={"env": {"FROM_INVENTORY": "$(touch /tmp/pwned) 'q'"}})
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    env_value = "$(touch /tmp/pwned); `id` \"x\" 'y' λ"
    cp = run_cli("launch", "--env", f"TEST_DIR={test_dir}", "--env", f"HOSTILE={env_value}",
                 "--env", "EMPTY=", str(inv), str(payload), *HOSTILE)
    assert cp.returncode == 0, cp.stderr
    records = rank_records(cluster, ["node1", "node2"], test_dir)
    assert len(records) == 2
    for rec in records.values():
        assert rec["argv"] == HOSTILE
        assert rec["env"]["HOSTILE"] == env_value
        assert rec["env"]["EMPTY"] == ""
        assert rec["env"]["FROM_INVENTORY"] == "$(touch /tmp/pwned) 'q'"
    for name in ("node1", "node2"):
        assert cluster.run_on(name, "sh", "-c", "ls /tmp/pwned 2>/dev/null || true") == ""
    assert not Path("/tmp/pwned").exists()


def test_secrets_stay_off_command_lines_and_out_of_logs(cluster: Cluster, home: Path,
                                                        tmp_path: Path, payload: Path,
                                                        clean: None) -> None:
    canary = "CANARY" + uuid.uuid4().hex
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    proc = start_cli("launch", "--env", f"HF_TOKEN={canary}", "--env", f"TEST_DIR={test_dir}",
                     "--env", "SLEEP=4", str(inv), str(payload))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    seen_cmdlines = cluster.cmdlines_until_exit(proc, ["node1", "node2"])
    out.join()
    err.join()
    assert proc.returncode == 0, err.text
    assert seen_cmdlines and not any(canary.encode() in c for c in seen_cmdlines)
    assert canary not in out.text + err.text
    for path in (home / "runs").rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
    # The ranks do get it: they need it.
    records = rank_records(cluster, ["node1", "node2"], test_dir)
    assert all(r["env"]["HF_TOKEN"] == canary for r in records.values())


def test_dry_run_starts_nothing(cluster: Cluster, home: Path, tmp_path: Path, payload: Path,
                                clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3)
    count = "ls /tmp/clusterrun/runs 2>/dev/null | wc -l"
    before = {name: cluster.run_on(name, "sh", "-c", count) for name in HOSTS3}
    cp = run_cli("launch", "--dry-run", "--nproc-per-node", "2", "--env", "WANDB_API_KEY=s3cret",
                 str(inv), str(payload), "--epochs", "3")
    assert cp.returncode == 0, cp.stderr
    assert "s3cret" not in cp.stdout + cp.stderr
    assert "WANDB_API_KEY=******" in cp.stdout
    for name, ifname in zip(HOSTS3, ["eth0", "ens5", "enp3s0"]):
        assert f"{name} (" in cp.stdout
        assert f"GLOO_SOCKET_IFNAME={ifname}" in cp.stdout
    assert "--node-rank 2" in cp.stdout and "--epochs 3" in cp.stdout
    assert not (home / "runs").exists()
    assert {name: cluster.run_on(name, "sh", "-c", count) for name in HOSTS3} == before


def test_preflight_failure_starts_nothing(cluster: Cluster, home: Path, tmp_path: Path,
                                          payload: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"],
                            hosts={"node2": {"interface": "eth9"}})
    cp = run_cli("launch", str(inv), str(payload))
    assert cp.returncode == 3, cp.stderr
    assert "eth9" in cp.stderr and "ens5" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert not (home / "runs").exists()


def test_relaunch_copies_only_changed_files(cluster: Cluster, home: Path, tmp_path: Path,
                                            payload: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    (payload.parent / "data.txt").write_text("one\n")
    # rsync (what large changes take), then a small change over the open connection.
    first = run_cli("launch", str(inv), str(payload), env={"CLUSTERRUN_SYNC": "rsync"})
    assert first.returncode == 0, first.stderr
    assert re.search(r"node2: job/ rsync: 2 of 2 files copied, all 2 verified", first.stderr)
    (payload.parent / "data.txt").write_text("two\n")
    second = run_cli("launch", str(inv), str(payload))
    assert second.returncode == 0, second.stderr
    assert re.search(r"node2: job/ ssh: 1 of 2 files copied, all 2 verified", second.stderr)
    copy = payload_dir("/tmp/clusterrun", payload.parent)
    assert cluster.read("node2", f"{copy}/data.txt") == "two\n"
    third = run_cli("launch", str(inv), str(payload))
    assert third.returncode == 0, third.stderr
    assert re.search(r"node2: job/ unchanged: 0 of 2 files copied, all 2 verified", third.stderr)

