"""`clusterrun stacks` on a live run (issue 21): every rank's Python stack, taken from outside
with py-spy, identical stacks grouped, the odd ranks out first. Real torchrun and Gloo on the
namespace cluster; each hung rank of tests/payloads/hang.py must be named with its frame."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, copy_payload, run_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node9", "node10", "node11"]


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def detach(inv: Path, script: Path, *args: str) -> str:
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "2", *args,
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    return match.group(1)


def stacks_json(run_id: str, *args: str, ranks: int = 6, timeout: float = 120) -> dict:
    """`stacks --json` once every rank has printed its steps (the hang has begun)."""
    deadline = time.monotonic() + timeout
    while True:
        cp = run_cli("stacks", "--json", *args, run_id)
        found = json.loads(cp.stdout) if cp.returncode == 0 else {"ranks": []}
        waiting = [r for r in found["ranks"] if "all_reduce" in _functions(r)]
        if len(found["ranks"]) == ranks and len(waiting) >= ranks - 1:
            return found
        assert time.monotonic() < deadline, (cp.stdout, cp.stderr)
        time.sleep(2)


def _functions(rank: dict) -> list[str]:
    main = next(t for t in rank["threads"] if t["name"] == "MainThread")
    return [f["function"] for f in main["frames"]]


@pytest.mark.parametrize(("mode", "frame"), [
    ("sleep", "sleep_outside_collectives"), ("skip", "barrier"), ("stop", "<module>")])
def test_the_hung_rank_is_the_odd_one_out(cluster: Cluster, home: Path, tmp_path: Path,  # noqa: PLR0917
                                          strays: None, mode: str, frame: str) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "hang.py")
    run_id = detach(inv, script, "--env", f"HANG={mode}", "--env", "HANG_RANK=3")
    found = stacks_json(run_id)
    assert found["run"] == run_id
    by_rank = {r["rank"]: r for r in found["ranks"]}
    assert sorted(by_rank) == list(range(6))
    assert by_rank[3]["node"] == "node10"
    odd = _functions(by_rank[3])
    assert odd[0] == "<module>" and odd[-1] == frame, odd  # outermost first
    for rank in (0, 1, 2, 4, 5):
        assert _functions(by_rank[rank])[-1] == "all_reduce"
        assert by_rank[rank]["pid"] > 0
    text = run_cli("stacks", run_id)
    assert text.returncode == 0, text.stderr
    first, rest = text.stdout.split("\n\n", 2)[1:3]
    assert first.startswith("odd one out: rank 3 (node10)"), text.stdout
    assert "rank 3 step 2" in first  # its last line
    assert rest.startswith("ranks 0-2,4-5 (node[9-11]): waiting in all_reduce"), text.stdout
    if mode == "stop":
        assert "STOPPED" in first
        # Taking stacks never resumes or stops a rank: it is still stopped, the others wait.
        state = cluster.run_on("node10", "sh", "-c", f"grep State /proc/{by_rank[3]['pid']}/status")
        assert "stopped" in state
    ps = {row["id"]: row for row in json.loads(run_cli("ps", "--json").stdout)}
    assert ps[run_id]["state"] == "running"
    assert run_cli("stop", "--grace", "2", run_id).returncode == 0
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_stacks_of_a_no_torchrun_run_one_rank(cluster: Cluster, home: Path, tmp_path: Path,
                                              strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "hang.py")
    run_id = detach(inv, script, "--no-torchrun", "--env", "HANG=sleep", "--env", "HANG_RANK=4")
    found = stacks_json(run_id)
    assert _functions({r["rank"]: r for r in found["ranks"]}[4])[-1] == \
        "sleep_outside_collectives"
    one = json.loads(run_cli("stacks", "--json", "--rank", "4", run_id).stdout)
    assert [(r["rank"], r["node"]) for r in one["ranks"]] == [(4, "node11")]
    nodes = json.loads(run_cli("stacks", "--json", "--node", "node[9-10]", run_id).stdout)
    assert sorted(r["rank"] for r in nodes["ranks"]) == [0, 1, 2, 3]
    bad = run_cli("stacks", "--rank", "9", run_id)
    assert bad.returncode == 2 and "has no rank 9" in bad.stderr
    assert run_cli("stop", "--grace", "2", run_id).returncode == 0
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_stacks_as_a_normal_user_with_py_spy_shipped(cluster: Cluster, home: Path,
                                                     tmp_path: Path, strays: None) -> None:
    """A non-root user on the hosts, whose Python has no py-spy: clusterrun ships this
    machine's (a dependency of clusterrun), keeps it under the workdir, and reads that
    user's ranks with it."""
    from tests.support import users

    user = users.add(cluster.sb)
    try:
        workdir = f"/tmp/clusterrun-{user}"
        # The system Python (no py-spy beside it); --no-torchrun: no torch needed.
        inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2], defaults={
            "user": user, "python": "/usr/bin/python3", "workdir": workdir})
        script = tmp_path / "plain" / "sleeper.py"
        script.parent.mkdir()
        script.write_text("import os, time\n\n\ndef wait_here():\n    time.sleep(600)\n\n\n"
                          "print('rank', os.environ['RANK'], 'waiting', flush=True)\n"
                          "wait_here()\n")
        cp = run_cli("launch", "--detach", "--no-check", "--no-torchrun", "--nproc-per-node",
                     "1", "--grace", "2", str(inv), str(script))
        assert cp.returncode == 0, cp.stderr
        run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while True:
            found = run_cli("stacks", "--json", run_id)
            ranks = json.loads(found.stdout)["ranks"] if found.returncode == 0 else []
            if len(ranks) == 2 and all(_functions(r)[-1] == "wait_here" for r in ranks):
                break
            assert time.monotonic() < deadline, found.stdout + found.stderr
            time.sleep(1)
        shipped = cluster.run_on("node9", "sh", "-c", f"ls {workdir}/runs/.tools/; stat -c %U "
                                 f"{workdir}/runs/.tools/py-spy-*").split()
        assert shipped[0].startswith("py-spy-") and shipped[-1] == user, shipped
        for rank in ranks:  # the ranks read run as that user
            owner = cluster.run_on(rank["node"], "stat", "-c", "%U", f"/proc/{rank['pid']}")
            assert owner.strip() == user, (rank, owner)
        assert run_cli("stop", "--grace", "2", run_id).returncode == 0
        assert cluster.wait_no_processes(HOSTS[:2], 20) == {}
    finally:
        users.remove(user)


def test_stacks_of_a_rank_started_through_the_ptracer_stub(cluster: Cluster, home: Path,
                                                          tmp_path: Path, strays: None) -> None:
    """Where ptrace_scope is 1 the ranks start through rank.sh's PR_SET_PTRACER_ANY stub. This
    kernel has no Yama, so the path is forced here: the job runs as before, stacks still come."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS[:2])
    script = copy_payload(tmp_path, "hang.py")
    python = cluster.sb.inventory.read_text().split("python: ", 1)[1].split()[0]
    run_id = detach(inv, script, "--env", "HANG=sleep", "--env", "HANG_RANK=2", "--env",
                    f"CLUSTERRUN_PTRACER={python}")
    found = stacks_json(run_id, ranks=4)
    odd = {r["rank"]: r for r in found["ranks"]}[2]
    assert _functions(odd)[-1] == "sleep_outside_collectives"
    assert run_cli("stop", "--grace", "2", run_id).returncode == 0
    assert cluster.wait_no_processes(HOSTS[:2], 20) == {}
