"""An attached run's stalls on the controller: it shows what the run's one stall decider, the
master's supervisor (clusterrun/remote/node/stallhub.py), decided, as for a detached run.

Every node's supervisor reports how long its ranks have made no progress (``progress``
events, remote/shared/stallrule.py says what progress is); this side passes the other nodes'
on to the master, which decides. When the master asks (``stall_ask``) it fetches what an
attached run's master cannot reach itself: every rank's stack (``collect``) and, when no rank
stands out, the hosts' links tested again (stacks/links.py). The decision (``stalled``) is
printed as the report's lines, recorded in the run's journal (``ps`` shows ``stalled``,
summary.json keeps it, with the stacks collected here), and with --on-stall stop the blamed node
is told to fail (the master stops itself); "stall over" once the run moves again (``resumed``).
What it saw is kept in the attempt's folder when the attempt ends (``watch.json``: per node,
how many progress reports came and the longest quiet time one said), so a run that was never
called stalled shows it was watched.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from clusterrun import wire
from clusterrun.errors import ClusterrunError
from clusterrun.plan.model import LaunchPlan
from clusterrun.remote.shared.protocol import OP, Lifeline
from clusterrun.runs.journal import Journal
from clusterrun.runs.store import RunDir, write_json
from clusterrun.stacks import links
from clusterrun.stacks.collect import collect
from clusterrun.stacks.model import Collected, as_sent
from clusterrun.transport import SshOptions

Send = Callable[[str, dict[str, Any]], None]


def stacks_op(found: Collected) -> dict[str, Any]:
    """What the master's decider reads of the collected stacks (stallreport.build's input)."""
    return {OP: Lifeline.STACKS, "ranks": [as_sent(r) for r in found.ranks],
            "problems": found.problems, "flight": found.flight}


def links_op(found: links.Links) -> dict[str, Any]:
    return {OP: Lifeline.LINKS, "hosts": found.hosts, "blocked": [list(b) for b in found.blocked],
            "addresses": found.addresses, "untested": found.untested}


class StallView:
    """``progress``, ``ask``, ``stalled`` and ``resumed`` with the nodes' events; ``close`` when
    the attempt ends."""

    def __init__(self, run: RunDir, nodes: list[str], timeout: float, ssh: SshOptions, *,
                 master: str, send: Send, say: Callable[[str], None],
                 record: Callable[[Optional[dict[str, Any]]], None],
                 kept: Optional[RunDir] = None) -> None:
        self.run = run
        self.kept = kept  # the attempt's folder, where close() writes watch.json
        self.timeout = timeout
        self.ssh = ssh
        self.master = master
        self.send = send
        self.say = say
        self.record = record  # the report when the master decided, None when the run moves again
        self.seen: dict[str, dict[str, float]] = {n: {"reports": 0, "longest_quiet": 0.0}
                                                  for n in nodes}
        self.found: Optional[Collected] = None  # the stacks collected for the last stall
        self.fired = False
        # What the master asked for is fetched on a thread of its own (seconds, over SSH): once
        # the attempt has ended (``close``) it says, records and sends nothing more.
        self.closed = False
        self.speaking = threading.Lock()

    def close(self) -> None:
        """The attempt ended: nothing more is printed, recorded or sent for it."""
        with self.speaking:
            if self.closed:
                return
            self.closed = True
        if self.kept is None:
            return
        try:
            write_json(self.kept.file("watch.json"), {"timeout": self.timeout,
                                                      "nodes": self.seen})
        except OSError:  # a full disk: the run's own record matters more than this one
            return

    def progress(self, node: str, quiet: float) -> None:
        seen = self.seen.setdefault(node, {"reports": 0, "longest_quiet": 0.0})
        seen["reports"] += 1
        seen["longest_quiet"] = max(seen["longest_quiet"], quiet)
        if node != self.master:  # the master measures its own
            self._send(self.master, {OP: Lifeline.PROGRESS, "node": node, "quiet": quiet})

    def ask(self, what: str) -> threading.Thread:
        """Fetch what the master asked for, on a thread, and send it there."""
        def fetch() -> None:
            try:
                if what == Lifeline.STACKS:
                    found = collect(self.run, self.ssh)
                    self.found = found
                    self._send(self.master, stacks_op(found))
                elif what == Lifeline.LINKS:
                    self._send(self.master, links_op(links.retest(self.run, self.ssh)))
            except (ClusterrunError, OSError) as exc:
                # The decider waits for an answer: one that says what could not be seen keeps
                # it deciding (a blind report, links untested) instead of waiting forever.
                why = f"the controller could not ask the hosts: {exc}"
                if what == Lifeline.STACKS:
                    self._send(self.master, stacks_op(Collected(
                        self.run.id, problems=dict.fromkeys(self.seen, why))))
                else:
                    self._send(self.master, links_op(links.Links(
                        [], [], untested=dict.fromkeys(self.seen, why))))

        busy = threading.Thread(target=fetch, daemon=True, name="clusterrun-stall")
        busy.start()
        return busy

    def stalled(self, ev: wire.Stalled) -> None:
        report = dict(ev.report)
        if self.found is not None:
            report["stacks"] = self.found.to_json()["ranks"]
        with self.speaking:
            if self.closed:
                return
            self.fired = True
            for line in ev.lines:
                self.say(line)
            self.record(report)
            if ev.stop is not None:  # the blamed node fails with status 7
                self.send(ev.stop, {OP: Lifeline.STALL, "fail": True, "detail": ev.detail})

    def resumed(self) -> None:
        with self.speaking:
            if self.closed or not self.fired:
                return
            self.fired = False
            self.say("stall over: the run moves again")
            self.record(None)

    def _send(self, node: str, op: dict[str, Any]) -> None:
        with self.speaking:
            if not self.closed:
                self.send(node, op)


def for_session(plan: LaunchPlan, folder: RunDir, journal: Journal, send: Send,
                ssh: SshOptions, *, say: Callable[[str], None]) -> Optional[StallView]:
    """The view of an attached attempt's stalls (None when --stall-timeout is 0 or detached:
    the master's supervisor keeps those on its host). Records go through the run's journal."""
    if plan.stall_timeout <= 0 or plan.detach:
        return None
    master = next(n.name for n in plan.nodes if n.node_rank == 0)
    run = RunDir(folder.path.parent) if folder.attempt > 1 else folder

    def record(found: Optional[dict[str, Any]]) -> None:
        if found is None:
            journal.resumed(plan.attempt)
        else:
            journal.stalled(plan.attempt, found)

    return StallView(run, [n.name for n in plan.nodes], plan.stall_timeout, ssh, master=master,
                     send=send, say=say, record=record, kept=folder)
