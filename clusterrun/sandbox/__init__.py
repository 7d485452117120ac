"""A real multi-host cluster on one Linux machine (network namespaces + one sshd per host), for
trying clusterrun and for its test suite."""

from clusterrun.sandbox.cluster import (
    PARTITION_TABLE,
    Sandbox,
    add_network,
    down,
    exec_in,
    heal,
    load,
    partition,
    pids,
    regenerate_host_key,
    restore_host_key,
    up,
)
from clusterrun.sandbox.logins import logins
from clusterrun.sandbox.state import SandboxHost, SandboxNetwork, SandboxNic
from clusterrun.sandbox.support import require_support

__all__ = ["PARTITION_TABLE", "Sandbox", "SandboxHost", "SandboxNetwork", "SandboxNic",
           "add_network", "down", "exec_in", "heal", "load", "logins", "partition", "pids",
           "regenerate_host_key", "require_support", "restore_host_key", "up"]
