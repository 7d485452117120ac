"""`environment:` on the namespace cluster, its other forms and failures (a uv project's own
sources: test_environments_locks.py): `system_site_packages` keeping a base interpreter's own
torch and a host venv's own torch (DDP on 3 hosts x 2 in it), a lock pinning one of the host's
packages at another version refused, a host whose disk fills during the build of `env` or
`launch` (exit 6, host and path named, nothing half-built left in envs/), two launches at once
building it once, and a build killed on a host, or whose controller is killed, leaving nothing
half-built used and nothing running. The light lock (numpy and a wheel built here) is built by
the real uv, shipped by clusterrun, on hosts with no route to an index."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from clusterrun.inventory import load
from tests.conftest import Cluster, copy_payload, run_cli, start_cli
from tests.envtools import host_path, tiny_wheel

pytestmark = pytest.mark.cluster

HOSTS = ["node4", "node5"]
NUMPY = "2.3.4"


def env_json(*args: str) -> tuple[int, dict[str, Any], str]:
    cp = run_cli("env", "--json", *args, timeout=600)
    return cp.returncode, json.loads(cp.stdout or "{}"), cp.stderr


def numpy_wheel(folder: Path) -> Path:
    """numpy's wheel for this machine, from pip's configured (local) sources."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "-d", str(folder), f"numpy=={NUMPY}"],
                   check=True, timeout=300)
    return next(folder.glob("numpy-*.whl"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def workdir(cluster: Cluster) -> Iterator[str]:
    path = f"/tmp/clusterrun-env-{uuid.uuid4().hex[:8]}"
    yield path
    cluster.kill_all(HOSTS)  # what a failed test left there (a build held by SIGSTOP)
    for name in HOSTS:
        cluster.run_on(name, "sh", "-c", f"umount {path}/envs 2>/dev/null || true")
        shutil.rmtree(host_path(cluster, name, path), ignore_errors=True)


def in_env(cluster: Cluster, host: str, python: str, code: str) -> dict[str, Any]:
    return dict(json.loads(cluster.run_on(host, python, "-c", code)))


@dataclass(frozen=True)
class BasePython:
    python: str  # the interpreter: a base one, not a virtual environment's
    site: str  # its own site-packages directory, which holds torch


def copied_base(place: Path) -> tuple[str, str]:
    """A base interpreter (not a virtual environment) under ``place``, made from whatever Python
    runs the tests (pyenv's, the distribution's, a conda base): its binary copied under a prefix
    of its own, the standard library and libpython linked, no packages. Its python, and the site
    directory it reports (Debian's lib/python3/dist-packages, elsewhere
    lib/pythonX.Y/site-packages), not made."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    binary = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": sys.base_prefix}))
    (place / "bin").mkdir(parents=True)
    shutil.copy2(binary, place / "bin" / version)
    (place / "lib" / version).mkdir(parents=True)
    # A build with a shared libpython may find it beside its prefix ($ORIGIN/../lib).
    for shared in Path(sys.base_prefix, "lib").glob("libpython*"):
        (place / "lib" / shared.name).symlink_to(shared)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages"):
            (place / "lib" / version / entry.name).symlink_to(entry)
    python = str(place / "bin" / version)
    asked = subprocess.run([python, "-c", "import site, sys; print(sys.prefix); "
                            "print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert asked.returncode == 0, f"{python} does not start: {asked.stderr[-500:]}"
    prefix, site = asked.stdout.split()
    assert prefix == str(place), f"{python} takes its prefix from {prefix}, not {place}"
    return python, site


def torch_from(python: str, site: str) -> None:
    found = subprocess.run([python, "-c", "import torch; print(torch.__file__)"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert found.stdout.startswith(f"{site}/torch/"), \
        f"{python} does not import torch from {site}: {found.stderr[-500:]}"


@pytest.fixture(scope="module")
def base_python_with_torch() -> Iterator[BasePython]:
    """A base interpreter (copied_base) whose own site-packages holds torch, as a vendor's or a
    cluster module's Python does: its site directory is this interpreter's packages. Under
    /var/tmp, which the hosts share; the hosts' root reaches a base under /root."""
    place = Path(tempfile.mkdtemp(prefix="clusterrun-basepy-", dir="/var/tmp"))
    try:
        python, site = copied_base(place)
        Path(site).parent.mkdir(parents=True, exist_ok=True)
        Path(site).symlink_to(sysconfig.get_paths()["purelib"])
        torch_from(python, site)
        yield BasePython(python, site)
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.mark.usefixtures("home", "clean")
def test_system_site_packages_keeps_the_hosts_own_torch(
        cluster: Cluster, tmp_path: Path, workdir: str, base_python_with_torch: BasePython) -> None:
    # The lock pins nothing the base has (numpy at another version would be refused: below).
    tiny_wheel(tmp_path / "wheels")
    (tmp_path / "requirements.lock").write_text("clusterrun-tinypkg==0.1\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={
        "python": base_python_with_torch.python, "workdir": workdir,
        "environment": {"lock": "requirements.lock", "find_links": ["wheels"],
                        "system_site_packages": True}})
    code, built, err = env_json(str(inv))
    assert code == 0, err
    hosts = {h["name"]: h for h in built["hosts"]}
    assert {h["state"] for h in hosts.values()} == {"built"}
    assert all(h["drift"] == [] for h in hosts.values())  # the base's torch is not drift
    for name in HOSTS:
        env = hosts[name]["path"]
        found = in_env(cluster, name, f"{env}/bin/python",
                       "import json, torch, tinypkg; print(json.dumps({"
                       "'torch': torch.__file__, 'tiny': tinypkg.__file__}))")
        assert found["torch"].startswith(f"{base_python_with_torch.site}/torch/")
        assert found["tiny"].startswith(f"{env}/lib/")
        assert f"torch=={metadata.version('torch')}" in hosts[name]["host_packages"]
    code, again, err = env_json("--check", str(inv))
    assert code == 0, err
    assert {h["state"] for h in again["hosts"]} == {"ready"}


HOSTS3 = ["node4", "node5", "node6"]


@dataclass(frozen=True)
class HostVenv:
    python: str  # a virtual environment's interpreter, as a GPU image's /opt/venv/bin/python
    site: str  # its own site-packages
    torch: str  # the folder its torch lies in (its own .pth adds it)


@pytest.fixture(scope="module")
def venv_with_torch() -> Iterator[HostVenv]:
    """A host `python:` that is a virtual environment holding torch, whose base interpreter has
    none (copied_base): torch is in the venv's own site-packages through its own .pth naming this
    interpreter's packages, as a vendor's layout or an editable install does, with no copy of
    torch. Under /var/tmp, which the hosts share."""
    place = Path(tempfile.mkdtemp(prefix="clusterrun-hostvenv-", dir="/var/tmp"))
    try:
        base, _site = copied_base(place / "base")
        subprocess.run([base, "-m", "venv", "--without-pip", str(place / "venv")], check=True,
                       timeout=120)
        python = str(place / "venv" / "bin" / "python")
        site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        assert site.startswith(f"{place}/venv/"), site
        held = sysconfig.get_paths()["purelib"]
        Path(site, "held.pth").write_text(f"{held}\n")
        torch_from(python, held)
        gone = subprocess.run([base, "-c", "import torch"], capture_output=True, timeout=120,
                              check=False)
        assert gone.returncode != 0, f"{base}, the venv's base, has torch: it would prove nothing"
        yield HostVenv(python, site, held)
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.fixture
def workdir3(cluster: Cluster) -> Iterator[str]:
    path = f"/tmp/clusterrun-env-{uuid.uuid4().hex[:8]}"
    yield path
    cluster.kill_all(HOSTS3)
    for name in HOSTS3:
        shutil.rmtree(host_path(cluster, name, path), ignore_errors=True)


@pytest.mark.usefixtures("home", "clean")
def test_a_host_venvs_own_torch_is_kept_and_ddp_trains_on_3x2(
        cluster: Cluster, tmp_path: Path, workdir3: str, venv_with_torch: HostVenv) -> None:
    """A GPU image's layout: `python:` a venv holding torch, the lock one private wheel,
    `system_site_packages: true`. The environment imports torch from the host's venv and the
    lock's package from itself, says which came from where, and DDP trains in it."""
    torch = f"torch=={metadata.version('torch')}"
    tiny_wheel(tmp_path / "wheels")
    (tmp_path / "site.lock").write_text("clusterrun-tinypkg==0.1\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS3, defaults={
        "python": venv_with_torch.python, "workdir": workdir3,
        "environment": {"lock": "site.lock", "find_links": ["wheels"],
                        "system_site_packages": True}})
    code, built, err = env_json(str(inv))
    assert code == 0, err
    assert {h["state"] for h in built["hosts"]} == {"built"}
    for host in built["hosts"]:
        assert host["drift"] == [] and host["lock_packages"] == ["clusterrun-tinypkg==0.1"]
        assert torch in host["host_packages"]
        env = host["path"]
        found = in_env(cluster, host["name"], f"{env}/bin/python",
                       "import json, sys, torch, tinypkg; print(json.dumps({"
                       "'torch': torch.__file__, 'tiny': tinypkg.__file__, 'path': sys.path}))")
        assert found["torch"].startswith(f"{venv_with_torch.torch}/torch/")
        assert found["tiny"].startswith(f"{env}/lib/")
        path = found["path"]  # the lock's site-packages first, then the host venv's
        own = next(p for p in path if p.startswith(f"{env}/lib/"))
        assert path.index(own) < path.index(venv_with_torch.site) < path.index(
            venv_with_torch.torch)
    code, again, err = env_json("--check", str(inv))
    assert code == 0, err
    assert {h["state"] for h in again["hosts"]} == {"ready"}
    assert all(torch in h["host_packages"] for h in again["hosts"])
    plain = run_cli("env", "--check", str(inv), timeout=300)
    assert plain.returncode == 0, plain.stderr
    for name in HOSTS3:
        line = next(x for x in plain.stdout.splitlines() if x.startswith(f"{name}: "))
        assert line.endswith(f"ready (the lock's, nothing moved); 1 package(s) from the lock, "
                             f"{len(again['hosts'][0]['host_packages'])} from the host's "
                             f"{venv_with_torch.python} (torch {torch[7:]} among them)"), line

    # DDP in it, 3 hosts x 2: preflight finds torch (the host's), the ranks train.
    payload = copy_payload(tmp_path, "env_ddp.py")
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "--nproc-per-node", "2", "--env", f"TEST_DIR={test_dir}",
                 str(inv), str(payload), timeout=300)
    assert cp.returncode == 0, cp.stderr
    records = [json.loads(cluster.read(name, f"{test_dir}/{file}")) for name in HOSTS3
               for file in cluster.run_on(name, "ls", test_dir).split()]
    assert len(records) == 6
    env = built["hosts"][0]["path"]
    for rec in records:
        assert rec["prefix"] == env and rec["tinypkg"] == "tiny" and rec["same_weights"]
        assert rec["torch"].startswith(f"{venv_with_torch.torch}/torch/")
    assert cluster.wait_no_processes(HOSTS3, 15) == {}


