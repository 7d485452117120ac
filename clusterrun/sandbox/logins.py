"""Counting a sandbox host's logins: its ~/.bashrc appends a line for each (sshd.bashrc)."""

from __future__ import annotations

from clusterrun.sandbox import sshd
from clusterrun.sandbox.cluster import Sandbox


def logins(sb: Sandbox, host_name: str, *, from_sshd: bool = False) -> int:
    """How many times the host's ~/.bashrc has run so far: for each SSH channel that ran a
    command (a login), and for each shell a command started that reads it (`exec`'s);
    ``from_sshd``: the logins alone. Compare two readings around a command."""
    return sshd.logins(sb.root / sb.host(host_name).name, from_sshd=from_sshd)
