"""`environment:` on the namespace cluster: hosts whose base Python (/usr/bin/python3) has no
torch and no route to any package index get the lock's environment built offline by uv, the
wheels crossing the controller's link once; DDP trains on 3 hosts x 2 in it; a warm launch moves
and builds nothing; a package added by hand is named as drift and `env` fixes it."""

from __future__ import annotations

import json
import shutil
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, copy_payload, run_cli
from tests.envtools import host_path, tiny_wheel

pytestmark = pytest.mark.cluster

HOSTS3 = ["node1", "node2", "node3"]
# torch's own requirements, pinned as this test's Python has them (the lock lists every
# distribution); the CPU build lies in pip's configured find-links: never a CUDA download.
TORCH_DEPS = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "mpmath",
              "markupsafe", "setuptools")


def env_json(*args: str) -> tuple[int, dict[str, Any], str]:
    cp = run_cli("env", "--json", *args, timeout=900)
    return cp.returncode, json.loads(cp.stdout or "{}"), cp.stderr


def test_environment_built_once_trained_in_and_kept_identical(
        cluster: Cluster, home: Path, tmp_path: Path, clean: None) -> None:
    tiny_wheel(tmp_path / "wheels")
    pins = [f"{name}=={metadata.version(name)}" for name in TORCH_DEPS]
    (tmp_path / "requirements.lock").write_text(
        "torch==2.13.0+cpu\nnumpy==2.3.4\nclusterrun-tinypkg==0.1\n" + "\n".join(pins) + "\n")
    workdir = f"/tmp/clusterrun-env-{uuid.uuid4().hex[:8]}"
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3, defaults={
        "python": "/usr/bin/python3", "workdir": workdir,
        "environment": {"lock": "requirements.lock", "find_links": ["wheels"]}})
    for name in HOSTS3:  # the base Python has no torch: only the environment can give it
        assert "No module named" in cluster.run_on(
            name, "sh", "-c", "/usr/bin/python3 -c 'import torch' 2>&1 || true")
    try:
        # Cold: every wheel crosses this machine's link once, to the master; the others fetch.
        code, cold, err = env_json(str(inv))
        assert code == 0, err
        hosts = {h["name"]: h for h in cold["hosts"]}
        assert {h["state"] for h in hosts.values()} == {"built"}
        assert cold["sent_bytes"] > 150 * 2**20  # torch's CPU wheel alone is ~190 MB
        assert hosts["node1"]["received_bytes"] == cold["sent_bytes"]
        for name in ("node2", "node3"):
            assert hosts[name]["received_bytes"] == 0
            assert hosts[name]["fetched_bytes"] == cold["sent_bytes"]
        assert len({h["hash"] for h in hosts.values()}) == 1
        lock = hosts["node1"]["lock"]
        env_dir = f"{workdir}/envs/{lock}"
        assert cluster.run_on("node2", "ls", f"{workdir}/envs").split() == [lock]  # no .tmp-

        # The dry run shows each host's environment and the command that runs in it.
        payload = copy_payload(tmp_path, "env_ddp.py")
        dry = run_cli("launch", "--dry-run", str(inv), str(payload), timeout=120)
        assert dry.returncode == 0, dry.stderr
        assert f"{env_dir}/bin/python -m torch.distributed.run" in dry.stdout
        for name in HOSTS3:
            assert f"{name}: {env_dir}  ready" in dry.stdout

        # A launch with the environment ready: nothing moves, nothing builds; DDP trains in it.
        test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
        cp = run_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}",
                     str(inv), str(payload), timeout=300)
        assert cp.returncode == 0, cp.stderr
        assert "sending" not in cp.stderr and "building" not in cp.stderr
        records = {}
        for name in HOSTS3:
            for file in cluster.run_on(name, "ls", test_dir).split():
                records[(name, file)] = json.loads(cluster.read(name, f"{test_dir}/{file}"))
        assert len(records) == 6
        for rec in records.values():
            assert rec["prefix"] == env_dir
            assert rec["torch"].startswith(f"{env_dir}/lib/")
            assert rec["torch_version"] == "2.13.0+cpu" and rec["numpy"] == "2.3.4"
            assert rec["tinypkg"] == "tiny" and rec["same_weights"]
        summary = json.loads(next((home / "runs").iterdir()).joinpath("summary.json")
                             .read_text())
        assert summary["environment"] == lock
        listed = run_cli("ps", "--json", "--local")
        assert [row["environment"] for row in json.loads(listed.stdout)] == [lock]

        # A package added by hand on node2: drift, named, refused by check; `env` fixes it.
        site = cluster.run_on("node2", "sh", "-c", f"echo {env_dir}/lib/python3*/site-packages")
        cluster.run_on("node2", "mkdir", f"{site.strip()}/handmade-1.0.dist-info")
        code, drift, _err = env_json("--check", str(inv))
        assert code == 3
        states = {h["name"]: (h["state"], h["drift"]) for h in drift["hosts"]}
        assert states["node2"] == ("drift", ["handmade==1.0 not in the lock"])
        assert states["node1"][0] == states["node3"][0] == "ready"
        check = run_cli("check", str(inv), timeout=120)
        assert check.returncode == 3 and "node2" in check.stderr and "handmade" in check.stderr
        code, fixed, err = env_json(str(inv))
        assert code == 0, err
        assert {h["name"]: h["state"] for h in fixed["hosts"]} == {
            "node1": "ready", "node2": "built", "node3": "ready"}
        assert fixed["sent_bytes"] == 0  # node2's store still held every wheel
        assert len({h["hash"] for h in fixed["hosts"]}) == 1
    finally:
        for name in HOSTS3:  # three unpacked torches: no time limit, from this machine's side
            shutil.rmtree(host_path(cluster, name, workdir), ignore_errors=True)

