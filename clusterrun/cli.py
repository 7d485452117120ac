"""The command line. This is the only place exceptions become exit statuses."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Union

import click

from clusterrun import __version__, inventory, usage
from clusterrun.errors import ClusterrunError, ExitStatus, UsageError
from clusterrun.home import home as state_home
from clusterrun.runs import names

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
    """--nproc-per-node: a positive number of processes, or `auto` (the host's GPUs, else 1)."""
    if value is None or value == inventory.AUTO:
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise click.BadParameter(f"{value!r} is neither a positive number nor `auto` (= the "
                             "host's GPUs, else 1).")


def load_inventory(path: str) -> inventory.Inventory:
    """The inventory, and every known_hosts file it names readable, before any host is
    contacted."""
    from clusterrun.transport import hostkeys

    inv = inventory.load(path)
    hostkeys.check_files(h.known_hosts for h in inv.hosts)
    return inv


def ssh_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--connect-timeout", type=click.FloatRange(min=0.5), default=10.0,
                      show_default=True, metavar="SECONDS",
                      help="TCP connect, SSH banner and auth timeout per host.")(fn)
    return click.option("--accept-new-host-keys", is_flag=True,
                        help="Add unknown host keys to known_hosts (never changed ones).")(fn)


def make_options(connect_timeout: float, accept_new_host_keys: bool) -> Any:
    from clusterrun.transport import SshOptions

    return SshOptions(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="clusterrun")
def cli() -> None:
    """Launch one PyTorch training script on many machines over SSH.

    \b
    clusterrun check INVENTORY          preflight every host
    clusterrun launch INVENTORY SCRIPT  run SCRIPT with torchrun on every host
    clusterrun logs -f                  follow the latest run's logs
    """


@cli.command(context_settings=CONTEXT)
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


@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
@click.argument("inventory_path", metavar="INVENTORY")
@click.argument("script", metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[ARGS]...")
@click.option("--nproc-per-node", callback=nproc_value, default=None, metavar="N|auto",
              help="Processes per host (default: the inventory's, `auto` = GPUs or 1).")
@click.option("--master-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="Port of torch's c10d store on the master (default: a free one, checked).")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE|KEY",
              help="Extra environment for every rank; repeatable. Values arrive byte-exact. "
                   "KEY alone passes on KEY's value from this shell (for secrets).")
@click.option("--no-check", is_flag=True,
              help="Launch even if preflight checks fail (hosts must still be reachable).")
@click.option("--no-sync", is_flag=True,
              help="Do not copy the script's directory (a shared filesystem has it already).")
@click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
              help="Do not copy files matching PATTERN (besides .git, __pycache__, venvs).")
@click.option("--dry-run", is_flag=True, help="Print the per-host plan and start nothing.")
@click.option("--detach", is_flag=True,
              help="Return once every host has started; the run goes on without this terminal.")
@click.option("--name", default=None, help="A name for the run (default: the script's name).")
@click.option("--grace", type=click.FloatRange(min=0), default=15.0, show_default=True,
              metavar="SECONDS", help="Between SIGTERM and SIGKILL when a run is stopped.")
@click.option("--lease", type=click.FloatRange(min=5), default=30.0, show_default=True,
              metavar="SECONDS",
              help="A host that hears nothing from this controller for this long ends the run.")
@ssh_options
def launch(inventory_path: str, script: str, args: tuple[str, ...],
           nproc_per_node: Union[int, str, None], master_port: Optional[int],
           env_pairs: tuple[str, ...], no_check: bool, no_sync: bool, excludes: tuple[str, ...],
           dry_run: bool, detach: bool, name: Optional[str], grace: float, lease: float,
           connect_timeout: float, accept_new_host_keys: bool) -> None:
    """Run SCRIPT with torchrun on every host: check, sync, rank, launch, stream, tear down.

    Options go before INVENTORY; everything after SCRIPT is passed to the script untouched,
    as with torchrun: clusterrun launch inv.yaml train.py --lr 0.1

    Every output line shows as [node rRANK] line; logs are kept under
    $CLUSTERRUN_HOME/runs/<run-id>/. When any rank fails or a host is lost, every host is
    stopped. Exit status: 0 success; the root-cause rank's exit code; 2 usage; 3 preflight
    failed; 4 host unreachable; 5 node lost; 130 Ctrl-C; 143 SIGTERM.
    """
    from clusterrun.launch import launcher as launching
    from clusterrun.plan.build import parse_env

    usage.check_launch_words(inventory_path, script, args, click.get_current_context().command,
                             "clusterrun launch")
    inv = load_inventory(inventory_path)
    if nproc_per_node == inventory.AUTO:  # for every host, whatever the inventory says
        inv = dataclasses.replace(inv, hosts=tuple(
            dataclasses.replace(h, nproc_per_node=inventory.AUTO) for h in inv.hosts))
    launch_home = home(write=not dry_run)  # a dry run records nothing
    opts = launching.LaunchOptions(
        nproc_per_node=nproc_per_node if isinstance(nproc_per_node, int) else None,
        master_port=master_port,
        env=tuple(parse_env(env_pairs).items()), check=not no_check, sync=not no_sync,
        dry_run=dry_run, detach=detach, name=name, grace=grace, lease=lease, excludes=excludes)
    status = launching.run(inv, script, args,
                           ssh=make_options(connect_timeout, accept_new_host_keys), opts=opts,
                           home=launch_home)
    raise SystemExit(status)