def wheel_of(folder: Path, name: str, version: str) -> Path:
    """An empty wheel of ``name`` ``version`` (a distribution with no module)."""
    folder.mkdir(exist_ok=True)
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA",
                       f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                       "Root-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.usefixtures("home", "clean")
def test_a_lock_pinning_a_host_package_at_another_version_is_refused(
        cluster: Cluster, tmp_path: Path, workdir: str, venv_with_torch: HostVenv) -> None:
    """The lock pins mpmath (one of torch's requirements, which the host's venv has) at another
    version: `env` refuses each host (exit 3), naming it, the package and both versions, and
    builds nothing."""
    tiny_wheel(tmp_path / "wheels")
    wheel_of(tmp_path / "wheels", "mpmath", "0.0.1")
    (tmp_path / "site.lock").write_text("clusterrun-tinypkg==0.1\nmpmath==0.0.1\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={
        "python": venv_with_torch.python, "workdir": workdir,
        "environment": {"lock": "site.lock", "find_links": ["wheels"],
                        "system_site_packages": True}})
    cp = run_cli("env", str(inv), timeout=300)
    assert cp.returncode == 3, cp.stderr
    host = metadata.version("mpmath")
    for name in HOSTS:
        assert f"{name}: the lock ({tmp_path}/site.lock) pins packages that the host's own " \
               f"`python:` ({venv_with_torch.python}) has at other versions" in cp.stderr
        assert not host_path(cluster, name, f"{workdir}/envs").is_dir() or not [
            e for e in host_path(cluster, name, f"{workdir}/envs").iterdir()
            if not e.name.startswith(".")]
    assert f"mpmath==0.0.1 in the lock, mpmath {host} on the host" in cp.stderr
    assert "Traceback" not in cp.stderr


