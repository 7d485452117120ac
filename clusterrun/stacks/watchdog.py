"""The stall watchdog of an attached run, on the controller (detached runs: the hub's,
clusterrun/remote/watchdog.py, with the same rule).

Every node's supervisor reports how long its ranks have made no progress (remote/stall.py
says what progress is). When ``stall.stalled`` says the whole run is stalled, every rank's
stack is taken (``collect``), the report is printed, kept in the master's node.log (so `logs`
shows it) and recorded in the run's journal (``ps`` shows ``stalled``, summary.json keeps it).
When no rank stands out, the hosts' links are tested again first (stacks/links.py): a host
whose links fail is the root cause.
One report per stall: the run must move again (``resumed``) before another one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Optional

from clusterrun.plan.model import LaunchPlan
from clusterrun.remote import protocol, stall
from clusterrun.remote.protocol import OP, Lifeline
from clusterrun.remote.watchdog import stop_detail as stall_detail
from clusterrun.runs.journal import Journal
from clusterrun.runs.store import RunDir
from clusterrun.stacks import links, view
from clusterrun.stacks.collect import collect
from clusterrun.stacks.model import Collected
from clusterrun.transport import SshOptions


def report(found: Collected, timeout: float) -> tuple[list[str], dict[str, Any]]:
    """The report's lines (odd ranks out first, then the waiting group) and its record."""
    seen = [r for r in found.ranks if not r.error]
    if not seen:  # blind: say what could not be seen, name no rank (and so no host)
        return blind(found, timeout), {"timeout": timeout, "odd": [], "waiting": None,
                                       "blind": True, "stacks": found.to_json()["ranks"]}
    # A rank whose stack could not be read is no odd one out: not seeing it names no host.
    groups = view.groups(dataclasses.replace(found, ranks=seen))
    lines = [f"stall: no rank made progress for {timeout:g} s; {len(found.ranks)} ranks, "
             f"{len(groups)} different stack{'s' if len(groups) != 1 else ''}"]
    odd: list[dict[str, Any]] = []
    waiting: Optional[dict[str, Any]] = None
    for index, group in enumerate(groups):
        wait = view.waiting_in(group.first)
        where = f"the collective {wait}" if wait else view.innermost(group.first)
        if index < len(groups) - 1 or (len(groups) == 1 and len(group.ranks) == 1):
            for rank in group.ranks:
                stopped = " STOPPED (SIGSTOP)" if rank.state == "T" else ""
                lines.append(f"stall: odd one out: rank {rank.rank} on {rank.node} (pid "
                             f"{rank.pid}){stopped} in {where}; last line: {rank.last_line!r}")
                if rank.where:  # its own line, and its DataLoader workers'
                    lines.append(f"stall:   {rank.where}")
                odd.append({"rank": rank.rank, "node": rank.node, "pid": rank.pid,
                            "frame": view.innermost(rank), "last_line": rank.last_line,
                            "stopped": rank.state == "T", "where": rank.where})
        else:
            lines.append(f"stall: {group.label} wait in {wait or where}")
            waiting = {"ranks": [r.rank for r in group.ranks], "in": wait or where}
    for name, why in sorted(found.problems.items()):
        lines.append(f"stall: no stacks from {name}: {why}")
    lines.extend(f"stall: no stack from rank {r.rank} on {r.node} (pid {r.pid}): {r.error}"
                 for r in found.ranks if r.error)
    return lines, {"timeout": timeout, "odd": odd, "waiting": waiting,
                   "stacks": found.to_json()["ranks"]}


def blind(found: Collected, timeout: float) -> list[str]:
    """The report when no rank's stack could be read: why, per host, instead of a verdict."""
    lines = [f"stall: no rank made progress for {timeout:g} s; no rank's stack could be read, "
             "so no rank or host can be named as the cause"]
    for name, why in sorted(found.problems.items()):
        lines.append(f"stall: no stacks from {name}: {why}")
    for rank in found.ranks:
        lines.append(f"stall: rank {rank.rank} on {rank.node} (pid {rank.pid}): {rank.error}; "
                     f"last line: {rank.last_line!r}")
    return lines


class Watchdog:
    """``update`` with each node's progress report, ``tick`` from the session's loop."""

    def __init__(self, run: RunDir, nodes: list[str], timeout: float, ssh: SshOptions, *,
                 to_node: Callable[[Optional[str], dict[str, Any]], None],
                 say: Callable[[str], None], stop_run: bool = False,
                 record: Callable[[Optional[dict[str, Any]]], None]) -> None:
        self.run = run
        self.timeout = timeout
        self.ssh = ssh
        self.to_node = to_node  # None: the master
        self.stop_run = stop_run  # --on-stall stop
        self.say = say
        self.record = record  # the report when it fires, None when the run moves again
        self.quiet: dict[str, Optional[tuple[float, float]]] = dict.fromkeys(nodes)
        self.fired = False
        self.busy: Optional[threading.Thread] = None

    def update(self, node: str, quiet: float, arrived: float) -> None:
        self.quiet[node] = (quiet, arrived)

    def ended(self, node: str) -> None:
        """A node whose ranks have all ended makes no more progress."""
        self.quiet[node] = (float("inf"), time.monotonic())

    def _now(self, now: float) -> dict[str, Optional[float]]:
        return {n: (q[0] + now - q[1]) if q else None for n, q in self.quiet.items()}

    def tick(self, now: float) -> None:
        if self.timeout <= 0 or (self.busy is not None and self.busy.is_alive()):
            return
        if stall.stalled(self._now(now), self.timeout):  # type: ignore[no-untyped-call]
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
        for line in lines:
            self.say(line)
        # No odd rank out (all wait in one collective, or none could be seen): the hosts'
        # data path is tested again, and a host whose links fail is the root cause.
        blamed: Optional[str] = None
        more: list[str] = []
        if not record["odd"]:
            more, record["links"], blamed = links.judge(links.retest(self.run, self.ssh))
            for line in more:
                self.say(line)
            lines.extend(more)
        self.record(record)
        self.to_node(None, {OP: Lifeline.STALL, "lines": lines, "report": {
            k: v for k, v in record.items() if k != "stacks"}})
        # The odd rank's node, or the host whose links failed, fails with status 7 (--on-stall
        # stop there): the root cause names that host, so a restart replaces it if a spare is
        # left. Neither: the master.
        odd = record["odd"][0]["node"] if record["odd"] else blamed
        detail = (links.stop_detail(more[0]) if blamed  # the blamed host's line comes first
                  else stall_detail(lines))  # type: ignore[no-untyped-call]
        if self.stop_run:
            self.to_node(odd, {OP: Lifeline.STALL, "fail": True, "detail": detail})


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
                    say=say, record=record, stop_run=plan.on_stall == protocol.STALL_STOP)