@cli.command("exec", context_settings=CONTEXT)
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


@cli.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("-f", "--follow", is_flag=True,
              help="Keep showing new lines until the run ends (also from a new shell).")
@click.option("--node", "nodes", multiple=True, metavar="NAME", help="Only this node; repeatable.")
@click.option("--rank", "ranks_", multiple=True, type=click.IntRange(min=0), metavar="R",
              help="Only this global rank; repeatable.")
@click.option("--grep", "pattern", default=None, metavar="REGEX",
              help="Only lines matching this regular expression.")
@click.option("--tail", type=click.IntRange(min=0), default=None, metavar="N",
              help="Start with the last N lines.")
@ssh_options
def logs(run_id: Optional[str], follow: bool, nodes: tuple[str, ...], ranks_: tuple[int, ...],
         pattern: Optional[str], tail: Optional[int], connect_timeout: float,
         accept_new_host_keys: bool) -> None:
    """Aggregated logs of a run (the latest by default), every line prefixed [node rRANK].

    A finished run is read from the local mirrors; with -f a live run is followed from its
    hosts' files by byte offset, resuming where the mirrors end, so nothing is lost or shown
    twice, also after the launching terminal has gone.
    """
    import re

    from clusterrun.console import Printer
    from clusterrun.logs import show as logview_cmd
    from clusterrun.logs.view import Filter

    try:
        grep = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise ClusterrunError(f"--grep {pattern!r}: not a valid regular expression ({exc}).",
                              exit_status=ExitStatus.USAGE) from None
    run = names.resolve(home(write=False), run_id, note=note)
    known = {n["name"] for n in run.plan.get("nodes", [])}
    unknown = set(nodes) - known
    if unknown:
        raise ClusterrunError(f"run {run.id} has no node {', '.join(sorted(unknown))}; its "
                              f"nodes: {', '.join(sorted(known))}.", exit_status=ExitStatus.USAGE)
    world = int(run.plan.get("world_size") or 0)
    missing = sorted(set(ranks_) - set(range(world)))
    if missing:
        raise UsageError(f"run {run.id} has no rank {', '.join(map(str, missing))}; it has "
                         f"ranks 0-{world - 1}.")
    flt = Filter(nodes=nodes, ranks=ranks_, grep=grep)
    status = logview_cmd.show(run, flt, tail=tail, follow=follow,
                              ssh=make_options(connect_timeout, accept_new_host_keys),
                              printer=Printer(),
                              say=lambda text: click.echo(f"clusterrun: {text}", err=True))
    raise SystemExit(status)


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of runs, newest first.")
@click.option("--local", "local_only", is_flag=True,
              help="Do not ask the hosts about runs that may still be going.")
@ssh_options
def ps(as_json: bool, local_only: bool, connect_timeout: float,
       accept_new_host_keys: bool) -> None:
    """List runs, newest first: id, name, state, hosts, start time, duration.

    States: running, succeeded, failed, stopped, lost (a node or the controller was lost).
    """
    import json
    import time

    from clusterrun.runs import ps as listing

    rows = listing.ps_rows(home(write=False), make_options(connect_timeout, accept_new_host_keys),
                            refresh_remote=not local_only)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no runs yet")
        return
    click.echo(f"{'RUN':34} {'STATE':10} {'STARTED':19} {'DURATION':>9}  HOSTS")
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started_at"] or 0))
        duration = f"{row['duration']:.0f}s" if row["duration"] is not None else "-"
        click.echo(f"{row['id']:34} {row['state']:10} {started:19} {duration:>9}  "
                   f"{','.join(row['hosts'])}")


@cli.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@click.option("--grace", type=click.FloatRange(min=0), default=15.0, show_default=True,
              metavar="SECONDS", help="Between SIGTERM and SIGKILL.")
