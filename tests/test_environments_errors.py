"""`environment:`'s errors a user can act on, each from the real code path: pip asked for a
wheel that is nowhere (the package, the hosts' Python and platform, the hosts, find_links), uv
with no wheel for the hosts' CPU, a wheel whose sha256 is not the lock's, a host whose Python the
uv project does not allow; and where the master serves the wheels (its data interface)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from clusterrun import inventory
from clusterrun.envs import platforms, serve, sync, wheels
from clusterrun.envs.platforms import Platform
from clusterrun.errors import PreflightError
from clusterrun.inventory.pylock import Pin, PythonEnv
from clusterrun.remote.tools import pyenv
from tests.conftest import run_main
from tests.wheelsources import only_the_inventorys_sources, wheel

__all__ = ["only_the_inventorys_sources"]  # autouse: pip sees none of this machine's sources

X86 = Platform("3.11", "x86_64", (2, 36))
NOWHERE = "file:///nonexistent"  # an index that is not there: pip asks nothing of the network


def gather(tmp_path: Path, pin: Pin, platform: Platform = X86, *,
           with_uv: bool = True) -> list[wheels.Wheel]:
    """``wheels.resolve`` as a sync calls it, for hosts a and b, from ``tmp_path/links`` and
    an index that is not there; uv already in the controller's cache unless ``with_uv`` is
    False (then pip is asked for it too)."""
    (tmp_path / "links").mkdir(exist_ok=True)
    env = PythonEnv(str(tmp_path / "req.lock"), (pin,), find_links=(str(tmp_path / "links"),),
                    index_url=NOWHERE)
    cache = wheels.Cache(tmp_path / "cache")
    if with_uv:
        uv = wheel(tmp_path / "uv", f"uv-{wheels.UV.version}-py3-none-manylinux_2_17_"
                   f"{platform.machine}.whl")
        cache.add(uv, wheels.UV, platform, env)
    return wheels.resolve(cache, env, platform, ["a", "b"])


def test_a_pin_with_no_wheel_anywhere_names_the_package_platform_hosts_and_find_links(
        tmp_path: Path) -> None:
    with pytest.raises(PreflightError) as found:
        gather(tmp_path, Pin("clusterrun-nosuchpkg", "0.1", 3))
    message = found.value.message
    assert message.startswith("no wheel of clusterrun-nosuchpkg==0.1 (")
    assert f"req.lock, line 3) for Python 3.11 on {X86.label}, the platform of a, b" in message
    assert "find_links: [DIR]" in message and "\n" not in message


def test_a_wheel_for_another_python_is_named_with_the_hosts_python(tmp_path: Path) -> None:
    """A cp312 wheel for 3.11 hosts: no wheel for them, and the message says their Python and
    which file find_links holds instead."""
    wheel(tmp_path / "links", "compiled-1.0-cp312-cp312-manylinux_2_17_x86_64.whl")
    with pytest.raises(PreflightError) as found:
        gather(tmp_path, Pin("compiled", "1.0", 1))
    message = found.value.message
    assert "no wheel of compiled==1.0" in message and "for Python 3.11 on cp311" in message
    assert "find_links holds only compiled-1.0-cp312-cp312-manylinux_2_17_x86_64.whl" in message


def test_a_wheel_whose_requires_python_excludes_the_hosts_says_both_pythons(
        tmp_path: Path) -> None:
    wheel(tmp_path / "links", "newpy-1.0-py3-none-any.whl", requires_python=">=3.12")
    with pytest.raises(PreflightError) as found:
        gather(tmp_path, Pin("newpy", "1.0", 2))
    message = found.value.message
    assert "newpy==1.0 (" in message and "line 2) needs Python >=3.12" in message
    assert "a, b run Python 3.11" in message and "`python:`" in message


def test_uv_with_no_wheel_for_the_hosts_cpu_has_its_own_message(tmp_path: Path) -> None:
    arm = Platform("3.11", "aarch64", (2, 31))
    wheel(tmp_path / "links", "tinypkg-0.1-py3-none-any.whl")
    with pytest.raises(PreflightError) as found:
        gather(tmp_path, Pin("tinypkg", "0.1", 1), arm, with_uv=False)
    message = found.value.message
    assert message.startswith(f"no wheel of uv=={wheels.UV.version} for aarch64 (")
    assert "the platform of a, b" in message
    assert "uv is what clusterrun builds each host's environment with" in message
    assert f"uv-{wheels.UV.version}-py3-none-manylinux_..._aarch64.whl" in message
    assert f"find_links: [DIR]}}` (now {tmp_path / 'links'})" in message


def test_a_wheel_whose_sha256_is_not_the_locks_is_refused(tmp_path: Path) -> None:
    wheel(tmp_path / "links", "tinypkg-0.1-py3-none-any.whl")
    with pytest.raises(PreflightError) as found:
        gather(tmp_path, Pin("tinypkg", "0.1", 4, ("ab" * 32,)))
    message = found.value.message
    assert message.startswith("tinypkg-0.1-py3-none-any.whl's sha256 (")
    assert "req.lock, line 4) allows for tinypkg==0.1" in message
    assert "--hash is wrong" in message and "no host was sent it" in message
    assert not list((tmp_path / "cache").glob("*/tinypkg-*"))  # not kept as if it were good


def _uv_project(tmp_path: Path, requires: str) -> Path:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pyproject.toml").write_text("[project]\nname = 'trainer'\n")
    (tmp_path / "proj" / "uv.lock").write_text(f"""version = 1
