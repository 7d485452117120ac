"""`clusterrun launch`: check, plan, then the attempt loop (launch/loop.py): sync, start,
stream, tear down, report."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TextIO

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
from clusterrun.transport import SshOptions
from clusterrun.transport.pool import Connections

if TYPE_CHECKING:  # environments are imported when an inventory has one (launch's start time)
    from clusterrun.envs.sync import EnvReport
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


def _judge(report: CheckReport, opts: LaunchOptions, err: TextIO) -> CheckReport:
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


def _environments(inv: Inventory, pool: Connections, home: Path, *, dry_run: bool,
                  err: TextIO) -> Optional[EnvReport]:
    """The hosts' `environment:` made the lock's before anything is checked or started (a dry
    run only looks); a host that cannot hold it stops the launch (exit 3, 6 for a full disk)."""
    if not any(h.environment for h in inv.hosts):
        return None
    from clusterrun.envs import sync as envsync

    found = envsync.sync(inv, pool, home, build=not dry_run, say=_sayer(err))
    if not dry_run:
        found.raise_if_failed()
    return found


def run(inv: Inventory, job: Job, *, ssh: SshOptions, opts: LaunchOptions, home: Path,
        out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> Result:
    """Check the hosts, plan, and run the attempts (or, with --dry-run, print the plan)."""
    err = err or sys.stderr
    sources = EnvSources(extra=dict(opts.env), forward=opts.forward_env,
                         env_file=Path(opts.env_file) if opts.env_file else None)
    if sources.env_file is not None:  # a bad env file is refused before any host is contacted
        environment.read_env_file(sources.env_file)
    if opts.master_port is not None:
        inv = dataclasses.replace(inv, master_port=opts.master_port)
    # One connection per host, opened by preflight and reused by sync and the supervisors.
    with Connections(ssh) as pool:
        warm = _warm(inv, pool, home, err)
        envs: Optional[EnvReport] = None
        if warm is not None:
            from clusterrun.envs.warm import NotWarm

            try:
                return _checked(warm.inventory(inv), job, warm.report(), pool, sources,
                                opts=opts, home=home, out=out, err=err, warm=warm)
            except NotWarm:  # a host's environment is not the lock's: the sync as without
                envs = warm.rest(build=not opts.dry_run)
                if not opts.dry_run:
                    envs.raise_if_failed()
        else:
            envs = _environments(inv, pool, home, dry_run=opts.dry_run, err=err)
        if envs is not None:
            inv = envs.inventory(inv)  # each host's `python:`: its environment's interpreter
        return _checked(inv, job, envs, pool, sources, opts=opts, home=home, out=out, err=err)


def _warm(inv: Inventory, pool: Connections, home: Path, err: TextIO) -> Optional[Warm]:
    """Where every `environment:` host's workdir is known, its environment is judged from
    preflight's probe, run in that environment's interpreter (envs/warm.py): a warm launch
    asks no status of its own."""
    if not any(h.environment for h in inv.hosts):
        return None
    from clusterrun.envs.warm import Warm

    return Warm.of(inv, pool, home, say=_sayer(err))


def _checked(inv: Inventory, job: Job, envs: Optional[EnvReport], pool: Connections,
             sources: EnvSources, *, opts: LaunchOptions, home: Path, out: Optional[TextIO],
             err: TextIO, warm: Optional[Warm] = None) -> Result:
    """Preflight of ``inv`` (each host's `python:` its environment's interpreter), the plan,
    and the attempts (or, with --dry-run, the plan printed). ``warm``: preflight stops after
    the facts where a host's environment is not the lock's (envs/warm.NotWarm)."""
    slots = Slots.initial(inv, opts.min_nodes)
    # Each host's manifest of the code is read as soon as its facts are in (read only;
    # a dry run copies nothing and needs none).
    head = None if opts.dry_run or not opts.sync else HeadStart(
        job, pool, excludes(job.code, opts, slots.inventory(inv).hosts))
    loop = AttemptLoop(inv, job, opts, pool, slots, sources, _sayer(err), out or sys.stdout,
                       err, head)
    loop.environment = envs.lock if envs is not None else None
    on_facts = head.read if head else None
    checked = loop.check(1, on_facts=warm.gate(on_facts) if warm else on_facts,
                         after_facts=warm.after_facts if warm else None)
    report = _judge(checked, opts, err)
    plan = loop.plan(1, report, None)
    if opts.dry_run:
        loop.out.write("\n".join(planview.dry_run(plan, [h.name for h in inv.spares])) + "\n")
        if envs is not None:
            from clusterrun.envs import view as envview

            loop.out.write("\nenvironments (`environment:`, built by launch where not "
                           "ready):\n")
            envview.render_plain(envs, loop.out)
        return Result()
    return loop.run(plan, report, home)


def execute(job: Job, plan: LaunchPlan, inv: Inventory, report: CheckReport,
            pool: Connections, *, home: Path, opts: LaunchOptions,
            out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> Result:
    """Run a plan made elsewhere (`check --smoke`) on the hosts ``pool`` holds connections to,
    as one attempt."""
    err = err or sys.stderr
    loop = AttemptLoop(inv, job, opts, pool, Slots.initial(inv), EnvSources(),
                       _sayer(err), out or sys.stdout, err)
    return loop.run(plan, report, home)