# Run in the lock's environment: where each rank's interpreter and packages came from.
IN_ENV = """import json, os, sys
import numpy, tinypkg
out = os.environ["TEST_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "rank-%s.json" % os.environ["RANK"]), "w") as handle:
    json.dump({"prefix": sys.prefix, "numpy": numpy.__version__, "tiny": tinypkg.WORD}, handle)
"""
IN_CREATE, IN_MOVED_TO = 0x100, 0x80


def light_lock(cluster: Cluster, tmp_path: Path, workdir: str) -> tuple[Path, str]:
    """An inventory of HOSTS with numpy and the tiny wheel as their environment, and the
    lock's hash (the name of its folder under <workdir>/envs on every host)."""
    tiny_wheel(tmp_path / "wheels")
    (tmp_path / "requirements.lock").write_text(f"numpy=={NUMPY}\nclusterrun-tinypkg==0.1\n")
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={
        "python": "/usr/bin/python3", "workdir": workdir,
        "environment": {"lock": "requirements.lock", "find_links": ["wheels"]}})
    env = load(inv).hosts[0].environment
    assert env is not None
    return inv, env.digest


def launch_args(inv: Path, tmp_path: Path, test_dir: str) -> list[str]:
    """`launch`'s arguments for IN_ENV: one process a host (rank 0 on node4). The lock has no
    torch, which preflight asks of every host: --no-check shows that and goes on."""
    script = tmp_path / "job" / "in_env.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(IN_ENV)
    return ["--no-torchrun", "--no-check", "--nproc-per-node", "1", "--env",
            f"TEST_DIR={test_dir}", str(inv), str(script)]


