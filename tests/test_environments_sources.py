"""Where a lock says its wheels are, used as it says: `name @ URL` lines as pip freeze writes them,
uv.lock's path and url wheels (the real `uv lock`'s), the best wheel for each host's platform,
an index's credentials as uv and pip users give them (sent only to that index, never written),
and environment markers evaluated for each host's platform. pip sees no source but the test's."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun import inventory
from clusterrun.envs import locked, platforms, sync, wheels
from clusterrun.envs.platforms import Platform
from clusterrun.errors import InventoryError, PreflightError
from clusterrun.inventory.pylock import LockedWheel, Pin, PythonEnv
from tests.envtools import tiny_wheel
from tests.wheelsources import UV, Index, only_the_inventorys_sources, wheel, wheel_of

__all__ = ["only_the_inventorys_sources"]  # autouse: pip sees none of this machine's sources

X86 = Platform("3.11", "x86_64", (2, 36), "3.11.7")
ARM = Platform("3.12", "aarch64", (2, 31), "3.12.3")


def inv(tmp_path: Path, lock: str, environment: str = "environment: req.lock") -> Path:
    (tmp_path / "req.lock").write_text(lock)
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  {environment}\nhosts:\n  - host: 10.0.0.1\n")
    return path


def env_of(path: Path) -> PythonEnv:
    env = inventory.load(path).hosts[0].environment
    assert env is not None
    return env


def cache_with_uv(tmp_path: Path, env: PythonEnv, platform: Platform = X86) -> wheels.Cache:
    """The controller's cache, holding uv already: pip is asked for nothing else."""
    cache = wheels.Cache(tmp_path / "cache")
    uv = wheel(tmp_path / "uv", f"uv-{wheels.UV.version}-py3-none-manylinux_2_17_"
               f"{platform.machine}.whl")
    cache.add(uv, wheels.UV, platform, env)
    return cache


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return tiny_wheel(tmp_path / "built")


@pytest.fixture
def index(tiny: Path) -> Iterator[Index]:
    served = Index({f"/files/{tiny.name}": tiny.read_bytes()})
    yield served
    served.close()


def test_pip_freeze_direct_references_are_pins_with_their_wheels(tmp_path: Path,
                                                                 tiny: Path) -> None:
    sha = wheels.sha256_of(tiny)
    env = env_of(inv(tmp_path, (
        f"clusterrun-tinypkg @ file://{tiny}\n"
        f"other[extra] @ https://127.0.0.1:9/w/other-2.0-py3-none-any.whl --hash=sha256:{sha}\n"
        f"third @ https://127.0.0.1:9/third-1.1-py3-none-any.whl#sha256={sha} ; "
        "python_version >= '3.8'\n")))
    tiny_pin, other, third = env.pins
    assert (tiny_pin.name, tiny_pin.version, tiny_pin.hashes) == ("clusterrun-tinypkg", "0.1", ())
    assert tiny_pin.files[0].location == str(tiny) and tiny_pin.files[0].stamp  # no hash: stat
    assert (other.version, other.hashes, other.files[0].location) == (
        "2.0", (sha,), "https://127.0.0.1:9/w/other-2.0-py3-none-any.whl")
    assert (third.version, third.hashes, third.marker) == ("1.1", (sha,), "python_version >= '3.8'")
    assert third.files[0].location == "https://127.0.0.1:9/third-1.1-py3-none-any.whl"


@pytest.mark.parametrize(("line", "words"), [
    ("tiny @ file:///nowhere/tiny-1.0-py3-none-any.whl", ("No such file", "put it back")),
    ("tiny @ https://127.0.0.1:9/other-1.0-py3-none-any.whl", ("is not a wheel of tiny",)),
    ("tiny @ https://127.0.0.1:9/tiny-1.0.tar.gz", ("is not a wheel (a https source)",)),
])
def test_a_direct_reference_that_cannot_be_shipped_is_refused_with_its_line(
        tmp_path: Path, line: str, words: tuple[str, ...]) -> None:
    with pytest.raises(InventoryError, match=r"req\.lock:1: ") as found:
        env_of(inv(tmp_path, line + "\n"))
    for word in words:
        assert word in found.value.message