@click.option("--force", is_flag=True, help="SIGKILL at once.")
@ssh_options
def stop(run_id: str, grace: float, force: bool, connect_timeout: float,
         accept_new_host_keys: bool) -> None:
    """End a run on every host (graceful, then forced), also after its controller died.

    Only this run's processes are touched: other runs on the same hosts go on.
    """
    from clusterrun.runs import lifecycle
    from clusterrun.runs import remote as remote_runs

    run = names.resolve(home(write=True), run_id, note=note, prefer=lifecycle.live)
    ended = lifecycle.recorded(run)
    if ended is not None and ended.final:
        # The one run-state rule: an ended run keeps the state it ended with.
        click.echo(f"run {run.id} already {ended.value}; nothing to stop")
        return
    ssh = make_options(connect_timeout, accept_new_host_keys)
    results = remote_runs.stop(run, ssh, grace, force)
    failed = []
    for name, result in results.items():
        if "error" in result:
            failed.append(name)
            click.echo(f"{name}: {result['error']}", err=True)
            continue
        final = (result.get("state") or {}).get("state", "not found")
        click.echo(f"{name}: {final}")
    if failed:
        click.echo(f"run {run.id}: NOT stopped on {', '.join(failed)}", err=True)
        raise SystemExit(int(ExitStatus.UNREACHABLE))
    if lifecycle.watched(run):
        click.echo(f"run {run.id}: stopped; its launch in another terminal records how it ended")
        return
    state = lifecycle.settle(run, ssh)
    if not state.final:  # every host answered that it stopped: nothing of it is left
        state = lifecycle.record(run, lifecycle.RunState.STOPPED,
                                 exit_status=int(ExitStatus.SIGTERM))
    click.echo(f"run {run.id} {state.value}")


@cli.group(context_settings=CONTEXT)
def sandbox() -> None:
    """A local simulated cluster: network namespaces + one sshd per host (Linux, root)."""


@sandbox.command("up", context_settings=CONTEXT)
@click.argument("n", type=click.IntRange(1, 250))
@click.option("--decoy", is_flag=True,
              help="Give every host a virbr0 with 192.168.122.1/24, as libvirt hosts have.")
def sandbox_up(n: int, decoy: bool) -> None:
    """Build N hosts and write an inventory under $CLUSTERRUN_HOME/sandbox/."""
    from clusterrun import sandbox as sb

    root = home() / "sandbox"
    if (root / "sandbox.json").exists():
        raise ClusterrunError(
            f"a sandbox already exists in {root}; remove it first with `clusterrun sandbox down`.",
            exit_status=ExitStatus.USAGE)
    box = sb.up(n, root, decoy=decoy)
    click.echo(f"{n} hosts up: " + ", ".join(f"{h.name} {h.address} ({h.ifname})"
                                              for h in box.hosts))
    click.echo(f"inventory: {box.inventory}")
    click.echo(f"try: clusterrun check {box.inventory}")


@sandbox.command("down", context_settings=CONTEXT)
def sandbox_down() -> None:
    """Remove the sandbox cluster and everything running in it."""
    from clusterrun import sandbox as sb

    root = home() / "sandbox"
    sb.down(root)
    click.echo(f"sandbox removed ({root})")


def _inside(folder: Path, path: str) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the CLI and turn every outcome into an exit status."""
    try:
        status = cli.main(args=argv, prog_name="clusterrun", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        click.echo(f"clusterrun: error: {usage.from_click(exc).message}", err=True)
        sys.exit(ExitStatus.USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(ExitStatus.SIGINT)
    except ClusterrunError as exc:
        click.echo(f"clusterrun: error: {exc.message}", err=True)
        sys.exit(int(exc.exit_status))
    except KeyboardInterrupt:
        click.echo("clusterrun: interrupted", err=True)
        sys.exit(ExitStatus.SIGINT)
    except BrokenPipeError:
        sys.stderr.close()  # a closed pager or `| head`: not an error worth a traceback
        sys.exit(ExitStatus.SUCCESS)
    except PermissionError as exc:
        # Anything in $CLUSTERRUN_HOME that is not ours (a run directory another user made):
        # the same error as for the directory itself. Anything else is a bug: a traceback.
        from clusterrun.runs import store

        if not exc.filename or not _inside(state_home(), exc.filename):
            raise
        click.echo(f"clusterrun: error: {store.unusable(state_home(), exc.filename).message}",
                   err=True)
        sys.exit(ExitStatus.USAGE)
    sys.exit(status if isinstance(status, int) else ExitStatus.SUCCESS)
