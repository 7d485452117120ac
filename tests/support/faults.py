"""Crashing a sandbox host and bringing it back, for the tests of lost hosts and restarts.

A crash is every process in the host's network namespace killed at once, its sshd listener
included: the host answers nothing, as a machine that lost power. ``revive`` starts a fresh sshd
there (new UTS and mount namespaces, the same address, name and host key), as a reboot would.
"""

from __future__ import annotations

from pathlib import Path

from clusterrun.sandbox import cluster, net, sshd


def crash(sb: cluster.Sandbox, host_name: str) -> None:
    net.kill_netns_processes(sb.host(host_name).netns)


def revive(root: Path, host_name: str) -> cluster.Sandbox:
    """Start the crashed host's sshd again; returns the sandbox as it now is (the host's sshd
    pid has changed)."""
    state = cluster.read_state(root)
    host = state.host(host_name)
    net.kill_netns_processes(host.netns)  # whatever is left of the crashed host
    proc = sshd.start(root, state.view, host, sshd.shared_under_tmp(state.python))
    state.set_pids(sshd.wait_ready(root, [host], {host_name: proc}))
    cluster.write_state(root, state)
    return cluster.load(root)