def test_a_file_reference_is_taken_from_its_file_and_its_hash_checked(tmp_path: Path,
                                                                       tiny: Path) -> None:
    env = env_of(inv(tmp_path, f"clusterrun-tinypkg @ file://{tiny}\n"))
    got = wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a"])
    assert [(w.name, w.sha) for w in got] == [("clusterrun-tinypkg", wheels.sha256_of(tiny)),
                                              ("uv", got[1].sha)]
    bad = env_of(inv(tmp_path, f"clusterrun-tinypkg @ file://{tiny} --hash=sha256:{'0' * 64}\n"))
    with pytest.raises(PreflightError, match=r"is not one the lock .* allows"):
        wheels.resolve(cache_with_uv(tmp_path, bad), bad, X86, ["a"])


def url_pin(index: Index, tiny: Path, **more: Any) -> Pin:
    wheel_ = LockedWheel(tiny.name, f"{index.url}/files/{tiny.name}", wheels.sha256_of(tiny),
                         **more)
    return Pin("clusterrun-tinypkg", "0.1", 7, (wheel_.sha or "",), files=(wheel_,))


def test_a_private_index_gets_uvs_credentials_and_no_one_else_does(
        tmp_path: Path, tiny: Path, index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    pin = url_pin(index, tiny, index_url=f"{index.url}/simple", index_name="corp-wheels")
    env = PythonEnv(str(tmp_path / "uv.lock"), (pin,))
    with pytest.raises(PreflightError) as found:
        wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a", "b"])
    message = found.value.message
    for word in ("HTTP 401", "no credentials were found", "UV_INDEX_CORP_WHEELS_USERNAME",
                 "machine 127.0.0.1", "uv.lock, line 7", "found no wheel of it either"):
        assert word in message, message

    monkeypatch.setenv("UV_INDEX_CORP_WHEELS_USERNAME", "alice")
    monkeypatch.setenv("UV_INDEX_CORP_WHEELS_PASSWORD", "s3cret-word")
    got = wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a", "b"])
    assert got[0].sha == wheels.sha256_of(tiny)
    assert index.seen[-1] == (f"/files/{tiny.name}", f"Basic {index.token}")
    written = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()
               and b"s3cret" in p.read_bytes()]
    assert written == []

    # The same variables are not sent to a wheel the index links to on another host.
    other = url_pin(index, tiny, index_url="http://127.0.0.2:1/simple", index_name="corp-wheels")
    env = PythonEnv(str(tmp_path / "uv.lock"), (other,))
    with pytest.raises(PreflightError, match="HTTP 401"):
        wheels.resolve(wheels.Cache(tmp_path / "cache2"), env, X86, ["a"])
    assert index.seen[-1][1] == ""