requires-python = "{requires}"

[[package]]
name = "tinypkg"
version = "0.1"
source = {{ registry = "https://pypi.org/simple" }}
wheels = [{{ url = "http://127.0.0.1:9/tinypkg.whl", hash = "sha256:{'ab' * 32}" }}]

[[package]]
name = "trainer"
version = "0.1.0"
source = {{ editable = "." }}
dependencies = [{{ name = "tinypkg" }}]
""")
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults:\n  environment: proj\nhosts:\n  - host: localhost\n    name: n0\n")
    return inv


def test_a_host_whose_python_the_uv_project_does_not_allow_is_refused(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """This machine's Python against a requires-python that excludes it: `env` asks the host
    its Python and stops with exit 3 before any wheel is gathered."""
    import platform

    mine = platform.python_version()
    inv = _uv_project(tmp_path, "<3.9")
    env = inventory.load(inv).hosts[0].environment
    assert env is not None and env.requires_python == "<3.9"
    code, out, err = run_main(capsys, "env", str(inv))
    assert code == 3 and out == "", err  # the host's paragraph is on stderr
    assert err.startswith(f"n0: its Python is {mine} (")
    assert f"and the lock ({tmp_path / 'proj' / 'uv.lock'}) allows only Python <3.9" in err
    assert "`uv lock` again" in err and "Traceback" not in err
    assert not (home / "wheels" / "resolved").exists()  # pip was never asked


def test_the_python_check_lets_an_allowed_python_through() -> None:
    env = PythonEnv("/l/uv.lock", (), requires_python=">=3.10,<3.13")
    status = {"python": "3.12.1", "python_path": "/usr/bin/python3"}
    assert platforms.python_refused("a", status, env) is None
    assert "its Python is 3.13.0 (/usr/bin/python3)" in str(
        platforms.python_refused("a", {**status, "python": "3.13.0"}, env))
    assert platforms.python_refused("a", status, dataclasses.replace(env,
                                                                     requires_python=None)) is None


def _worker(tmp_path: Path, top: str = "", master: str = "") -> sync.Sync:
    (tmp_path / "req.lock").write_text("numpy==2.3.4\n")
    path = tmp_path / "inv.yaml"
    path.write_text(f"{top}defaults:\n  environment: req.lock\nhosts:\n"
                    f"  - host: 10.0.0.1\n    name: m\n{master}  - host: 10.0.0.2\n    name: w\n")
    return sync.Sync(inventory.load(path), None, tmp_path)  # type: ignore[arg-type]


def test_the_master_serves_wheels_on_its_data_interface(tmp_path: Path) -> None:
    """The relay's status is asked its `interface:`'s address, and the wheels are served
    there; without one, on the address SSH reached it on; master_addr wins over both."""
    worker = _worker(tmp_path, master="    interface: ib0\n")
    asked: list[dict[str, Any]] = []

    def call(host: sync.HostEnv, request: dict[str, Any], *_: Any, **__: Any) -> dict[str, Any]:
        asked.append(dict(request, host=host.spec.name))
        return {"missing": [], "interface_address": "10.9.0.1" if "interface" in request
                else None}

    worker._call = call  # type: ignore[method-assign]
    relay, other = worker.hosts
    relay.status = {"ssh_server_address": "10.0.0.1"}
    assert worker._ship([relay, other]) == 0  # nothing missing: nothing sent
    assert [(r["host"], r.get("interface")) for r in asked] == [("m", "ib0"), ("w", None)]
    assert serve.address(worker.inv, relay.spec, relay.status) == "10.9.0.1"

    plain = _worker(tmp_path)
    plain.hosts[0].status = {"ssh_server_address": "10.0.0.1"}
    assert serve.address(plain.inv, plain.hosts[0].spec, plain.hosts[0].status) == "10.0.0.1"
    fixed = _worker(tmp_path, top="master_addr: 10.5.0.1\n", master="    interface: ib0\n")
    fixed.hosts[0].status = {"interface_address": "10.9.0.1"}
    assert serve.address(fixed.inv, fixed.hosts[0].spec, fixed.hosts[0].status) == "10.5.0.1"


def test_a_hosts_status_gives_its_interfaces_address(tmp_path: Path) -> None:
    found = pyenv.status({"workdir": str(tmp_path), "lock": "x", "interface": "lo"})
    assert found["interface_address"] == "127.0.0.1"
    assert pyenv.status({"workdir": str(tmp_path), "lock": "x",
                         "interface": "nosuchif0"})["interface_address"] is None
    assert pyenv.status({"workdir": str(tmp_path), "lock": "x"})["interface_address"] is None
