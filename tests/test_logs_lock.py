"""`logs -f` of a detached run follows it to its end whatever holds the run's mirror lock: a
process that holds it for a moment (a `ps`, a `logs`) is waited for and then taken over from,
and another `logs -f` is read from while it mirrors and taken over from when it is
interrupted. Every line shows exactly once, across each hand-over."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, run_cli, start_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node1", "node2"]
LINES = 40  # 0.2 s apart: about 8 s of output per rank
EVERY_LINE = {0: list(range(LINES)), 1: list(range(LINES))}

# A line of tests/payloads/spam.py as `logs` shows it: rank, line number, when it was printed.
LINE = re.compile(r"^\[(node\d+) r(\d+)\] r(\d+) (\d{7}) (\d+\.\d+) x+$")

# Holds the run's mirror lock as another clusterrun process would while it fetches.
HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def numbered(text: str) -> dict[int, list[int]]:
    """Per rank, the line numbers shown, in order; fails on a numbered line that is mangled."""
    seen: dict[int, list[int]] = defaultdict(list)
    for line in text.splitlines():
        if re.match(r"^\[node\d+ r\d+\] r\d+ \d{7} ", line):
            match = LINE.match(line)
            assert match and match.group(2) == match.group(3), f"mangled line: {line[:200]!r}"
            seen[int(match.group(3))].append(int(match.group(4)))
    return seen


def _detach(inv: Path, payload: Path, *env: str) -> str:
    cp = run_cli("launch", "--detach", *[x for e in env for x in ("--env", e)], str(inv),
                 str(payload))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    return match.group(1)


def _state(run_id: str) -> str:
    cp = run_cli("ps", "--json")
    assert cp.returncode == 0, cp.stderr
    return str({row["id"]: row for row in json.loads(cp.stdout)}[run_id]["state"])


def _same_as_hosts(cluster: Cluster, home: Path, run_id: str) -> None:
    """The run's mirrors here are byte for byte its files on the hosts."""
    for node, rank in (("node1", 0), ("node2", 1)):
        mirror = home / "runs" / run_id / "nodes" / node / f"rank-{rank}.log"
        host_file = f"/tmp/clusterrun/runs/{run_id}/{node}/rank-{rank}.log"
        on_host = cluster.run_on(node, "sha256sum", host_file).split()[0]
        assert hashlib.sha256(mirror.read_bytes()).hexdigest() == on_host


def _ended_with_the_run(cluster: Cluster, home: Path, run_id: str, out: str, err: str) -> None:
    assert numbered(out) == EVERY_LINE, f"{err}\n{out[-3000:]}"
    for rank in (0, 1):
        assert out.count(f"r{rank} finished {LINES} lines") == 1, out[-2000:]
    assert f"run {run_id} succeeded" in err, err
    assert _state(run_id) == "succeeded"
    _same_as_hosts(cluster, home, run_id)
    left = cluster.wait_no_processes(HOSTS, 15)
    assert left == {}, left
    here = _here(run_id)
    assert here == [], f"left on this machine: {here}"


def _here(run_id: str) -> list[str]:
    """Command lines of this machine's processes that name the run (a follower left over)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if run_id in cmdline:
                    found.append(cmdline)
    return found


def test_logs_follow_waits_for_a_moment_s_holder_then_takes_over(
        cluster: Cluster, home: Path, tmp_path: Path, spam: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    run_id = _detach(inv, spam, f"LINES={LINES}", "PERIOD=0.2")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home / "runs" / run_id / "mirror.lock"), "2"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        follower = start_cli("logs", "-f", run_id)
        out, err = follower.communicate(timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert follower.returncode == 0, err
    _ended_with_the_run(cluster, home, run_id, out, err)


def test_a_second_logs_follow_takes_over_when_the_first_is_interrupted(
        cluster: Cluster, home: Path, tmp_path: Path, spam: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    gate = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    half = LINES // 2
    # The ranks wait half-way until the test opens the gate: the first follower is
    # interrupted with the run part-way, however slowly it got going.
    run_id = _detach(inv, spam, f"LINES={LINES}", "PERIOD=0.2", f"HOLD_AT={half}",
                     f"HOLD_FILE={gate}/go")
    first = start_cli("logs", "-f", run_id)
    first_out = Reader(first.stdout)
    first_out.wait_for(r"^\[node\d r\d\] r\d 0000000 ")  # it holds the mirror lock
    second = start_cli("logs", "-f", run_id)
    second_out, second_err = Reader(second.stdout), Reader(second.stderr)
    try:
        last = f"{half - 1:07d}"
        first_out.wait_for(rf"^\[node\d r\d\] r\d {last} ", count=2)
        second_out.wait_for(rf"^\[node\d r\d\] r\d {last} ", count=2)
        assert second.poll() is None, second_err.text
        first.send_signal(signal.SIGINT)
        first.wait(30)
        for node in HOSTS:
            cluster.run_on(node, "sh", "-c", f"mkdir -p {gate} && touch {gate}/go")
        assert second.wait(120) == 0, second_err.text
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    second_out.join()
    second_err.join()
    _ended_with_the_run(cluster, home, run_id, second_out.text, second_err.text)
