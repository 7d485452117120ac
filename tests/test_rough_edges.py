"""Rough edges a new user hit, against the namespace cluster: `check --smoke` no longer leaves
the run that `logs` shows by default, and `logs --tail N` of a live run shows every node."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import Cluster, run_cli

pytestmark = pytest.mark.cluster

TICK = """\
import os, time
rank = int(os.environ["RANK"])
for i in range(int(os.environ["TICKS"])):
    print(f"r{rank} tick {i}", flush=True)
    time.sleep(float(os.environ["EVERY"]))
print(f"r{rank} done", flush=True)
"""


def test_check_smoke_is_not_the_latest_run(cluster: Cluster, home: Path, tmp_path: Path,
                                           clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    cp = run_cli("check", "--smoke", str(inv))
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert json.loads(run_cli("ps", "--json", "--local").stdout) == []
    logs = run_cli("logs")
    assert logs.returncode == 2 and "no runs" in logs.stderr, logs.stderr
    kept = list((home / "smoke" / "runs").iterdir())  # its logs are kept, apart
    assert len(kept) == 1 and (kept[0] / "nodes" / "node2" / "rank-1.log").exists()


def _ticks(text: str) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = defaultdict(list)
    for line in text.splitlines():
        match = re.fullmatch(r"\[node\d r(\d)\] r\d (tick \d+|done)", line)
        if match:
            seen[int(match.group(1))].append(match.group(2))
    return seen


def test_tail_of_a_live_run_shows_every_node_then_follows(cluster: Cluster, home: Path,
                                                          tmp_path: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node3", "node4"])
    script = tmp_path / "tick" / "tick.py"
    script.parent.mkdir()
    script.write_text(TICK)
    cp = run_cli("launch", "--detach", "--name", "tick", "--env", "TICKS=60", "--env",
                 "EVERY=0.25", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    deadline = time.monotonic() + 60
    while not all(f"r{r} tick 8" in run_cli("logs", "tick").stdout for r in (0, 1)):
        assert time.monotonic() < deadline, "the ranks did not print"
        time.sleep(1)
    # By name, while it runs: the last 4 lines of both nodes, then every later line once.
    follow = run_cli("logs", "tick", "--tail", "4", "-f", "--grep", "tick|done", timeout=120)
    assert follow.returncode == 0, follow.stderr
    lines = follow.stdout.splitlines()
    assert {line.split()[0] for line in lines[:4]} == {"[node3", "[node4"}, lines[:8]
    for rank, seen in _ticks(follow.stdout).items():
        assert seen[-1] == "done", (rank, seen)
        numbers = [int(t.split()[1]) for t in seen[:-1]]
        assert numbers == list(range(numbers[0], 60)), (rank, seen)
    tail = run_cli("logs", "tick", "--tail", "2").stdout.splitlines()
    assert sorted(tail) == ["[node3 r0] r0 done", "[node4 r1] r1 done"]
