"""Host sources and subsets on the namespace cluster: a hostfile, a range and the plain list give
the same plan; `-x` of one host launches on the rest."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import Cluster, run_cli

pytestmark = pytest.mark.cluster

HOSTS3 = ["node1", "node2", "node3"]


def _plan(cp_stdout: str) -> str:
    return re.sub(r"\b\d{8}-\d{6}-[0-9a-z-]+\b", "RUN", cp_stdout)


def test_hostfile_range_and_list_give_one_plan(cluster: Cluster, home: Path, tmp_path: Path,
                                               payload: Path, clean: None) -> None:
    addresses = [cluster.host(n).address for n in HOSTS3]
    prefix = addresses[0].rsplit(".", 1)[0]
    lasts = [int(a.rsplit(".", 1)[1]) for a in addresses]
    assert all(a.startswith(prefix + ".") for a in addresses) and lasts == list(
        range(lasts[0], lasts[0] + 3))
    plain = cluster.inventory(tmp_path / "plain.yaml", HOSTS3)
    doc = yaml.safe_load(plain.read_text())
    doc["defaults"]["nproc_per_node"] = 2
    for h in doc["hosts"]:
        del h["name"]  # a range names its hosts after their addresses; so does a hostfile
    plain.write_text(yaml.safe_dump(doc))
    ranged = dict(doc, hosts=[{"host": f"{prefix}.[{lasts[0]}-{lasts[-1]}]"}])
    (tmp_path / "ranged.yaml").write_text(yaml.safe_dump(ranged))
    (tmp_path / "hosts.txt").write_text("".join(f"{a} slots=2  # node\n" for a in addresses))
    from_file = {k: v for k, v in doc.items() if k != "hosts"}
    from_file["defaults"] = {k: v for k, v in doc["defaults"].items() if k != "nproc_per_node"}
    (tmp_path / "file.yaml").write_text(yaml.safe_dump({**from_file, "hostfile": "hosts.txt"}))
    plans = []
    for inv in ("plain.yaml", "ranged.yaml", "file.yaml"):
        cp = run_cli("launch", "--dry-run", "--master-port", "29511", str(tmp_path / inv),
                     str(payload), "--epochs", "1")
        assert cp.returncode == 0, cp.stderr
        plans.append(_plan(cp.stdout).replace(str(tmp_path / inv), "INV"))
    assert plans[0] == plans[1] == plans[2]
    assert "--node-rank 2" in plans[0] and all(a in plans[0] for a in addresses)
    assert "2 process(es)" in plans[0]  # the hostfile's slots became nproc_per_node


def test_exclude_one_host_launches_on_the_rest(cluster: Cluster, home: Path, tmp_path: Path,
                                               payload: Path, clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3, hosts={"node1": {"master": True}})
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "-x", "node1", "--env", f"TEST_DIR={test_dir}", str(inv),
                 str(payload))
    assert cp.returncode == 0, cp.stderr
    assert "leaves out the master node1; node2 is the master" in cp.stderr
    for rank, host in enumerate(["node2", "node3"]):
        assert f"[{host} r{rank}] report rank {rank} on {host}" in cp.stdout
    assert "[node1 " not in cp.stdout
    assert cluster.run_on("node1", "sh", "-c", f"ls {test_dir} 2>/dev/null | wc -l").strip() == "0"
