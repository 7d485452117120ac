"""An attached run's stall watchdog keeps what it saw (watch.json in the attempt's folder), so
a run never called stalled still shows it was watched; tests/test_stall.py reads it from real
runs."""

from __future__ import annotations

import json
from pathlib import Path

from clusterrun.runs.store import RunDir
from clusterrun.stacks import watchdog
from clusterrun.transport import SshOptions


def test_the_watchdog_keeps_each_nodes_reports_and_longest_quiet(tmp_path: Path) -> None:
    said: list[str] = []
    dog = watchdog.Watchdog(RunDir(tmp_path), ["node1", "node2"], 8, SshOptions(),
                            to_node=lambda node, op: None, say=said.append,
                            record=lambda found: None, kept=RunDir(tmp_path))
    for second, (busy, waiting) in enumerate([(0.0, 1.0), (0.5, 3.0), (0.0, 5.0)]):
        dog.update("node1", busy, 100.0 + second)
        dog.update("node2", waiting, 100.0 + second)
        dog.tick(100.0 + second)
    assert not (tmp_path / "watch.json").exists()  # written when the attempt ends
    dog.close()
    dog.close()  # the attempt's end heard twice: written once, the same
    kept = json.loads((tmp_path / "watch.json").read_text())
    assert kept == {"timeout": 8, "nodes": {"node1": {"reports": 3, "longest_quiet": 0.5},
                                            "node2": {"reports": 3, "longest_quiet": 5.0}}}
    assert said == []
