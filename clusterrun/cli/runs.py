"""`clusterrun logs`, `ps` and `stop`: runs this machine knows, from any shell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import click

from clusterrun.cli import complete, selectors
from clusterrun.cli.common import (
    CONTEXT,
    home,
    make_options,
    note,
    ssh_options,
)
from clusterrun.errors import ExitStatus, LocalFilesError, Result, UsageError, exit_status
from clusterrun.launch.options import GRACE
from clusterrun.runs import names
from clusterrun.runs.store import RunDir

if TYPE_CHECKING:  # the command imports its modules when it runs: `--help` starts fast
    from clusterrun.runs.remote import Stopped


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@click.option("-f", "--follow", is_flag=True,
              help="Keep showing new lines until the run ends (also from a new shell).")
@selectors.node_option
@selectors.rank_option
@click.option("--grep", "pattern", default=None, metavar="REGEX",
              help="Only lines matching this regular expression.")
@click.option("--tail", type=click.IntRange(min=0), default=None, metavar="N",
              help="Start with the last N lines.")
@click.option("--attempt", type=click.IntRange(min=1), default=None, metavar="K",
              help="Attempt K of a restarted run (default: the current one).")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: node, rank, stream, time, text (also with -f).")
@ssh_options
def logs(run_id: Optional[str], follow: bool, nodes: tuple[str, ...], ranks_: tuple[int, ...],
         pattern: Optional[str], tail: Optional[int], attempt: Optional[int], as_json: bool,
         connect_timeout: float, accept_new_host_keys: bool) -> Result:
    """Aggregated logs of a run (the latest by default), every line prefixed [node rRANK].

    A finished run is read from the local mirrors; with -f a live run is followed from its
    hosts' files by byte offset, resuming where the mirrors end, so nothing is lost or shown
    twice, also after the launching terminal has gone. A restarted run shows its current
    attempt (with -f, each new attempt as it starts); --attempt K shows an earlier one.
    """
    import re

    from clusterrun.console import Printer
    from clusterrun.logs import show as logview_cmd
    from clusterrun.logs.view import Filter, prefix
    from clusterrun.runs import attempts
    from clusterrun.runs.records import PlanRecord

    try:
        grep = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise UsageError(f"--grep {pattern!r}: not a valid regular expression ({exc}).") \
            from None
    run = names.resolve(home(write=False), run_id, note=note)
    total = attempts.count(run)
    if attempt is not None and attempt > total:
        had = "1 attempt" if total == 1 else f"{total} attempts (1-{total})"
        raise UsageError(f"run {run.id} has no attempt {attempt}; it has had {had}.")
    if attempt is None and total > 1:
        earlier = "1" if total == 2 else f"1 to {total - 1}"
        note(f"run {run.id}: attempt {total} of {total} (earlier: --attempt {earlier})")
    # Hosts and ranks may differ between attempts: check against the one shown.
    plan = PlanRecord.of(attempts.attempt_dir(run, attempt or total))
    of = f"attempt {attempt or total} of run {run.id}" if total > 1 else f"run {run.id}"
    selectors.check(plan, nodes, ranks_, of)
    flt = Filter(nodes=nodes, ranks=ranks_, grep=grep)
    printer, label = Printer(), prefix
    if as_json:
        from clusterrun.logs import jsonlines

        printer, label = jsonlines.JsonLines(), jsonlines.label
    return logview_cmd.show(run, flt, tail=tail, follow=follow,
                            ssh=make_options(connect_timeout, accept_new_host_keys),
                            printer=printer, attempt=attempt, label=label,
                            say=lambda text: click.echo(f"clusterrun: {text}", err=True))


@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of runs, newest first.")
@click.option("--local", "local_only", is_flag=True,
              help="Do not ask the hosts about runs that may still be going.")
@ssh_options
def ps(as_json: bool, local_only: bool, connect_timeout: float,
       accept_new_host_keys: bool) -> None:
    """List runs, newest first: run id (it holds the script's name), state, start time,
    duration, hosts (`--json` gives the name apart).

    States: running, succeeded, failed, stopped, lost (a node or the controller was lost). A
    restarted run shows its attempt, e.g. running (attempt 2/3), and the current attempt's
    hosts; hosts it quarantined are listed on a line under it, and the `environment:` lock's
    hash a run's ranks ran in too.
    """
    import time

    from clusterrun.logs.settle import settle
    from clusterrun.runs import ps as listing
    from clusterrun.runs import store

    state_home = home(write=False)
    if not local_only:
        ssh = make_options(connect_timeout, accept_new_host_keys)
        for run in store.all_runs(state_home):
            if run.problem is None:  # one that cannot be read is listed as such, not settled
                settle(run, ssh)
    rows = listing.ps_rows(state_home)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no runs yet")
        return
    width = max(10, *(len(listing.state_text(row)) for row in rows))
    click.echo(f"{'RUN':34} {'STATE':{width}} {'STARTED':19} {'DURATION':>9}  HOSTS")
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started_at"])) \
            if row["started_at"] else "-"
        duration = f"{row['duration']:.0f}s" if row["duration"] is not None else "-"
        click.echo(f"{row['id']:34} {listing.state_text(row):{width}} {started:19} "
                   f"{duration:>9}  {','.join(row['hosts'])}")
        if listing.problem_line(row):
            click.echo(listing.problem_line(row))
        if row["quarantined"]:
            click.echo(listing.quarantine_line(row))
        if listing.cause_line(row):
            click.echo(listing.cause_line(row))
        if listing.nccl_line(row):
            click.echo(listing.nccl_line(row))
        if listing.environment_line(row):
            click.echo(listing.environment_line(row))


def _only_running(state_home: Path, say: Callable[[str], None]) -> Optional[RunDir]:
    """`stop` without RUN: the one run this machine last saw running; None (said) when none
    is; refused, with their ids, when several are."""
    from clusterrun.runs import lifecycle, store

    runs = store.all_runs(state_home)
    for run in runs:
        if run.problem is not None:
            note(f"run {run.id}: {run.problem}; not known whether it runs (`clusterrun stop "
                 f"{run.id}` says more).")
    running = [r for r in runs if r.problem is None and lifecycle.live(r)]
    if len(running) > 1:
        listed = "; ".join(f"{r.id} ({r.plan.get('name') or 'no name'})" for r in running)
        raise UsageError(f"{len(running)} runs are running: {listed}. Give the one to stop: "
                         "`clusterrun stop RUN`.")
    if not running:
        say("no run is running; nothing to stop")
        return None
    note(f"stopping run {running[0].id}, the only one running")
    return running[0]


class _Told:
    """What `stop` tells: lines on stdout, or with --json one object at the end
    (``{"ok", "run", "state", "message", "hosts": [...]}``, docs/commands.md)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.doc: dict[str, Any] = {"ok": True, "run": None, "state": None, "message": None,
                                    "hosts": []}

    def say(self, text: str) -> None:
        """A line for stdout; the document's ``message`` (the last one said)."""
        self.doc["message"] = text
        if not self.as_json:
            click.echo(text)

    def host(self, name: str, result: Stopped) -> None:
        final = result.state.state if result.state and result.state.state else None
        self.doc["hosts"].append({"node": name, "ok": result.error is None,
                                  "found": result.found, "was": result.was, "state": final,
                                  "error": result.error})
        if result.error is not None:
            click.echo(f"{name}: {result.error}", err=True)
        elif not self.as_json:
            click.echo(f"{name}: {final or 'not found'}")

    def end(self, run: Optional[RunDir], result: Result) -> Result:
        if self.as_json:
            from clusterrun.runs import lifecycle

            recorded = lifecycle.recorded(run) if run is not None else None
            self.doc.update(ok=exit_status(result) == 0, run=run.id if run else None,
                            state=recorded.value if recorded is not None else None)
            click.echo(json.dumps(self.doc, indent=2))
        return result


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@click.option("--grace", type=click.FloatRange(min=0), default=GRACE, show_default=True,
              metavar="SECONDS", help="Between SIGTERM and SIGKILL.")
@click.option("--force", is_flag=True, help="SIGKILL at once.")
@selectors.refused(
    "`stop` ends a run on every host, never part of it: ranks left running would wait in "
    "their next collective for the stopped ones. To leave a host out, stop the run and launch "
    "it again with -x HOST (or give spares and --max-restarts); `clusterrun logs` and `stacks` "
    "take --node and --rank to look at some ranks.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: the run, its state after the stop, and each host's.")
@ssh_options
def stop(run_id: Optional[str], grace: float, force: bool, as_json: bool,
         connect_timeout: float, accept_new_host_keys: bool) -> Result:
    """End a run on every host (graceful, then forced), also after its controller died.

    Without RUN: the only run still running (several: they are listed, name one). Only this
    run's processes are touched: other runs on the same hosts go on. A restarted run is
    stopped on the hosts of its current attempt.
    """
    from clusterrun.logs.settle import settle
    from clusterrun.runs import attempts, lifecycle
    from clusterrun.runs import remote as remote_runs
    from clusterrun.runs.journal import Journal

    told = _Told(as_json)
    if run_id is None:
        only = _only_running(home(write=True), told.say)
        if only is None:
            return told.end(None, Result())
        run_id = only.id
    run = names.resolve(home(write=True), run_id, note=note, prefer=lifecycle.live)
    ended = lifecycle.recorded(run)
    if ended is not None and ended.final:
        # The one run-state rule: an ended run keeps the state it ended with.
        told.say(f"run {run.id} already {ended.value}; nothing to stop")
        return told.end(run, Result())
    ssh = make_options(connect_timeout, accept_new_host_keys)
    # The current attempt's hosts and rundirs: earlier attempts have ended (and some of their
    # hosts are quarantined, maybe unreachable).
    current = attempts.current(run)
    if not remote_runs.host_specs(current):
        raise LocalFilesError(f"run {run.id}: its plan.json names no hosts "
                              f"({current.file('plan.json')}); nothing was contacted or "
                              "stopped.")
    results = remote_runs.stop(current, ssh, grace, force)
    for name, result in results.items():
        told.host(name, result)
    failed = [name for name, result in results.items() if result.error is not None]
    if failed:
        told.doc["message"] = f"run {run.id}: NOT stopped on {', '.join(failed)}"
        click.echo(told.doc["message"], err=True)
        return told.end(run, Result(unreachable=True))
    if lifecycle.watched(run):
        told.say(f"run {run.id}: stopped; its launch in another terminal records how it ended")
        return told.end(run, Result())
    with Journal.of(run, note) as journal:
        state = settle(run, ssh, journal=journal)
        if not state.final:  # every host answered that it stopped: nothing of it is left
            state = journal.ended(attempts.count(run), lifecycle.RunState.STOPPED,
                                  status=int(ExitStatus.SIGTERM))
    told.say(f"run {run.id} {state.value}")
    return told.end(run, Result())
