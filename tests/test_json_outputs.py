"""`--json` on a real detached run of the session cluster: `launch --dry-run --json` (the plan),
`launch --detach --json` (its events, then the summary), `logs --json` (also followed with -f
while the run is stopped) and `stop --json`; every line of stdout through json.loads, and what
they say checked against the hosts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, Reader, run_cli, start_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node9", "node10"]


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = text.splitlines()
    assert lines, "no output"
    return [json.loads(line) for line in lines]


def test_launch_logs_and_stop_json_on_a_detached_run(cluster: Cluster, home: Path,
                                                     tmp_path: Path, payload: Path,
                                                     strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    words = ["--nproc-per-node", "2", "--grace", "3", "--env", "SLEEP=600",
             "--env", "WANDB_API_KEY=s3cr3t-value"]
    dry = run_cli("launch", "--dry-run", "--json", *words, str(inv), str(payload))
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert [n["name"] for n in plan["nodes"]] == HOSTS and plan["world_size"] == 4
    assert all(n["interface"] == n["env"]["NCCL_SOCKET_IFNAME"] for n in plan["nodes"])
    assert "s3cr3t-value" not in dry.stdout
    assert not cluster.run_processes(HOSTS[0], plan["run_id"])  # a dry run starts nothing

    launched = run_cli("launch", "--detach", "--json", *words, str(inv), str(payload))
    assert launched.returncode == 0, launched.stderr
    *events, summary = json_lines(launched.stdout)
    kinds = [e["event"] for e in events]
    # A rank's first line may be heard before the launch returns.
    assert kinds[:2] == ["started", "attempt_begun"] and kinds[-1] == "detached", kinds
    assert set(kinds) <= {"started", "attempt_begun", "first_line", "detached"}
    run_id = summary["run"]
    assert (summary["event"], summary["ok"], summary["state"], summary["detached"]) == \
        ("summary", True, "running", True)
    deadline = time.monotonic() + 90
    while sum(len(cluster.run_processes(h, run_id)) for h in HOSTS) < 6:  # 2 torchrun + 4 ranks
        assert time.monotonic() < deadline, "the run should be up on both hosts"
        time.sleep(0.5)

    follow = start_cli("logs", "--json", "-f", run_id)
    assert follow.stdout is not None
    reader = Reader(follow.stdout)
    try:
        reader.wait_for('"text": "report rank', count=4)  # every rank's first line
        shown = run_cli("logs", "--json", run_id)  # what the follower has mirrored so far
        assert shown.returncode == 0, shown.stderr
        for line in json_lines(shown.stdout):
            assert set(line) == {"node", "rank", "stream", "time", "text"}
            if line["text"].startswith("report rank"):  # the rank's host says who it is
                assert line["text"] == f"report rank {line['rank']} on {line['node']}"
                assert line["stream"] == "rank"

        stopped = run_cli("stop", "--json", run_id)
        assert stopped.returncode == 0, stopped.stderr
        doc = json.loads(stopped.stdout)
        assert (doc["ok"], doc["run"], doc["state"]) == (True, run_id, "stopped")
        assert sorted(h["node"] for h in doc["hosts"]) == sorted(HOSTS)
        assert all(h["ok"] and h["found"] and h["was"] == "running" and h["state"] == "stopped"
                   for h in doc["hosts"]), doc
        assert cluster.wait_no_processes(HOSTS, 15) == {}  # stopped on the hosts, as it says

        assert follow.wait(timeout=60) == 0  # -f ends with the run
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    reader.join()
    followed = json_lines(reader.text)
    texts = {(x["node"], x["rank"], x["text"]) for x in followed}
    for rank, node in enumerate([HOSTS[0]] * 2 + [HOSTS[1]] * 2):
        assert (node, rank, f"report rank {rank} on {node}") in texts
        assert (node, rank, f"rank {rank} got signal 15") in texts  # the stop, followed
    assert all(isinstance(x["time"], float) for x in followed)
