"""The hosts a command reaches at once (`check`, `exec`, `env`): INVENTORY less -w/-x, and the SSH
options to reach them with, taken as one value."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

from clusterrun import inventory
from clusterrun.cli.common import (
    host_options,
    load_inventory,
    make_options,
    selection_options,
    ssh_options,
)
from clusterrun.inventory.adhoc import Overrides


@dataclass(frozen=True)
class Target:
    path: Optional[str]  # INVENTORY as given (None: -w alone): messages name it as written
    only_hosts: Optional[str]
    exclude_hosts: Optional[str]
    connect_timeout: float
    accept_new_host_keys: bool
    overrides: Overrides = dataclasses.field(default_factory=Overrides)

    @property
    def named(self) -> str:
        """How messages name the hosts: INVENTORY, else -w's list."""
        return self.path if self.path is not None else f"-w {self.only_hosts}"

    def inventory(self) -> inventory.Inventory:
        """Loaded when the command asks, so that its own usage errors come first."""
        return load_inventory(self.path, self.only_hosts, self.exclude_hosts, self.overrides)

    def ssh(self) -> Any:
        return make_options(self.connect_timeout, self.accept_new_host_keys)


def target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-w/-x, --python/--workdir/--master and the SSH options for a command whose INVENTORY
    argument is ``inventory_path``: the command gets them, with that path, as ``target``."""

    @functools.wraps(fn)
    def with_target(*, inventory_path: Optional[str], only_hosts: Optional[str],
                    exclude_hosts: Optional[str], connect_timeout: float,
                    accept_new_host_keys: bool, python: Optional[str], workdir: Optional[str],
                    master: Optional[str], **rest: Any) -> Any:
        return fn(target=Target(inventory_path, only_hosts, exclude_hosts, connect_timeout,
                                accept_new_host_keys,
                                Overrides(python=python, workdir=workdir, master=master)),
                  **rest)

    return selection_options(host_options(ssh_options(with_target)))
