"""What NCCL chose on each host, as a run's summary keeps it, is shown again after the run: a
line per host above `logs`, one line under the run in `ps`, and the whole of it in `ps --json`
(the launch says it only once, as the ranks initialise: a detached run's nobody heard)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from clusterrun.launch import nccl
from clusterrun.wire import NcclReport
from tests.conftest import run_cli

RUN_ID = "20250101-100000-nccl-aaaa"
IB = NcclReport(0.5, interfaces=(("eth1", "10.0.0.11"),), networks=("IB",),
                devices=("mlx5_0:1/IB",), gdr="on", nranks=4, nnodes=2, init_done=(0, 1))
TCP = NcclReport(0.5, interfaces=(("eth0", "10.0.0.12"),), networks=("Socket",), no_ib=True,
                 nranks=4, nnodes=2, init_done=(2, 3))


def finished_run(home: Path, with_nccl: bool = True) -> Path:
    """A finished two-node run as a launch leaves it, its summary made by launch/nccl.py."""
    path = home / "runs" / RUN_ID
    now = time.time()
    plan = {"run_id": RUN_ID, "name": "nccl", "created": now - 10, "nnodes": 2,
            "world_size": 4,
            "nodes": [{"name": f"gpu-{c}", "host": "localhost", "node_rank": i, "nproc": 2,
                       "ranks": [2 * i, 2 * i + 1], "connection": {}}
                      for i, c in enumerate("ab")]}
    for i, c in enumerate("ab"):
        folder = path / "nodes" / f"gpu-{c}"
        folder.mkdir(parents=True)
        (folder / f"rank-{2 * i}.log").write_text(f"rank {2 * i} trained\n")
    (path / "arrivals").write_text("".join(
        f"gpu-{c}\trank-{2 * i}.log\t{len(f'rank {2 * i} trained') + 1}\n"
        for i, c in enumerate("ab")))
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "state.json").write_text(json.dumps({"id": RUN_ID, "name": "nccl",
                                                 "state": "succeeded", "started_at": now - 10,
                                                 "ended_at": now - 1, "exit_status": 0}))
    hosts = [nccl.HostNccl("gpu-a", range(0, 2), IB), nccl.HostNccl("gpu-b", range(2, 4), TCP)]
    summary = {"exit_status": 0, "nccl": nccl.summary(hosts, 4) if with_nccl else None}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_logs_and_ps_show_what_nccl_chose_on_each_host(tmp_path: Path) -> None:
    home = tmp_path / "home"
    finished_run(home)
    env = {"CLUSTERRUN_HOME": str(home)}

    logs = run_cli("logs", RUN_ID, env=env, timeout=60)
    assert logs.returncode == 0, logs.stderr
    said = [line for line in logs.stderr.splitlines() if "nccl" in line]
    assert said[:2] == [
        "clusterrun: nccl gpu-a: eth1 10.0.0.11, IB (mlx5_0:1), GPUDirect RDMA on, "
        "2/2 ranks init done",
        "clusterrun: nccl gpu-b: eth0 10.0.0.12, Socket, 2/2 ranks init done"]
    assert said[2].startswith("clusterrun: nccl warning: gpu-b uses Socket (TCP) while gpu-a "
                              "use IB")
    assert "[gpu-a r0] rank 0 trained" in logs.stdout  # the lines themselves, on stdout

    ps = run_cli("ps", "--local", env=env, timeout=60)
    assert ps.returncode == 0, ps.stderr
    assert (f"  nccl: IB on gpu-a; Socket on gpu-b; 1 warning (clusterrun logs {RUN_ID})"
            in ps.stdout.splitlines())

    rows = json.loads(run_cli("ps", "--local", "--json", env=env, timeout=60).stdout)
    found = rows[0]["nccl"]
    assert set(found["hosts"]) == {"gpu-a", "gpu-b"}
    assert found["hosts"]["gpu-a"]["devices"] == ["mlx5_0:1/IB"]
    assert found["hosts"]["gpu-b"]["line"].startswith("nccl gpu-b: eth0 10.0.0.12, Socket")
    assert len(found["flags"]) == 1


def test_a_run_without_nccl_shows_no_nccl_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    finished_run(home, with_nccl=False)
    env = {"CLUSTERRUN_HOME": str(home)}
    logs = run_cli("logs", RUN_ID, env=env, timeout=60)
    assert logs.returncode == 0 and "nccl " not in logs.stderr, logs.stderr
    ps = run_cli("ps", "--local", env=env, timeout=60)
    assert "  nccl:" not in ps.stdout
    assert json.loads(run_cli("ps", "--local", "--json", env=env).stdout)[0]["nccl"] is None
