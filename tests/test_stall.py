"""The stall watchdog (issue 21) on real torchrun + Gloo: each kind of hung rank is named as the
odd one out within the stall timeout + 30 s; --on-stall stop ends the run everywhere with exit
status 7; a silent busy job is never called stalled; a detached run's hub does it all with no
controller."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, copy_payload, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node13", "node14", "node15"]
TIMEOUT = 10


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def _odd_line(text: str) -> str:
    found = [x for x in text.splitlines() if "stall: odd one out:" in x]
    assert found, text
    return found[0]


@pytest.mark.parametrize(("mode", "frame"), [
    ("sleep", "sleep_outside_collectives"), ("skip", "barrier"), ("stop", "STOPPED")])
def test_a_stopped_stall_names_the_hung_rank_and_exits_7(cluster: Cluster, home: Path,  # noqa: PLR0917
                                                         tmp_path: Path, strays: None,
                                                         mode: str, frame: str) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "hang.py")
    started = time.monotonic()
    cp = run_cli("launch", "--nproc-per-node", "2", "--grace", "2", "--stall-timeout",
                 str(TIMEOUT), "--on-stall", "stop", "--env", f"HANG={mode}", "--env",
                 "HANG_RANK=4", str(inv), str(script), timeout=240)
    assert cp.returncode == 7, cp.stderr[-3000:]
    odd = _odd_line(cp.stderr)
    assert "rank 4 on node15" in odd and frame in odd, odd
    assert "'rank 4 step 2'" in odd  # its last line
    assert re.search(r"stall: ranks 0-3,5 \(node\[13-15\]\) wait in all_reduce", cp.stderr)
    # Named within the timeout + 30 s of the hang: the start and the steps before it take
    # under a minute here, so the whole launch stays well inside this.
    assert time.monotonic() - started < 60 + TIMEOUT + 30
    assert cluster.wait_no_processes(HOSTS, 20) == {}
    run_id = re.search(r"run (\S+) failed \(exit 7\)", cp.stderr)
    assert run_id, cp.stderr[-2000:]
    logs = run_cli("logs", run_id.group(1))
    assert "clusterrun: stall: odd one out: rank 4 on node15" in logs.stdout
    summary = json.loads((home / "runs" / run_id.group(1) / "state.json").read_text())
    assert summary["state"] == "failed" and summary["exit_status"] == 7
    # A stall, not a rank that exited 7: the blamed host and its odd rank out.
    blamed = {"node": "node15", "rank": 4}
    assert (summary["outcome"], summary["stalled"]) == ("stalled", blamed), summary
    ended = json.loads((home / "runs" / run_id.group(1) / "summary.json").read_text())
    assert (ended["outcome"], ended["stalled"]) == ("stalled", blamed)
    events = (home / "runs" / run_id.group(1) / "events.jsonl").read_text()
    assert '"event": "stalled"' in events


def test_a_dataloader_worker_hang_names_the_users_line_and_the_worker(
        cluster: Cluster, home: Path, tmp_path: Path, strays: None) -> None:
    """Rank 1's DataLoader worker sleeps for ever in the dataset's __getitem__: the report names
    the rank, the script's own line it waits in and the library call, and the worker process
    with its own line; the stop leaves no worker behind on any host."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "loader_hang.py")
    cp = run_cli("launch", "--nproc-per-node", "1", "--grace", "2", "--stall-timeout",
                 str(TIMEOUT), "--on-stall", "stop", "--env", "HANG_RANK=1", str(inv),
                 str(script), timeout=240)
    assert cp.returncode == 7, cp.stderr[-3000:]
    odd = _odd_line(cp.stderr)
    assert "rank 1 on node14" in odd, odd
    lines = cp.stderr.splitlines()
    where = lines[next(i for i, x in enumerate(lines) if "stall: odd one out:" in x) + 1]
    assert ("stall:   rank 1 waits in `for step, batch in enumerate(loader):` "
            "(loader_hang.py:34), inside `_BaseDataLoaderIter.__next__`") in where, where
    assert re.search(r"; DataLoader worker \d \(pid \d+\) waits in `time.sleep\(3600\)` "
                     r"\(loader_hang.py:29\) in `Shards.__getitem__`", where), where
    assert re.search(r"stall: ranks 0,2 \(node\[13,15\]\) wait in all_reduce", cp.stderr)
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_stacks_shows_the_hung_dataloader_worker_and_the_stop_leaves_none(
        cluster: Cluster, home: Path, tmp_path: Path, strays: None) -> None:
    """`clusterrun stacks` while rank 1's DataLoader worker hangs (a detached run, so the
    command runs beside it): the odd rank's own line, then each of its workers with its pid
    and its own stack down to the dataset's ``__getitem__``. The hub's --on-stall stop then
    ends it, and no rank and no worker is left on any host."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "loader_hang.py")
    timeout = 30  # long enough for `stacks` to see the hang before the stop
    cp = run_cli("launch", "--detach", "--nproc-per-node", "1", "--grace", "2",
                 "--stall-timeout", str(timeout), "--on-stall", "stop", "--env", "HANG_RANK=1",
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 90
    odd = "odd one out: rank 1 (node14): <module> (loader_hang.py:34)"
    # Both at once: one sample in a full cluster run read rank 0 as "no Python frames" and so
    # named it the odd one; the test asks for the answer the hang gives, not the first sample.
    while not ("Shards.__getitem__" in (shown := run_cli("stacks", run_id)).stdout
               and odd in shown.stdout):
        assert time.monotonic() < deadline, (shown.stdout, shown.stderr)
        time.sleep(2)
    text = shown.stdout
    workers = re.findall(r"^    DataLoader worker (\d) \(pid (\d+)\):$", text, re.M)
    assert workers, text
    assert re.search(r"^        Shards\.__getitem__  \S*/loader_hang\.py:29$", text, re.M), text
    assert re.search(r"; DataLoader worker \d \(pid \d+\) waits in `time.sleep\(3600\)` "
                     r"\(loader_hang.py:29\) in `Shards.__getitem__`", text), text
    pids = {int(pid) for _n, pid in workers}
    alive = cluster.run_on("node14", "sh", "-c", "ls /proc")
    assert pids <= {int(x) for x in alive.split() if x.isdigit()}, (pids, text)
    # The hub stops the run on the worker's host; nothing of it is left anywhere.
    state_file = f"/tmp/clusterrun/runs/{run_id}/node13/state.json"
    deadline = time.monotonic() + timeout + 90
    while (state := json.loads(cluster.read("node13", state_file))).get("state") in (
            "running", "stalled", "stopping"):
        assert time.monotonic() < deadline, state
        time.sleep(1)
    assert cluster.wait_no_processes(HOSTS, 20) == {}
    rows = {r["id"]: r for r in json.loads(run_cli("ps", "--json").stdout)}
    assert (rows[run_id]["outcome"], rows[run_id]["stalled"]) == (
        "stalled", {"node": "node14", "rank": 1}), rows[run_id]


def test_a_stopped_stall_restarts_on_a_spare_in_the_blamed_hosts_place(
        cluster: Cluster, home: Path, tmp_path: Path, strays: None) -> None:
    """`--on-stall stop --max-restarts 1` with a spare: the host of the odd rank out is left
    out, the spare takes its node rank, and the second attempt (where nothing hangs) succeeds;
    the first attempt is recorded as a stall, not as a rank that exited 7."""
    spare = "node16"
    inv = cluster.inventory(tmp_path / "inv.yaml", [*HOSTS, spare],
                            hosts={spare: {"spare": True}})
    script = copy_payload(tmp_path, "hang.py")
    hang_host = cluster.run_on(HOSTS[2], "hostname").strip()
    cp = run_cli("launch", "--nproc-per-node", "2", "--grace", "2", "--stall-timeout",
                 str(TIMEOUT), "--on-stall", "stop", "--max-restarts", "1", "--env", "HANG=sleep",
                 "--env", "HANG_RANK=4", "--env", f"HANG_HOST={hang_host}", str(inv),
                 str(script), timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert re.search(rf"attempt 2/2: {HOSTS[2]} blamed by the stall watchdog; replaced by "
                     rf"spare {spare}", cp.stderr), cp.stderr[-3000:]
    ps = run_cli("ps", "--json")
    [row] = json.loads(ps.stdout)
    assert (row["state"], row["exit_status"], row["outcome"]) == ("succeeded", 0, None), row
    first = row["attempts"][0]
    assert first["exit_status"] == 7 and "stalled" in first["root_cause"], first
    assert [q["host"] for q in row["quarantined"]] == [HOSTS[2]]
    assert row["hosts"] == [*HOSTS[:2], spare]
    assert cluster.wait_no_processes([*HOSTS, spare], 20) == {}


def test_a_silent_busy_job_is_not_stalled(cluster: Cluster, home: Path, tmp_path: Path,
                                          strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2])
    script = copy_payload(tmp_path, "hang.py")
    # Silent computing for 4 stall timeouts: never a stall, the run succeeds.
    cp = run_cli("launch", "--nproc-per-node", "1", "--stall-timeout", "6", "--on-stall",
                 "stop", "--env", "HANG=busy", "--env", "BUSY=25", str(inv), str(script),
                 timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "stall" not in cp.stderr
    # It was watched all along, and each node's busy rank was seen making progress.
    seen = _watched(home, 6)
    assert sorted(seen) == HOSTS[:2]
    for node, looked in seen.items():
        assert looked["reports"] >= 5 and looked["longest_quiet"] < 6, (node, looked)


def _watched(home: Path, timeout: float) -> dict[str, dict[str, float]]:
    """What the latest run's stall watchdog saw (watch.json): per node, its progress reports
    and the longest quiet time one said."""
    rows = json.loads(run_cli("ps", "--json", "--local").stdout)
    watch = json.loads((home / "runs" / rows[0]["id"] / "watch.json").read_text())
    assert watch["timeout"] == timeout, watch
    return dict(watch["nodes"])


def test_a_slow_checkpoint_write_is_not_a_stall(cluster: Cluster, home: Path, tmp_path: Path,
                                                strays: None) -> None:
    """Rank 0 writes a checkpoint slowly for 3 stall timeouts (little CPU, no output) while the
    others wait in all_reduce: its growing bytes are progress, and the run succeeds."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2])
    script = copy_payload(tmp_path, "hang.py")
    cp = run_cli("launch", "--nproc-per-node", "1", "--stall-timeout", "8", "--on-stall",
                 "stop", "--env", "HANG=write", "--env", "WRITE=25", "--env", "HANG_RANK=0",
                 str(inv), str(script), timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "stall" not in cp.stderr
    assert "rank 1 done" in cp.stdout + cp.stderr
    # The watchdog looked: the writer's node never went quiet for a stall timeout, while the
    # node whose rank waited in all_reduce was seen quiet (the run as a whole was not).
    seen = _watched(home, 8)
    writer, waiter = seen[HOSTS[0]], seen[HOSTS[1]]
    assert writer["reports"] >= 5 and writer["longest_quiet"] < 8, seen
    assert waiter["reports"] >= 5 and waiter["longest_quiet"] > 4, seen


def test_the_detached_hub_reports_a_stall_with_no_controller(cluster: Cluster, home: Path,
                                                             tmp_path: Path,
                                                             strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "hang.py")
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "2",
                 "--stall-timeout", str(TIMEOUT), "--env", "HANG=stop", "--env", "HANG_RANK=3",
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    # The launching controller is gone. The hub (node13's supervisor) finds the stall.
    state_file = f"/tmp/clusterrun/runs/{run_id}/node13/state.json"
    deadline = time.monotonic() + TIMEOUT + 90
    while True:
        state = json.loads(cluster.read("node13", state_file))
        if state.get("state") == "stalled":
            break
        assert time.monotonic() < deadline, state
        time.sleep(1)
    lines = state["stall"]["lines"]
    assert any("odd one out: rank 3 on node14" in x and "STOPPED" in x for x in lines), lines
    rows = {r["id"]: r for r in json.loads(run_cli("ps", "--json").stdout)}
    assert rows[run_id]["state"] == "stalled"
    assert "odd one out: rank 3 on node14" in run_cli("logs", run_id).stdout
    # It moves again: running again, then it ends well.
    pid = next(r["pid"] for r in state["stall"]["nodes"]["node14"] if r["rank"] == 3)
    cluster.run_on("node14", "kill", "-CONT", str(pid))
    deadline = time.monotonic() + 60
    while json.loads(cluster.read("node13", state_file)).get("state") in ("stalled", "running"):
        assert time.monotonic() < deadline
        time.sleep(1)
    final = json.loads(cluster.read("node13", state_file))
    assert final["state"] == "succeeded", final
    assert "the run moves again" in run_cli("logs", run_id).stdout
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_a_detached_run_on_hosts_without_py_spy_is_not_blind(cluster: Cluster, home: Path,
                                                              tmp_path: Path,
                                                              strays: None) -> None:
    """Hosts whose Python has no py-spy and whose workdir has never seen one: launch ships this
    machine's with the run, so the detached hub, with no `stacks` ever run, names the stuck rank
    from its stack. A second launch finds the copy and sends nothing (the same file stays)."""
    workdir = f"/tmp/clusterrun-fresh-{tmp_path.name}"
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2], defaults={
        "python": "/usr/bin/python3", "workdir": workdir})  # no py-spy beside it, no torch
    script = tmp_path / "plain" / "stuck.py"
    script.parent.mkdir()
    script.write_text("import os\nimport time\n\n\ndef stuck_here():\n    time.sleep(600)\n\n\n"
                      "def wait_for_peers():\n    time.sleep(600)\n\n\n"
                      "rank = int(os.environ['RANK'])\nprint('rank', rank, 'ready', flush=True)\n"
                      "if rank == 3:\n    stuck_here()\nwait_for_peers()\n")
    copy = f"{workdir}/runs/.tools/py-spy-*"
    try:
        cp = run_cli("launch", "--detach", "--no-check", "--no-torchrun", "--nproc-per-node", "2",
                     "--grace", "2", "--stall-timeout", str(TIMEOUT), str(inv), str(script))
        assert cp.returncode == 0, cp.stderr
        run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
        shipped = {h: cluster.run_on(h, "sh", "-c", f"stat -c '%n %i' {copy}").split()
                   for h in HOSTS[:2]}
        assert all(s and "/py-spy-" in s[0] for s in shipped.values()), shipped
        state_file = f"{workdir}/runs/{run_id}/{HOSTS[0]}/state.json"
        deadline = time.monotonic() + TIMEOUT + 60
        while (state := json.loads(cluster.read(HOSTS[0], state_file))).get("state") != \
                "stalled":
            assert time.monotonic() < deadline, state
            time.sleep(1)
        lines = state["stall"]["lines"]
        assert lines[0].endswith("4 ranks, 2 different stacks"), lines
        assert any(f"odd one out: rank 3 on {HOSTS[1]}" in x and "in stuck_here (stuck.py:6)"
                   in x for x in lines), lines
        assert any("ranks 0-2" in x and "wait in wait_for_peers (stuck.py:10)" in x
                   for x in lines), lines
        assert run_cli("stop", "--grace", "2", run_id).returncode == 0
        assert cluster.wait_no_processes(HOSTS[:2], 20) == {}
        # Warm: the probe reports the copy, launch sends nothing, the file is the same one.
        script.write_text("print('done', flush=True)\n")
        again = run_cli("launch", "--no-check", "--no-torchrun", "--nproc-per-node", "1",
                        "--stall-timeout", str(TIMEOUT), str(inv), str(script))
        assert again.returncode == 0, again.stderr
        assert {h: cluster.run_on(h, "sh", "-c", f"stat -c '%n %i' {copy}").split()
                for h in HOSTS[:2]} == shipped
    finally:
        for host in HOSTS[:2]:
            cluster.run_on(host, "rm", "-rf", workdir)
