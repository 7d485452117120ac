"""The sandbox's docker daemons from outside any Sandbox: their socket, their client inside a
host, and their teardown. sandbox.down() calls stop() before it kills the hosts' processes, so
this module does not import sandbox.cluster (tests/support/docker.py, which starts them, does)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterrun.errors import SandboxError
from clusterrun.sandbox import daemons, net, sshd
from clusterrun.sandbox.state import DockerHost, SandboxHost

HOME = "docker"  # in a host's directory
DOCKER_TIMEOUT = 60.0


def socket_path(view: str, host: str) -> str:
    """Where the host's dockerd listens, as the host sees it."""
    return f"{view}/{host}/{HOME}/docker.sock"


def stop(hosts: Sequence[SandboxHost], docker: Mapping[str, DockerHost], view: str) -> list[str]:
    """Remove the containers of those of these hosts with a daemon in docker (by host name)
    while each host's sshd lives, then stop their daemons and remove their cgroups; return
    what survived, as error messages. sandbox.down() calls it before it kills the hosts'
    processes: a container killed with its host's processes, not removed, would leave its state
    and cgroups behind."""
    records = [(h, docker[h.name]) for h in hosts if h.name in docker]

    def remove_all(host: SandboxHost) -> None:
        if host.sshd_pid not in net.netns_pids(host.netns):
            return  # a crashed host: stopping its daemon stops what is left
        with contextlib.suppress(SandboxError):  # best effort: the daemon's stop follows
            names = client(host.sshd_pid, host.name, view, ["ps", "-aq"],
                            check=False).stdout.split()
            if names:
                client(host.sshd_pid, host.name, view, ["rm", "--force", *names],
                        check=False)

    alive = [(h, r) for h, r in records if daemons.alive(r.daemon)]
    net.parallel(remove_all, [h for h, _ in alive])
    errors = daemons.stop([[r.daemon for _, r in records]])
    for _, record in records:
        remove_cgroups(record.cgroup)
    return errors


def client(sshd_pid: int, host: str, view: str, args: list[str], *,
            check: bool) -> subprocess.CompletedProcess[str]:
    return sshd.session_run(sshd_pid, host, ["docker", *args], timeout=DOCKER_TIMEOUT,
                            check=check, env={"DOCKER_HOST": f"unix://{socket_path(view, host)}"})


def remove_cgroups(name: str) -> None:
    """Remove the host's cgroup parent in every hierarchy, innermost first (what a container
    killed without its daemon left): only ever this name, and only what is empty."""
    for top in [Path("/sys/fs/cgroup") / name, *Path("/sys/fs/cgroup").glob(f"*/{name}")]:
        if not top.is_dir():
            continue
        for path, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(path)