def test_a_redirect_to_another_host_does_not_carry_the_credentials(
        tmp_path: Path, tiny: Path, index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index that sends its downloads to object storage: the storage gets no password (and
    would refuse a second authorization); a redirect within the index keeps it."""
    storage = Index({f"/bucket/{tiny.name}": tiny.read_bytes()}, host="127.0.0.2",
                    open_to_all=True)
    try:
        index.redirects[f"/files/{tiny.name}"] = f"/moved/{tiny.name}"
        index.redirects[f"/moved/{tiny.name}"] = f"{storage.url}/bucket/{tiny.name}"
        monkeypatch.setenv("UV_INDEX_CORP_USERNAME", "alice")
        monkeypatch.setenv("UV_INDEX_CORP_PASSWORD", "s3cret-word")
        env = PythonEnv(str(tmp_path / "uv.lock"), (url_pin(
            index, tiny, index_url=f"{index.url}/simple", index_name="corp"),))
        got = wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a"])
        assert got[0].sha == wheels.sha256_of(tiny)
        assert index.seen == [(f"/files/{tiny.name}", f"Basic {index.token}"),
                              (f"/moved/{tiny.name}", f"Basic {index.token}")]
        assert storage.seen == [(f"/bucket/{tiny.name}", "")]
    finally:
        storage.close()


def test_netrc_gives_a_url_its_credentials(tmp_path: Path, tiny: Path, index: Index,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login alice password s3cret-word\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    env = PythonEnv(str(tmp_path / "req.lock"), (url_pin(index, tiny),))
    got = wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a"])
    assert got[0].filename == tiny.name
    assert index.seen == [(f"/files/{tiny.name}", f"Basic {index.token}")]


def test_a_wheel_of_that_name_in_find_links_is_taken_before_the_network(
        tmp_path: Path, tiny: Path, index: Index) -> None:
    links = tmp_path / "mirror"
    links.mkdir()
    shutil.copy(tiny, links / tiny.name)
    env = PythonEnv(str(tmp_path / "req.lock"), (url_pin(index, tiny),),
                    find_links=(str(links),))
    got = wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a"])
    assert got[0].sha == wheels.sha256_of(tiny)
    assert index.seen == []


def test_each_platform_gets_the_locks_best_wheel_for_it(tmp_path: Path) -> None:
    names = ["pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
             "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
             "pkg-1.0-cp312-cp312-manylinux_2_28_aarch64.whl",
             "pkg-1.0-cp311-cp311-win_amd64.whl", "pkg-1.0-py3-none-any.whl"]
    pin = Pin("pkg", "1.0", 1, files=tuple(LockedWheel(n, f"/w/{n}") for n in names))
    assert locked.choose(pin, X86) == pin.files[1]  # the newest manylinux it runs
    assert locked.choose(pin, ARM) == pin.files[2]
    old = Platform("3.11", "x86_64", (2, 17))
    assert locked.choose(pin, old) == pin.files[0]
    assert locked.choose(pin, Platform("3.10", "x86_64", (2, 36))) == pin.files[4]
    binary = Pin("pkg", "1.0", 1, files=pin.files[:4])
    assert locked.choose(binary, Platform("3.13", "ppc64le", (2, 36))) is None


def test_markers_are_evaluated_for_each_hosts_platform(tmp_path: Path) -> None:
    env = env_of(inv(tmp_path, (
        'numpy==1.26.4 ; python_version < "3.12"\n'
        'numpy==2.3.4 ; python_version >= "3.12"\n'
        "nvidia-nccl-cu12==2.27.3 ; platform_machine == 'x86_64'\n"
        "tomli==2.2.1 ; python_full_version < '3.11.4'\n"
        'pywin32==311 ; sys_platform == "win32"\n')))
    def names(platform: Platform) -> list[str]:
        return [p.requirement for p in wheels.for_platform(env, platform)]

    assert names(X86) == ["numpy==1.26.4", "nvidia-nccl-cu12==2.27.3", "uv==0.13.9"]
    assert names(ARM) == ["numpy==2.3.4", "uv==0.13.9"]
    assert names(Platform("3.11", "x86_64", (2, 36), "3.11.2")) == [
        "numpy==1.26.4", "nvidia-nccl-cu12==2.27.3", "tomli==2.2.1", "uv==0.13.9"]
    overlap = env_of(inv(tmp_path, 'numpy==1.26.4 ; python_version < "3.13"\n'
                                   'numpy==2.3.4 ; python_version >= "3.12"\n'))
    with pytest.raises(PreflightError, match=r"lines 1 .* and 2 .* both apply to Python 3\.12\.3"):
        wheels.for_platform(overlap, ARM)
    with pytest.raises(InventoryError, match=r"numpy is pinned twice .* give each line a marker"):
        env_of(inv(tmp_path, 'numpy==1.26.4\nnumpy==2.3.4 ; python_version >= "3.12"\n'))


def test_a_line_for_none_of_the_hosts_is_skipped_and_said_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = inv(tmp_path, 'numpy==2.3.4\npywin32==311 ; sys_platform == "win32"\n')
    path.write_text(path.read_text() + "  - host: 10.0.0.2\n")
    found = inventory.load(path)
    monkeypatch.setattr("clusterrun.envs.wheels.resolve", lambda *_a: [
        wheels.Wheel("numpy", "2.3.4", "numpy.whl", "a" * 64, 1),
        wheels.Wheel("uv", wheels.UV.version, "uv.whl", "b" * 64, 1)])
    said: list[str] = []
    worker = sync.Sync(found, None, tmp_path, say=said.append)  # type: ignore[arg-type]
    for host in worker.hosts:
        host.status = {"python": "3.11.7", "machine": "x86_64", "libc": "glibc 2.36",
                       "system": "Linux", "workdir": "/w", "env": None}
        host.platform = platforms.from_status(host.spec.name, host.status)
    worker.resolve()
    assert said == [f"{tmp_path / 'req.lock'}, line 2: pywin32==311; sys_platform == \"win32\" "
                    "is for none of the hosts; skipped"]





def uv_lock(project: Path, *args: str) -> None:
    """`uv lock` as its users run it, with every source on this machine: its default index
    (PyPI) an empty one."""
    assert UV, "uv is not installed beside this Python (pip install -e '.[test]' installs it)"
    empty = project.parent / "empty-index"
    empty.mkdir(exist_ok=True)
    done = subprocess.run([UV, "lock", "--default-index", empty.as_uri(),
                           "--cache-dir", str(project.parent / "uv-cache"), *args], cwd=project,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("UV_")},
                               "XDG_CONFIG_HOME": str(project.parent)})  # no user uv.toml
    assert done.returncode == 0, done.stderr


def test_a_real_uv_lock_says_where_each_wheel_is(tmp_path: Path, tiny: Path, index: Index,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A flat index of pyproject.toml's, a `--find-links` folder, a `path` wheel and a `url`
    wheel, as `uv lock` records them: every wheel's place found on this machine, nothing
    restated in the inventory, each gathered from there with its sha256."""
    for folder, name in (("flat", "flatpkg"), ("links", "linkpkg"), ("proj/vendor", "vendored")):
        wheel_of(tmp_path / folder, name, name)
    served = wheel_of(tmp_path / "served", "servedpkg", "servedpkg")
    index.files[f"/files/{served.name}"] = served.read_bytes()
    project = tmp_path / "proj"
    (project / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n'
        'dependencies = ["flatpkg", "linkpkg", "vendored", "servedpkg"]\n\n'
        '[[tool.uv.index]]\nname = "local"\nurl = "../flat"\nformat = "flat"\nexplicit = true\n\n'
        '[tool.uv.sources]\nflatpkg = { index = "local" }\n'
        'vendored = { path = "vendor/vendored-0.1-py3-none-any.whl" }\n'
        f'servedpkg = {{ url = "{index.url}/files/{served.name}" }}\n')
    netrc = tmp_path / "netrc"  # uv lock fetches the url wheel to hash it, as clusterrun will
    netrc.write_text("machine 127.0.0.1 login alice password s3cret-word\n")
    monkeypatch.setenv("NETRC", str(netrc))
    uv_lock(project, "--find-links", str(tmp_path / "links"))
    env = env_of(inv(tmp_path, "", "environment: proj"))
    places = {p.name: p.files[0].location for p in env.pins}
    assert places == {
        "flatpkg": str(tmp_path / "flat" / "flatpkg-0.1-py3-none-any.whl"),
        "linkpkg": str(tmp_path / "links" / "linkpkg-0.1-py3-none-any.whl"),
        "vendored": str(project / "vendor" / "vendored-0.1-py3-none-any.whl"),
        "servedpkg": f"{index.url}/files/{served.name}"}
    got = wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a"])
    assert sorted(w.name for w in got) == ["flatpkg", "linkpkg", "servedpkg", "uv", "vendored"]

    # A wheel that is not the one uv locked (its place now holds another) is refused here.
    (project / "vendor" / "vendored-0.1-py3-none-any.whl").write_bytes(served.read_bytes())
    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(PreflightError, match=r"vendored-0.1-py3-none-any.whl's sha256 .* is "
                       r"not one the lock .*uv\.lock, line \d+\) allows for vendored==0\.1"):
        wheels.resolve(cache_with_uv(tmp_path, env), env, X86, ["a"])


def test_a_wheel_url_with_a_query_and_escapes_is_named_by_its_path(tmp_path: Path) -> None:
    """PyTorch's index escapes `+` (%2B); a signed download URL carries a query."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "t"\nversion = "1"\n')
    url = ("https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-"
           "manylinux_2_28_x86_64.whl?Signature=abc%2Fdef")
    (project / "uv.lock").write_text(
        'version = 1\nrequires-python = ">=3.11"\n\n[[package]]\nname = "t"\nversion = "1"\n'
        'source = { virtual = "." }\ndependencies = [{ name = "torch" }]\n\n'
        '[[package]]\nname = "torch"\nversion = "2.13.0+cpu"\n'
        'source = { registry = "https://download.pytorch.org/whl/cpu" }\n'
        f'wheels = [{{ url = "{url}", hash = "sha256:{"d" * 64}" }}]\n')
    env = env_of(inv(tmp_path, "", "environment: proj"))
    wheel_ = env.pins[0].files[0]
    assert wheel_.filename == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert (wheel_.location, wheel_.index_url) == (url, "https://download.pytorch.org/whl/cpu")
    assert locked.choose(env.pins[0], X86) == wheel_
