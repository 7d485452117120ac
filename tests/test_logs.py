"""Logs and run management against the namespace cluster: every line exactly once, a paused
controller never slows the ranks, `logs -f` from a second shell, --detach / ps / stop, and
concurrent runs on the same hosts."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, run_cli, start_cli

pytestmark = pytest.mark.cluster

LINE = re.compile(r"^\[(node\d+) r(\d+)\] r(\d+) (\d{7}) (\d+\.\d+) x+$")


def numbered(text: str) -> dict[int, list[int]]:
    """Per rank, the line numbers seen, in order; fails on any line with a broken prefix."""
    seen: dict[int, list[int]] = defaultdict(list)
    for line in text.splitlines():
        if not line.startswith("[node") or " finished " in line or not re.match(
                r"^\[node\d+ r\d+\] r\d+ \d{7} ", line):
            continue
        match = LINE.match(line)
        assert match, f"mangled line: {line[:200]!r}"
        node_rank, rank = int(match.group(2)), int(match.group(3))
        assert node_rank == rank, line
        seen[rank].append(int(match.group(4)))
    return seen


def latest_run(home: Path) -> str:
    rows = json.loads(run_cli("ps", "--json", "--local").stdout)
    return rows[0]["id"]


def sha_on_host(cluster: Cluster, name: str, path: str) -> str:
    return cluster.run_on(name, "sha256sum", path).split()[0]


def test_forty_thousand_lines_per_rank_exactly_once(cluster: Cluster, home: Path,
                                                    tmp_path: Path, spam: Path,
                                                    clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    cp = run_cli("launch", "--nproc-per-node", "2", "--env", "LINES=40000", str(inv), str(spam),
                 timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    live = numbered(cp.stdout)
    assert sorted(live) == [0, 1, 2, 3]
    for rank, numbers in live.items():
        assert numbers == list(range(40000)), f"rank {rank}: {len(numbers)} lines"
    run_id = latest_run(home)
    logs = run_cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    replayed = numbered(logs.stdout)
    assert {r: len(v) for r, v in replayed.items()} == {0: 40000, 1: 40000, 2: 40000, 3: 40000}
    assert all(v == list(range(40000)) for v in replayed.values())
    only_node2 = run_cli("logs", run_id, "--node", "node2").stdout
    assert only_node2 and all(line.startswith("[node2") for line in only_node2.splitlines())
    assert sorted(numbered(only_node2)) == [2, 3]
    only_rank1 = run_cli("logs", run_id, "--rank", "1", "--grep", "finished").stdout
    assert only_rank1.strip().startswith("[node1 r1] r1 finished 40000 lines")
    tail = run_cli("logs", run_id, "--rank", "3", "--tail", "5").stdout.splitlines()
    assert len(tail) == 5 and tail[-1].startswith("[node2 r3] r3 finished")
    # Mirrors are byte-identical to the ranks' files on their hosts.
    summary = json.loads((home / "runs" / run_id / "summary.json").read_text())
    assert summary["logs"]["differ"] == [] and summary["logs"]["identical"] == 6
    mirror = home / "runs" / run_id / "nodes" / "node2" / "rank-3.log"
    host_file = f"/tmp/clusterrun/runs/{run_id}/node2/rank-3.log"
    assert hashlib.sha256(mirror.read_bytes()).hexdigest() == sha_on_host(cluster, "node2",
                                                                          host_file)


def test_paused_controller_never_slows_the_ranks(cluster: Cluster, home: Path, tmp_path: Path,
                                                 spam: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    proc = start_cli("launch", "--env", "LINES=3000", "--env", "PERIOD=0.01", str(inv),
                     str(spam))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    out.wait_for(r"^\[node2 r1\] r1 0000100 ")
    paused_at = time.time()
    proc.send_signal(signal.SIGSTOP)
    time.sleep(20)
    resumed_at = time.time()
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(120) == 0, err.text
    out.join()
    live = numbered(out.text)
    assert live == {0: list(range(3000)), 1: list(range(3000))}
    # The ranks' own pace, from the timestamps they printed: as fast while the controller was
    # stopped as before it.
    run_id = latest_run(home)
    for node, rank in (("node1", 0), ("node2", 1)):
        stamps = [float(line.split()[2]) for line in (
            home / "runs" / run_id / "nodes" / node / f"rank-{rank}.log").read_text().splitlines()
            if line.startswith(f"r{rank} 0")]
        during = [t for t in stamps if paused_at + 1 < t < resumed_at - 1]
        before = [t for t in stamps if t < paused_at]
        rate_during = len(during) / (resumed_at - paused_at - 2)
        rate_before = len(before) / (before[-1] - before[0])
        assert rate_during > 0.9 * rate_before, (rate_during, rate_before)
        assert max(b - a for a, b in zip(stamps, stamps[1:])) < 1.0


def test_logs_follow_from_a_second_shell(cluster: Cluster, home: Path, tmp_path: Path,
                                         spam: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    proc = start_cli("launch", "--env", "LINES=60", "--env", "PERIOD=0.2", str(inv), str(spam))
    out, err = Reader(proc.stdout), Reader(proc.stderr)
    out.wait_for(r"r1 0000005 ")
    follower = start_cli("logs", "-f")
    followed = Reader(follower.stdout)
    started = time.time()
    assert follower.wait(60) == 0
    assert proc.wait(60) == 0, err.text
    followed.join()
    latencies = []
    for arrived_mono, line in followed.lines:
        match = LINE.match(line)
        if not match:
            continue
        printed = float(match.group(5))
        arrived = time.time() - (time.monotonic() - arrived_mono)
        if printed > started + 1:  # lines printed after the follower caught up
            latencies.append(arrived - printed)
    assert len(latencies) > 20
    assert max(latencies) < 1.0, sorted(latencies)[-5:]
    assert numbered(followed.text) == {0: list(range(60)), 1: list(range(60))}


def _ps(home: Path) -> dict[str, dict]:
    cp = run_cli("ps", "--json")
    assert cp.returncode == 0, cp.stderr
    return {row["id"]: row for row in json.loads(cp.stdout)}


def _detach(inv: Path, payload: Path, *env: str) -> str:
    args = [x for e in env for x in ("--env", e)]
    cp = run_cli("launch", "--detach", *args, str(inv), str(payload))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    return match.group(1)


def _running(cluster: Cluster, names: list[str], run_id: str) -> int:
    return sum(len(cluster.run_processes(name, run_id)) for name in names)


def test_detach_ps_logs_stop(cluster: Cluster, home: Path, tmp_path: Path, payload: Path,
                             clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    started = time.monotonic()
    run_id = _detach(inv, payload, "SLEEP=600")
    assert time.monotonic() - started < 60
    assert _ps(home)[run_id]["state"] == "running"
    deadline = time.monotonic() + 60
    while True:
        logs = run_cli("logs", run_id)
        both = ("[node1 r0] report rank 0" in logs.stdout
                and "[node2 r1] report rank 1" in logs.stdout)
        if both or time.monotonic() > deadline:  # the two ranks need not print at once
            break
        time.sleep(1)
    assert "[node1 r0] report rank 0 on node1" in logs.stdout
    assert "[node2 r1] report rank 1 on node2" in logs.stdout
    assert _running(cluster, ["node1", "node2"], run_id) > 0
    stop = run_cli("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    stopped_at = time.monotonic()
    assert cluster.wait_no_processes(["node1", "node2"], 30) == {}
    assert time.monotonic() - stopped_at < 30
    assert _ps(home)[run_id]["state"] == "stopped"


def test_concurrent_runs_on_the_same_hosts(cluster: Cluster, home: Path, tmp_path: Path,
                                           payload: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node3", "node4"])
    # Two attached runs at once both succeed: their own ports, directories and worlds.
    first = start_cli("launch", "--env", "SLEEP=3", str(inv), str(payload))
    second = start_cli("launch", "--env", "SLEEP=3", str(inv), str(payload))
    outs = [p.communicate(timeout=180) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outs
    ports = {re.search(r"master \S+:(\d+)", err).group(1) for _, err in outs}
    assert len(ports) == 2
    # Stopping one leaves the other running.
    keep = _detach(inv, payload, "SLEEP=600")
    drop = _detach(inv, payload, "SLEEP=600")
    deadline = time.monotonic() + 60
    while min(_running(cluster, ["node3", "node4"], r) for r in (keep, drop)) < 4:
        assert time.monotonic() < deadline, "both runs should be up"
        time.sleep(0.5)
    assert run_cli("stop", drop).returncode == 0
    assert _running(cluster, ["node3", "node4"], drop) == 0
    assert _running(cluster, ["node3", "node4"], keep) >= 4
    rows = _ps(home)
    assert rows[drop]["state"] == "stopped" and rows[keep]["state"] == "running"
    assert run_cli("stop", keep).returncode == 0
    assert cluster.wait_no_processes(["node3", "node4"], 30) == {}


UGLY = r'''
import os, sys, time
out = sys.stdout.buffer
rank = os.environ["RANK"]
out.write(b"big " + b"y" * 300000 + b"\n")
for pct in range(0, 101, 10):
    out.write(b"\rprogress %d%%" % pct); out.flush(); time.sleep(0.02)
out.write(b"\n")
out.write(b"bad bytes \xff\xfe end\n")
word = "λ→✓".encode()
out.write(b"split " + word[:3]); out.flush(); time.sleep(0.05)
out.write(word[3:] + b" joined\n")
out.write(b"no newline at exit"); out.flush()
'''


def test_ugly_output_keeps_its_framing(cluster: Cluster, home: Path, tmp_path: Path,
                                       clean: None) -> None:
    folder = tmp_path / "ugly"
    folder.mkdir()
    (folder / "ugly.py").write_text(UGLY)
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    old = os.umask(0o022)
    try:
        cp = run_cli("launch", str(inv), str(folder / "ugly.py"))
    finally:
        os.umask(old)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    for rank, node in ((0, "node1"), (1, "node2")):
        mine = [line for line in lines if line.startswith(f"[{node} r{rank}] ")]
        bodies = [line[len(f"[{node} r{rank}] "):] for line in mine]
        assert "big " + "y" * 300000 in bodies
        assert "progress 100%" in bodies
        assert "bad bytes \ufffd\ufffd end" in bodies
        assert "split λ→✓ joined" in bodies
        assert bodies.count("no newline at exit") == 1
    assert all(line.count("[node") == 1 for line in lines if line.startswith("[node"))
    # Private files, whatever the umask, here and on the hosts.
    run_dir = home / "runs" / latest_run(home)
    for path in [run_dir, *run_dir.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    remote = f"/tmp/clusterrun/runs/{run_dir.name}/node1"
    modes = cluster.run_on("node1", "sh", "-c", f"stat -c '%a %n' {remote} {remote}/*.log "
                           f"{remote}/state.json")
    for line in modes.splitlines():
        mode, name = line.split(" ", 1)
        assert mode == ("700" if name == remote else "600"), line


def test_a_killed_logs_follower_is_resumed_where_its_mirror_ends(cluster: Cluster, home: Path,
                                                                  tmp_path: Path, spam: Path,
                                                                  clean: None) -> None:
    """`logs -f` killed with SIGKILL once it has mirrored part of a detached run's logs; the
    next `logs -f` goes on from there: the mirrors equal the hosts' files, each line shown once."""
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"])
    gate = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    # The ranks stop half-way until the test opens the gate: the first follower is killed
    # with the run part-way, however slowly it got going.
    cp = run_cli("launch", "--detach", "--env", "LINES=4000", "--env", "PERIOD=0.002",
                 "--env", "HOLD_AT=2000", "--env", f"HOLD_FILE={gate}/go", str(inv), str(spam))
    assert cp.returncode == 0, cp.stderr
    run_id = latest_run(home)
    mirrors = {(node, rank): home / "runs" / run_id / "nodes" / node / f"rank-{rank}.log"
               for node, rank in (("node1", 0), ("node2", 1))}
    follower = start_cli("logs", "-f", run_id, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not all(path.is_file() and path.stat().st_size > 0 for path in mirrors.values()):
        assert follower.poll() is None, follower.communicate()[1]
        assert time.monotonic() < deadline, "the first `logs -f` mirrored nothing"
        time.sleep(0.1)
    follower.kill()
    follower.communicate()
    had = {key: path.read_bytes() for key, path in mirrors.items()}
    for node in ("node1", "node2"):
        cluster.run_on(node, "sh", "-c", f"mkdir -p {gate} && touch {gate}/go")
    again = run_cli("logs", "-f", run_id, timeout=120)
    assert again.returncode == 0, again.stderr
    for (node, rank), mirror in mirrors.items():
        host_file = f"/tmp/clusterrun/runs/{run_id}/{node}/rank-{rank}.log"
        assert hashlib.sha256(mirror.read_bytes()).hexdigest() == sha_on_host(
            cluster, node, host_file)
        # The second one resumed: the first one's bytes are kept as they were, and the rest,
        # half of the run at least, came after them.
        now = mirror.read_bytes()
        assert 0 < len(had[(node, rank)]) < len(now) and now.startswith(had[(node, rank)])
    # Every line once, also across the seam, in what the second one showed and in `logs`.
    assert numbered(again.stdout) == {0: list(range(4000)), 1: list(range(4000))}
    full = run_cli("logs", run_id).stdout
    assert numbered(full) == {0: list(range(4000)), 1: list(range(4000))}
    assert _ps(home)[run_id]["state"] == "succeeded"
