"""The inventory's top level: which keys belong where, and what is said when a host's key, a
list or a Python script is found in its place."""

from __future__ import annotations

import re
from pathlib import Path

from clusterrun.errors import InventoryError
from clusterrun.inventory.checker import Checker
from clusterrun.inventory.yaml_lines import Located

HOST_SETTINGS = (
    "user",
    "port",
    "identity_file",
    "known_hosts",
    "python",
    "setup",
    "workdir",
    "nproc_per_node",
    "interface",
    "env",
    "forward_env",
    "env_file",
    "container",
    "container_engine",
    "container_user",
    "proxy_jump",
    "environment",
)
HOST_ONLY = ("host", "name", "master", "gpus", "spare")
TOP_KEYS = ("defaults", "master_addr", "master_port", "hosts", "hostfile", "transport")

# What a Python script's first lines hold and no inventory or hostfile does.
_PYTHON_RE = re.compile(r"^(#!.*python|import [A-Za-z_]|from [A-Za-z_.]+ import |def [A-Za-z_]+\(|"
                        r"class [A-Za-z_]+[(:]|if __name__ ==)")


def looks_like_script(path: Path) -> bool:
    """A Python script by its name or its first lines."""
    head: list[str] = []
    try:
        # A regular file only: reading a pipe (`<(...)`) here would take what the loader needs.
        if path.is_file():
            with path.open(encoding="utf-8", errors="replace") as handle:
                head = handle.read(1 << 16).splitlines()[:50]
    except OSError:
        pass  # a missing or unreadable file: yaml_lines.load says which
    return path.suffix == ".py" or any(_PYTHON_RE.match(line) for line in head)


def not_a_script(path: Path) -> None:
    """`clusterrun launch train.py inv.yaml`: the arguments swapped, said as such rather than
    as a hostfile or YAML problem in the script."""
    if looks_like_script(path):
        raise InventoryError(f"{path}: INVENTORY looks like a Python script: the order is "
                             f"`clusterrun launch INVENTORY SCRIPT` (e.g. `clusterrun launch "
                             f"inventory.yaml {path.name}`).")


def keys(chk: Checker, root: Located) -> dict[str, Located]:
    """The inventory's top-level keys; a list, or a host's key at the top, is told where it
    belongs."""
    if isinstance(root.value, list):
        chk.fail(root.line, "the inventory is a list; an inventory is a mapping: put the hosts "
                 "under `hosts:`, e.g.\n  hosts:\n    - host: 10.0.0.11")
        return {}
    if not isinstance(root.value, dict):
        return chk.keys(root, TOP_KEYS, "inventory")
    for key, val in root.value.items():
        if key == "master":
            chk.fail(val.line, "`master:` is a host's key: write `master: true` under the host "
                     "that should be rank 0, in `hosts:` (`master_addr:` and `master_port:` "
                     "are the top-level ones).")
        elif key in HOST_ONLY and key != "host":  # `host:` at the top: `hosts:` mistyped
            chk.fail(val.line, f"`{key}:` is a host's key, not the inventory's: put it under the "
                     "host it is about, in `hosts:`.")
        elif key in HOST_SETTINGS:
            chk.fail(val.line, f"`{key}:` is a host setting: put it under `defaults:` (every "
                     "host) or under a host in `hosts:`.")
    rest = {k: v for k, v in root.value.items()
            if k == "host" or k not in HOST_ONLY + HOST_SETTINGS}
    return chk.keys(Located(rest, root.line), TOP_KEYS, "inventory")
