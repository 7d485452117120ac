"""A uv project (pyproject.toml + uv.lock) as `environment:`: uv.lock read on the controller into
the hosts' lock, walked from the project for every Linux host it allows, its wheels' sha256s and
places kept, a package only some hosts need marked for them; what clusterrun cannot ship (a git
or directory source) is refused with uv.lock's line (exit 2, before any SSH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError
from tests.conftest import run_main

SHA = {name: f"{i:x}" * 64 for i, name in enumerate(("numpy", "torch", "filelock", "rich"), 1)}

# As `uv lock` writes it: the project (editable), its dependencies with markers on the edges, a
# Windows-only dependency, a dev group, an extra, and a package nothing on Linux needs.
UV_LOCK = f"""version = 1
revision = 3
requires-python = ">=3.11"

[[package]]
name = "colorama"
version = "0.4.6"
source = {{ registry = "https://pypi.org/simple" }}
wheels = [
    {{ url = "https://x/colorama-0.4.6-py2.py3-none-any.whl", hash = "sha256:{'c' * 64}" }},
]

[[package]]
name = "FileLock"
version = "3.20.0"
source = {{ registry = "https://pypi.org/simple" }}
wheels = [
    {{ url = "https://x/filelock-3.20.0-py3-none-any.whl", hash = "sha256:{SHA['filelock']}" }},
]

[[package]]
name = "numpy"
version = "2.3.4"
source = {{ registry = "https://pypi.org/simple" }}
wheels = [
    {{ url = "https://x/numpy-linux.whl", hash = "sha256:{SHA['numpy']}" }},
    {{ url = "https://x/numpy-2.3.4-cp311-cp311-win_amd64.whl", hash = "sha256:{'e' * 64}" }},
]

[[package]]
name = "pytest"
version = "9.0.0"
source = {{ registry = "https://pypi.org/simple" }}

[[package]]
name = "rich"
version = "14.0.0"
source = {{ registry = "https://pypi.org/simple" }}
wheels = [
    {{ url = "https://x/rich-14.0.0-py3-none-any.whl", hash = "sha256:{SHA['rich']}" }},
]

[[package]]
name = "torch"
version = "2.13.0+cpu"
source = {{ registry = "https://download.pytorch.org/whl/cpu" }}
dependencies = [
    {{ name = "filelock" }},
    {{ name = "numpy", marker = "sys_platform == 'linux'" }},
]
wheels = [
    {{ url = "https://x/torch-linux.whl", hash = "sha256:{SHA['torch']}" }},
]

[package.optional-dependencies]
pretty = [
    {{ name = "rich" }},
]

[[package]]
name = "trainer"
version = "0.1.0"
source = {{ editable = "." }}
dependencies = [
    {{ name = "colorama", marker = "sys_platform == 'win32'" }},
    {{ name = "torch", extra = ["pretty"] }},
]

