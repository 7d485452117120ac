"""The locks users bring, on the namespace cluster with nothing restated in the inventory: a uv
project locked by the real `uv lock` (torch from a flat index of pyproject.toml's, numpy and a
private package from an index that wants uv's credentials, a wheel from a `--find-links` folder)
trains
DDP on 3 hosts x 2; and `pip freeze` of a virtual environment with packages installed from
wheel files (`name @ file://...` lines) is built as it is. The hosts have no route to any
index: the controller takes every wheel from where the lock says and ships it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, copy_payload, run_cli
from tests.envtools import host_path, tiny_wheel
from tests.wheelsources import UV, Index, wheel_of

pytestmark = pytest.mark.cluster

HOSTS3 = ["node1", "node2", "node3"]
TORCH_DEPS = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "mpmath",
              "markupsafe", "setuptools")
NUMPY = "2.3.4"
USER, PASSWORD = "trainer", "s3cret-word"


def download(folder: Path, *pins: str) -> list[Path]:
    """Wheels for this machine, from pip's configured sources (the CPU torch among them)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "-d", str(folder), *pins], check=True, timeout=600)
    return sorted(folder.glob("*.whl"))


@pytest.fixture
def workdir(cluster: Cluster) -> Iterator[str]:
    path = f"/tmp/clusterrun-env-{uuid.uuid4().hex[:8]}"
    yield path
    for name in HOSTS3:  # unpacked torches: no time limit, from this machine's side
        shutil.rmtree(host_path(cluster, name, path), ignore_errors=True)


def records(cluster: Cluster, test_dir: str) -> list[dict[str, Any]]:
    return [json.loads(cluster.read(name, f"{test_dir}/{file}")) for name in HOSTS3
            for file in cluster.run_on(name, "ls", test_dir).split()]


@pytest.mark.usefixtures("clean")
def test_a_uv_project_trains_from_its_own_sources_with_nothing_restated(
        cluster: Cluster, home: Path, tmp_path: Path, workdir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    download(tmp_path / "flat", "torch==2.13.0+cpu",
             *(f"{name}=={metadata.version(name)}" for name in TORCH_DEPS))
    tiny_wheel(tmp_path / "links")
    index = Index({}, USER, PASSWORD)
    try:
        index.add_project(*download(tmp_path / "numpy", f"numpy=={NUMPY}"))
        index.add_project(wheel_of(tmp_path / "corp", "corp-utils", "corputils"))
        project = tmp_path / "proj"
        project.mkdir()
        python = f"{sys.version_info[0]}.{sys.version_info[1]}"
        (project / "pyproject.toml").write_text(
            f'[project]\nname = "trainer"\nversion = "0.1.0"\nrequires-python = "=={python}.*"\n'
            f'dependencies = ["torch==2.13.0+cpu", "numpy=={NUMPY}", "clusterrun-tinypkg", '
            '"corp-utils"]\n\n'
            "[tool.uv]\nenvironments = [\"sys_platform == 'linux' and platform_machine == "
            "'x86_64'\"]\n\n"
            '[[tool.uv.index]]\nname = "torch-wheels"\nurl = "../flat"\nformat = "flat"\n\n'
            f'[[tool.uv.index]]\nname = "private"\nurl = "{index.url}/simple"\ndefault = true\n')
        monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
        with_credentials = {"UV_INDEX_PRIVATE_USERNAME": USER,
                            "UV_INDEX_PRIVATE_PASSWORD": PASSWORD}
        assert UV, "uv is not installed beside this Python (pip install -e '.[test]')"
        locked = subprocess.run(
            [UV, "lock", "--find-links", str(tmp_path / "links"), "--cache-dir",
             str(tmp_path / "uv-cache")], cwd=project, capture_output=True, text=True,
            timeout=600, check=False, env={**with_credentials, "PATH": "/usr/bin:/bin",
                                           "HOME": str(tmp_path), "NETRC": str(tmp_path / "x")})
        assert locked.returncode == 0, locked.stderr
        lock = (project / "uv.lock").read_text()
        assert f'registry = "{index.url}/simple"' in lock and 'registry = "../flat"' in lock

        inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3, defaults={
            "python": "/usr/bin/python3", "workdir": workdir, "environment": "proj"})
        # Without the index's credentials: refused before any host builds, with the way to
        # give them.
        refused = run_cli("env", str(inv), timeout=600)
        assert refused.returncode == 3, refused.stderr
        for words in ("HTTP 401", "UV_INDEX_PRIVATE_USERNAME", "corp-utils==0.1"):
            assert words in refused.stderr, refused.stderr

        payload = copy_payload(tmp_path, "env_ddp.py")
        test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
        cp = run_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}",
                     str(inv), str(payload), timeout=900, env=with_credentials)
        assert cp.returncode == 0, cp.stderr
        assert any(path.endswith(".whl") and auth for path, auth in index.seen)
    finally:
        index.close()
    ranks = records(cluster, test_dir)
    assert len(ranks) == 6
    for rank in ranks:
        assert rank["prefix"].startswith(f"{workdir}/envs/")
        assert rank["torch"].startswith(f"{rank['prefix']}/lib/")
        assert (rank["torch_version"], rank["numpy"], rank["tinypkg"]) == (
            "2.13.0+cpu", NUMPY, "tiny")
        assert rank["same_weights"]
    # The credentials went to the index alone: no file of the run, the controller's cache or
    # a host's workdir holds them.
    for root in [home, *(host_path(cluster, name, workdir) for name in HOSTS3)]:
        leaked = subprocess.run(["grep", "-rl", "--binary-files=text", PASSWORD, str(root)],
                                capture_output=True, text=True, check=False)
        assert leaked.stdout == "", leaked.stdout


def test_pip_freeze_of_a_venv_with_wheels_installed_from_files_is_built_as_it_is(
        cluster: Cluster, home: Path, tmp_path: Path, workdir: str, clean: None) -> None:
    tiny = tiny_wheel(tmp_path / "tiny")
    numpy = download(tmp_path / "numpy", f"numpy=={NUMPY}")[0]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    subprocess.run([*pip, "install", "--quiet", "--no-index", "--no-deps", str(tiny), str(numpy)],
                   check=True, timeout=300)
    frozen = subprocess.run([*pip, "freeze"], capture_output=True, text=True, check=True,
                            timeout=120).stdout
    assert f"clusterrun-tinypkg @ file://{tiny}" in frozen and f"numpy @ file://{numpy}" in frozen
    (tmp_path / "requirements.lock").write_text(frozen)
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3[:2], defaults={
        "python": "/usr/bin/python3", "workdir": workdir, "environment": "requirements.lock"})
    cp = run_cli("env", "--json", str(inv), timeout=600)
    assert cp.returncode == 0, cp.stderr
    built = json.loads(cp.stdout)
    assert {h["state"] for h in built["hosts"]} == {"built"}
    env = built["hosts"][1]["path"]
    found = json.loads(cluster.run_on(
        HOSTS3[1], f"{env}/bin/python", "-c", "import json, numpy, tinypkg; print(json.dumps("
        "{'numpy': numpy.__version__, 'where': numpy.__file__, 'tiny': tinypkg.WORD}))"))
    assert (found["numpy"], found["tiny"]) == (NUMPY, "tiny")
    assert found["where"].startswith(f"{env}/lib/")
