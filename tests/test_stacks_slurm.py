"""`clusterrun stacks` on Slurm nodes (`hosts: slurm`, real slurmd in the namespace hosts): the
stacks are taken through job steps of the run's own allocation, the hung rank is named."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cluster, copy_payload, slurm_inventory
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.cluster

NODES = ["node23", "node24"]


def test_stacks_of_a_run_on_slurm_nodes(cluster: Cluster, slurm_nodes: SlurmCluster,
                                        home: Path, tmp_path: Path) -> None:
    inv = slurm_inventory(cluster, tmp_path / "inv.yaml")
    script = copy_payload(tmp_path, "hang.py")
    cr = shlex.join([sys.executable, "-m", "clusterrun"])
    # Inside one allocation, as a user does: start it detached, look, stop it.
    body = (f"{cr} launch --detach --name slurmhang --nproc-per-node 2 --grace 2 --env HANG=sleep "
            f"--env HANG_RANK=3 {shlex.quote(str(inv))} {shlex.quote(str(script))} || exit 1\n"
            "for i in $(seq 60); do\n"
            f"  {cr} stacks --json slurmhang > {tmp_path}/stacks.json 2>/dev/null\n"
            f"  grep -q sleep_outside_collectives {tmp_path}/stacks.json && "
            f"[ $(grep -c '\"all_reduce\"' {tmp_path}/stacks.json) -ge 3 ] && break\n"
            "  sleep 2\n"
            "done\n"
            f"{cr} stop --grace 2 slurmhang\n")
    proc = subprocess.run(slurm_nodes.salloc_argv(2, NODES, ["sh", "-c", body]),
                          env=slurm_nodes.env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads((tmp_path / "stacks.json").read_text())
    by_rank = {r["rank"]: r for r in found["ranks"]}
    assert sorted(by_rank) == [0, 1, 2, 3], found
    main = next(t for t in by_rank[3]["threads"] if t["name"] == "MainThread")
    assert main["frames"][-1]["function"] == "sleep_outside_collectives"
    assert by_rank[3]["node"] == "node24"
