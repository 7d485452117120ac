"""The attempt loop of `clusterrun launch`: each attempt checks its hosts (spares taking failed
hosts' slots), plans, puts the code on the hosts and runs the session; the restart policy
(launch/restarts.py) decides from the attempt's result whether another follows. Every change
of the run is recorded by its journal (runs/journal.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO, Union

from clusterrun.console import Printer
from clusterrun.errors import ClusterrunError, ExitStatus, Outcome, Result
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.inventory.slots import CannotReplace, Slots
from clusterrun.launch import outcome, restarts, sync, watchers
from clusterrun.launch.headstart import HeadStart
from clusterrun.launch.interrupts import Interrupted, Interrupts
from clusterrun.launch.options import LaunchOptions
from clusterrun.launch.restarts import AttemptResult, Restart
from clusterrun.launch.session import Session
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.view import LogView
from clusterrun.plan import build as planning
from clusterrun.plan import view as planview
from clusterrun.plan.build import EnvSources
from clusterrun.plan.model import Job, LaunchPlan
from clusterrun.preflight import spares
from clusterrun.preflight import view as checkview
from clusterrun.preflight.report import CheckReport, HostReport
from clusterrun.runs.journal import Journal, Listener, RunRecord
from clusterrun.runs.state import RunState
from clusterrun.runs.store import RunDir
from clusterrun.stacks.ship import ship as ship_pyspy
from clusterrun.transport.pool import Connections

Say = Callable[[str], None]


@dataclass(frozen=True)
class Detached:
    """A detached run's start: every node started (``result`` success), or not."""

    result: Result


