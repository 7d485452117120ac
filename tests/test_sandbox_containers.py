"""Containers inside the sandbox hosts are real and per host, as on real machines: what the
`container:` tests build on (tests/support/containers.py)."""

from __future__ import annotations

import glob
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterrun import sandbox
from clusterrun.sandbox import cluster as sandbox_cluster
from clusterrun.sandbox import dockerd as sandbox_dockerd
from clusterrun.sandbox import net as sandbox_net
from tests.conftest import Cluster, Containers
from tests.support import containers as sandbox_containers
from tests.support import docker as sandbox_docker

pytestmark = pytest.mark.cluster

A, B, C = "node30", "node31", "node32"  # hosts no other test uses


def running(podman_hosts: Containers, host: str, name: str) -> bool:
    cp = podman_hosts.podman(host, "inspect", "--format", "{{.State.Running}}", name, check=False)
    return cp.stdout.strip() == "true"


def test_same_named_containers_on_two_hosts_are_independent(cluster: Cluster,
                                                            podman_hosts: Containers) -> None:
    for host in (A, B):
        podman_hosts.run(host, "job")
    podman_hosts.podman(A, "exec", "job", "touch", "/tmp/only-in-a")
    assert "only-in-a" in podman_hosts.podman(A, "exec", "job", "ls", "/tmp").stdout
    assert "only-in-a" not in podman_hosts.podman(B, "exec", "job", "ls", "/tmp").stdout
    assert "only-in-a" not in cluster.run_on(A, "ls", "/tmp")  # the container's own /tmp
    assert podman_hosts.podman(C, "ps", "-a", "--format", "{{.Names}}").stdout.strip() == ""

    sandbox_containers.remove(cluster.sb, A, "job")
    sandbox_containers.remove(cluster.sb, A, "job")  # removing twice is fine
    assert podman_hosts.podman(A, "ps", "-a", "--format", "{{.Names}}").stdout.strip() == ""
    assert running(podman_hosts, B, "job")
    assert cluster.wait_no_processes([A], timeout=5) == {}  # no conmon or container left


def test_the_sandbox_python_and_the_hosts_nic_inside(cluster: Cluster,
                                                     podman_hosts: Containers) -> None:
    podman_hosts.run(A, "job")
    code = ("import os, socket, sys, torch; print(torch.__version__); print(socket.gethostname());"
            "print(sys.prefix); print(' '.join(sorted(os.listdir('/sys/class/net'))))")
    out = podman_hosts.podman(A, "exec", "-i", "job", "python3", "-c", code).stdout.splitlines()
    version, hostname, prefix, nics = out
    assert version == importlib.metadata.version("torch")
    assert hostname == A
    assert prefix == sys.prefix  # the sandbox's Python (this one), mounted at its own path
    assert cluster.host(A).ifname in nics.split()
    assert cluster.host(B).ifname not in nics.split()


def test_a_container_without_python_has_no_shell_either(podman_hosts: Containers) -> None:
    podman_hosts.run(C, "bare", python=False)
    assert running(podman_hosts, C, "bare")
    for argv in (["python3", "-V"], ["sh", "-c", "true"]):
        cp = podman_hosts.podman(C, "exec", "bare", *argv, check=False)
        assert cp.returncode == 127, cp
        assert "not found" in cp.stderr


def test_stdin_eof_through_ssh_is_the_lifeline(cluster: Cluster, podman_hosts: Containers) -> None:
    """How clusterrun reaches a container, and how a program there learns its controller died:
    `podman exec -i` passes no signal on, only the end of stdin."""
    podman_hosts.run(B, "job")
    sb, host = cluster.sb, cluster.host(B)
    code = "import sys; sys.stdin.read(); open('/tmp/eof', 'w')"
    ssh = subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={sb.known_hosts}", "-o", "IdentitiesOnly=yes",
         "-i", str(sb.identity_file), f"root@{host.address}",
         "podman", "exec", "-i", "job", "python3", "-c", f'"{code}"'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not any(b"stdin.read" in cmdline(pid) for pid in cluster.pids(B)):
            assert time.monotonic() < deadline and ssh.poll() is None, "it never started"
            time.sleep(0.1)
    finally:
        ssh.kill()
        ssh.wait()
    deadline = time.monotonic() + 10
    while podman_hosts.podman(B, "exec", "job", "ls", "/tmp/eof", check=False).returncode:
        assert time.monotonic() < deadline, "the program never saw the end of its stdin"
        time.sleep(0.1)


