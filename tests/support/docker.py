"""A docker engine of its own in sandbox hosts, for testing `container:` with docker.

Each enabled host runs one dockerd (and the containerd that dockerd starts) inside the host's
namespaces, with its data, runtime state, socket, key and cgroup parent its own: two hosts can
each run a container of the same name, as two machines can. dockerd gets a /run of its own (a
tmpfs), so that nothing it writes there lands on the machine. SSH sessions on the host find it
through DOCKER_HOST (sshd's SetEnv), the way clusterrun finds a daemon that does not listen on
/var/run/docker.sock; with the daemon there, clusterrun picks docker over podman, as on any host
that has both. Each daemon imports IMAGE, the same few-KB rootfs podman uses
(tests/support/containers.py), run with the machine's /usr and the sandbox's Python mounted.

disable() and sandbox.down() remove a host's containers while the host lives, then stop its
daemon; the sandbox state records each daemon (clusterrun.sandbox.daemons).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence

from clusterrun.errors import SandboxError
from clusterrun.sandbox import cluster, daemons, dockerd, net, sshd
from clusterrun.sandbox.state import DaemonRecord, DockerHost, DockerState
from tests.support import containers

IMAGE = containers.IMAGE  # docker names an imported image NAME:TAG, no localhost/ in front
PACKAGE = "docker.io"
TOOLS = ("dockerd", "docker", "containerd", "runc")
ROOTFS = "docker-rootfs.tar"  # under the sandbox root, imported by every daemon
READY_TIMEOUT = 30.0
# vfs, as for podman: the image is a few KB, and overlay on overlay fails in container-based CI.
DRIVER = "vfs"


def require_docker() -> None:
    """Raise SandboxError saying what to install when this machine cannot run dockerd."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise SandboxError(f"docker in the sandbox needs {', '.join(missing)}: "
                           f"`apt-get install -y {PACKAGE}` (with a policy-rc.d that exits 101, "
                           "so that the package starts no daemon of the machine's own)")


def enable(sb: cluster.Sandbox, hosts: Sequence[str]) -> None:
    """Start a dockerd on each of these hosts, ready to run IMAGE, and give the hosts' SSH
    sessions DOCKER_HOST. Idempotent."""
    require_docker()
    state = cluster.read_state(sb.root)
    if state.docker is None:
        state.docker = DockerState(path=containers.CONTAINER_PATH, hosts={})
    entry = state.docker
    new = [sb.host(name).name for name in dict.fromkeys(hosts) if name not in entry.hosts]
    if not new:
        return
    view = state.view
    with net.step("write the docker daemons' files"):
        if entry.mounts is None:
            entry.mounts, entry.path = containers.python_mounts(state.python)
        rootfs = sb.root / ROOTFS
        if not rootfs.exists():
            rootfs.write_bytes(containers.rootfs())
        for name in new:
            home = sb.root / name / dockerd.HOME
            (home / "etc").mkdir(parents=True, exist_ok=True)
            # Nothing read from the machine's /etc/docker/daemon.json: every machine's alike.
            (home / "daemon.json").write_text("{}\n")
    # Each daemon is recorded before anything waits on it: down() stops what was started.
    for name in new:
        entry.hosts[name] = DockerHost(daemon=_start(sb, name, view), cgroup=_cgroup(sb, name))
        cluster.write_state(sb.root, state)
    net.parallel(lambda name: _wait_ready(sb, name, entry.hosts[name].daemon), new)
    net.parallel(lambda name: _prepare(sb, name, view), new)


def disable(sb: cluster.Sandbox, hosts: Sequence[str]) -> None:
    """Remove the hosts' containers, stop their daemons and take DOCKER_HOST out of their SSH
    sessions: the hosts are as before enable(), but for the daemons' files."""
    state = cluster.read_state(sb.root)
    enabled = state.docker.hosts if state.docker else {}
    names = [name for name in hosts if name in enabled]
    for name in names:
        (sb.root / name / sshd.CONFIG).write_text("")
    errors = dockerd.stop([h for h in state.hosts if h.name in names], enabled, state.view)

    def restart(name: str) -> None:
        host = sb.host(name)
        sshd.restart(sb.root / name, host.netns, host.sshd_pid, host.address)

    net.parallel(restart, names)
    for name in names:
        del enabled[name]
    cluster.write_state(sb.root, state)
    if errors:
        raise SandboxError("docker disable left things behind: " + "; ".join(errors))


