"""`clusterrun check` and `clusterrun exec`: every host of an inventory at once."""

from __future__ import annotations

import sys
from typing import Optional

import click

from clusterrun.cli.common import (
    CONTEXT,
    home,
    load_inventory,
    make_options,
    ssh_options,
)
from clusterrun.errors import ExitStatus


@click.command(context_settings=CONTEXT)
@click.argument("inventory_path", metavar="INVENTORY")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--smoke", is_flag=True,
              help="Also run a tiny all-reduce across all hosts on the chosen interfaces.")
@ssh_options
def check(inventory_path: str, as_json: bool, smoke: bool, connect_timeout: float,
          accept_new_host_keys: bool) -> None:
    """Preflight every host in parallel: SSH, interfaces, data path to the master, versions.

    Exits 0 only when every host passes; 3 when a check fails; 4 when a host cannot be
    reached, authenticated or trusted.
    """
    from rich.console import Console

    from clusterrun.preflight import checks as preflight
    from clusterrun.preflight import view as checkview
    from clusterrun.transport.pool import Connections

    inv = load_inventory(inventory_path)
    smoke_home = home(write=True) if smoke else None  # refused before any host is contacted
    with Connections(make_options(connect_timeout, accept_new_host_keys)) as pool:
        report = preflight.run(inv, pool)
        if as_json:
            checkview.render_json(report, sys.stdout)
        elif sys.stdout.isatty():
            checkview.render_table(report, Console())
        else:
            checkview.render_plain(report, sys.stdout)
        if not report.ok:
            raise SystemExit(int(ExitStatus.PREFLIGHT if not report.unreachable
                                 else ExitStatus.UNREACHABLE))
        if smoke_home is not None:
            from clusterrun.launch import smoke as smoke_test

            raise SystemExit(smoke_test.run(inv, report, pool, smoke_home))


@click.command("exec", context_settings=CONTEXT)
@click.argument("inventory_path", metavar="INVENTORY")
@click.argument("cmd", nargs=-1, required=True)
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Give up on hosts still running after this long.")
@ssh_options
def exec_(inventory_path: str, cmd: tuple[str, ...], timeout: Optional[float],
          connect_timeout: float, accept_new_host_keys: bool) -> None:
    """Run a shell command on every host in parallel (after `setup:`), pdsh-style.

    Every output line is prefixed with the host's name. The words of CMD are joined with spaces,
    as ssh does; quote it to keep shell syntax for the remote side:
    clusterrun exec inv.yaml -- 'nvidia-smi | head -5'. Exits with the largest exit status of
    the hosts, or 4 when a host could not be reached.
    """
    from clusterrun import exec as fanout
    from clusterrun.console import Printer

    inv = load_inventory(inventory_path)
    printer = Printer()
    results = fanout.run(inv, " ".join(cmd), make_options(connect_timeout, accept_new_host_keys),
                         printer, timeout)
    lines, status = fanout.summarize(results)
    for line in lines:
        click.echo(line, err=True)
    raise SystemExit(int(status))
