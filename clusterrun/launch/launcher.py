"""`clusterrun launch`: check, plan, sync, start, stream, tear down, report."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from clusterrun.console import Printer
from clusterrun.errors import (
    ClusterrunError,
    ExitStatus,
    PreflightError,
    UnreachableError,
    UsageError,
)
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.launch import outcome, restarts, sync
from clusterrun.launch.headstart import HeadStart
from clusterrun.launch.outcome import NodeOutcome
from clusterrun.launch.session import Session
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.view import LogView
from clusterrun.plan import build as planning
from clusterrun.plan import environment, placeholders
from clusterrun.plan import torchrun as torchrunopts
from clusterrun.plan import view as planview
from clusterrun.plan.build import EnvSources
from clusterrun.plan.model import Job, LaunchPlan
from clusterrun.preflight import view as checkview
from clusterrun.preflight.report import CheckReport
from clusterrun.runs import lifecycle
from clusterrun.runs import store as runs
from clusterrun.runs.state import RunState, from_outcome
from clusterrun.transport import SshOptions
from clusterrun.transport.pool import Connections


@dataclass(frozen=True)
class LaunchOptions:
    nproc_per_node: Optional[int] = None
    master_port: Optional[int] = None
    env: tuple[tuple[str, str], ...] = ()
    check: bool = True
    sync: bool = True
    dry_run: bool = False
    detach: bool = False
    name: Optional[str] = None
    grace: float = 15.0
    lease: float = 30.0
    excludes: tuple[str, ...] = ()
    env_file: Optional[str] = None
    forward_env: tuple[str, ...] = ()
    allow_busy_gpus: bool = False
    max_restarts: int = 0
    min_nodes: Optional[int] = None  # None: a lost host with no spare left ends the run


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


class Interrupts:
    """Ctrl-C and SIGTERM become entries in a list the watch loop reads; a signal handler
    must not take locks the interrupted code may hold."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.received: list[int] = []
        self.say = say
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handler(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def announce(self, signum: int, first: bool) -> None:
        name = signal.Signals(signum).name
        if first:
            self.say(f"{name}: stopping the run on every node (SIGTERM, then SIGKILL after the "
                     "grace period); press Ctrl-C again to kill at once")
        else:
            self.say(f"{name} again: killing the run on every node now")


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


def run(inv: Inventory, job: Job, *, ssh: SshOptions, opts: LaunchOptions, home: Path,
        out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    sources = EnvSources(extra=dict(opts.env), forward=opts.forward_env,
                         env_file=Path(opts.env_file) if opts.env_file else None)
    if sources.env_file is not None:  # a bad env file is refused before any host is contacted
        environment.read_env_file(sources.env_file)
    if opts.master_port is not None:
        inv = dataclasses.replace(inv, master_port=opts.master_port)
    say = _sayer(err)
    slots = restarts.Slots.initial(inv, opts.min_nodes)
    # One connection per host, opened by preflight and reused by sync and the supervisors.
    with Connections(ssh) as pool:
        # Each host's manifest of the code is read as soon as its facts are in (read only;
        # a dry run copies nothing and needs none).
        head = None if opts.dry_run or not opts.sync else HeadStart(
            job, pool, _excludes(job.code, opts, slots.inventory(inv).hosts))
        report = _judge(restarts.checked(inv, pool, slots, attempt=1, data_path=opts.check,
                                         allow_busy_gpus=opts.allow_busy_gpus, say=say,
                                         on_facts=head.read if head else None),
                        opts, err)

        def plan_for(attempt: int, report: CheckReport, run_id: Optional[str]) -> LaunchPlan:
            return planning.build(slots.inventory(inv), report, job, name=opts.name,
                                  nproc_override=opts.nproc_per_node, env=sources,
                                  sync=opts.sync, grace=opts.grace, lease=opts.lease,
                                  detach=opts.detach, run_id=run_id, attempt=attempt,
                                  max_restarts=opts.max_restarts)

        plan = plan_for(1, report, None)
        if opts.dry_run:
            out.write("\n".join(planview.dry_run(plan, [h.name for h in inv.spares])) + "\n")
            return int(ExitStatus.SUCCESS)

        def again(attempt: int, nodes: list[NodeOutcome],
                  root: outcome.Failure) -> Optional[tuple[LaunchPlan, CheckReport]]:
            """The next attempt's plan after a failed one (None: it cannot be made)."""
            head = f"attempt {attempt}/{opts.max_restarts + 1}"
            lost = restarts.lost_hosts(nodes)
            try:
                for name, why in lost:
                    pool.discard(name)
                    say(f"{head}: {slots.leave_out(name, why, attempt - 1)}")
            except restarts.CannotReplace as exc:
                say(f"cannot restart: {exc}")
                return None
            if not lost:
                say(f"{head}: restarting after {root.detail}, on the same hosts once they "
                    "pass the check")
            found = restarts.checked(inv, pool, slots, attempt=attempt, data_path=opts.check,
                                     allow_busy_gpus=opts.allow_busy_gpus, say=say)
            if not found.ok and (opts.check or found.unreachable):
                checkview.render_plain(found, err)
                say("cannot restart: the hosts left failed the check (see above).")
                return None
            return plan_for(attempt, found, plan.run_id), found

        return execute(plan, inv, report, pool, home=home, opts=opts, out=out, err=err,
                       again=again, slots=slots, head=head)


Again = Callable[[int, list[NodeOutcome], outcome.Failure],
                 Optional[tuple[LaunchPlan, CheckReport]]]


def execute(plan: LaunchPlan, inv: Inventory, report: CheckReport, pool: Connections, *,
            home: Path, opts: LaunchOptions, out: Optional[TextIO] = None,
            err: Optional[TextIO] = None, again: Optional[Again] = None,
            slots: Optional[restarts.Slots] = None, head: Optional[HeadStart] = None) -> int:
    """Run a plan on the hosts ``pool`` holds connections to (preflight made them); with
    ``again``, a failed attempt is followed by the next one, up to --max-restarts. ``head``:
    the first attempt's manifests, read during its preflight."""
    out = out or sys.stdout
    say = _sayer(err or sys.stderr)
    run_dir = runs.create(home, plan.run_id)
    runs.write_json(run_dir.file("plan.json"), dict(plan.public(), inventory=str(inv.path)))
    run_dir.update_state(id=plan.run_id, name=plan.name, state=RunState.RUNNING.value,
                         detached=plan.detach,
                         controller_pid=os.getpid(), started_at=runs.now(),
                         hosts=[n.name for n in plan.nodes], inventory=str(inv.path))
    lock = run_dir.lock_fd("mirror.lock")  # held while this process writes the mirrors
    history = restarts.History(run_dir, opts.max_restarts, slots)
    attempt_dir = run_dir
    with Interrupts(say) as interrupts:
        while True:
            history.begin(plan)
            nodes = _attempt(plan, run_dir, attempt_dir, report, pool, opts=opts, say=say,
                             out=out, interrupts=interrupts,
                             head=head if plan.attempt == 1 else None)
            if isinstance(nodes, int):
                return nodes  # detached: running on without this process
            found = outcome.failures(nodes)
            root = found[0] if found else None
            nxt = None
            reported = False
            if (again is not None and root is not None and not interrupts.received
                    and plan.attempt <= opts.max_restarts):
                history.end(plan, attempt_dir, nodes, root, say)
                reported = True
                nxt = again(plan.attempt + 1, nodes, root)
            if nxt is None or interrupts.received:  # Ctrl-C while the hosts were re-checked
                status = _finish(plan, run_dir, attempt_dir, nodes, reported=reported,
                                 interrupts=interrupts.received, say=say, history=history)
                break
            plan, report = nxt
            attempt_dir = history.next_dir(plan, str(inv.path))
    if lock is not None:
        os.close(lock)
    return status


def _attempt(plan: LaunchPlan, run_dir: runs.RunDir, attempt_dir: runs.RunDir,
             report: CheckReport,
             pool: Connections, *, opts: LaunchOptions, say: Callable[[str], None],
             out: TextIO, interrupts: Interrupts, head: Optional[HeadStart]) -> Any:
    """One attempt, from the banner to the end of its watch: its nodes' outcomes (or, for a
    detached run, the exit status of the start)."""
    for line in planview.banner(plan):
        say(line)
    specs = {h.spec.name: h.spec for h in report.hosts}
    try:
        _code_on_hosts(plan, report, pool, opts=opts, say=say, head=head)
    except ClusterrunError as exc:  # a copy failed, the script is missing, or a host went away
        reason = "copying the code failed" if plan.sync else "the script is not on the hosts"
        lifecycle.record(run_dir, RunState.FAILED, reason=reason, exit_status=exc.exit_status)
        raise
    mirror = Mirror(attempt_dir)
    view = LogView(Printer(out))
    session = Session(plan, pool.transports, specs, mirror=mirror, view=view, notify=say)
    session.start()
    if plan.detach:
        return _detached(plan, attempt_dir, session, say)
    session.watch(interrupts.received, interrupts.announce)
    session.end_lost()
    view.close()
    mirror.close()
    return list(session.nodes.values())


def _code_on_hosts(plan: LaunchPlan, report: CheckReport, pool: Connections, *,
                   opts: LaunchOptions, say: Callable[[str], None],
                   head: Optional[HeadStart] = None) -> None:
    """The script's directory on every host: copied and verified, or with --no-sync, checked
    to be there already."""
    specs = {h.spec.name: h.spec for h in report.hosts}
    if not plan.sync:
        sync.require_present(plan, pool.transports, specs)
        return
    if all(n.local for n in plan.nodes):
        return
    facts = {h.spec.name: h.facts for h in report.hosts}
    for name, how in sync.sync(plan, pool.transports, specs, facts,
                               _excludes(plan.code_dir, opts, specs.values()),
                               early=head.answers if head else None).items():
        say(f"{name}: {plan.code_dir.name}/ {how}")


def _excludes(code_dir: Path, opts: LaunchOptions, specs: Iterable[HostSpec]) -> tuple[str, ...]:
    """--exclude, and the env files inside the copied directory (never copied: secrets)."""
    env_files = [opts.env_file, *(s.env_file for s in specs)]
    return (*opts.excludes, *sync.env_file_excludes(code_dir, env_files))


def _detached(plan: LaunchPlan, run_dir: runs.RunDir, session: Session,
              say: Callable[[str], None]) -> int:
    session.watch_start()
    lost = [n for n in session.nodes.values() if n.lost is not None]
    if lost:
        for node in lost:
            say(f"{node.plan.name}: {node.lost}")
        stopped = session.stop_started()
        lifecycle.record(run_dir, RunState.FAILED, reason="a node did not start",
                         exit_status=int(ExitStatus.NODE_LOST))
        if stopped:
            say(f"the run did not start everywhere; stopped it on {', '.join(stopped)}")
        else:
            say(f"the run did not start everywhere; stop what did start with `clusterrun "
                f"stop {plan.run_id}`")
        return int(ExitStatus.NODE_LOST)
    run_dir.update_state(state="running", controller_pid=None)
    say(f"run {plan.run_id} started on {len(plan.nodes)} nodes and runs on without this "
        f"terminal. Follow it: clusterrun logs -f {plan.run_id}   end it: clusterrun stop "
        f"{plan.run_id}")
    return int(ExitStatus.SUCCESS)


def _finish(plan: LaunchPlan, run_dir: runs.RunDir, attempt_dir: runs.RunDir,
            nodes: list[NodeOutcome], *, interrupts: list[int], say: Callable[[str], None],
            history: restarts.History, reported: bool = False) -> int:
    found = outcome.failures(nodes)
    root = found[0] if found else None
    interrupted = interrupts[0] if interrupts else None
    stopped = any(n.state == "stopped" for n in nodes)
    status = outcome.exit_status(root, interrupted, stopped)
    summary, logs = restarts.attempt_summary(attempt_dir, nodes, root=root, status=status,
                                             interrupted=interrupted)
    seen = from_outcome(root_lost=None if root is None else root.code is None,
                        interrupted=interrupted is not None, stopped=stopped)
    history.close(plan, status, root)
    if plan.attempt > 1:
        runs.write_json(attempt_dir.file("summary.json"), summary)
        lifecycle.record(attempt_dir, seen, exit_status=status)
        summary = dict(summary, attempt=plan.attempt, **history.public())
    runs.write_json(run_dir.file("summary.json"), summary)
    state = lifecycle.record(run_dir, seen, ended_at=runs.now(), exit_status=status)
    if status != 0 and not reported:  # a failed attempt's root cause is said when it ends
        for line in outcome.report(attempt_dir, nodes, root, interrupted, stopped):
            say(line)
    if plan.attempt > 1:
        for entry in history.public()["attempts"]:
            what = entry.get("root_cause") or (
                "succeeded" if entry.get("exit_status") == 0 else "stopped")
            say(f"attempt {entry['attempt']}: {what} (exit {entry.get('exit_status')})")
        for q in history.public()["quarantined"]:
            say(f"quarantined: {q['host']} ({q['reason']}, attempt {q['attempt']})")
    if logs["differ"]:
        say(f"logs: {len(logs['differ'])} file(s) differ from the hosts' copies: "
            f"{', '.join(logs['differ'][:5])} (the hosts keep the originals)")
    else:
        say(f"logs: {logs['identical']} files, identical on the hosts and in {attempt_dir.path}")
    say(f"run {plan.run_id} {state.value} (exit {status})"
        + (f" after {plan.attempt} attempts" if plan.attempt > 1 else ""))
    return status
