"""Node ranks: the master is 0, the other hosts follow in inventory order. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence

from clusterrun.inventory.hosts import HostSpec


def in_rank_order(hosts: Sequence[HostSpec]) -> list[HostSpec]:
    """The hosts ordered by node rank."""
    return sorted(hosts, key=lambda h: not h.master)  # stable: inventory order after the master


def global_ranks(nprocs: Sequence[int]) -> list[range]:
    """Per node (in rank order), the global ranks of its processes, given each node's process
    count. torchrun assigns them the same way with a static rendezvous."""
    out: list[range] = []
    start = 0
    for n in nprocs:
        out.append(range(start, start + n))
        start += n
    return out
