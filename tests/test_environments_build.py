"""A host's build of `environment:` (clusterrun/remote/tools/pyenv.py) on this machine, with a
stand-in uv (a shell script shipped in a wheel as uv is): two builds at once build once, a killed
build leaves nothing that is used, a drifted environment is replaced whole."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

LOCK = "0123456789abcdef"
# venv DIR: a pyvenv.cfg; pip install ... --python DIR/bin/python ... -r LOCK: writes its pid to
# DIR/started, waits for the file FAKE_UV_GATE if one is named, then a dist-info per line. Each
# call is logged, so a test counts builds.
FAKE_UV = r"""#!/bin/sh
echo "$1" >> "$FAKE_UV_LOG"
last() { for a in "$@"; do :; done; echo "$a"; }
if [ "$1" = venv ]; then
  dir=$(last "$@"); mkdir -p "$dir/lib/python3.11/site-packages"
  printf 'home = /usr/bin\nversion_info = %s\n' "$FAKE_PY" > "$dir/pyvenv.cfg"
  exit 0
fi
env=; lock=; prev=
for a in "$@"; do
  [ "$prev" = --python ] && env=$(dirname "$(dirname "$a")")
  [ "$prev" = -r ] && lock=$a
  prev=$a
done
echo $$ > "$env/started.tmp" && mv "$env/started.tmp" "$env/started"
if [ -n "$FAKE_UV_GATE" ]; then
  while [ ! -e "$FAKE_UV_GATE" ]; do sleep 0.02; done
fi
while read -r line; do
  name=${line%%==*}; version=${line#*==}
  mkdir "$env/lib/python3.11/site-packages/$name-$version.dist-info"
done < "$lock"
"""


def _store(workdir: Path, name: str, data: bytes) -> dict[str, Any]:
    sha = hashlib.sha256(data).hexdigest()
    folder = workdir / "wheels" / sha
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return {"sha": sha, "name": name, "size": len(data)}


@pytest.fixture
def request_(tmp_path: Path) -> dict[str, Any]:
    workdir = tmp_path / "work"
    uv = tmp_path / "uv.whl"
    with zipfile.ZipFile(uv, "w") as wheel:
        wheel.writestr("uv-0.13.9.data/scripts/uv", FAKE_UV)
    return {"op": "build", "workdir": str(workdir), "lock": LOCK,
            "requirements": "alpha==1.0\nbeta==2.0\n",
            "files": [_store(workdir, "alpha-1.0-py3-none-any.whl", b"a"),
                      _store(workdir, "beta-2.0-py3-none-any.whl", b"b")],
            "uv": _store(workdir, "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl",
                         uv.read_bytes()),
            "expected": ["alpha==1.0", "beta==2.0"], "python": "3.11.2"}


def start(req: dict[str, Any], tmp_path: Path, gate: Path | None = None,
          payload: bytes = b"", python: str = sys.executable) -> subprocess.Popen[bytes]:
    """pyenv.py run as a host runs it (with ``python``, under -S); its uv installs nothing until
    ``gate`` exists."""
    env = dict(os.environ, FAKE_UV_LOG=str(tmp_path / "uv.log"), FAKE_PY="3.11.2",
               FAKE_UV_GATE=str(gate or ""), PYTHONPATH=str(REPO))
    code = "import sys; from clusterrun.remote.tools import pyenv; pyenv.main(sys.stdin.buffer)"
    proc = subprocess.Popen([python, "-S", "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(req).encode() + b"\n" + payload)
    proc.stdin.close()
    return proc


def answer(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(60)
    return dict(json.loads(out.decode().strip().split(" ", 1)[1]))


def builds(tmp_path: Path) -> int:
    log = tmp_path / "uv.log"
    return log.read_text().split().count("venv") if log.exists() else 0


def wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 60  # only against a hang
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < end, "the build never started"
        time.sleep(0.02)


def waits_for_a_lock(pid: int) -> bool:
    """Whether the process is blocked taking a file lock (a ``->`` line of /proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        words = line.split()
        if len(words) > 5 and words[1] == "->" and words[5] == str(pid):
            return True
    return False


def test_two_builds_at_once_build_once(request_: dict[str, Any], tmp_path: Path) -> None:
    """The second build starts while the first holds the lock mid-build (its uv waits for the
    gate), and is seen blocked on that lock before the gate opens: it finds the environment
    only by looking again once it holds the lock."""
    gate = tmp_path / "gate"
    first = start(request_, tmp_path, gate)
    envs = Path(request_["workdir"]) / "envs"
    wait_for(envs / f".tmp-{LOCK}-{first.pid}" / "started", first)
    second = start(request_, tmp_path, gate)
    end = time.monotonic() + 60  # only against a hang: each step is waited for
    while not waits_for_a_lock(second.pid):
        assert second.poll() is None and time.monotonic() < end, "the second never waited"
        time.sleep(0.02)
    assert builds(tmp_path) == 1
    gate.touch()
    one, two = answer(first), answer(second)
    assert builds(tmp_path) == 1
    assert one["built"] is True and two["built"] is False  # it waited, then found it done
    assert one["env"]["dists"] == two["env"]["dists"] == ["alpha==1.0", "beta==2.0"]
    assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".uv")) == [
        f".{LOCK}.lock", LOCK]


