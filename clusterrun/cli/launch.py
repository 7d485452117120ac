"""`clusterrun launch`: one training script (or module) on every host."""

from __future__ import annotations

from typing import Any, Optional

import click

from clusterrun import usage
from clusterrun.cli import complete
from clusterrun.cli.common import (
    CONTEXT,
    NO_HOSTS,
    allow_busy_gpus_option,
    home,
    host_options,
    load_inventory,
    make_options,
    note,
    nproc_value,
    selection_options,
    ssh_options,
)
from clusterrun.errors import Result, UsageError
from clusterrun.inventory.adhoc import Overrides
from clusterrun.launch.options import GRACE, LEASE, STALL_TIMEOUT
from clusterrun.plan import torchrun
from clusterrun.remote.shared.protocol import STALL_REPORT, STALL_STOP


@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                               "allow_interspersed_args": False},
               epilog=torchrun.help_text())
@click.argument("inventory_path", metavar="[INVENTORY]", required=False,  # or -w alone
                shell_complete=complete.inventories)
@click.argument("script", metavar="SCRIPT", required=False, shell_complete=complete.files)
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[ARGS]...",
                shell_complete=complete.files)
@click.option("-m", "--module", default=None, metavar="MODULE",
              help="Run a module, as `python -m` does, instead of SCRIPT (its package, found "
                   "from here, is copied to every host).")
@click.option("--nproc-per-node", "--nproc_per_node", "nproc_per_node", callback=nproc_value,
              default=None, metavar="N|auto|gpu|cpu",
              help="Processes per host (default: the inventory's): N, or per host `gpu` = its "
                   "GPUs, `cpu` = its CPUs, `auto` = its GPUs, else 1.")
@click.option("--nnodes", default=None, hidden=True, metavar="N",
              help="torchrun's: accepted when it is the inventory's host count (see below).")
@click.option("--master-port", "--master_port", "master_port", type=click.IntRange(1, 65535),
              default=None, metavar="PORT",
              help="Port of torch's c10d store on the master (default: a free one, checked).")
@click.option("--no-torchrun", is_flag=True,
              help="Start nproc_per_node copies of the script on each host directly, each with "
                   "torchrun's environment (RANK, WORLD_SIZE, ...), for scripts that "
                   "rendezvous themselves.")
@click.option("--local-rank-arg", is_flag=True,
              help="Every process also gets --local_rank=N as its first argument (scripts "
                   "written for python -m torch.distributed.launch).")
@click.option("--torchrun-arg", "torchrun_args", multiple=True, metavar="--OPTION[=VALUE]",
              help="Pass one more option to torchrun; repeatable. Options clusterrun sets "
                   "itself (--nnodes, --node-rank, --master-addr, ...) are refused; see the "
                   "table below.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE|KEY",
              help="Extra environment for every rank; repeatable. Values arrive byte-exact. "
                   "KEY alone passes on KEY's value from this shell (for secrets).")
@click.option("--env-file", default=None, metavar="PATH", shell_complete=complete.files,
              help="Environment for every rank from a dotenv file (NAME=value lines).")
@click.option("--forward-env", multiple=True, metavar="GLOB",
              help="Also forward variables matching GLOB from this shell; repeatable (NCCL_*, "
                   "WANDB_*, HF_*, ... are forwarded already).")
@click.option("--no-check", is_flag=True,
              help="Launch even if preflight checks fail (hosts must still be reachable).")
@allow_busy_gpus_option
@click.option("--no-sync", is_flag=True,
              help="Do not copy the script's directory (a shared filesystem has it already).")
@click.option("--exclude-files", "excludes", multiple=True, metavar="PATTERN",
              help="Do not copy files matching PATTERN (besides .git, __pycache__, venvs).")
@click.option("--dry-run", is_flag=True, help="Print the per-host plan and start nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON on stdout: with --dry-run the plan as one object; else the run's "
                   "events as JSON lines, then a summary line (the ranks' lines stay in its "
                   "logs: `clusterrun logs --json`).")
@click.option("--detach", is_flag=True,
              help="Return once every host has started; the run goes on without this terminal.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N",
              help="After a failure, start the run again up to N times on healthy hosts, "
                   "spares taking the failed hosts' places (docs/restarts.md). Needs the "
                   "attached controller: not with --detach.")