class Created:
    """The names created in (or moved into) a folder from now on, by inotify: none is missed,
    however briefly it lives. The folder is a host's, seen from this machine's side."""

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(folder),
                                                 IN_CREATE | IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")
        self.names: list[str] = []

    def read(self) -> list[str]:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return self.names
            at = 0
            while at < len(data):  # struct inotify_event: wd, mask, cookie, len, name
                size = struct.unpack_from("iIII", data, at)[3]
                self.names.append(data[at + 16:at + 16 + size].rstrip(b"\0").decode())
                at += 16 + size

    def close(self) -> None:
        os.close(self.fd)


def lock_waiters(path: Path) -> list[int]:
    """The processes waiting for the flock on ``path`` (/proc/locks marks them ``->``)."""
    st = path.stat()
    file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # 1: -> FLOCK ADVISORY WRITE <pid> <major:minor:inode> 0 EOF
        if fields[1:3] == ["->", "FLOCK"] and fields[6:7] == [file]:
            found.append(int(fields[5]))
    return found


def wait_until(what: str, found: Any, procs: list[subprocess.Popen[str]],
               timeout: float = 120) -> Any:
    """``found()`` once it is true, polled while the commands run."""
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value:
            return value
        ended = [p.args for p in procs if p.poll() is not None]
        assert not ended and time.monotonic() < deadline, f"{what} not seen; ended: {ended}"
        time.sleep(0.02)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:  # it exited meanwhile
        return ""


