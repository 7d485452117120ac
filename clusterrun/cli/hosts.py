"""`clusterrun check` and `clusterrun exec`: every host of an inventory at once."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Optional, Union

import click

from clusterrun import usage
from clusterrun.cli import complete
from clusterrun.cli.common import (
    CONTEXT,
    allow_busy_gpus_option,
    home,
    host_options,
    nproc_value,
    resolve_inventory,
    selection_options,
)
from clusterrun.cli.target import Target, target_options
from clusterrun.errors import Result, UsageError
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.inventory.adhoc import Overrides
from clusterrun.remote.shared import layout


@click.command(context_settings=CONTEXT)
@click.argument("inventory_path", metavar="[INVENTORY]", required=False,
                shell_complete=complete.inventories)
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
                hint = envview.what_to_do(envs, target.named)
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
@click.argument("inventory_path", metavar="[INVENTORY]", required=False,
                shell_complete=complete.inventories)  # or -w alone
@click.argument("cmd", nargs=-1)  # required: said below, with what was meant
@click.option("-b", "--gather", is_flag=True,
              help="Print each distinct output once, under the hosts that printed it "
                   "(clush -b); stderr still comes as it arrives, prefixed, on stderr.")
@click.option("-f", "--fanout", type=click.IntRange(min=1), default=None, metavar="N",
              help="Work on at most N hosts at once (default: all).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: per host its exit status, stdout, stderr and time.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Give up on hosts still running after this long.")
@click.option("--container", "container", metavar="NAME", default=None,
              help="Run it inside this running container on every host (default: the "
                   "inventory's `container:`, where a host has one).")
@click.option("--on-host", is_flag=True,
              help="Run it on the hosts themselves, not in the inventory's containers.")
@target_options
def exec_(target: Target, cmd: tuple[str, ...], gather: bool, fanout: Optional[int],
          as_json: bool, timeout: Optional[float], container: Optional[str],
          on_host: bool) -> Result:
    """Run a shell command on every host in parallel (after `setup:`), pdsh-style.

    Every output line is prefixed with the host's name (-b: each distinct output once, under
    its hosts); then the hosts grouped by exit status, on stderr. The words of CMD are joined
    with spaces, as ssh does; quote it to keep shell syntax for the remote side:
    clusterrun exec inv.yaml -- 'nvidia-smi | head -5'. INVENTORY may be a host list, and -w
    may stand alone: clusterrun exec -w 'gpu[01-04]' -- hostname. Exits with the largest exit
    status of the hosts, or 4 when a host could not be reached.
    """
    from clusterrun import exec as runner
    from clusterrun import execview
    from clusterrun.console import Printer
    from clusterrun.transport.local import require_linux

    ctx = click.get_current_context()
    path, cmd = usage.exec_words(ctx, target.path, cmd, target.only_hosts)
    if not cmd:
        raise usage.missing_command(ctx, path, target.only_hosts)
    if path is None:  # -w alone: its hosts are the inventory
        target = dataclasses.replace(target, path=None)
    if container is not None and on_host:
        raise UsageError("give either --container NAME or --on-host, not both.")
    inv = runner.placed(target.inventory(), container, on_host=on_host)
    require_linux(inv.hosts, target.named)  # --on-host: a local container host's own OS
    collected = None
    if as_json:  # stdout holds the document alone
        collected = execview.Collected()
    elif gather:  # stdout waits for the end; stderr comes as it arrives, as with clush -b
        collected = execview.Collected(runner.prefixed(Printer(sys.stderr)),
                                       frozenset({layout.EXEC_ERR}))
    results = runner.run(inv, " ".join(cmd), target.ssh(),
                         collected if collected is not None else runner.prefixed(Printer()),
                         timeout, fanout=fanout or runner.RUNNING)
    lines, result = execview.summarize(results)
    if collected is not None and as_json:
        click.echo(json.dumps(execview.document(results, collected, result, gathered=gather),
                              indent=2))
        return result
    if collected is not None:
        execview.render_gathered(execview.gather([r.name for r in results], collected),
                                 sys.stdout)
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
@click.argument("inventory_path", metavar="[INVENTORY]", required=False,
                shell_complete=complete.inventories)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of hosts.")
@click.option("--yaml", "as_yaml", is_flag=True,
              help="Print the hosts as an inventory file to keep (it loads back to the same "
                   "hosts): clusterrun hosts 'gpu[01-04]' --yaml > inv.yaml.")
@click.option("--nproc-per-node", callback=nproc_value, default=None, metavar="N|auto",
              help="Processes per host (default: the inventory's, else `auto` = GPUs or 1).")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="Environment for the ranks on every host; repeatable.")
@selection_options
@host_options
def hosts(inventory_path: Optional[str], as_json: bool, as_yaml: bool,
          nproc_per_node: Union[int, str, None], env_pairs: tuple[str, ...],
          only_hosts: Optional[str], exclude_hosts: Optional[str], python: Optional[str],
          workdir: Optional[str], master: Optional[str]) -> None:
    """Show the resolved host table (what a hostfile, a range or a host list turned into); no
    network. INVENTORY may be a host list (gpu[01-04]), or -w may stand alone.

    Columns: source (file:line), name, address, user and port (`-`: from ~/.ssh/config, else the
    local user and 22), how the host is reached (ssh, `ssh via BASTION` with `proxy_jump:`, or
    local for this machine; `> NAME` when
    everything there runs in container NAME), nproc per node, the master, and the spares
    (`spare: true`: held back for restarts). --yaml prints an inventory file instead, with
    what ~/.ssh/config says of each host beside it.
    """
    if as_json and as_yaml:
        raise UsageError("give either --json or --yaml, not both.")
    from clusterrun.plan.build import parse_env

    if any("=" not in pair for pair in env_pairs):
        raise UsageError("hosts --env takes NAME=VALUE: a value written into an inventory is "
                         "no secret (pass secrets at launch, `launch --env NAME`).")
    overrides = Overrides(python=python, workdir=workdir, nproc_per_node=nproc_per_node,
                          env=tuple(parse_env(env_pairs).items()), master=master)
    inv = resolve_inventory(inventory_path, only_hosts, exclude_hosts, overrides)
    if as_yaml:
        click.echo(inventory_yaml(inv, inventory_path, only_hosts), nl=False)
        return
    rows = [{"source": "command line" if inv.adhoc else f"{h.source or inv.path}:{h.line}",
             "name": h.name, "address": h.host,
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


def inventory_yaml(inv: Inventory, path: Optional[str], only_hosts: Optional[str]) -> str:
    """``inv`` as a file to keep, each host with what ~/.ssh/config says of it now (read as the
    connection reads it)."""
    from clusterrun.inventory.adhoc import to_yaml
    from clusterrun.transport.ssh import ssh_config_says

    given = path if path is not None else f"-w {only_hosts}"
    beside = {h.name: ssh_config_says(h.host) for h in inv.hosts
              if h.transport == "ssh" and not h.local}
    return to_yaml(inv, f"made from {given}", {k: v for k, v in beside.items() if v})
