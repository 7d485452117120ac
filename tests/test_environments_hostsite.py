"""`system_site_packages: true` without a cluster: a host whose `python:` is a virtual environment
keeps that environment's own packages in the built one (after the lock's), the host's packages
are reported and a lock pinning one of them at another version is refused (exit 3, host and
package named), and a host without torch in environment mode is told what fixes it there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterrun import inventory
from clusterrun.envs import hostsite, platforms, sync, view
from clusterrun.envs.wheels import UV, Wheel
from clusterrun.errors import PreflightError
from clusterrun.preflight import decide
from clusterrun.preflight.facts import HostFacts
from clusterrun.remote.probe import envstate, sitedirs
from tests.conftest import REPO, host_spec

SHA = "ab" * 32
BASE = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
VERSION = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def holding(site: Path, name: str, version: str, word: str) -> None:
    """A distribution installed in ``site`` as an installer leaves it: its module and dist-info."""
    (site / f"{name}.py").write_text(f"WORD = {word!r}\n")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def venv(place: Path, *flags: str) -> tuple[str, Path]:
    """A virtual environment made from the base interpreter under these tests: its python and
    its site-packages."""
    subprocess.run([BASE, "-m", "venv", "--without-pip", *flags, str(place)], check=True,
                   timeout=120)
    return str(place / "bin" / "python"), place / "lib" / VERSION / "site-packages"


@pytest.fixture(scope="module")
def host_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """A host's `python:` that is a virtual environment: it holds `hostpkg` 2.0 and `shared` 2.0
    in its own site-packages, and `viapth` 1.5 in a folder its own .pth adds (as an editable
    install or a vendor's layout does); its base interpreter has none of them."""
    root = tmp_path_factory.mktemp("hostvenv")
    python, site = venv(root / "venv")
    holding(site, "hostpkg", "2.0", "host")
    holding(site, "shared", "2.0", "host's")
    extra = root / "extra"
    extra.mkdir()
    holding(extra, "viapth", "1.5", "through a .pth")
    (site / "vendor.pth").write_text(f"{extra}\n")
    return python, site, extra


def test_a_venvs_own_site_packages_are_found_and_a_base_interpreter_has_none(
        host_venv: tuple[str, Path, Path]) -> None:
    python, site, _extra = host_venv
    asked = sitedirs.ask(python)
    assert sitedirs.own_site_dirs(asked) == [str(site)]
    # A base interpreter, as a conda environment's is: its prefix is its own, and the built
    # environment's system site directory already.
    assert sitedirs.own_site_dirs(sitedirs.ask(BASE)) == []
    found = sitedirs.distributions(asked["path"])
    assert (found["hostpkg"], found["shared"], found["viapth"]) == ("2.0", "2.0", "1.5")


def test_a_built_environment_sees_the_host_venvs_packages_after_its_own(
        host_venv: tuple[str, Path, Path], tmp_path: Path) -> None:
    """The environment uv builds on a venv's interpreter: a venv of its base with
    --system-site-packages (what `uv venv --system-site-packages --python VENV` makes), holding
    the lock's `shared` 1.0."""
    python, site, extra = host_venv
    env_python, env_site = venv(tmp_path / "env", "--system-site-packages")
    holding(env_site, "shared", "1.0", "the lock's")
    sitedirs.keep_host(str(tmp_path / "env"), sitedirs.own_site_dirs(sitedirs.ask(python)))
    out = subprocess.run([env_python, "-c", "import json, sys, hostpkg, shared, viapth; "
                          "print(json.dumps([hostpkg.WORD, shared.WORD, viapth.WORD, sys.path]))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    host, shared, via, path = json.loads(out)
    assert (host, shared, via) == ("host", "the lock's", "through a .pth")
    assert path.index(str(env_site)) < path.index(str(site)) < path.index(str(extra))
    # Drift sees the environment's own distributions only, not the host's.
    assert envstate.distributions(str(tmp_path / "env")) == ["shared==1.0"]


def _pyenv(python: str, req: dict[str, Any], *flags: str) -> dict[str, Any]:
    """pyenv.py as a host runs it: with -S, as clusterrun runs it."""
    code = "import sys; from clusterrun.remote.tools import pyenv; pyenv.main(sys.stdin.buffer)"
    proc = subprocess.run([python, *flags, "-c", code], input=json.dumps(req).encode() + b"\n",
                          capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          timeout=60, check=False)
    return dict(json.loads(proc.stdout.decode().strip().split(" ", 1)[1]))


def test_status_reports_the_host_pythons_packages_also_from_the_environments_interpreter(
        host_venv: tuple[str, Path, Path], tmp_path: Path) -> None:
    """Under -S a venv's sys.prefix is its base's: the host's interpreter is asked with its
    site module. A status run by another interpreter (the
    environment's own) asks the one the request names."""
    python, _site, _extra = host_venv
    req = {"op": "status", "workdir": str(tmp_path / "w"), "lock": "0123456789abcdef",
           "system_site_packages": True}
    for runner, ask in ((python, None), (BASE, python)):
        found = _pyenv(runner, {**req, "host_python": ask}, "-S")["host_packages"]
        assert (found["hostpkg"], found["viapth"]) == ("2.0", "1.5")
    assert "host_packages" not in _pyenv(python, {**req, "system_site_packages": False}, "-S")
    missing = _pyenv(python, {**req, "host_python": str(tmp_path / "none" / "python")}, "-S")
    assert "asking" in missing["error"] and "none/python" in missing["error"]


# -- the controller: where each package comes from, and clashes refused ----------------------


def test_conflicts_and_what_comes_from_the_host() -> None:
    lock = ["numpy==2.3.4", "tinypkg==0.1", "torch==2.13.0+cpu"]
    host = {"numpy": "2.4.6", "torch": "2.13.0+cpu", "tinypkg": "0.1.0", "sympy": "1.13"}
    assert hostsite.conflicts(lock, host) == [hostsite.Conflict("numpy", "2.3.4", "2.4.6")]
    assert hostsite.from_host(lock, host) == {"sympy": "1.13"}


def _worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            host_packages: list[dict[str, str]]) -> sync.Sync:
    (tmp_path / "site.lock").write_text("tinypkg==0.1\nnumpy==2.3.4\n")
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  python: /opt/venv/bin/python\n  environment: {lock: site.lock, "
                    "system_site_packages: true}\nhosts:\n  - host: 10.0.0.1\n    name: n1\n"
                    "  - host: 10.0.0.2\n    name: n2\n")
    monkeypatch.setattr("clusterrun.envs.wheels.resolve", lambda *_args: [
        Wheel("tinypkg", "0.1", "tinypkg.whl", SHA, 1),
        Wheel("numpy", "2.3.4", "numpy.whl", SHA, 1), Wheel(UV.name, UV.version, "uv.whl", SHA, 1)])
    worker = sync.Sync(inventory.load(path), None, tmp_path)  # type: ignore[arg-type]
    for host, found in zip(worker.hosts, host_packages):
        host.status = {"python": "3.11.2", "machine": "x86_64", "libc": "glibc 2.36",
                       "system": "Linux", "workdir": "/w", "host_packages": found,
                       "env": {"python": "3.11.2", "dists": ["numpy==2.3.4", "tinypkg==0.1"]}}
        host.platform = platforms.from_status(host.spec.name, host.status)
    return worker


def test_a_host_package_the_lock_pins_at_another_version_is_refused_with_exit_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker(tmp_path, monkeypatch, [{"torch": "2.13.0", "sympy": "1.13"},
                                             {"torch": "2.13.0", "numpy": "2.4.6"}])
    worker.resolve()
    ready, clash = worker.hosts
    assert (ready.state, clash.state) == (sync.READY, sync.FAILED)
    report = sync.EnvReport(worker.hosts)
    with pytest.raises(PreflightError) as raised:
        report.raise_if_failed()
    assert raised.value.exit_status == 3
    said = raised.value.message
    assert said.startswith(f"n2: the lock ({tmp_path}/site.lock) pins packages that the host's "
                           "own `python:` (/opt/venv/bin/python) has at other versions")
    for part in ("numpy==2.3.4 in the lock, numpy 2.4.6 on the host", "(numpy==2.4.6)",
                 "leave numpy out of the lock", "`system_site_packages: false`"):
        assert part in said
    assert "n1" not in said
    # Which packages come from where: `env`'s line and its --json.
    assert view.line(ready).endswith("ready (the lock's, nothing moved); 2 package(s) from the "
                                     "lock, 2 from the host's /opt/venv/bin/python (torch 2.13.0 "
                                     "among them)")
    shown = ready.as_json()
    assert shown["lock_packages"] == ["numpy==2.3.4", "tinypkg==0.1"]
    assert shown["host_packages"] == ["sympy==1.13", "torch==2.13.0"]
    assert view.line(clash) == clash.problem
    worker.hosts[0].status.pop("host_packages")  # a status that did not say: unknown, not none
    assert ready.as_json()["host_packages"] is None
    assert view.line(ready).endswith("ready (the lock's, nothing moved)")


def test_without_system_site_packages_nothing_comes_from_the_host(tmp_path: Path) -> None:
    (tmp_path / "site.lock").write_text("tinypkg==0.1\n")
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  environment: site.lock\nhosts:\n  - host: 10.0.0.1\n")
    host = sync.HostEnv(inventory.load(path).hosts[0], state=sync.READY)
    assert host.as_json()["host_packages"] == []
    assert view.line(host).endswith("ready (the lock's, nothing moved)")


# -- preflight's torch check in environment mode ----------------------------------------------


def _no_torch(tmp_path: Path, environment: str) -> str:
    (tmp_path / "site.lock").write_text("tinypkg==0.1\n")
    (tmp_path / "inv.yaml").write_text(f"defaults:\n  environment: {environment}\n"
                                       "hosts:\n  - host: 10.0.0.1\n    name: gpu-a\n")
    spec = inventory.load(tmp_path / "inv.yaml").hosts[0]
    facts = HostFacts.from_json({"python": "3.11.7", "python_path": "/w/envs/abc/bin/python"})
    check = next(c for c in decide.host_checks(spec, facts) if c.name == "torch")
    assert not check.ok
    return check.detail


def test_no_torch_in_environment_mode_says_what_fixes_it_there(tmp_path: Path) -> None:
    plain = _no_torch(tmp_path, "site.lock")
    assert plain.startswith("torch is not installed for /w/envs/abc/bin/python on gpu-a, the "
                            f"environment of the lock {tmp_path}/site.lock: add torch to the lock")
    assert "`system_site_packages: true`" in plain and "pip install" not in plain
    kept = _no_torch(tmp_path, "{lock: site.lock, system_site_packages: true}")
    assert "nor for the host's own `python:`" in kept and "add torch to the lock" in kept
    assert "pip install" not in kept
    spec = host_spec("gpu-b")
    bare = decide.no_torch(spec, HostFacts.from_json({"python_path": "/usr/bin/python3"}))
    assert "install it there (pip install torch)" in bare