def installing(cluster: Cluster, name: str, workdir: str, lock: str) -> list[tuple[int, int]]:
    """(uv, its build process) for each uv installing the lock's wheels on the host: the
    build's folder, .tmp-<lock>-<pid>, names the build process."""
    pattern = re.compile(rf"{re.escape(workdir)}/runs/\.tools/uv-\w+ pip install .*"
                         rf"{re.escape(workdir)}/envs/\.tmp-{lock}-(\d+)/bin/python")
    return [(pid, int(m.group(1))) for pid in cluster.pids(name)
            if (m := pattern.search(cmdline(pid)))]


@pytest.mark.usefixtures("home", "clean")
@pytest.mark.parametrize("command", ["env", "launch"])
def test_a_full_disk_during_the_build_exits_6_and_leaves_nothing_half_built(
        cluster: Cluster, tmp_path: Path, workdir: str, command: str) -> None:
    inv, _lock = light_lock(cluster, tmp_path, workdir)
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    args = launch_args(inv, tmp_path, test_dir) if command == "launch" else [str(inv)]
    # node5's envs/ is a 4 MiB file system of its own: the wheels fit in its store, numpy's
    # unpacked files (tens of MB) do not.
    cluster.run_on("node5", "mkdir", "-p", f"{workdir}/envs")
    cluster.run_on("node5", "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", f"{workdir}/envs")
    cp = run_cli(command, *args, timeout=600)
    assert cp.returncode == 6, cp.stderr
    assert f"node5: no space left in {workdir}/envs" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert "node4" not in cp.stderr.split("no space left")[0].splitlines()[-1]
    left = cluster.run_on("node5", "ls", "-A", f"{workdir}/envs").split()
    assert not [n for n in left if not n.startswith(".") or n.startswith(".tmp-")], left
    ok = cluster.run_on("node4", "ls", f"{workdir}/envs").split()
    assert len(ok) == 1  # node4 built the lock's environment
    for name in HOSTS:  # a launch started nothing anywhere
        assert not host_path(cluster, name, test_dir).exists()


