"""The hosts a command reaches at once (`check`, `exec`, `env`): INVENTORY less -w/-x, and the SSH
options to reach them with, taken as one value."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

from clusterrun import inventory
from clusterrun.cli.common import load_inventory, make_options, selection_options, ssh_options


@dataclass(frozen=True)
class Target:
    path: str  # INVENTORY as given: messages name it as the user wrote it
    only_hosts: Optional[str]
    exclude_hosts: Optional[str]
    connect_timeout: float
    accept_new_host_keys: bool

    def inventory(self) -> inventory.Inventory:
        """Loaded when the command asks, so that its own usage errors come first."""
        return load_inventory(self.path, self.only_hosts, self.exclude_hosts)

    def ssh(self) -> Any:
        return make_options(self.connect_timeout, self.accept_new_host_keys)


def target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-w/-x and the SSH options for a command whose INVENTORY argument is ``inventory_path``:
    the command gets them, with that path, as ``target``."""

    @functools.wraps(fn)
    def with_target(*, inventory_path: str, only_hosts: Optional[str],
                    exclude_hosts: Optional[str], connect_timeout: float,
                    accept_new_host_keys: bool, **rest: Any) -> Any:
        return fn(target=Target(inventory_path, only_hosts, exclude_hosts, connect_timeout,
                                accept_new_host_keys), **rest)

    return selection_options(ssh_options(with_target))