@dataclass
class AttemptLoop:
    """One launch: the inventory and job, the connections preflight opened, and the slots
    (which hosts run each attempt)."""

    inv: Inventory
    job: Job
    opts: LaunchOptions
    pool: Connections
    slots: Slots
    sources: EnvSources
    say: Say
    out: TextIO
    err: TextIO
    head: Optional[HeadStart] = None  # the first attempt's manifests, read during its preflight
    environment: Optional[str] = None  # the `environment:` lock's hash, for summary.json
    listeners: tuple[Listener, ...] = ()  # hear the run's events (`launch --json`)

    # -- before an attempt -----------------------------------------------------------------

    def check(self, attempt: int, *,
              on_facts: Optional[Callable[[HostReport], None]] = None,
              after_facts: Optional[Callable[[Sequence[HostReport]], bool]] = None
              ) -> CheckReport:
        """Preflight of the attempt's hosts, failing hosts replaced where spares allow."""
        return spares.check(self.inv, self.pool, self.slots, attempt=attempt,
                            data_path=self.opts.check, allow_busy_gpus=self.opts.allow_busy_gpus,
                            say=self.say, torch_needed=self.job.torchrun, on_facts=on_facts,
                            after_facts=after_facts)

    def plan(self, attempt: int, report: CheckReport, run_id: Optional[str]) -> LaunchPlan:
        return planning.build(self.slots.inventory(self.inv), report, self.job,
                              name=self.opts.name, nproc_override=self.opts.nproc_per_node,
                              env=self.sources, sync=self.opts.sync, grace=self.opts.grace,
                              lease=self.opts.lease, detach=self.opts.detach, run_id=run_id,
                              attempt=attempt, max_restarts=self.opts.max_restarts,
                              stall=(self.opts.stall_timeout, self.opts.on_stall))

    # -- the loop --------------------------------------------------------------------------

    def run(self, plan: LaunchPlan, report: CheckReport, home: Path) -> Result:
        """Run ``plan`` (attempt 1, checked as ``report``) and the attempts that follow it."""
        record = RunRecord(
            id=plan.run_id, name=plan.name, hosts=tuple(n.name for n in plan.nodes),
            inventory=str(self.inv.path), detached=plan.detach, controller_pid=os.getpid(),
            max_restarts=self.opts.max_restarts, notify=self.opts.notify)
        # Every attempt's plan gives the ranks the same environment, secrets included.
        env = [kv for n in plan.nodes for kv in n.env]
        with Journal.launching(home, record, self._public(plan), env, self.say,
                               listeners=self.listeners) as journal:
            lock = journal.run.lock_fd("mirror.lock")  # held while this process writes mirrors
            try:
                with Interrupts(self.say) as interrupts:
                    result = self._attempts(journal, plan, report, interrupts)
            finally:
                if lock is not None:
                    os.close(lock)
        return result

    def _attempts(self, journal: Journal, plan: LaunchPlan, report: CheckReport,
                  interrupts: Interrupts) -> Result:
        while True:
            reported = False  # whether this attempt's root cause has been said
            self._record_quarantine(journal)
            folder = journal.attempt_begun(plan.attempt, [n.name for n in plan.nodes],
                                           self._public(plan))
            ended = self._attempt(journal, plan, report, folder, interrupts)
            if isinstance(ended, Detached):
                return ended.result
            step = restarts.next_step(ended, self.opts.max_restarts,
                                      spare=bool(self.slots.spares))
            if step is None:
                break
            self._attempt_failed(journal, ended)
            reported = True
            try:
                with interrupts.raising():
                    following = self._restart(step, ended)
            except Interrupted:
                following = None
            if interrupts.received:  # while the hosts were re-checked: the run ends, stopped
                signum = interrupts.received[0]
                self.say(f"{signal.Signals(signum).name}: attempt {step.attempt} not started; "
                         "the run ends here")
                ended = dataclasses.replace(ended, interrupted=signum)
                break
            if following is None:
                break
            plan, report = following
        self._record_quarantine(journal)
        return self._finish(journal, ended, reported=reported)

    def _attempt(self, journal: Journal, plan: LaunchPlan, report: CheckReport,
                 folder: RunDir, interrupts: Interrupts) -> Union[AttemptResult, Detached]:
        """One attempt, from the banner to the end of its watch."""
        for line in planview.banner(plan):
            self.say(line)
        specs = {h.spec.name: h.spec for h in report.hosts}
        # py-spy goes to the hosts that lack it (a watched run) while the code is copied.
        shipping = threading.Thread(target=ship_pyspy, daemon=True, name="clusterrun-pyspy",
                                    args=(plan, self.pool.transports, specs,
                                          {h.spec.name: h.facts for h in report.hosts},
                                          self.say))
        shipping.start()
        try:
            self._code_on_hosts(plan, report, head=self.head if plan.attempt == 1 else None)
        except ClusterrunError as exc:  # a copy failed, the script is missing, a host went away
            reason = "copying the code failed" if plan.sync else "the script is not on the hosts"
            journal.ended(plan.attempt, RunState.FAILED, status=exc.exit_status, reason=reason)
            raise
        finally:
            shipping.join()
        mirror = Mirror(folder, first_line=journal.first_line_of(plan.attempt))
        view = LogView(Printer(self.out))
        session = Session(plan, self.pool.transports, specs, mirror=mirror, view=view,
                          notify=self.say)
        watchers.watch_stalls(session, folder, journal, self.pool.options, say=self.say)
        session.start()
        if plan.detach:
            return self._detached(journal, plan, session)
        session.watch(interrupts.received, interrupts.announce)
        session.end_lost()
        view.close()
        mirror.close()
        return AttemptResult.of(plan, folder, list(session.nodes.values()),
                                interrupts.received[0] if interrupts.received else None)

    def _code_on_hosts(self, plan: LaunchPlan, report: CheckReport, *,
                       head: Optional[HeadStart]) -> None:
        """The script's directory on every host: copied and verified, or with --no-sync,
        checked to be there already."""
        specs = {h.spec.name: h.spec for h in report.hosts}
        if not plan.sync:
            sync.require_present(plan, self.pool.transports, specs)
            return
        if all(n.local for n in plan.nodes):
            return
        facts = {h.spec.name: h.facts for h in report.hosts}
        for name, how in sync.sync(plan, self.pool.transports, specs, facts,
                                   excludes(plan.code_dir, self.opts, specs.values()),
                                   early=head.answers if head else None).items():
            self.say(f"{name}: {plan.code_dir.name}/ {how}")

    def _detached(self, journal: Journal, plan: LaunchPlan, session: Session) -> Detached:
        session.watch_start()
        lost = [n for n in session.nodes.values() if n.lost is not None]
        if not lost:
            journal.detached()
            self.say(f"run {plan.run_id} started on {len(plan.nodes)} nodes and runs on without "
                     f"this terminal. Follow it: clusterrun logs -f {plan.run_id}   end it: "
                     f"clusterrun stop {plan.run_id}")
            return Detached(Result())
        for node in lost:
            self.say(f"{node.plan.name}: {node.lost}")
        stopped = session.stop_started()
        journal.ended(plan.attempt, RunState.FAILED, status=int(ExitStatus.NODE_LOST),
                      reason="a node did not start")
        if stopped:
            self.say(f"the run did not start everywhere; stopped it on {', '.join(stopped)}")
        else:
            self.say(f"the run did not start everywhere; stop what did start with `clusterrun "
                     f"stop {plan.run_id}`")
        return Detached(Result(cause=Outcome.NODE_LOST))

    # -- between attempts and at the end ---------------------------------------------------

    def _record_quarantine(self, journal: Journal) -> None:
        """The hosts left out since the journal last heard (a check before an attempt can
        quarantine hosts before the run has a journal)."""
        for entry in self.slots.quarantined[len(journal.quarantined()):]:
            journal.host_quarantined(entry)

    def _attempt_failed(self, journal: Journal, ended: AttemptResult) -> None:
        """A failed attempt that another may follow: its summary and its root cause, now."""
        summary, _logs = outcome.attempt_summary(ended.folder, ended.nodes, root=ended.root,
                                                 status=ended.status, interrupted=None)
        for line in outcome.report(ended.folder, list(ended.nodes), ended.root, None, False):
            self.say(line)
        journal.attempt_ended(ended.plan.attempt, status=ended.status,
                              root=ended.root.public() if ended.root else None, summary=summary)

    def _restart(self, step: Restart,
                 ended: AttemptResult) -> Optional[tuple[LaunchPlan, CheckReport]]:
        """The next attempt's plan and check after a failed one (None: it cannot be made)."""
        head = f"attempt {step.attempt}/{self.opts.max_restarts + 1}"
        try:
            for name, why in step.leave_out:
                self.pool.discard(name)
                self.say(f"{head}: {self.slots.leave_out(name, why, step.attempt - 1)}")
        except CannotReplace as exc:
            self.say(f"cannot restart: {exc}")
            return None
        if not step.leave_out and ended.root is not None:
            self.say(f"{head}: restarting after {ended.root.detail}, on the same hosts once "
                     "they pass the check")
        found = self.check(step.attempt)
        if not found.ok and (self.opts.check or found.unreachable):
            checkview.render_plain(found, self.err)
            self.say("cannot restart: the hosts left failed the check (see above).")
            return None
        return self.plan(step.attempt, found, ended.plan.run_id), found

    def _finish(self, journal: Journal, ended: AttemptResult, *, reported: bool) -> Result:
        status = ended.status
        summary, logs = outcome.attempt_summary(ended.folder, ended.nodes, root=ended.root,
                                                status=status, interrupted=ended.interrupted)
        k = ended.plan.attempt
        if self.environment:  # the lock's hash every host ran (`environment:`)
            summary = summary.with_(environment=self.environment)
        state = journal.ended(k, ended.state, status=status, summary=summary,
                              root=ended.root.public() if ended.root else None)
        if status != 0 and not reported:  # a failed attempt's root cause is said when it ends
            for line in outcome.report(ended.folder, list(ended.nodes), ended.root,
                                       ended.interrupted, ended.stopped):
                self.say(line)
        if k > 1:
            for entry in journal.attempts():
                what = entry.get("root_cause") or (
                    "succeeded" if entry.get("exit_status") == 0 else "stopped")
                self.say(f"attempt {entry['attempt']}: {what} (exit {entry.get('exit_status')})")
            for q in journal.quarantined():
                self.say(f"quarantined: {q['host']} ({q['reason']}, attempt {q['attempt']})")
        if logs["differ"]:
            self.say(f"logs: {len(logs['differ'])} file(s) differ from the hosts' copies: "
                     f"{', '.join(logs['differ'][:5])} (the hosts keep the originals)")
        else:
            self.say(f"logs: {logs['identical']} files, identical on the hosts and in "
                     f"{ended.folder.path}")
        self.say(f"run {ended.plan.run_id} {state.value} (exit {status})"
                 + (f" after {k} attempts" if k > 1 else ""))
        return ended.result

    def _public(self, plan: LaunchPlan) -> dict[str, object]:
        found = dict(plan.public(), inventory=str(self.inv.path))
        if self.environment:  # `ps` shows the lock's hash from the start of the run
            found["environment"] = self.environment
        return found


def excludes(code_dir: Path, opts: LaunchOptions, specs: Iterable[HostSpec]) -> tuple[str, ...]:
    """--exclude, and the env files inside the copied directory (never copied: secrets)."""
    env_files = [opts.env_file, *(s.env_file for s in specs)]
    return (*opts.excludes, *sync.env_file_excludes(code_dir, env_files))