def test_a_killed_build_leaves_nothing_used(request_: dict[str, Any], tmp_path: Path) -> None:
    proc = start(request_, tmp_path, tmp_path / "never")
    envs = Path(request_["workdir"]) / "envs"
    started = envs / f".tmp-{LOCK}-{proc.pid}" / "started"
    wait_for(started, proc)
    uv = int(started.read_text())
    proc.send_signal(signal.SIGKILL)  # the host's build, and its uv with it (a lost session)
    os.kill(uv, signal.SIGKILL)
    proc.wait(10)
    assert not (envs / LOCK).exists()  # half-built: never under the lock's name
    status = answer(start({"op": "status", "workdir": request_["workdir"], "lock": LOCK},
                          tmp_path))
    assert status["env"] is None
    done = answer(start(request_, tmp_path))
    assert done["built"] is True and done["env"]["dists"] == ["alpha==1.0", "beta==2.0"]
    assert not [p for p in envs.iterdir() if p.name.startswith(".tmp-")]  # the stale one went


def test_a_drifted_environment_is_replaced_whole(request_: dict[str, Any],
                                                 tmp_path: Path) -> None:
    assert answer(start(request_, tmp_path))["built"] is True
    site = Path(request_["workdir"]) / "envs" / LOCK / "lib" / "python3.11" / "site-packages"
    (site / "handmade-1.0.dist-info").mkdir()
    again = answer(start(request_, tmp_path))
    assert again["built"] is True and builds(tmp_path) == 2
    assert again["env"]["dists"] == ["alpha==1.0", "beta==2.0"]
    assert not (site / "handmade-1.0.dist-info").exists()


def test_a_wheel_that_arrives_changed_is_not_stored(request_: dict[str, Any],
                                                    tmp_path: Path) -> None:
    item = {"sha": "00" * 32, "name": "gamma-1.0-py3-none-any.whl", "size": 3}
    proc = start({"op": "receive", "workdir": request_["workdir"], "files": [item]}, tmp_path,
                 payload=b"abc")
    reply = answer(proc)
    assert "another sha256" in reply["error"]
    assert not (Path(request_["workdir"]) / "wheels" / item["sha"] / item["name"]).exists()


def test_prune_keeps_the_current_and_the_previous(request_: dict[str, Any],
                                                  tmp_path: Path) -> None:
    envs = Path(request_["workdir"]) / "envs"
    base = time.time() - 100
    for i, lock in enumerate(("a" * 16, "b" * 16, "c" * 16)):
        assert answer(start(dict(request_, lock=lock), tmp_path))["built"] is True
        os.utime(envs / lock, (base + i, base + i))  # built one after the other, a second apart
    reply = answer(start({"op": "prune", "workdir": request_["workdir"], "lock": "c" * 16,
                          "keep": ["c" * 16]}, tmp_path))
    assert reply["removed"] == ["a" * 16]
    assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".")) == [
        "b" * 16, "c" * 16]


def test_a_venv_pythons_own_site_packages_are_kept_and_an_environment_without_them_rebuilt(
        request_: dict[str, Any], tmp_path: Path) -> None:
    """`python:` a virtual environment, `system_site_packages`: the build adds that venv's own
    site-packages (remote/probe/sitedirs.py); an environment that does not (built by an older
    clusterrun, or before `python:` was a venv) is said not built by the status and built
    again, where one that does is kept."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([base, "-m", "venv", "--without-pip", str(tmp_path / "hv")], check=True,
                   timeout=120)
    python = str(tmp_path / "hv" / "bin" / "python")
    own = str(tmp_path / "hv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
              / "site-packages")
    req = dict(request_, system_site_packages=True)
    status = {"op": "status", "workdir": req["workdir"], "lock": LOCK,
              "system_site_packages": True, "host_python": python}
    assert answer(start(req, tmp_path, python=python))["built"] is True
    pth = Path(req["workdir"]) / "envs" / LOCK / "lib" / "python3.11" / "site-packages" / \
        "_clusterrun_host.pth"
    assert pth.read_text() == f"import site; site.addsitedir({own!r})\n"
    assert answer(start(status, tmp_path))["env"]["dists"] == ["alpha==1.0", "beta==2.0"]
    assert answer(start(req, tmp_path, python=python))["built"] is False and builds(tmp_path) == 1
    pth.unlink()
    assert answer(start(status, tmp_path))["env"] is None
    assert answer(start(req, tmp_path, python=python))["built"] is True and builds(tmp_path) == 2
    assert pth.exists()