def test_down_removes_the_containers_before_the_hosts(tmp_path: Path) -> None:
    sb = sandbox.up(2, tmp_path / "sb")
    try:
        sandbox_containers.enable(sb)
        sandbox_containers.enable(sb, ["node1"])  # idempotent
        sandbox_containers.run(sb, "node1", "job")
        # On a network of its own, outside the host's namespace: killing the host misses it.
        sandbox_containers.run(sb, "node2", "job", network="none")
        inits = [int(sandbox_containers.podman(sb, h, "inspect", "--format", "{{.State.Pid}}",
                                               "job").stdout) for h in ("node1", "node2")]
        sandbox_net.kill_netns_processes(sb.host("node2").netns)  # a crash: podman is gone too
        assert live(inits[1])
    finally:
        sandbox.down(sb.root)
    deadline = time.monotonic() + 5
    while (alive := [pid for pid in inits if live(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert sb.prefix not in spaces.stdout


def test_a_hosts_own_dockerd_is_found_through_ssh_and_leaves_nothing(tmp_path: Path) -> None:
    """tests/support/docker.py: each host's daemon and containers are its own, the host's SSH
    sessions find it (DOCKER_HOST), and disable() or down() (after a crash too) leave no
    process, cgroup or file of it on the machine."""
    machine = ("/run/docker", "/etc/docker/key.json")  # where a dockerd would write by default
    before = [os.path.exists(path) for path in machine]
    sb = sandbox.up(2, tmp_path / "sb")
    try:
        sandbox_docker.enable(sb, ["node1", "node2"])
        sandbox_docker.enable(sb, ["node1"])  # idempotent
        for host in ("node1", "node2"):
            sandbox_docker.run(sb, host, "job")
        sandbox_docker.docker(sb, "node1", "exec", "job", "touch", "/tmp/only-in-1")
        view = sandbox_cluster.read_state(sb.root).view
        seen = ssh(sb, "node2", 'echo "$DOCKER_HOST"; docker exec job ls -a / /tmp').split()
        assert seen[0] == f"unix://{sandbox_dockerd.socket_path(view, 'node2')}"
        assert ".dockerenv" in seen and "only-in-1" not in seen
        docker = sandbox_cluster.read_state(sb.root).docker
        assert docker is not None
        daemons = {h: docker.hosts[h].daemon.pid for h in ("node1", "node2")}
        inits = {h: int(sandbox_docker.docker(sb, h, "inspect", "--format", "{{.State.Pid}}",
                                              "job").stdout) for h in ("node1", "node2")}
        sandbox_docker.disable(sb, ["node1"])
        assert ssh(sb, "node1", 'echo "[${DOCKER_HOST:-}]"').strip() == "[]"
        assert not live(daemons["node1"]) and not live(inits["node1"])
        sandbox_net.kill_netns_processes(sb.host("node2").netns)  # a crash: dockerd is gone too
    finally:
        sandbox.down(sb.root)
    assert [pid for pid in [*daemons.values(), *inits.values()] if live(pid)] == []
    assert glob.glob(f"/sys/fs/cgroup/*/clusterrun-sandbox-{sb.prefix}-*") == []
    assert glob.glob(f"/sys/fs/cgroup/clusterrun-sandbox-{sb.prefix}-*") == []
    assert [os.path.exists(path) for path in machine] == before


def ssh(sb: sandbox.Sandbox, host: str, command: str) -> str:
    cp = subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={sb.known_hosts}", "-o", "IdentitiesOnly=yes",
         "-i", str(sb.identity_file), f"root@{sb.host(host).address}", command],
        capture_output=True, text=True, timeout=60, check=True)
    return cp.stdout


def live(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
