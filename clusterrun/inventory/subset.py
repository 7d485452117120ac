"""`-w/--hosts` and `-x/--exclude`: a subset of the inventory's hosts, in NodeSet syntax."""

from __future__ import annotations

import dataclasses
from typing import Optional

from clusterrun.errors import UsageError
from clusterrun.inventory import ranges
from clusterrun.inventory.hosts import AUTO, HostSpec, Inventory


def _nodes(text: str, option: str, inv: Inventory) -> set[str]:
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    if ranges.at_most(text) > ranges.MAX_HOSTS:
        raise UsageError(f"{option} {text!r} stands for more than {ranges.MAX_HOSTS} hosts; no "
                         "inventory has that many.")
    try:
        nodes = set(NodeSet(text))
    except (NodeSetException, ValueError) as exc:
        raise UsageError(f"{option} {text!r} is not a NodeSet ({exc}); write e.g. "
                         "gpu[01-04],gpu07 or 10.0.0.[11-12].") from None
    known = {h.name for h in inv.hosts} | {h.host for h in inv.hosts}
    unknown = sorted(nodes - known) or ([] if nodes else [text])  # `*.ckpt`: no nodes at all
    if unknown:
        hint = (" (to leave files out of the copy, `launch` spells that --exclude-files)"
                if option.startswith("-x") else "")
        missing = ranges.fold(unknown) if nodes else text
        raise UsageError(f"{option} {text!r}: no host named {missing} in "
                         f"{inv.path}{hint}. Its hosts: {_listing(inv)}.")
    return nodes


def _listing(inv: Inventory) -> str:
    return ", ".join(h.name if h.name == h.host else f"{h.name} ({h.host})" for h in inv.hosts)


def _matches(host: HostSpec, nodes: set[str]) -> bool:
    return host.name in nodes or host.host in nodes


def select(inv: Inventory, hosts: Optional[str] = None,
           exclude: Optional[str] = None) -> tuple[Inventory, list[str]]:
    """The inventory narrowed to the hosts ``hosts`` names (all if None) less those ``exclude``
    names, by name or address, in the inventory's order; and notes for stderr. The master stays
    the master when selected; otherwise the first selected host that is not a spare becomes it
    (with a note when the inventory had named one). A selection of spares only uses them as
    ordinary hosts."""
    if hosts is None and exclude is None:
        return inv, []
    keep = list(inv.hosts)
    if hosts is not None:
        wanted = _nodes(hosts, "-w/--hosts", inv)
        keep = [h for h in keep if _matches(h, wanted)]
    if exclude is not None:
        unwanted = _nodes(exclude, "-x/--exclude", inv)
        keep = [h for h in keep if not _matches(h, unwanted)]
    if not keep:
        raise UsageError(f"the selection (-w/--hosts, -x/--exclude) leaves no host of {inv.path}. "
                         f"Its hosts: {_listing(inv)}.")
    notes: list[str] = []
    if all(h.spare for h in keep):
        # Naming only spares (`exec -w gpu-e -- nvidia-smi`) means using them: as ordinary hosts.
        keep = [dataclasses.replace(h, spare=False) for h in keep]
        notes.append(f"the selection holds only spare hosts ({ranges.fold(h.name for h in keep)});"
                     " they are used as ordinary hosts.")
    master_addr = inv.master_addr
    if not any(h.master for h in keep):
        old = inv.master
        first = next(i for i, h in enumerate(keep) if not h.spare)
        keep[first] = dataclasses.replace(keep[first], master=True)
        if inv.master_named:
            notes.append(f"the selection leaves out the master {old.name}; {keep[first].name} is "
                         "the master (rank 0) instead.")
        if master_addr != AUTO:
            notes.append(f"master_addr {master_addr} belonged to {old.name}: using `auto` "
                         f"(the address of {keep[first].name}).")
            master_addr = AUTO
    return dataclasses.replace(inv, hosts=tuple(keep), master_addr=master_addr), notes
