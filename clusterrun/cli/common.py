"""What every command shares: the local state directory, the inventory as commands load it,
and the SSH options."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional, Union

import click

from clusterrun import inventory
from clusterrun.errors import UsageError
from clusterrun.home import home as state_home
from clusterrun.inventory import HostSpec
from clusterrun.inventory.adhoc import Overrides

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


NO_HOSTS = ("no hosts given: name them with INVENTORY (a YAML inventory, a hostfile, `slurm`, "
            "or a host list such as gpu[01-04]) or with -w HOSTS.")


def resolve_inventory(path: Optional[str], hosts: Optional[str] = None,
                      exclude: Optional[str] = None,
                      overrides: Optional[Overrides] = None) -> inventory.Inventory:
    """INVENTORY (None: -w's hosts are the inventory) less what -w/-x leave out, with the
    command line's settings; its notes said on stderr. Nothing is checked on this machine."""
    from clusterrun.inventory.subset import select

    if path is None:
        if hosts is None:
            raise UsageError(NO_HOSTS)
        from clusterrun.inventory.load import from_hosts

        inv, notes = select(from_hosts(hosts, "-w/--hosts"), None, exclude)
    else:
        inv, notes = select(inventory.load(path), hosts, exclude)
    if overrides is not None:
        inv, more = overrides.apply(inv)
        notes += more
    for text in notes:
        note(text)
    return inv


def load_inventory(path: Optional[str], hosts: Optional[str] = None,
                   exclude: Optional[str] = None,
                   overrides: Optional[Overrides] = None) -> inventory.Inventory:
    """The inventory narrowed to -w/--hosts less -x/--exclude (with no INVENTORY, -w's hosts
    are the inventory), the command line's settings applied, its local nodes runnable here,
    and every known_hosts file its hosts name readable, before any host is contacted."""
    inv = resolve_inventory(path, hosts, exclude, overrides)
    from clusterrun.transport.local import require_linux

    require_linux(inv.hosts, path or str(hosts))
    check_known_hosts(inv.hosts)
    return inv


def check_known_hosts(hosts: Sequence[HostSpec]) -> None:
    """Every known_hosts file readable, or LocalFilesError naming the bad line. With the warm
    session on, only the files of the hosts it reaches over SSH (local and srun hosts read
    none), and its daemon reads them when one runs: it has paramiko loaded, so a command that
    reaches its hosts through it never imports paramiko. Without a daemon, or when it finds a
    bad file, they are read here."""
    from clusterrun import transport

    files = [h.known_hosts for h in hosts]
    if transport.route is not None:
        files = [h.known_hosts for h in hosts if not h.local and h.transport != "srun"]
        if not files:
            return
        from clusterrun.session import client

        if client.known_hosts_readable(files):
            return
    # Only now: paramiko costs ~0.1 s to import, which a mistyped inventory, refused before
    # this, never needs.
    from clusterrun.transport import hostkeys

    hostkeys.check_files(files)


def selection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-w/--hosts and -x/--exclude: a subset of the inventory's hosts, as pdsh and clush take."""
    fn = click.option("-x", "--exclude", "exclude_hosts", default=None, metavar="NODESET",
                      help="Leave out these hosts (names or addresses, NodeSet syntax).")(fn)
    return click.option("-w", "--hosts", "only_hosts", default=None, metavar="NODESET",
                        help="Only these hosts, by name or address in NodeSet syntax, e.g. "
                             "gpu[01-04],10.0.0.12. Alone, with no INVENTORY: these hosts, "
                             "each reached as ~/.ssh/config says.")(fn)


def host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--python, --workdir and --master: what an inventory file would say, for every host (the
    way to say it for hosts named on the command line; over a file's own settings otherwise)."""
    fn = click.option("--master", default=None, metavar="HOST",
                      help="This host (name or address) is the master, rank 0 (default: the "
                           "inventory's `master: true`, else the first host).")(fn)
    fn = click.option("--workdir", default=None, metavar="DIR",
                      help="Working directory on every host (default: the inventory's, else "
                           "~/clusterrun).")(fn)
    return click.option("--python", default=None, metavar="PATH",
                        help="Python interpreter on every host (default: the inventory's, "
                             "else python3).")(fn)


def allow_busy_gpus_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--allow-busy-gpus, as `check` and `launch` take it (it reaches the same preflight)."""
    return click.option("--allow-busy-gpus", is_flag=True,
                        help="Go on when GPUs this run will use are busy (memory in use, other "
                             "users' processes) or unhealthy (compute mode, ECC, row remaps): "
                             "warnings, not failures.")(fn)


def _no_session(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        from clusterrun import transport

        os.environ["CLUSTERRUN_SESSION"] = "0"  # what this command starts goes direct too
        transport.route = None


def ssh_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--no-session", is_flag=True, expose_value=False, callback=_no_session,
                      help="Reach the hosts directly, not through the warm session "
                           "(CLUSTERRUN_SESSION=0: always).")(fn)
    fn = click.option("--connect-timeout", type=click.FloatRange(min=0.5), default=10.0,
                      show_default=True, metavar="SECONDS",
                      help="TCP connect, SSH banner and auth timeout per host.")(fn)
    return click.option("--accept-new-host-keys", is_flag=True,
                        help="Add unknown host keys to known_hosts (never changed ones).")(fn)


def make_options(connect_timeout: float, accept_new_host_keys: bool) -> Any:
    from clusterrun.transport import SshOptions

    return SshOptions(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)
