"""`clusterrun env`: build, refresh, check or prune every host's `environment:`."""

from __future__ import annotations

import contextlib
import sys

import click

from clusterrun.cli import complete
from clusterrun.cli.common import CONTEXT, home, note
from clusterrun.cli.target import Target, target_options
from clusterrun.errors import Result, UsageError


@click.command("env", context_settings=CONTEXT)
@click.argument("inventory_path", metavar="[INVENTORY]", required=False,
                shell_complete=complete.inventories)
@click.option("--check", "check_only", is_flag=True,
              help="Only report each host's drift from the lock, package by package; change "
                   "nothing.")
@click.option("--prune", is_flag=True,
              help="Afterwards remove every environment but the current and the previous one "
                   "on each host.")
@click.option("--json", "as_json", is_flag=True,
              help='One object: {"ok", "sent_bytes", "hosts": [{"name", "state", "lock", '
                   '"path", "platform", "hash", "drift", "problem", ...}]}.')
@target_options
def env(target: Target, check_only: bool, prune: bool, as_json: bool) -> Result:
    """Build or refresh the inventory's `environment:` on every host, without launching.

    Each host gets <workdir>/envs/<lock hash>, built offline with uv from the lock's wheels;
    only the wheels a host lacks move, and they cross this machine's link once (the master
    serves them to the others). A host already holding the lock's environment is left as it
    is. On a terminal, a progress bar per host. Exits 0 when every host holds the lock's
    environment, 3 when one differs (--check) or cannot get it, 4 when a host cannot be
    reached, 6 when a host's disk is full.
    """
    if check_only and prune:
        raise UsageError("--check changes nothing and --prune removes environments: give one.")
    inv = target.inventory()
    if not any(h.environment for h in inv.hosts):
        raise UsageError(f"{target.named}: no host has an `environment:`; add one (a lock "
                         "file with == pins) to `defaults:` or to the hosts that need it.")
    from clusterrun.envs import sync as envsync
    from clusterrun.envs import view
    from clusterrun.transport import programs
    from clusterrun.transport.pool import Connections

    state = home(write=True)
    # A bar per host on a terminal; plain lines (and --json) elsewhere.
    bars = view.Bars() if sys.stderr.isatty() and not as_json else None
    with Connections(target.ssh()) as pool, \
            bars or contextlib.nullcontext():
        worker = envsync.Sync(inv, pool, state, say=bars.say if bars else note,
                              progress=bars.update if bars else None)
        report = worker.run(build=not check_only)
        if prune and report.ok:
            worker.prune()
            programs.release(*pool.transports.values())
    disk_full = any(h.disk_full for h in report.hosts) and not any(h.unreachable
                                                                    for h in report.hosts)
    if as_json:
        view.render_json(report, sys.stdout)
    else:  # what failed on stderr, once: a full disk's paragraph comes with its exit status
        view.render_plain(report, sys.stdout, None if disk_full else sys.stderr)
        hint = view.what_to_do(report, target.named) if check_only else None
        if hint:
            click.echo(hint, err=True)
    if disk_full:
        report.raise_if_failed()  # exit 6, as for a payload that does not fit
    return Result(unreachable=any(h.unreachable for h in report.hosts),
                  failed_check=not report.ok)
