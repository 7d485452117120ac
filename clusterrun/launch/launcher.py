"""`clusterrun launch`, in four steps, each handing the next its answer: the hosts'
environments (``Environments``), the checks (``Checked``, or ``Stale`` where preflight's facts
show an environment a warm launch took to be ready is not), the plan, and the attempt loop
(launch/loop.py: sync, start, stream, tear down, report)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TextIO, Union

from clusterrun.console import discard
from clusterrun.errors import PreflightError, Result, UnreachableError, UsageError
from clusterrun.inventory import Inventory
from clusterrun.inventory.slots import Slots
from clusterrun.launch.headstart import HeadStart
from clusterrun.launch.loop import AttemptLoop, excludes
from clusterrun.launch.options import LaunchOptions
from clusterrun.plan import build as planning
from clusterrun.plan import environment, placeholders
from clusterrun.plan import torchrun as torchrunopts
from clusterrun.plan import view as planview
from clusterrun.plan.build import EnvSources
from clusterrun.plan.model import Job, LaunchPlan
from clusterrun.preflight import view as checkview
from clusterrun.preflight.report import CheckReport
from clusterrun.runs.journal import Listener
from clusterrun.transport import SshOptions
from clusterrun.transport.pool import Connections

if TYPE_CHECKING:  # envs/ is imported where an inventory has `environment:` (see _environments)
    from clusterrun.envs.hostenv import EnvReport
    from clusterrun.envs.warm import Warm

__all__ = ["LaunchOptions", "execute", "job_for", "run"]


def job_for(script: Optional[str], args: tuple[str, ...], *, module: Optional[str] = None,
            torchrun: bool = True, local_rank_arg: bool = False,
            torchrun_args: tuple[str, ...] = ()) -> Job:
    """What to run, checked before any host is contacted (usage errors exit 2)."""
    if module is not None:
        path = planning.module_path(module)
    elif script is None:
        raise UsageError("missing SCRIPT: give the training script after INVENTORY, or "
                         "-m MODULE before it.")
    else:
        path = planning.script_path(script)
    if torchrun_args and not torchrun:
        raise UsageError("--torchrun-arg and --no-torchrun do not go together: without torchrun "
                         "there is nothing to pass them to.")
    job = Job(script=path, args=tuple(args), module=module, torchrun=torchrun,
              local_rank_arg=local_rank_arg, torchrun_args=torchrunopts.passthrough(torchrun_args))
    placeholders.check(job.args, per_process=not torchrun)
    return job


def _sayer(err: TextIO) -> Callable[[str], None]:
    def say(text: str) -> None:
        err.write(f"clusterrun: {text}\n")
        err.flush()

    return say


@dataclass(frozen=True)
class Environments:
    """The environment step's answer, what the checks take: the inventory to check (each
    `environment:` host's `python:` its environment's interpreter), the hosts' environments
    (None without `environment:`), and ``warm`` where they are only taken to be ready, to be
    judged by preflight's own facts (envs/warm.py)."""

    inventory: Inventory
    report: Optional[EnvReport] = None
    warm: Optional[Warm] = None

    @property
    def lock(self) -> Optional[str]:
        """The lock's hash, for summary.json."""
        return self.report.lock if self.report is not None else None


@dataclass(frozen=True)
class Checked:
    """The checks' answer: the launch's attempt loop, its first attempt's hosts as checked
    (a failure has stopped the launch, unless --no-check), and their environments."""

    loop: AttemptLoop
    report: CheckReport
    envs: Environments


@dataclass(frozen=True)
class Stale:
    """The checks' other answer: preflight stopped after the facts, as a host's environment
    that a warm launch took to be ready is not the lock's (``inventory``: as checked)."""

    warm: Warm
    inventory: Inventory


def run(inv: Inventory, job: Job, *, ssh: SshOptions, opts: LaunchOptions, home: Path,
        out: Optional[TextIO] = None, err: Optional[TextIO] = None,
        listeners: tuple[Listener, ...] = ()) -> Result:
    """The environments, the checks, the plan and the attempts (or, with --dry-run, the plan
    printed). ``listeners`` hear the run's events as its journal writes them (`--json`)."""
    out, err = out or sys.stdout, err or sys.stderr
    sources = EnvSources(extra=dict(opts.env), forward=opts.forward_env,
                         env_file=Path(opts.env_file) if opts.env_file else None)
    if sources.env_file is not None:  # a bad env file is refused before any host is contacted
        environment.read_env_file(sources.env_file)
    if opts.master_port is not None:
        inv = dataclasses.replace(inv, master_port=opts.master_port)
    # One connection per host, opened by the first program there and reused by the checks,
    # the sync and the supervisors.
    with Connections(ssh) as pool:
        envs = _environments(inv, pool, home, dry_run=opts.dry_run, say=_sayer(err))
        # With --json stdout holds the events alone: the ranks' lines are in the run's logs.
        shown = discard() if opts.as_json and not opts.dry_run else out
        checked = _checks(envs, job, pool, sources, opts=opts, out=shown, err=err,
                          listeners=listeners)
        if isinstance(checked, Stale):  # built as without a warm start, then checked in it
            envs = _rebuilt(checked, dry_run=opts.dry_run)
            checked = _checks(envs, job, pool, sources, opts=opts, out=shown, err=err,
                              listeners=listeners)
        assert isinstance(checked, Checked)  # built: nothing is taken to be ready any more
        plan = checked.loop.plan(1, checked.report, None)
        if opts.dry_run:
            return _show(plan, checked, out=out, as_json=opts.as_json)
        return checked.loop.run(plan, checked.report, home)


