"""Hosts named on the command line instead of an inventory file: INVENTORY `gpu[01-04]`, `a,b`
or `localhost`, or `-w HOSTS` alone, as pdsh and clush take them; and such an inventory (or
any other) written back out as YAML, to keep.

A host named this way is an inventory host that says nothing but its address: ~/.ssh/config
decides how it is reached (HostName, User, Port, IdentityFile, ProxyJump, read by the transport
when it connects, as for any inventory host without `user:`/`port:`/...), and the rest takes the
inventory defaults, or what --python, --workdir, --nproc-per-node, --env and --master say
(``Overrides``, which apply to an inventory file's hosts as well).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

from clusterrun.errors import InventoryError, UsageError
from clusterrun.inventory import ranges, slurm
from clusterrun.inventory.hosts import AUTO, DEFAULTS, HostSpec, Inventory, where_it_runs

# A word ending so, holding a '/' or starting with '~' or '.' is a file's path whether or not
# the file exists: a missing `inv.yaml` is reported missing, never taken for a host's name.
FILE_SUFFIXES = (".yaml", ".yml", ".txt", ".json", ".py")


def names_a_file(word: str) -> bool:
    """Whether INVENTORY ``word`` means a file (or `slurm`, the allocation's hosts) rather than
    hosts: an existing path always does."""
    return (os.path.exists(word) or word == slurm.WORD or "/" in word
            or word.startswith(("~", ".")) or word.lower().endswith(FILE_SUFFIXES))


def is_host_list(word: str) -> bool:
    return bool(word) and not names_a_file(word)


def neither(word: str, why: str, what: str = "INVENTORY") -> str:
    if what != "INVENTORY":
        return f"{what} {word!r} is not a host list: {why}."
    return (f"INVENTORY {word!r} is neither an inventory file (there is no file of that name "
            f"here) nor a host list: {why}. Give the path of a YAML inventory or hostfile, or "
            "hosts in NodeSet syntax (gpu[01-04], a,b, localhost).")


def names(word: str, what: str = "INVENTORY") -> list[str]:
    """The hosts ``word`` names, in order (NodeSet syntax); InventoryError when it names none."""
    if "@" in word:  # also NodeSet's group syntax, which would read a groups file
        raise InventoryError(neither(word, "'@' has no place in a host list: a user belongs in "
                                     "~/.ssh/config (`Host NAME`, then `User USER`) or in an "
                                     "inventory's `user:`, and NodeSet groups (@name) are not "
                                     "read", what))
    try:
        found = ranges.expand(word)
    except ValueError as exc:
        raise InventoryError(neither(word, str(exc).rstrip("."), what)) from None
    if not found:
        raise InventoryError(neither(word, "it names no host", what))
    return found


@dataclass(frozen=True)
class Overrides:
    """What an inventory file would say, given on the command line for every host."""

    python: Optional[str] = None
    workdir: Optional[str] = None
    nproc_per_node: Union[int, str, None] = None
    env: tuple[tuple[str, str], ...] = ()
    master: Optional[str] = None

    def apply(self, inv: Inventory) -> tuple[Inventory, list[str]]:
        """``inv`` with these settings on every host, and notes for stderr."""
        for option, value in (("--python", self.python), ("--workdir", self.workdir)):
            if value is not None and (not value or "\0" in value or "\n" in value):
                raise UsageError(f"{option} {value!r}: give a non-empty path without NUL or "
                                 "newline characters.")
        changes: dict[str, Any] = {k: v for k, v in (
            ("python", self.python), ("workdir", self.workdir),
            ("nproc_per_node", self.nproc_per_node)) if v is not None}
        hosts = [dataclasses.replace(h, **changes) for h in inv.hosts]
        if self.env:
            hosts = [dataclasses.replace(h, env=tuple(sorted({**h.env_dict, **dict(self.env)}
                                                             .items()))) for h in hosts]
        inv = dataclasses.replace(inv, hosts=tuple(hosts))
        return (inv, []) if self.master is None else _master(inv, self.master)


def _master(inv: Inventory, wanted: str) -> tuple[Inventory, list[str]]:
    """--master: that host (by name or address) is rank 0."""
    found = [h for h in inv.hosts if wanted in (h.name, h.host)]
    if not found:
        raise UsageError(f"--master {wanted!r}: no such host among {_listing(inv)}; give one of "
                         "them (by name or address).")
    chosen = found[0]
    if chosen.spare:
        raise UsageError(f"--master {wanted!r}: {chosen.name} is a spare (`spare: true`), held "
                         "back for restarts; the master runs every attempt. Name another host.")
    notes = []
    master_addr = inv.master_addr
    if master_addr != AUTO and not chosen.master:
        notes.append(f"master_addr {master_addr} belonged to {inv.master.name}: using `auto` "
                     f"(the address of {chosen.name}).")
        master_addr = AUTO
    hosts = tuple(dataclasses.replace(h, master=h is chosen) for h in inv.hosts)
    return dataclasses.replace(inv, hosts=hosts, master_addr=master_addr,
                               master_named=True), notes


def _listing(inv: Inventory) -> str:
    return ranges.fold(h.name for h in inv.hosts)


# The per-host settings written back, in the order an inventory's `defaults:` lists them.
_SETTINGS = ("user", "port", "identity_file", "known_hosts", "python", "setup", "workdir",
             "nproc_per_node", "interface", "env", "forward_env", "env_file", "container",
             "container_engine", "container_user", "proxy_jump")
_SHOWN_DEFAULTS = ("python", "workdir", "nproc_per_node")  # commented in when left as they are


def _default(spec: HostSpec, key: str) -> Any:
    """What the loader gives ``spec`` for ``key`` when the file says nothing."""
    if key in ("python", "workdir"):
        python, workdir = where_it_runs(own=spec.local and not spec.container)
        return python if key == "python" else workdir
    return () if key in ("env", "forward_env") else DEFAULTS[key]


def _plain(key: str, value: Any) -> Any:
    """A setting as YAML holds it."""
    if key == "env":
        return dict(value)
    return list(value) if isinstance(value, tuple) else value


def _scalar(value: Any) -> str:
    import yaml

    text: str = yaml.safe_dump(value, default_flow_style=True, width=1 << 16)
    return text.removesuffix("\n...\n").rstrip("\n")


def to_yaml(inv: Inventory, title: str, beside: Optional[dict[str, str]] = None) -> str:
    """``inv`` as an inventory file that loads back to the same hosts: settings every host shares
    in `defaults:`, the rest beside each host. ``beside``: a comment per host name (what
    ~/.ssh/config says of it)."""
    if any(h.environment for h in inv.hosts):
        raise UsageError("--yaml writes hosts and their settings, and cannot write an "
                         "`environment:` lock; keep the inventory file that names it.")
    if any(h.transport != "ssh" for h in inv.hosts):
        raise UsageError("--yaml cannot write the nodes of a Slurm allocation: they are the "
                         "allocation's only while it lasts. Keep `hosts: slurm`.")
    lines = [f"# clusterrun inventory {title}; every key: docs/inventory.md.",
             "# Each host is reached as ssh would reach it: ~/.ssh/config's HostName, User, Port,",
             "# IdentityFile and ProxyJump apply where this file names none (beside each host: "
             "what it says now).",
             "defaults:"]
    shared: dict[str, Any] = {}
    for key in _SETTINGS:
        values = [getattr(h, key) for h in inv.hosts]
        if all(v == _default(h, key) for v, h in zip(values, inv.hosts)):
            if key in _SHOWN_DEFAULTS:
                lines.append(f"  # {key}: {_scalar(_plain(key, values[0]))}   (the default)")
        elif all(v == values[0] for v in values):
            shared[key] = values[0]
            lines.append(f"  {key}: {_scalar(_plain(key, values[0]))}")
    if lines[-1] == "defaults:":
        lines[-1] = "# defaults: (none)"
    if inv.master_addr != AUTO:
        lines.append(f"master_addr: {_scalar(inv.master_addr)}")
    if inv.master_port is not None:
        lines.append(f"master_port: {inv.master_port}")
    lines.append("hosts:")
    first = next(h for h in inv.hosts if not h.spare)
    for h in inv.hosts:
        lines += _host_lines(h, shared, master=h.master and h is not first,
                             note=(beside or {}).get(h.name))
    return "\n".join(lines) + "\n"


def _host_lines(h: HostSpec, shared: dict[str, Any], *, master: bool,
                note: Optional[str]) -> list[str]:
    own: list[tuple[str, Any]] = [("host", h.host)]
    if h.name != h.host:
        own.append(("name", h.name))
    if master:
        own.append(("master", True))
    if h.spare:
        own.append(("spare", True))
    if h.gpus is not None:
        own.append(("gpus", list(h.gpus)))
    own += [(key, _plain(key, getattr(h, key))) for key in _SETTINGS
            if key not in shared and getattr(h, key) != _default(h, key)]
    out = [f"  - {own[0][0]}: {_scalar(own[0][1])}" + (f"   # {note}" if note else "")]
    return out + [f"    {key}: {_scalar(value)}" for key, value in own[1:]]
