"""A run's events (runs/<id>/events.jsonl) and `--notify` on the namespace cluster: a detached
run's events arrive in order and exactly once, also when the watcher its launch left on this
machine is killed with SIGKILL and a later command records the end; a restart is an event; a
secret the job prints is masked in every record of the run, whoever writes it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from clusterrun.runs import store
from clusterrun.runs.journal import events
from tests.conftest import Cluster, _cmdline, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node7", "node8"]


def _watchers(run_id: str) -> list[int]:
    """This machine's `clusterrun logs -f RUN` processes for the run."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()
            and re.search(rf"-m clusterrun logs -f {run_id}$", _cmdline(int(p)))]


def _heard(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_detached_runs_events_arrive_once_in_order_after_its_watcher_is_killed(
        cluster: Cluster, home: Path, tmp_path: Path, payload: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    heard = tmp_path / "heard.jsonl"
    cp = run_cli("launch", "--detach", "--grace", "3", "--notify", f"cat >> {heard}",
                 "--env", "FAIL_RANK=1", "--env", "FAIL_CODE=3", "--env", "FAIL_AFTER=4",
                 "--env", "SLEEP=600", str(inv), str(payload))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while not _watchers(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    watchers = _watchers(run_id)
    assert watchers, "the detached launch left no watcher for its --notify hook"
    for pid in watchers:  # the controller side is gone, the run goes on
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert cluster.wait_no_processes(HOSTS, 90) == {}  # rank 1 failed: the gang ended it
    for _ in range(2):  # whoever looks first records the end, once
        ps = run_cli("ps", "--json")
        assert ps.returncode == 0, ps.stderr
    row = next(r for r in json.loads(ps.stdout) if r["id"] == run_id)
    assert (row["state"], row["exit_status"]) == ("failed", 3), row
    written = events(store.RunDir(home / "runs" / run_id))
    got = _heard(heard)
    assert [e["seq"] for e in written] == list(range(1, len(written) + 1))
    assert [(e["seq"], e["event"]) for e in got] == [(e["seq"], e["event"]) for e in written]
    kinds = [e["event"] for e in written if e["event"] != "first_line"]
    assert kinds[:3] == ["started", "attempt_begun", "detached"], kinds
    assert kinds[-3:] == ["rank_failed", "attempt_ended", "finished"], kinds
    failed = next(e for e in written if e["event"] == "rank_failed")
    root = failed["root_cause"]  # one rank per host: rank 1 is node8's
    assert (root["node"], root["rank"], root["code"]) == ("node8", 1, 3), root


def test_a_restart_and_the_quarantined_host_are_events(cluster: Cluster, home: Path,
                                                      tmp_path: Path, payload: Path) -> None:
    """A rank that fails on a healthy host: the same hosts run attempt 2, and the run's events
    say so in order."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    cp = run_cli("launch", "--max-restarts", "1", "--grace", "3", "--env", "FAIL_RANK=1",
                 "--env", "FAIL_CODE=4", str(inv), str(payload), timeout=240)
    assert cp.returncode == 4, cp.stderr
    [run_dir] = store.all_runs(home)
    kinds = [e["event"] for e in events(run_dir) if e["event"] != "first_line"]
    assert kinds == ["started", "attempt_begun", "rank_failed", "attempt_ended", "restarted",
                     "rank_failed", "attempt_ended", "finished"], kinds
    assert cluster.wait_no_processes(HOSTS, 30) == {}


LEAK = """import os, sys, time
print("logged in with", os.environ["HF_TOKEN"], flush=True)
time.sleep(2)
print("rank", os.environ["RANK"], "ends; token was", os.environ["HF_TOKEN"], flush=True)
sys.exit(3 if os.environ["RANK"] == "1" else 0)
"""


def _records(run_dir: store.RunDir, heard: Path) -> dict[str, str]:
    """What the run's records and its hook hold: none may hold a secret's value."""
    ps = run_cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    return {"events.jsonl": run_dir.file("events.jsonl").read_text(),
            "state.json": run_dir.file("state.json").read_text(),
            "summary.json": run_dir.file("summary.json").read_text(),
            "hook": heard.read_text(), "ps --json": ps.stdout}


def test_a_secret_the_job_prints_is_masked_in_every_record_attached_or_detached(
        cluster: Cluster, home: Path, tmp_path: Path) -> None:
    """A detached run's events are written by the watcher its launch leaves and its end by
    `ps`, which never saw `--env`: they mask the token as the attached launch does."""
    token = "hf_" + uuid.uuid4().hex
    job = tmp_path / "job" / "leak.py"
    job.parent.mkdir()
    job.write_text(LEAK)
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    heard = tmp_path / "detached.jsonl"
    cp = run_cli("launch", "--detach", "--grace", "3", "--notify", f"cat >> {heard}",
                 "--env", f"HF_TOKEN={token}", str(inv), str(job))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(
            e["event"] == "finished" for e in _heard(heard)):
        time.sleep(0.2)
    run_dir = store.RunDir(home / "runs" / run_id)
    firsts = [e["line"] for e in events(run_dir) if e["event"] == "first_line"]
    assert firsts == ["logged in with ******"] * 2, firsts
    assert [e["event"] for e in _heard(heard)] == [e["event"] for e in events(run_dir)]
    for name, text in _records(run_dir, heard).items():
        assert token not in text, name
    assert any(token in p.read_text(errors="replace")  # the job's own logs: as it wrote them
               for p in run_dir.path.glob("nodes/*/*") if p.is_file())
    assert cluster.wait_no_processes(HOSTS, 30) == {}

    heard = tmp_path / "attached.jsonl"
    cp = run_cli("launch", "--grace", "3", "--notify", f"cat >> {heard}", "--env",
                 f"HF_TOKEN={token}", str(inv), str(job))
    assert cp.returncode == 3, cp.stderr
    [run_dir] = [r for r in store.all_runs(home) if r.id != run_id]
    assert [e["line"] for e in events(run_dir) if e["event"] == "first_line"] == [
        "logged in with ******"] * 2
    for name, text in _records(run_dir, heard).items():
        assert token not in text, name