def _environments(inv: Inventory, pool: Connections, home: Path, *, dry_run: bool,
                  say: Callable[[str], None]) -> Environments:
    """The hosts' `environment:` before anything is checked or started. Where every such
    host's workdir is known here, their environments are taken to be ready and preflight's
    probe, run in each environment's interpreter, judges them (a warm launch asks no status of
    its own); else each is made the lock's now (a dry run only looks)."""
    if not any(h.environment for h in inv.hosts):
        return Environments(inv)
    # Here, not at the top: a launch without `environment:` does not load envs/ (about 30 ms
    # of its start, measured with and without on this package).
    from clusterrun.envs import sync as envsync
    from clusterrun.envs.warm import Warm

    warm = Warm.of(inv, pool, home, say=say)
    if warm is not None:
        return Environments(warm.inventory(inv), warm.report(), warm)
    return _made(envsync.sync(inv, pool, home, build=not dry_run, say=say), inv,
                 dry_run=dry_run)


def _rebuilt(stale: Stale, *, dry_run: bool) -> Environments:
    """After a ``Stale`` check: the hosts whose environment is not the lock's get it as
    without a warm start (their status, the wheels, the build; a dry run only looks)."""
    return _made(stale.warm.rest(build=not dry_run), stale.inventory, dry_run=dry_run)


def _made(found: EnvReport, inv: Inventory, *, dry_run: bool) -> Environments:
    """A host that cannot hold its environment stops the launch (exit 3, 4, or 6 for a full
    disk); the others are checked in theirs."""
    if not dry_run:
        found.raise_if_failed()
    return Environments(found.inventory(inv), found)


def _checks(envs: Environments, job: Job, pool: Connections, sources: EnvSources, *,
            opts: LaunchOptions, out: TextIO, err: TextIO,
            listeners: tuple[Listener, ...] = ()) -> Union[Checked, Stale]:
    """Preflight of the environments' inventory, and the attempt loop that runs it. Where the
    environments are only taken to be ready, each host's facts judge its own, and preflight
    stops after the facts where one is not the lock's (``Stale``)."""
    inv = envs.inventory
    slots = Slots.initial(inv, opts.min_nodes)
    # Each host's manifest of the code is read as soon as its facts are in (read only;
    # a dry run copies nothing and needs none).
    head = None if opts.dry_run or not opts.sync else HeadStart(
        job, pool, excludes(job.code, opts, slots.inventory(inv).hosts))
    loop = AttemptLoop(inv, job, opts, pool, slots, sources, _sayer(err), out, err, head,
                       environment=envs.lock, listeners=listeners)
    on_facts = head.read if head else None
    if envs.warm is None:
        report = loop.check(1, on_facts=on_facts)
    else:  # nothing is asked of a host whose environment is to be rebuilt
        report = loop.check(1, on_facts=envs.warm.gate(on_facts), after_facts=envs.warm.ready)
        if report.stopped:
            return Stale(envs.warm, inv)
    return Checked(loop, _stop_if_failed(report, opts, err), envs)


def _stop_if_failed(report: CheckReport, opts: LaunchOptions, err: TextIO) -> CheckReport:
    """The checked hosts' report, where the launch may go on with it: a host that cannot be
    reached stops it (exit 4), and so does a failed check (exit 3) unless --no-check."""
    if report.ok:
        return report
    checkview.render_plain(report, err)
    if report.unreachable:
        names = ", ".join(h.spec.name for h in report.unreachable)
        raise UnreachableError(f"cannot reach {names}; nothing was started (see above).")
    if opts.check:
        raise PreflightError("preflight failed; nothing was started. Fix the problems above, "
                             "or launch anyway with --no-check.")
    return report  # --no-check: the problems are shown, the launch goes on


def _show(plan: LaunchPlan, checked: Checked, *, out: TextIO, as_json: bool = False) -> Result:
    """--dry-run: the plan, and the hosts' environments where they have one."""
    spares = [h.name for h in checked.envs.inventory.spares]
    if as_json:
        import json

        shown = planview.dry_run_json(plan, spares)
        if checked.envs.report is not None:
            from clusterrun.envs import view as envview  # loaded with envs/ (see _environments)

            shown["environment"] = envview.as_json(checked.envs.report)
        else:
            shown["environment"] = None
        out.write(json.dumps(shown, indent=2) + "\n")
        return Result()
    out.write("\n".join(planview.dry_run(plan, spares)) + "\n")
    found = checked.envs.report
    if found is not None:
        from clusterrun.envs import view as envview  # loaded with envs/ (see _environments)

        out.write("\nenvironments (`environment:`, built by launch where not ready):\n")
        envview.render_plain(found, out)
    return Result()


def execute(job: Job, plan: LaunchPlan, inv: Inventory, report: CheckReport,
            pool: Connections, *, home: Path, opts: LaunchOptions,
            out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> Result:
    """Run a plan made elsewhere (`check --smoke`) on the hosts ``pool`` holds connections to,
    as one attempt."""
    err = err or sys.stderr
    loop = AttemptLoop(inv, job, opts, pool, Slots.initial(inv), EnvSources(),
                       _sayer(err), out or sys.stdout, err)
    return loop.run(plan, report, home)