[package.dev-dependencies]
dev = [
    {{ name = "pytest" }},
]
"""


def project(tmp_path: Path, lock: str = UV_LOCK, named: str = "proj") -> Path:
    folder = tmp_path / "proj"
    folder.mkdir(exist_ok=True)
    (folder / "pyproject.toml").write_text('[project]\nname = "trainer"\nversion = "0.1.0"\n')
    (folder / "uv.lock").write_text(lock)
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  environment: {named}\nhosts:\n  - host: 10.0.0.1\n")
    return path


@pytest.mark.parametrize("named", ["proj", "proj/pyproject.toml", "proj/uv.lock"])
def test_a_uv_project_is_the_lock_of_its_linux_dependencies(tmp_path: Path, named: str) -> None:
    env = inventory.load(project(tmp_path, named=named)).hosts[0].environment
    assert env is not None
    assert env.lock == str((tmp_path / "proj" / "uv.lock").resolve())
    # Not colorama (Windows only), pytest (the dev group), nor the project itself; torch's
    # extra brings rich.
    assert [(p.name, p.version) for p in env.pins] == [
        ("filelock", "3.20.0"), ("numpy", "2.3.4"), ("rich", "14.0.0"), ("torch", "2.13.0+cpu")]
    numpy = next(p for p in env.pins if p.name == "numpy")
    assert numpy.hashes == tuple(sorted((SHA["numpy"], "e" * 64)))
    assert numpy.line == UV_LOCK.splitlines().index('name = "numpy"') + 1
    torch = next(p for p in env.pins if p.name == "torch")
    assert [(f.location, f.sha, f.index_url) for f in torch.files] == [
        ("https://x/torch-linux.whl", SHA["torch"], "https://download.pytorch.org/whl/cpu")]
    assert all(p.marker is None for p in env.pins)  # every Linux host needs each of them


def test_the_same_pins_as_a_requirements_file_are_the_same_environment(tmp_path: Path) -> None:
    uv = inventory.load(project(tmp_path)).hosts[0].environment
    assert uv is not None
    (tmp_path / "req.lock").write_text("".join(
        f"{p.requirement}" + "".join(f" --hash=sha256:{h}" for h in p.hashes) + "\n"
        for p in uv.pins))
    (tmp_path / "inv2.yaml").write_text("defaults:\n  environment: req.lock\nhosts:\n"
                                        "  - host: 10.0.0.1\n")
    plain = inventory.load(tmp_path / "inv2.yaml").hosts[0].environment
    assert plain is not None and plain.digest == uv.digest


@pytest.mark.parametrize(("change", "marker"), [
    (('{ name = "numpy", marker = "sys_platform == \'linux\'" }',
      '{ name = "numpy", marker = "python_full_version < \'3.12\'" }'),
     "python_version == '3.11'"),
    (('{ name = "filelock" }', '{ name = "filelock", marker = "platform_machine == \'aarch64\'" }'),
     "platform_machine == 'aarch64'"),
    (('{ name = "filelock" }',
      '{ name = "filelock", marker = "platform_machine == \'aarch64\' and python_version >= '
      '\'3.14\'" }'),
     "(platform_machine == 'aarch64' and (python_version == '3.14' or "
     "python_version == '3.15'))"),
])
def test_a_package_only_some_hosts_need_is_marked_for_them(
        tmp_path: Path, change: tuple[str, str], marker: str) -> None:
    lock = UV_LOCK.replace(*change)
    assert lock != UV_LOCK
    env = inventory.load(project(tmp_path, lock)).hosts[0].environment
    assert env is not None
    marked = {p.name: p.marker for p in env.pins if p.marker}
    assert len(marked) == 1 and next(iter(marked.values())) == marker
    from packaging.markers import Marker
    for python in ("3.11", "3.12", "3.14"):
        for machine in ("x86_64", "aarch64"):
            host = {"python_version": python, "platform_machine": machine,
                    "python_full_version": f"{python}.0", "sys_platform": "linux"}
            assert Marker(marker).evaluate(host) == Marker(change[1].split('marker = "')[1]
                                                           .rstrip('" }')).evaluate(host)


@pytest.mark.parametrize(("change", "words"), [
    (('source = { registry = "https://pypi.org/simple" }\nwheels = [\n    { url = "https://x/rich',
      'source = { git = "https://github.com/x/rich" }\nwheels = [\n    { url = "https://x/rich'),
     ("rich comes from git (https://github.com/x/rich)", "pip wheel --no-deps git+URL",
      "[tool.uv.sources]")),
    (('source = { registry = "https://pypi.org/simple" }\nwheels = [\n    { url = "https://x/rich',
      'source = { directory = "../rich" }\nwheels = [\n    { url = "https://x/rich'),
     ("rich comes from a directory source (../rich), not a wheel", "uv build --wheel")),
])
def test_what_clusterrun_cannot_ship_is_refused_with_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str],
        words: tuple[str, ...]) -> None:
    lock = UV_LOCK.replace(*change)
    assert lock != UV_LOCK
    code, _out, err = run_main(capsys, "hosts", str(project(tmp_path, lock)))
    assert code == 2, err
    assert f"{(tmp_path / 'proj' / 'uv.lock').resolve()}:" in err
    for word in words:
        assert word in err
    assert "Traceback" not in err


def test_two_versions_of_one_package_for_different_pythons_are_each_marked(
        tmp_path: Path) -> None:
    lock = UV_LOCK.replace('{ name = "filelock" }',
                           '{ name = "filelock", version = "3.20.0", marker = '
                           '"python_full_version < \'3.13\'" },\n    { name = "filelock", '
                           'version = "3.21.0", marker = "python_full_version >= \'3.13\'" }')
    lock += ('\n[[package]]\nname = "filelock"\nversion = "3.21.0"\n'
             'source = { registry = "https://pypi.org/simple" }\n')
    env = inventory.load(project(tmp_path, lock)).hosts[0].environment
    assert env is not None
    assert [(p.version, p.marker) for p in env.pins if p.name == "filelock"] == [
        ("3.20.0", "python_version == '3.11' or python_version == '3.12'"),
        ("3.21.0", "python_version == '3.13' or python_version == '3.14' or "
                   "python_version == '3.15'")]
    # An edge that does not say which of two versions it means is refused.
    lock = UV_LOCK.replace('{ name = "filelock" }', '{ name = "filelock", version = "3.20.0" }')
    lock += ('\n[[package]]\nname = "filelock"\nversion = "3.21.0"\n'
             'source = { registry = "https://pypi.org/simple" }\n')
    inventory.load(project(tmp_path, lock))  # the edge names its version: fine
    with pytest.raises(InventoryError, match="filelock is locked at 2 versions"):
        inventory.load(project(tmp_path, lock.replace(', version = "3.20.0"', "")))
    (tmp_path / "proj" / "uv.lock").unlink()
    with pytest.raises(InventoryError, match=r"needs its uv\.lock"):
        inventory.load(tmp_path / "inv.yaml")