def run(sb: cluster.Sandbox, host: str, name: str, *, options: Sequence[str] = ()) -> None:
    """Start container `name` on the host with host networking, idle (sleep infinity) until
    removed, with the machine's /usr and the sandbox's Python mounted read-only at their own
    paths (the venv's bin first on PATH). options: e.g. --cap-add SYS_PTRACE."""
    entry = _enabled(sb, host)
    mounts = ["/usr", *(entry.mounts or [])]  # enable() has filled them in
    volumes = [arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")]
    docker(sb, host, "run", "-d", "--name", name, "--network", "host", *volumes,
           "--env", f"PATH={entry.path}", *options, IMAGE, "sleep", "infinity")


def remove(sb: cluster.Sandbox, host: str, name: str) -> None:
    """Remove the container, running or not; one that does not exist is already removed."""
    cp = docker(sb, host, "rm", "--force", name, check=False)
    if cp.returncode != 0 and "no such container" not in cp.stderr.lower():
        raise SandboxError(f"`docker rm --force {name}` on {host} failed: {cp.stderr.strip()}")


def docker(sb: cluster.Sandbox, host: str, *args: str,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the docker client on the host, as an SSH session there would (DOCKER_HOST set)."""
    _enabled(sb, host)
    view = cluster.read_state(sb.root).view
    return dockerd.client(sb.host(host).sshd_pid, host, view, list(args), check=check)


# ---------------------------------------------------------------- internals


def _enabled(sb: cluster.Sandbox, host: str) -> DockerState:
    sb.host(host)
    entry = cluster.read_state(sb.root).docker
    if entry is None or host not in entry.hosts:
        raise SandboxError(f"docker is not enabled on {host}: call docker.enable first")
    return entry


def _cgroup(sb: cluster.Sandbox, host: str) -> str:
    """The cgroup the host's containers are made under, in every hierarchy: a name no other
    sandbox or host has, so that it can be removed without looking at anyone else's."""
    return f"clusterrun-sandbox-{sb.prefix}-{host}-docker"


def _start(sb: cluster.Sandbox, host: str, view: str) -> DaemonRecord:
    """Start the host's dockerd, in its namespaces and a mount namespace of the daemon's own.

    In it, a directory of the host's own covers /etc/docker, where dockerd 20.10 writes its
    key.json, and a tmpfs covers /run, where dockerd makes /run/docker whatever its exec root;
    the sandbox's view (under /run) is bound back through a descriptor opened before, since its
    source, the sandbox root, may lie under /tmp, which the host's own /tmp hides.
    """
    home = f"{view}/{host}/{dockerd.HOME}"
    q = shlex.quote
    argv = ["dockerd", "--config-file", f"{home}/daemon.json", "--data-root", f"{home}/data",
               "--exec-root", f"{home}/run", "--pidfile", f"{home}/docker.pid",
               "-H", f"unix://{dockerd.socket_path(view, host)}", "--storage-driver", DRIVER,
               # No bridge and no firewall rules: containers use the host's network, and the
               # machine's nftables and forwarding stay as they are.
               "--bridge", "none", "--iptables=false", "--ip6tables=false",
               "--ip-forward=false", "--ip-masq=false",
               "--exec-opt", "native.cgroupdriver=cgroupfs",
               "--cgroup-parent", f"/{_cgroup(sb, host)}"]
    script = "\n".join([
        "set -e", f"exec 3<{q(view)}",
        f"if [ -d /etc/docker ]; then mount --bind {q(home + '/etc')} /etc/docker; fi",
        "mount -t tmpfs -o mode=755 tmpfs /run",
        f"mkdir -p {q(view)}",
        # --no-canonicalize: mount must not turn fd 3 back into the (now hidden) path
        f"mount --no-canonicalize --bind /proc/self/fd/3 {q(view)}", "exec 3<&-",
        f"exec {shlex.join(argv)}"])
    # The environment of an SSH session there, not this process's (a TMPDIR or DOCKER_*
    # here would point dockerd at the machine's state); `env` and nsenter exec, keeping the pid.
    session = [f"{key}={value}" for key, value in sshd.SESSION_ENV.items()]
    entered = ["env", "-i", *session, "nsenter", "-t", str(sb.host(host).sshd_pid), "-m", "-u",
            "-n", "--", "unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    return daemons.start(f"dockerd of {host}", entered,
                         sb.root / host / dockerd.HOME / "dockerd.log")


def _wait_ready(sb: cluster.Sandbox, host: str, record: DaemonRecord) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    log = sb.root / host / dockerd.HOME / "dockerd.log"
    view = cluster.read_state(sb.root).view
    while True:
        if not daemons.alive(record):
            raise SandboxError(f"start dockerd on {host}: it exited with status "
                               f"{daemons.exit_status(record)}; {sshd.log_tail(log)}")
        cp = dockerd.client(sb.host(host).sshd_pid, host, view,
                     ["version", "--format", "{{.Server.Version}}"], check=False)
        if cp.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"start dockerd on {host}: not answering after "
                               f"{READY_TIMEOUT:g} s; {sshd.log_tail(log)}")
        time.sleep(0.1)


def _prepare(sb: cluster.Sandbox, host: str, view: str) -> None:
    """Import IMAGE into the host's daemon, then let its SSH sessions find the daemon."""
    dockerd.client(sb.host(host).sshd_pid, host, view, ["import", f"{view}/{ROOTFS}", IMAGE],
            check=True)
    with net.step(f"give the SSH sessions of {host} DOCKER_HOST"):
        (sb.root / host / sshd.CONFIG).write_text(
            f"SetEnv DOCKER_HOST=unix://{dockerd.socket_path(view, host)}\n")
    h = sb.host(host)
    sshd.restart(sb.root / host, h.netns, h.sshd_pid, h.address)
