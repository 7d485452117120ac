"""Counting a sandbox host's logins: its ~/.bashrc appends a line for each (sshd.bashrc)."""

from __future__ import annotations

from clusterrun.sandbox import sshd
from clusterrun.sandbox.cluster import Sandbox


def logins(sb: Sandbox, host_name: str) -> int:
    """How many login shells (SSH channels that ran a command) the host has had so far.
    Compare two readings around a command."""
    return sshd.logins(sb.root / sb.host(host_name).name)
