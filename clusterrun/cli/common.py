"""What every command shares: the local state directory, the inventory as commands load it,
and the SSH options."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Union

import click

from clusterrun import inventory
from clusterrun.home import home as state_home

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def home(*, write: Optional[bool] = None) -> Path:
    """Local state: $CLUSTERRUN_HOME, default ~/.clusterrun; with ``write`` given, first checked
    to be usable (readable, and with ``write=True`` writable) by this user."""
    from clusterrun.runs import store

    path = state_home()
    if write is not None:
        store.check_home(path, write=write)
    return path


def note(text: str) -> None:
    click.echo(f"clusterrun: {text}", err=True)


def nproc_value(_ctx: click.Context, _param: click.Parameter,
                value: Optional[str]) -> Union[int, str, None]:
    """--nproc-per-node as torchrun takes it: a positive number of processes, or a word each
    host resolves: `auto` (its GPUs, else 1), `gpu` (its GPUs), `cpu` (its CPUs)."""
    from clusterrun.inventory.hosts import PER_HOST

    if value is None or value in PER_HOST:
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise click.BadParameter(f"{value!r} is neither a positive number nor `auto` (= the "
                             "host's GPUs, else 1), `gpu` (= its GPUs) or `cpu` (= its CPUs); "
                             "clusterrun counts NVIDIA GPUs only.")


def load_inventory(path: str, hosts: Optional[str] = None,
                   exclude: Optional[str] = None) -> inventory.Inventory:
    """The inventory narrowed to -w/--hosts less -x/--exclude, its local nodes runnable here,
    and every known_hosts file its hosts name readable, before any host is contacted."""
    from clusterrun.inventory.subset import select

    inv, notes = select(inventory.load(path), hosts, exclude)
    for text in notes:
        note(text)
    # Only now: the transport brings paramiko and fabric (~0.1 s), which a mistyped inventory,
    # refused above, never needs.
    from clusterrun.transport import hostkeys
    from clusterrun.transport.local import require_linux

    require_linux(inv.hosts, path)
    hostkeys.check_files(h.known_hosts for h in inv.hosts)
    return inv


def selection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-w/--hosts and -x/--exclude: a subset of the inventory's hosts, as pdsh and clush take."""
    fn = click.option("-x", "--exclude", "exclude_hosts", default=None, metavar="NODESET",
                      help="Leave out these hosts (names or addresses, NodeSet syntax).")(fn)
    return click.option("-w", "--hosts", "only_hosts", default=None, metavar="NODESET",
                        help="Only these hosts, by name or address in NodeSet syntax, e.g. "
                             "gpu[01-04],10.0.0.12.")(fn)


def allow_busy_gpus_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--allow-busy-gpus, as `check` and `launch` take it (it reaches the same preflight)."""
    return click.option("--allow-busy-gpus", is_flag=True,
                        help="Go on when GPUs this run will use are busy (memory in use, other "
                             "users' processes) or unhealthy (compute mode, ECC, row remaps): "
                             "warnings, not failures.")(fn)


def ssh_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--connect-timeout", type=click.FloatRange(min=0.5), default=10.0,
                      show_default=True, metavar="SECONDS",
                      help="TCP connect, SSH banner and auth timeout per host.")(fn)
    return click.option("--accept-new-host-keys", is_flag=True,
                        help="Add unknown host keys to known_hosts (never changed ones).")(fn)


def make_options(connect_timeout: float, accept_new_host_keys: bool) -> Any:
    from clusterrun.transport import SshOptions

    return SshOptions(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)