def test_two_launches_at_once_build_the_environment_once(
        cluster: Cluster, home: Path, tmp_path: Path, workdir: str, clean: None) -> None:
    inv, lock = light_lock(cluster, tmp_path, workdir)
    # This test takes each host's build lock first: both launches get as far as the build and
    # wait there, so the two builds are truly at once; released, one builds and the other, still
    # waiting, must find it built.
    envs = {name: host_path(cluster, name, f"{workdir}/envs") for name in HOSTS}
    held = {}
    for name, folder in envs.items():
        cluster.run_on(name, "mkdir", "-p", f"{workdir}/envs")
        held[name] = (folder / f".{lock}.lock").open("a")
        fcntl.flock(held[name].fileno(), fcntl.LOCK_EX)
    test_dirs = [f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}" for _ in range(2)]
    runs = [start_cli("launch", *launch_args(inv, tmp_path, test_dir)) for test_dir in test_dirs]
    watches: dict[str, Created] = {}
    try:
        for name, handle in held.items():
            path = Path(handle.name)
            wait_until(f"both launches waiting to build on {name}",
                       lambda path=path: len(lock_waiters(path)) == 2, runs)
            watches[name] = Created(envs[name])
        for handle in held.values():
            handle.close()
        outputs = [run.communicate(timeout=300) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
        for handle in held.values():
            handle.close()
    for run, (_out, err) in zip(runs, outputs):
        assert run.returncode == 0, err
        assert f"environment {lock}: building on 2 of 2 host(s)" in err  # both found it cold
    env_dir = f"{workdir}/envs/{lock}"
    for name, watch in watches.items():
        builds = [n for n in watch.read() if re.fullmatch(rf"\.tmp-{lock}-\d+", n)]
        watch.close()
        assert len(builds) == 1, (name, watch.names)  # one of the two built, once
        left = cluster.run_on(name, "ls", "-A", f"{workdir}/envs").split()
        assert sorted(left) == sorted([lock, f".{lock}.lock", ".uv-cache"]), (name, left)
    for test_dir in test_dirs:  # each launch ran its rank on each host in the one environment
        for rank, name in enumerate(HOSTS):
            record = json.loads(cluster.read(name, f"{test_dir}/rank-{rank}.json"))
            shutil.rmtree(host_path(cluster, name, test_dir))
            assert record == {"prefix": env_dir, "numpy": NUMPY, "tiny": "tiny"}
    assert cluster.wait_no_processes(HOSTS, 15) == {}


def test_a_build_killed_on_a_host_leaves_nothing_used_or_running(
        cluster: Cluster, home: Path, tmp_path: Path, workdir: str, clean: None) -> None:
    inv, lock = light_lock(cluster, tmp_path, workdir)
    proc = start_cli("env", "--json", str(inv))
    try:
        # node5's build caught in uv's install, uv held there (SIGSTOP) so that the kill lands
        # mid-build; then the build process (pyenv.py, uv's parent) killed outright.
        uv, builder = wait_until("uv installing on node5",
                                 lambda: installing(cluster, "node5", workdir, lock), [proc])[0]
        os.kill(uv, signal.SIGSTOP)
        os.kill(builder, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err
    states = {h["name"]: h["state"] for h in json.loads(out)["hosts"]}
    assert states == {"node4": "built", "node5": "failed"}, out
    # Nothing of the build lives on: not its uv (its parent gone, it goes too), not another.
    assert cluster.wait_no_processes(HOSTS, 10) == {}
    assert lock not in cluster.run_on("node5", "ls", "-A", f"{workdir}/envs").split()
    code, found, err = env_json("--check", str(inv))
    assert code == 3, err
    assert {h["name"]: h["state"] for h in found["hosts"]} == {
        "node4": "ready", "node5": "missing"}
    code, built, err = env_json(str(inv))
    assert code == 0, err
    assert {h["name"]: h["state"] for h in built["hosts"]} == {
        "node4": "ready", "node5": "built"}
    assert built["sent_bytes"] == 0  # node5's store kept every wheel it had fetched
    left = cluster.run_on("node5", "ls", "-A", f"{workdir}/envs").split()
    assert sorted(left) == sorted([lock, f".{lock}.lock", ".uv-cache"])  # the killed one's gone
    code, again, err = env_json("--check", str(inv))
    assert code == 0, err
    assert {h["state"] for h in again["hosts"]} == {"ready"}
    assert len({h["hash"] for h in again["hosts"]}) == 1


def test_a_controller_killed_mid_build_leaves_nothing_half_built_or_running(
        cluster: Cluster, home: Path, tmp_path: Path, workdir: str, clean: None) -> None:
    inv, lock = light_lock(cluster, tmp_path, workdir)
    proc = start_cli("env", "--json", str(inv))
    try:
        wait_until("uv installing on node5", lambda: installing(cluster, "node5", workdir, lock),
                   [proc])
        proc.kill()  # SIGKILL: the controller's connections close, nothing more is said
        proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # A build whose controller is gone ends (its answer has no one to go to); what it leaves
    # under the lock's name is the whole environment or nothing.
    assert cluster.wait_no_processes(HOSTS, 60) == {}
    code, found, err = env_json("--check", str(inv))
    assert {h["state"] for h in found["hosts"]} <= {"ready", "missing"}, (code, err)
    code, built, err = env_json(str(inv))
    assert code == 0, err
    assert {h["state"] for h in built["hosts"]} <= {"ready", "built"}
    for name in HOSTS:
        left = cluster.run_on(name, "ls", "-A", f"{workdir}/envs").split()
        assert sorted(left) == sorted([lock, f".{lock}.lock", ".uv-cache"]), (name, left)
    code, again, err = env_json("--check", str(inv))
    assert code == 0, err
    assert {h["state"] for h in again["hosts"]} == {"ready"}
    assert len({h["hash"] for h in again["hosts"]}) == 1