@click.option("--min-nodes", type=click.IntRange(min=1), default=None, metavar="M",
              help="With --max-restarts: when no spare is left, restart on fewer hosts, down to "
                   "M (node ranks renumbered, the world shrinks; default: the full count).")
@click.option("--notify", default=None, metavar="CMD",
              help="Run CMD on this machine for each event of the run (started, each rank's "
                   "first line, stalled, a failed rank, a lost host, a restart, finished), the "
                   "event's JSON on its stdin, secrets masked (docs/observability.md).")
@click.option("--stall-timeout", type=click.FloatRange(min=0), default=STALL_TIMEOUT,
              show_default=True,
              metavar="SECONDS",
              help="Call the run stalled when no rank has made progress (a new line, or CPU "
                   "outside a collective) for this long, and report every rank's stack; 0: off.")
@click.option("--on-stall", type=click.Choice([STALL_REPORT, STALL_STOP]), default=STALL_REPORT,
              show_default=True,
              help="After the stall report: let the run wait, or end it everywhere (exit 7).")
@click.option("--name", default=None, help="A name for the run (default: the script's name).")
@click.option("--grace", type=click.FloatRange(min=0), default=GRACE, show_default=True,
              metavar="SECONDS", help="Between SIGTERM and SIGKILL when a run is stopped.")
@click.option("--lease", type=click.FloatRange(min=5), default=LEASE, show_default=True,
              metavar="SECONDS",
              help="A host that hears nothing from this controller for this long ends the run.")
@selection_options
@host_options
@ssh_options
def launch(inventory_path: Optional[str], script: Optional[str], args: tuple[str, ...],
           **opt: Any) -> Result:
    """Run SCRIPT with torchrun on every host: check, sync, rank, launch, stream, tear down.

    Options go before INVENTORY; everything after SCRIPT is passed to the script untouched,
    as with torchrun: clusterrun launch inv.yaml train.py --lr 0.1. INVENTORY may be a host
    list (clusterrun launch 'gpu[01-04]' train.py), or -w may stand alone (clusterrun launch
    -w 'gpu[01-04]' train.py): each host is then reached as ~/.ssh/config says. The exact words
    {node_rank}, {nnodes}, {master_addr}, {master_port} in the arguments (with --no-torchrun
    also {rank}, {local_rank}, {world_size}) are filled in per host or process; {{ is a
    literal {.

    Every output line shows as [node rRANK] line; logs are kept under
    $CLUSTERRUN_HOME/runs/<run-id>/. When any rank fails or a host is lost, every host is
    stopped. Exit status: 0 success; the root-cause rank's exit code; 2 usage; 3 preflight
    failed; 4 host unreachable; 5 node lost; 6 copying the code failed; 7 stalled and ended by
    --on-stall stop; 130 Ctrl-C; 143 SIGTERM.
    """
    from clusterrun.launch import launcher as launching
    from clusterrun.plan.build import parse_env

    env_pairs = tuple(parse_env(opt["env_pairs"]).items())
    if opt["only_hosts"] is not None and inventory_path is not None and _not_inventory(
            inventory_path, module=opt["module"] is not None):
        # -w alone: the first word is already the script's (or the module's first argument).
        words = (inventory_path, script) if script is not None else (inventory_path,)
        inventory_path, script, args = None, words[0], (*words[1:], *args)
    if inventory_path is None and opt["only_hosts"] is None:
        raise UsageError(NO_HOSTS)
    if opt["module"] is not None:
        # With -m there is no SCRIPT: the word after INVENTORY is the module's first argument.
        usage.check_launch_words(inventory_path or "", "", (),
                                 click.get_current_context().command, "clusterrun launch")
        args = (script, *args) if script is not None else args
        script = None
    elif script is not None:
        usage.check_launch_words(inventory_path or "", script, args,
                                 click.get_current_context().command, "clusterrun launch")
    job = launching.job_for(script, args, module=opt["module"], torchrun=not opt["no_torchrun"],
                            local_rank_arg=opt["local_rank_arg"],
                            torchrun_args=opt["torchrun_args"])
    _check_restarts(opt["max_restarts"], opt["min_nodes"], detach=opt["detach"])
    nproc = opt["nproc_per_node"]
    overrides = Overrides(python=opt["python"], workdir=opt["workdir"], master=opt["master"],
                          nproc_per_node=nproc)
    inv = load_inventory(inventory_path, opt["only_hosts"], opt["exclude_hosts"], overrides)
    starts = len(inv.active)
    if opt["min_nodes"] is not None and opt["min_nodes"] > starts:
        raise UsageError(f"--min-nodes {opt['min_nodes']} is more than the {starts} "
                         f"host{'s' if starts != 1 else ''} a run starts on in {inv.path} "
                         "(spares not counted): give at most that many.")
    _check_nnodes(opt["nnodes"], starts, inv.path)
    launch_home = home(write=not opt["dry_run"])  # a dry run records nothing
    # The inventory made here, before the plan: one to keep (--json: the plan's hosts say it,
    # and stdout holds the one document).
    if opt["dry_run"] and inv.adhoc and not opt["as_json"]:
        from clusterrun.cli.hosts import inventory_yaml

        click.echo(inventory_yaml(inv, inventory_path, opt["only_hosts"]))
    opts = launching.LaunchOptions(
        nproc_per_node=nproc if isinstance(nproc, int) else None,
        master_port=opt["master_port"], env=env_pairs,
        env_file=opt["env_file"], forward_env=opt["forward_env"], check=not opt["no_check"],
        sync=not opt["no_sync"], dry_run=opt["dry_run"], detach=opt["detach"],
        name=opt["name"], grace=opt["grace"], lease=opt["lease"], excludes=opt["excludes"],
        allow_busy_gpus=opt["allow_busy_gpus"], max_restarts=opt["max_restarts"],
        min_nodes=opt["min_nodes"], notify=opt["notify"],
        stall_timeout=opt["stall_timeout"], on_stall=opt["on_stall"], as_json=opt["as_json"])
    ssh = make_options(opt["connect_timeout"], opt["accept_new_host_keys"])
    if not opt["as_json"] or opt["dry_run"]:
        return launching.run(inv, job, ssh=ssh, opts=opts, home=launch_home)
    from clusterrun.launch.eventlines import EventLines

    lines = EventLines()
    result = launching.run(inv, job, ssh=ssh, opts=opts, home=launch_home, listeners=(lines,))
    lines.summary(result, launch_home)
    return result


