"""`clusterrun check` and `clusterrun exec`: every host of an inventory at once."""

from __future__ import annotations

import sys
from typing import Optional

import click

from clusterrun import usage
from clusterrun.cli import complete
from clusterrun.cli.common import CONTEXT, allow_busy_gpus_option, home, note, selection_options
from clusterrun.cli.target import Target, target_options
from clusterrun.errors import Result, UsageError
from clusterrun.inventory import HostSpec
from clusterrun.inventory.subset import select


@click.command(context_settings=CONTEXT)
@click.argument("inventory_path", metavar="INVENTORY", shell_complete=complete.inventories)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--smoke", is_flag=True,
              help="Also run a tiny all-reduce across all hosts on the chosen interfaces.")
@click.option("--bandwidth", is_flag=True,
              help="Also measure each worker's TCP throughput to the master on its chosen "
                   "interface (about a second per worker); with --smoke, the all-reduce's bus "
                   "bandwidth too.")
@allow_busy_gpus_option
@target_options
def check(target: Target, as_json: bool, smoke: bool, bandwidth: bool,
          allow_busy_gpus: bool) -> Result:
    """Preflight every host in parallel: SSH, interfaces, the data path to the master and
    between every pair of hosts, names, software and package parity, GPUs, limits and links
    (docs/troubleshooting.md says what each failure means and how to fix it).

    Exits 0 only when every host passes; 3 when a check fails; 4 when a host cannot be
    reached, authenticated or trusted.
    """
    inv = target.inventory()
    from clusterrun.preflight import checks as preflight  # after: a bad inventory needs none
    from clusterrun.preflight import view as checkview
    from clusterrun.transport.pool import Connections

    smoke_home = home(write=True) if smoke else None  # refused before any host is contacted
    envs = None
    with Connections(target.ssh()) as pool:
        if any(h.environment for h in inv.hosts):
            # `environment:`: each host's must be the lock's (check builds nothing; `clusterrun
            # env` does), and preflight then looks at that environment's interpreter.
            from clusterrun.envs import sync as envsync

            envs = envsync.sync(inv, pool, home(write=True), build=False)
            from clusterrun.envs import view as envview

            if not envs.ok:
                envview.render_plain(envs, sys.stderr)
                hint = envview.what_to_do(envs, target.path)
                if hint:
                    click.echo(hint, err=True)
                if as_json:  # still one JSON object on stdout, as for any failed check
                    envview.check_json(envs, sys.stdout)
                return Result(unreachable=any(h.unreachable for h in envs.hosts),
                              failed_check=True)
            inv = envs.inventory(inv)
        report = preflight.run(inv, pool, bandwidth=bandwidth, allow_busy_gpus=allow_busy_gpus)
        if as_json:
            checkview.render_json(report, sys.stdout, extra={"environment": envview.as_json(envs)}
                                  if envs is not None else None)
        elif sys.stdout.isatty():
            from rich.console import Console  # only for a terminal: rich takes a while to load

            checkview.render_table(report, Console())
        else:
            checkview.render_plain(report, sys.stdout)
        if envs is not None and not as_json:  # each host's environment, as `env --check` says it
            envview.render_plain(envs, sys.stdout)
        if not report.ok:
            return Result(unreachable=bool(report.unreachable), failed_check=True)
        if smoke_home is None:
            return Result()
        from clusterrun.launch import smoke as smoke_test

        return smoke_test.run(inv, report, pool, smoke_home, bandwidth=bandwidth)


@click.command("exec", cls=usage.RemoteCommand, context_settings=CONTEXT)
@click.argument("inventory_path", metavar="INVENTORY", shell_complete=complete.inventories)
@click.argument("cmd", nargs=-1)  # required: said below, with what was meant
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Give up on hosts still running after this long.")
@click.option("--container", "container", metavar="NAME", default=None,
              help="Run it inside this running container on every host (default: the "
                   "inventory's `container:`, where a host has one).")
@click.option("--on-host", is_flag=True,
              help="Run it on the hosts themselves, not in the inventory's containers.")
@target_options
def exec_(target: Target, cmd: tuple[str, ...], timeout: Optional[float],
          container: Optional[str], on_host: bool) -> Result:
    """Run a shell command on every host in parallel (after `setup:`), pdsh-style.

    Every output line is prefixed with the host's name. The words of CMD are joined with spaces,
    as ssh does; quote it to keep shell syntax for the remote side:
    clusterrun exec inv.yaml -- 'nvidia-smi | head -5'. Exits with the largest exit status of
    the hosts, or 4 when a host could not be reached.
    """
    from clusterrun import exec as fanout
    from clusterrun.console import Printer
    from clusterrun.transport.local import require_linux

    if not cmd:
        raise usage.missing_command(click.get_current_context(), target.path, target.only_hosts)
    if container is not None and on_host:
        raise UsageError("give either --container NAME or --on-host, not both.")
    inv = fanout.placed(target.inventory(), container, on_host=on_host)
    require_linux(inv.hosts, target.path)  # --on-host: a local container host's own OS
    printer = Printer()
    results = fanout.run(inv, " ".join(cmd), target.ssh(), printer, timeout)
    lines, result = fanout.summarize(results)
    for line in lines:
        click.echo(line, err=True)
    return result


def _reached(spec: HostSpec) -> str:
    if spec.transport == "srun":
        return f"srun (job {spec.slurm_job})"
    if spec.local:
        return "local"
    return f"ssh via {spec.proxy_jump}" if spec.proxy_jump else "ssh"


@click.command("hosts", context_settings=CONTEXT)
@click.argument("inventory_path", metavar="INVENTORY", shell_complete=complete.inventories)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of hosts.")
@selection_options
def hosts(inventory_path: str, as_json: bool, only_hosts: Optional[str],
          exclude_hosts: Optional[str]) -> None:
    """Show the resolved host table (what a hostfile or a range turned into); no network.

    Columns: source (file:line), name, address, user and port (`-`: from ~/.ssh/config, else the
    local user and 22), how the host is reached (ssh, `ssh via BASTION` with `proxy_jump:`, or
    local for this machine; `> NAME` when
    everything there runs in container NAME), nproc per node, the master, and the spares
    (`spare: true`: held back for restarts).
    """
    import json

    from clusterrun import inventory

    inv, notes = select(inventory.load(inventory_path), only_hosts, exclude_hosts)
    for text in notes:
        note(text)
    rows = [{"source": f"{h.source or inv.path}:{h.line}", "name": h.name, "address": h.host,
             "user": h.user, "port": h.port,
             "reached": _reached(h),
             "container": h.container, "nproc": h.nproc_per_node, "master": h.master,
             "spare": h.spare}
            for h in inv.hosts]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    head = ["SOURCE", "NAME", "ADDRESS", "USER", "PORT", "REACHED", "NPROC", "MASTER", "SPARE"]
    table = [head] + [[str(r["source"]), str(r["name"]), str(r["address"]),
                       str(r["user"] or "-"), str(r["port"] or "-"),
                       str(r["reached"]) + (f" > {r['container']}" if r["container"] else ""),
                       str(r["nproc"]), "yes" if r["master"] else "",
                       "yes" if r["spare"] else ""] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
