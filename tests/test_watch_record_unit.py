"""An attached run's stall view keeps what the watchdog saw (watch.json in the attempt's folder), so
a run never called stalled still shows it was watched; tests/test_stall.py reads it from real
runs."""

from __future__ import annotations

import json
from pathlib import Path

from clusterrun.runs.store import RunDir
from clusterrun.stacks import stallview
from clusterrun.transport import SshOptions


def test_the_watchdog_keeps_each_nodes_reports_and_longest_quiet(tmp_path: Path) -> None:
    said: list[str] = []
    passed: list[tuple[str, dict[str, object]]] = []
    dog = stallview.StallView(RunDir(tmp_path), ["node1", "node2"], 8, SshOptions(),
                              master="node1", send=lambda node, op: passed.append((node, op)),
                              say=said.append, record=lambda found: None, kept=RunDir(tmp_path))
    for busy, waiting in [(0.0, 1.0), (0.5, 3.0), (0.0, 5.0)]:
        dog.progress("node1", busy)
        dog.progress("node2", waiting)
    # node2's quiet times go on to the master, which decides; the master measures its own
    assert [(node, op["node"], op["quiet"]) for node, op in passed] == [
        ("node1", "node2", 1.0), ("node1", "node2", 3.0), ("node1", "node2", 5.0)]
    assert not (tmp_path / "watch.json").exists()  # written when the attempt ends
    dog.close()
    dog.close()  # the attempt's end heard twice: written once, the same
    kept = json.loads((tmp_path / "watch.json").read_text())
    assert kept == {"timeout": 8, "nodes": {"node1": {"reports": 3, "longest_quiet": 0.5},
                                            "node2": {"reports": 3, "longest_quiet": 5.0}}}
    assert said == []