def _not_inventory(word: str, *, module: bool) -> bool:
    """With -w given, whether the first word is the script (or, with -m, the module's first
    argument) rather than INVENTORY: a Python script, or a word that names no inventory file."""
    from pathlib import Path

    from clusterrun.inventory.adhoc import names_a_file
    from clusterrun.inventory.toplevel import looks_like_script

    if not module and looks_like_script(Path(word)):
        return True
    return not names_a_file(word)


def _check_nnodes(nnodes: Optional[str], starts: int, path: object) -> None:
    """torchrun's --nnodes: the inventory's count is the one clusterrun uses; a value that
    agrees is noted, any other refused."""
    if nnodes is None:
        return
    low, _, high = nnodes.partition(":")
    hosts = f"{starts} host{'s' if starts != 1 else ''}"
    if low.isdigit() and int(low) == starts and (not high or high == low):
        note(f"--nnodes {nnodes}: the {hosts} of {path}, which clusterrun counts itself; "
             "--nnodes may be left out.")
        return
    elastic = (" torchrun's elastic MIN:MAX is --min-nodes MIN with --max-restarts N here."
               if high and high != low else "")
    raise UsageError(f"--nnodes {nnodes}: a run of {path} starts on {hosts} (spares aside, "
                     "after -w/-x), and clusterrun takes the node count from the inventory: "
                     f"leave --nnodes out, or pick the hosts with -w/-x.{elastic}")


def _check_restarts(max_restarts: int, min_nodes: Optional[int], *, detach: bool) -> None:
    """--max-restarts and --min-nodes against the other flags, before any host is contacted."""
    if max_restarts > 0 and detach:
        raise UsageError("restarts need the attached controller: a detached run has no process "
                         "left to restart it. Run it attached (inside tmux, screen or nohup) to "
                         "use --max-restarts.")
    if min_nodes is not None and max_restarts == 0:
        raise UsageError("--min-nodes only matters when a run restarts: give --max-restarts N "
                         "too, or leave --min-nodes out.")
