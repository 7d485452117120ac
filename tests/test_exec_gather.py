"""`clusterrun exec` as clush users expect it, on the namespace cluster: `-b` gathers identical
output into one group and sets the odd host apart, `-f N` bounds the hosts worked on at once
(seen on the hosts themselves), and `--json` is one document with every host's status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, run_cli

pytestmark = pytest.mark.cluster

RULE = "-" * 15


@pytest.fixture
def odd_file(cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    """A file that exists on node17 alone (each host has its own /tmp)."""
    path = f"/tmp/clusterrun-odd-{tmp_path.name}"
    cluster.run_on("node17", "sh", "-c", f"echo odd one out > {path}")
    yield path
    cluster.run_on("node17", "rm", "-f", path)


def test_gather_on_32_hosts_prints_one_group_and_the_odd_host_apart(
        cluster: Cluster, tmp_path: Path, odd_file: str) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", cluster.names)
    cp = run_cli("exec", "-b", str(inv), "--", f"cat {odd_file} 2>/dev/null || echo same",
                 timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == [RULE, "node[1-16,18-32] (31)", RULE, "same",
                                      RULE, "node17", RULE, "odd one out"], cp.stdout
    assert cp.stderr.splitlines()[-1] == "exit 0: node[1-32] (32)", cp.stderr


def _overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _when, step in edges:  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def test_fanout_bounds_the_hosts_running_the_command_at_once(cluster: Cluster,
                                                             tmp_path: Path) -> None:
    names = [f"node{k}" for k in range(20, 26)]
    inv = cluster.inventory(tmp_path / "inv.yaml", names)
    stamps = f"/tmp/clusterrun-fanout-{tmp_path.name}"
    # The hosts share this machine's clock: their stamps compare.
    cmd = f"date +%s.%N > {stamps}; sleep 1; date +%s.%N >> {stamps}"
    try:
        cp = run_cli("exec", "-f", "2", str(inv), "--", cmd, timeout=120)
        assert cp.returncode == 0, cp.stderr
        spans = []
        for name in names:
            start, end = (float(t) for t in cluster.read(name, stamps).split())
            spans.append((start, end))
        assert _overlap(spans) == 2, spans  # bounded, and still two at a time
    finally:
        for name in names:
            cluster.run_on(name, "rm", "-f", stamps)


def test_json_is_one_document_with_every_host_s_status(cluster: Cluster,
                                                       tmp_path: Path) -> None:
    names = ["node26", "node27", "node28", "node29"]
    # node28's SSH port is one nothing listens on: refused at once, so unreachable.
    inv = cluster.inventory(tmp_path / "inv.yaml", names, hosts={"node28": {"port": 1}})
    cmd = 'if [ "$(hostname)" = node27 ]; then echo broken >&2; exit 5; fi; hostname'
    cp = run_cli("exec", "--json", str(inv), "--", cmd, timeout=120)
    assert cp.returncode == 4, cp.stderr  # unreachable outranks the hosts' own 5
    doc = json.loads(cp.stdout)
    assert doc["ok"] is False and doc["exit_status"] == 4
    hosts = {h["name"]: h for h in doc["hosts"]}
    assert list(hosts) == names
    for name in ("node26", "node29"):
        assert hosts[name]["state"] == "exited" and hosts[name]["exit_status"] == 0
        assert hosts[name]["stdout"] == f"{name}\n"
        assert 0 <= hosts[name]["time"] < 60
    assert hosts["node27"]["exit_status"] == 5
    assert hosts["node27"]["stderr"] == "broken\n" and hosts["node27"]["stdout"] == ""
    assert hosts["node28"]["state"] == "unreachable"
    assert hosts["node28"]["exit_status"] is None and hosts["node28"]["time"] is None
    assert "refused" in hosts["node28"]["reason"], hosts["node28"]
    assert "exit 0:" not in cp.stderr  # the summary is in the document, not on stderr
