"""The stall watchdog of an attached run, on the controller (detached runs: the hub's,
clusterrun/remote/node/stallwatch.py, with the same rule).

Every node's supervisor reports how long its ranks have made no progress (remote/shared/stallrule.py
says what progress is). When ``stallrule.stalled`` says the whole run is stalled, every rank's
stack is taken (``collect``), the report (remote/shared/stallreport.py, the hub's rule and words)
is printed, kept in the master's node.log (so `logs` shows it) and recorded in the run's
journal (``ps`` shows ``stalled``, summary.json keeps it).
When no rank stands out, the hosts' links are tested again first (stacks/links.py): a host
whose links fail is the root cause.
One report per stall: the run must move again (``resumed``) before another one.
What it saw is kept in the attempt's folder when the attempt ends (``watch.json``: per node,
how many progress reports came and the longest quiet time one said), so a run that was never
called stalled shows it was watched.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from clusterrun.inventory.ranges import fold, fold_numbers
from clusterrun.plan.model import LaunchPlan
from clusterrun.remote.shared import protocol, stallreport, stallrule
from clusterrun.remote.shared.protocol import OP, Lifeline
from clusterrun.runs.journal import Journal
from clusterrun.runs.store import RunDir, write_json
from clusterrun.stacks import links
from clusterrun.stacks.collect import collect
from clusterrun.stacks.model import Collected, as_sent
from clusterrun.transport import SshOptions


def report(found: Collected, timeout: float) -> tuple[list[str], dict[str, Any]]:
    """The report's lines (odd ranks out first, then the waiting group) and its record, by the
    hub's own rule and words (remote/shared/stallreport.py); host names folded by NodeSet here."""
    lines, record = stallreport.build(  # type: ignore[no-untyped-call]
        [as_sent(r) for r in found.ranks], timeout, found.problems,
        fold_nodes=fold, fold_ranks=fold_numbers, records=found.flight)
    return lines, dict(record, stacks=found.to_json()["ranks"])


class Watchdog:
    """``update`` with each node's progress report, ``tick`` from the session's loop."""

    def __init__(self, run: RunDir, nodes: list[str], timeout: float, ssh: SshOptions, *,
                 to_node: Callable[[Optional[str], dict[str, Any]], None],
                 say: Callable[[str], None], stop_run: bool = False,
                 record: Callable[[Optional[dict[str, Any]]], None],
                 kept: Optional[RunDir] = None) -> None:
        self.run = run
        self.kept = kept  # the attempt's folder, where close() writes watch.json
        self.timeout = timeout
        self.ssh = ssh
        self.to_node = to_node  # None: the master
        self.stop_run = stop_run  # --on-stall stop
        self.say = say
        self.record = record  # the report when it fires, None when the run moves again
        self.quiet: dict[str, Optional[tuple[float, float]]] = dict.fromkeys(nodes)
        self.seen: dict[str, dict[str, float]] = {n: {"reports": 0, "longest_quiet": 0.0}
                                                  for n in nodes}
        self.fired = False
        self.busy: Optional[threading.Thread] = None
        # The report is made on its own thread (collecting stacks takes seconds): once the
        # attempt has ended (``close``) it says, records and sends nothing more.
        self.closed = False
        self.speaking = threading.Lock()

    def close(self) -> None:
        """The attempt ended: a report still being made is dropped, never printed after the
        attempt's end (nor recorded, nor sent to a node that has stopped)."""
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

    def update(self, node: str, quiet: float, arrived: float) -> None:
        self.quiet[node] = (quiet, arrived)
        seen = self.seen.setdefault(node, {"reports": 0, "longest_quiet": 0.0})
        seen["reports"] += 1
        seen["longest_quiet"] = max(seen["longest_quiet"], quiet)

    def ended(self, node: str) -> None:
        """A node whose ranks have all ended makes no more progress."""
        self.quiet[node] = (float("inf"), time.monotonic())

    def _now(self, now: float) -> dict[str, Optional[float]]:
        return {n: (q[0] + now - q[1]) if q else None for n, q in self.quiet.items()}

    def tick(self, now: float) -> None:
        if self.timeout <= 0 or (self.busy is not None and self.busy.is_alive()):
            return
        if stallrule.stalled(self._now(now), self.timeout):  # type: ignore[no-untyped-call]
            if not self.fired:
                self.fired = True
                self.busy = threading.Thread(target=self._fire, daemon=True,
                                             name="clusterrun-stall")
                self.busy.start()
        elif self.fired:
            self.fired = False
            self.say("stall over: the run moves again")
            self.to_node(None, {OP: Lifeline.RESUMED})
            self.record(None)

    def _fire(self) -> None:
        found = collect(self.run, self.ssh)
        lines, record = report(found, self.timeout)
        if not self._say(lines):
            return
        # No odd rank out (all wait in one collective, or none could be seen): the hosts'
        # data path is tested again, and a host whose links fail is the root cause.
        more: list[str] = []
        if not record["odd"]:
            more, record["links"], _blamed = links.judge(links.retest(self.run, self.ssh))
            lines.extend(more)
        with self.speaking:
            if self.closed:
                return
            for line in more:
                self.say(line)
            self.record(record)
            self.to_node(None, {OP: Lifeline.STALL, "lines": lines, "report": {
                k: v for k, v in record.items() if k != "stacks"}})
            # The odd rank's node, or the host whose links failed, fails with status 7
            # (--on-stall stop there): the root cause names that host, so a restart replaces
            # it if a spare is left. Neither (None): the master, whose failure's detail says
            # that no host is blamed (wire.RootCause). The hub decides by the same rule.
            target, detail = stallreport.stop(lines, record)  # type: ignore[no-untyped-call]
            if self.stop_run:
                self.to_node(target, {OP: Lifeline.STALL, "fail": True, "detail": detail})

    def _say(self, lines: list[str]) -> bool:
        """Print the lines unless the attempt has ended; whether it had not."""
        with self.speaking:
            if self.closed:
                return False
            for line in lines:
                self.say(line)
            return True


def for_session(plan: LaunchPlan, folder: RunDir, journal: Journal,
                send: Callable[[str, dict[str, Any]], None], ssh: SshOptions, *,
                say: Callable[[str], None]) -> Optional[Watchdog]:
    """The watchdog of an attached attempt (None when --stall-timeout is 0 or detached: the
    hub watches those). Records go through the run's journal."""
    if plan.stall_timeout <= 0 or plan.detach:
        return None
    master = next(n.name for n in plan.nodes if n.node_rank == 0)
    run = RunDir(folder.path.parent) if folder.attempt > 1 else folder

    def record(found: Optional[dict[str, Any]]) -> None:
        if found is None:
            journal.resumed(plan.attempt)
        else:
            journal.stalled(plan.attempt, found)

    return Watchdog(run, [n.name for n in plan.nodes], plan.stall_timeout, ssh,
                    to_node=lambda node, op: send(node or master, op),
                    say=say, record=record, stop_run=plan.on_stall == protocol.STALL_STOP,
                    kept=folder)
