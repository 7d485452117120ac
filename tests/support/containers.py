"""Real containers inside sandbox hosts, for testing `container:` in inventories.

Each enabled host gets a podman of its own: its own configuration (bound over /etc/containers in
the host's mount namespace), storage, runtime state and /dev/shm, so that two hosts can each run a
container of the same name, as two machines can. All of them read one image, IMAGE, from a shared
read-only image store under the sandbox root: a rootfs of a few KB, imported once (no registry is
reachable), that gets the machine's /usr and the sandbox's Python mounted read-only at run time.
The sandbox state lists the enabled hosts, whose containers sandbox.down() removes first.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

from clusterrun.errors import SandboxError
from clusterrun.sandbox import cluster, net, sshd
from clusterrun.sandbox.state import ContainersState

IMAGE = "clusterrun-sandbox:latest"
PACKAGES = "podman crun conmon"
STORE = "image-store"  # under the sandbox root: the shared image store and its own config
PODMAN_TIMEOUT = 60.0
CONTAINER_PATH = sshd.SESSION_ENV["PATH"]
# vfs copies the image into every container; with a rootfs of a few KB that costs nothing, and
# unlike overlay it works on any filesystem (overlay on overlay fails in container-based CI)
# and leaves no mounts behind to outlive a host.
DRIVER = "vfs"
POLICY = {"default": [{"type": "insecureAcceptAnything"}]}


def require_podman() -> None:
    """Raise SandboxError saying what to install when this machine cannot run containers."""
    missing = [tool for tool in PACKAGES.split() if shutil.which(tool) is None
               and not os.path.exists(f"/usr/libexec/podman/{tool}")]
    if missing:
        raise SandboxError(f"containers in the sandbox need {', '.join(missing)}: "
                           f"`apt-get install -y {PACKAGES}`")


def enable(sb: cluster.Sandbox, hosts: Sequence[str] | None = None) -> None:
    """Give these hosts (default: all) a working podman that can run IMAGE. Idempotent."""
    require_podman()
    names = [sb.host(name).name for name in hosts] if hosts is not None else [
        h.name for h in sb.hosts]
    state = cluster.read_state(sb.root)
    if state.containers is None:
        state.containers = ContainersState(path=CONTAINER_PATH, hosts=[])
    entry = state.containers
    new = [name for name in dict.fromkeys(names) if name not in entry.hosts]
    if not new:
        return
    view = state.view
    with net.step("write the container engines' configuration"):
        if entry.mounts is None:
            entry.mounts, entry.path = python_mounts(state.python)
        for name in new:
            (sb.root / name / sshd.CRUN_STATE).mkdir(parents=True, exist_ok=True)
            _write_config(sb.root / name / "containers", f"{view}/{name}/containers",
                          image_store=f"{view}/{STORE}/storage")
    # A host is recorded once its podman is in place: down() removes the containers of the
    # hosts recorded, and there can be none elsewhere. A retry after a failure mounts again,
    # over the first mounts, which does no harm.
    net.parallel(lambda name: _mount_config(sb, name, view), new)
    if not entry.image:
        _import_image(sb, new[0], view)
        entry.image = True
    entry.hosts += new
    cluster.write_state(sb.root, state)


def run(sb: cluster.Sandbox, host: str, name: str, *, python: bool = True,
        network: str = "host", options: Sequence[str] = ()) -> None:
    """Start container `name` on the host, idle (sleep infinity) until removed.

    python=True mounts the machine's /usr and the sandbox's Python read-only at their own paths
    (the venv's bin first on PATH); python=False gives a container with neither Python nor a
    shell, only what `sleep` needs to run. A container on a network of its own (not "host")
    lives outside the host's network namespace: killing every process of the host (a crash)
    leaves it running, until sandbox.down().
    """
    entry = _enabled(sb, host)
    if python:
        mounts = ["/usr", *(entry.mounts or [])]  # enable() has filled them in
        env = ["--env", f"PATH={entry.path}"]
    else:
        mounts = [p for p in ("/usr/bin/sleep", "/usr/lib", "/usr/lib64") if os.path.exists(p)]
        env = []
    volumes = [arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")]
    podman(sb, host, "run", "-d", "--name", name, f"--network={network}", *volumes, *env,
           *options, IMAGE, "sleep", "infinity")  # options: e.g. --cap-add SYS_PTRACE


def podman(sb: cluster.Sandbox, host: str, *args: str,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run podman on the host, in its namespaces and environment, as an SSH session there would."""
    _enabled(sb, host)
    return _podman(sb, host, list(args), check=check)


def stop(sb: cluster.Sandbox, host: str, name: str) -> None:
    """Stop the container at once (its idle process ignores SIGTERM, being pid 1)."""
    podman(sb, host, "stop", "--time", "0", name)


def remove(sb: cluster.Sandbox, host: str, name: str) -> None:
    """Remove the container, running or not; one that does not exist is already removed."""
    podman(sb, host, "rm", "--force", "--ignore", "--time", "0", name)


# ---------------------------------------------------------------- internals


def _enabled(sb: cluster.Sandbox, host: str) -> ContainersState:
    sb.host(host)
    entry = cluster.read_state(sb.root).containers
    if entry is None or host not in entry.hosts:
        raise SandboxError(f"containers are not enabled on {host}: call containers.enable first")
    return entry


def _podman(sb: cluster.Sandbox, host: str, args: list[str], *, check: bool,
            env: dict[str, str] | None = None,
            wrapper: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return sshd.session_run(sb.host(host).sshd_pid, host, [*wrapper, "podman", *args],
                            timeout=PODMAN_TIMEOUT, check=check, env=env)


def python_mounts(python: str) -> tuple[list[str], str]:
    """The prefixes (outside /usr) the sandbox's Python needs, and a PATH starting with its bin.

    Asked of that Python itself: the hosts' interpreter need not be this process's.
    """
    code = "import sys; print(sys.base_prefix); print(sys.prefix)"
    out = net.run([python, "-c", code], step=f"ask {python} for its prefixes")
    prefixes = [os.path.realpath(p) for p in out.split()]
    mounts = [p for p in dict.fromkeys(prefixes) if p != "/usr" and not p.startswith("/usr/")]
    bindir = os.path.dirname(os.path.abspath(python))
    return mounts, f"{bindir}:{CONTAINER_PATH}"


def _limits() -> list[str]:
    """Without these, podman asks for nofile and nproc limits of 1048576, which only a root with
    CAP_SYS_RESOURCE gets (not the root of some sandboxed machines): ask for this process's hard
    limits instead. podman itself runs with nproc lowered to the kernel's pid_max, and a
    container cannot be given more than podman has."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def _toml(value: object) -> str:
    return json.dumps(value)  # a JSON string or list of strings is also TOML


def _write_config(home: Path, inside: str, *, image_store: str | None = None) -> None:
    """A complete /etc/containers for one podman: nothing read from the machine's, so every
    machine's sandbox behaves alike. `inside` is where `home` appears inside the host."""
    etc = home / "etc"
    for sub in ("storage", "run", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    (etc / "networks").mkdir(parents=True, exist_ok=True)
    (etc / "containers.conf").write_text(
        "[containers]\n"
        f"default_ulimits = {_toml(_limits())}\n"
        'cgroups = "disabled"\n'  # no systemd and no cgroup delegation in a namespace host
        "[engine]\n"
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f"tmp_dir = {_toml(inside + '/tmp')}\n"  # else /run/libpod, shared by every host
        f"image_copy_tmp_dir = {_toml(inside + '/tmp')}\n"
        f"network_config_dir = {_toml(inside + '/etc/networks')}\n")
    stores = f"additionalimagestores = {_toml([image_store])}\n" if image_store else ""
    (etc / "storage.conf").write_text(
        "[storage]\n"
        f"driver = {_toml(DRIVER)}\n"
        f"graphroot = {_toml(inside + '/storage')}\n"
        f"runroot = {_toml(inside + '/run')}\n"
        "[storage.options]\n" + stores)
    (etc / "policy.json").write_text(json.dumps(POLICY) + "\n")
    # Short names resolve to local images only: no registry is reachable from the sandbox.
    (etc / "registries.conf").write_text('unqualified-search-registries = []\n'
                                         'short-name-mode = "permissive"\n')


def _mount_config(sb: cluster.Sandbox, host: str, view: str) -> None:
    # A /dev/shm of its own too: podman keeps its container locks in a shared memory segment
    # there, and a podman starting afresh frees every lock in it, other hosts' included.
    # crun keeps its state in /run/crun whatever podman's configuration says: the state of a
    # container killed with its host, not removed, would otherwise stay on the machine.
    home = shlex.quote(f"{view}/{host}/containers")
    script = "\n".join([
        "set -e", "mkdir -p /etc/containers /run/crun",
        f"mount --bind {home}/etc /etc/containers",
        f"mount --bind {shlex.quote(f'{view}/{host}/{sshd.CRUN_STATE}')} /run/crun",
        "mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm",
    ])
    with net.step(f"set up the container engine of {host}"):
        cp = cluster.exec_in(sb, host, ["sh", "-c", script], capture_output=True, text=True,
                             timeout=30, check=False)
    if cp.returncode != 0:
        raise SandboxError(f"set up the container engine of {host}: {cp.stderr.strip()}")


def _import_image(sb: cluster.Sandbox, host: str, view: str) -> None:
    """Import IMAGE into the shared store, through one host's podman (it has our policy.json)."""
    store = sb.root / STORE
    with net.step("write the image store"):
        _write_config(store, f"{view}/{STORE}")
        (store / "rootfs.tar").write_bytes(rootfs())
    etc = f"{view}/{STORE}/etc"
    env = {"CONTAINERS_CONF": f"{etc}/containers.conf",
           "CONTAINERS_STORAGE_CONF": f"{etc}/storage.conf",
           "CONTAINERS_REGISTRIES_CONF": f"{etc}/registries.conf"}
    # Importing also writes a cache of blob digests to the machine's own
    # /var/lib/containers/cache, whatever the configuration says: a tmpfs over /var/lib, in a
    # mount namespace of the import's own, keeps it off the machine (podman's storage here is
    # all under the sandbox root).
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs tmpfs /var/lib && exec "$@"', "sh"]
    _podman(sb, host, ["import", "--quiet", f"{view}/{STORE}/rootfs.tar", IMAGE], check=True,
            env=env, wrapper=wrapper)


def rootfs() -> bytes:
    """A merged-/usr root with nothing in /usr: containers get the machine's mounted there."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, *, mode: int = 0o755, link: str | None = None,
                text: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mode = mode
            data = (text or "").encode()
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
            elif text is not None:
                info.size = len(data)
            else:
                info.type = tarfile.DIRTYPE
            tar.addfile(info, io.BytesIO(data) if text is not None else None)

        for name in ("usr", "usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc", "proc", "sys",
                     "dev", "run", "var"):
            add(name)
        for name in ("tmp", "var/tmp"):
            add(name, mode=0o1777)
        add("root", mode=0o700)
        for name in ("bin", "lib", "lib64", "sbin"):
            add(name, link=f"usr/{name}")
        add("etc/passwd", mode=0o644, text="root:x:0:0:root:/root:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        add("etc/group", mode=0o644, text="root:x:0:\nnogroup:x:65534:\n")
        # As in any distribution's image: without it glibc asks DNS first, and every address
        # lookup torch makes waits for a nameserver the hosts do not have.
        add("etc/nsswitch.conf", mode=0o644, text="passwd: files\ngroup: files\n"
            "hosts: files dns\n")
    return buf.getvalue()
