"""A lost link on real torchrun + Gloo: one worker host's data path is cut mid-run while its SSH
stays up (a NIC or switch port that flaps). Every rank then waits in the same all_reduce, so no
rank stands out; the watchdog tests the hosts' links again and puts the stall on the cut host,
not on the healthy master, and `--on-stall stop` fails that host."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, Reader, copy_payload, run_cli, start_cli

pytestmark = pytest.mark.cluster

HOSTS = ["node13", "node14", "node15"]
CUT = HOSTS[1]  # a worker: the master (node13) stays healthy
TABLE = "clusterrun_test_cut"


def cut_data_path(cluster: Cluster, name: str) -> None:
    """Drop every packet in or out of the host but SSH's (port 22) and its loopback: its ranks'
    open connections carry nothing more, its supervisor's SSH channel lives on."""
    chain = ("  chain {0} {{\n    type filter hook {0} priority 0; policy drop;\n"
             "    {1} lo accept\n    tcp dport 22 accept\n    tcp sport 22 accept\n  }}\n")
    rules = (f"table inet {TABLE} {{\n" + chain.format("input", "iif")
             + chain.format("output", "oif") + "}\n")
    subprocess.run(["ip", "netns", "exec", cluster.host(name).netns, "nft", "-f", "-"],
                   input=rules, text=True, check=True)


def mend(cluster: Cluster, name: str) -> None:
    subprocess.run(["ip", "netns", "exec", cluster.host(name).netns, "nft", "-f", "-"],
                   input=f"table inet {TABLE}\ndelete table inet {TABLE}\n", text=True,
                   check=True)


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def test_a_cut_data_path_is_named_as_the_root_cause_not_the_master(
        cluster: Cluster, home: Path, tmp_path: Path, strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "ticker.py", "ticker")
    proc = start_cli("launch", "--nproc-per-node", "2", "--grace", "2", "--stall-timeout", "8",
                     "--on-stall", "stop", "--env", "STEP_SLEEP=0.05", "--env", "WORK=2",
                     "--env", "PRINT_EVERY=10", str(inv), str(script))
    out, err = Reader(proc.stdout), Reader(proc.stderr)  # type: ignore[arg-type]
    try:
        out.wait_for(r"step \d+ rank 5 ", timeout=120)  # every rank is in the loop
        cut_data_path(cluster, CUT)
        try:
            code = proc.wait(timeout=120)
        finally:
            mend(cluster, CUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.join()
    err.join()
    text = err.text
    assert code == 7, text[-3000:]
    assert re.search(r"stall: ranks 0-5 \(node\[13-15\]\) wait in all_reduce", text), text[-3000:]
    assert (f"stall: root cause: {CUT}'s links fail: node[13,15] cannot connect to {CUT}"
            in text), text[-3000:]
    assert "links fine" not in text
    run_id = re.search(r"run (\S+) failed \(exit 7\)", text)
    assert run_id, text[-2000:]
    summary = json.loads((home / "runs" / run_id.group(1) / "state.json").read_text())
    assert (summary["outcome"], summary["stalled"]) == ("stalled",
                                                         {"node": CUT, "rank": None}), summary
    assert summary["stall"]["links"]["blamed"] == [CUT], summary["stall"]
    assert cluster.wait_no_processes(HOSTS, 20) == {}


def test_the_detached_hub_names_the_cut_host_too(cluster: Cluster, home: Path, tmp_path: Path,
                                                 strays: None) -> None:
    """No controller: the hub (node13's supervisor) tests the links over the gang. node14's
    gang connection is cut as well, so it cannot answer: the hub's pair to it fails, and the
    stall is put on it, not on the master. A long lease keeps the gang's own loss detection
    from ending the run first; the link comes back once the hub has decided, so its stop
    reaches node14 and nothing is left there."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "ticker.py", "ticker")
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "2", "--lease", "120",
                 "--stall-timeout", "8", "--on-stall", "stop", "--env", "STEP_SLEEP=0.05",
                 "--env", "WORK=2", "--env", "PRINT_EVERY=10", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    log = f"/tmp/clusterrun/runs/{run_id}/node15/rank-5.log"
    deadline = time.monotonic() + 120
    while "step 20 " not in cluster.run_on("node15", "sh", "-c", f"cat {log} 2>/dev/null; true"):
        assert time.monotonic() < deadline, "rank 5 never got to step 20"
        time.sleep(0.5)
    state_file = f"/tmp/clusterrun/runs/{run_id}/node13/state.json"
    cut_data_path(cluster, CUT)
    try:  # until the hub has put the stall on a host
        deadline = time.monotonic() + 90
        while "root_cause" not in (state := json.loads(cluster.read("node13", state_file))):
            assert time.monotonic() < deadline, json.dumps(state)[-3000:]
            time.sleep(1)
    finally:
        mend(cluster, CUT)  # the link comes back: the hub's stop reaches node14 too
    # The master's ranks stop at once; the hub then waits for node14 to say it has ended, or
    # for the lease. Its gang connection sat in TCP's retransmission backoff while cut, so the
    # hub's stop and node14's answer may only cross at a later retransmission (up to about a
    # minute after the mend): the bound is the hub's own, grace + lease + 10 s, not a guess.
    deadline = time.monotonic() + 2 + 120 + 10 + 30
    while (state := json.loads(cluster.read("node13", state_file)))["state"] in (
            "running", "stalled", "stopping"):
        assert time.monotonic() < deadline, (
            state["state"], state.get("peers"), state.get("reason"),
            cluster.read("node13", state_file.replace("state.json", "node.log"))[-3000:])
        time.sleep(1)
    assert state["state"] == "stopped", state  # the master's ranks: stopped for node14
    lines = state["stall"]["lines"]
    assert any(x.startswith(f"stall: root cause: {CUT}'s links fail") for x in lines), lines
    assert state["stall"]["links"]["blamed"] == [CUT], state["stall"]
    assert state["root_cause"]["node"] == CUT, state
    assert state["root_cause"]["detail"].startswith(f"{CUT}: stalled, its links fail"), state
    assert cluster.wait_no_processes(HOSTS, 30) == {}
    rows = {r["id"]: r for r in json.loads(run_cli("ps", "--json").stdout)}
    row = rows[run_id]
    assert (row["state"], row["exit_status"], row["outcome"]) == ("failed", 7, "stalled"), row
    assert row["stalled"] == {"node": CUT, "rank": None}, row
