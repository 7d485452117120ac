"""`clusterrun stacks`: every rank's Python stack in a live run."""

from __future__ import annotations

from typing import Optional

import click

from clusterrun.cli import complete, selectors
from clusterrun.cli.common import CONTEXT, home, make_options, note, ssh_options
from clusterrun.errors import UnreachableError
from clusterrun.runs import names


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@selectors.node_option
@selectors.rank_option
@click.option("--json", "as_json", is_flag=True,
              help='{"ok", "run", "ranks": [{"rank", "node", "pid", "threads": [{"name", '
                   '"frames": [{"function", "file", "line"}]}]}]}, frames outermost first; '
                   'on an error {"ok": false, "error": {...}}.')
@click.option("--profile", type=click.FloatRange(min=1, max=600), default=None,
              metavar="SECONDS", help="Sample every rank for SECONDS first: each rank's share "
              "of time waiting in collectives, and the straggler the others wait for.")
@ssh_options
def stacks(run_id: Optional[str], nodes: tuple[str, ...], ranks_: tuple[int, ...],
           as_json: bool, profile: Optional[float], connect_timeout: float,
           accept_new_host_keys: bool) -> None:
    """The Python stack of every thread of every rank of a live run (the latest by default).

    Taken from outside with py-spy, no change to the script, never pausing a rank. Ranks with
    the same stack are grouped; the odd ones out come first, with their node, pid and last
    log line. py-spy is the host's own, or this machine's (it comes with clusterrun), shipped.
    """
    import json

    from clusterrun.runs import attempts
    from clusterrun.runs.records import PlanRecord
    from clusterrun.stacks import collect, view

    run = names.resolve(home(write=False), run_id, note=note)
    plan = PlanRecord.of(attempts.current(run))
    selectors.check(plan, nodes, ranks_, f"run {run.id}")
    found = collect.collect(run, make_options(connect_timeout, accept_new_host_keys),
                            nodes=set(nodes) if nodes else None,
                            ranks=set(ranks_) if ranks_ else None,
                            profile=profile)
    if as_json:
        for name, why in sorted(found.problems.items()):
            note(f"no stacks from {name}: {why}")
        if found.ranks:  # else the error below is the one document on stdout
            click.echo(json.dumps({"ok": True, **found.to_json()}, indent=2))
    else:
        if profile:
            from clusterrun.stacks.profile import lines

            for line in [*lines(found, profile), ""]:
                click.echo(line)
        for line in view.render(found):
            click.echo(line)
    if not found.ranks:
        raise UnreachableError(
            f"run {run.id}: no rank's stack could be taken; is the run still going "
            "(`clusterrun ps`)?")
