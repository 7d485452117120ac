"""What a run in progress dispatches to on the controller: a *watcher*, one concern of the run
(the pause detector, the teardown, the leases, the log view, NCCL's lines, the stall watchdog).

As ClusterShell's event handlers are built: a watcher overrides only what it needs and names the
node events it listens to. The session (session.py) records each node's events, then hands each
one to the watchers listening to its type; it ticks them all on every turn of its loop in the
order they were registered (``standard``, then ``Session.add``), passes them the logs' bytes,
tells them when it begins stopping the nodes, and once the run has ended has them finish, the
last registered first. It knows none of them: a new concern is a watcher added here, which sees
the session only through ``Run``.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Protocol

from clusterrun import wire
from clusterrun.inventory import HostSpec
from clusterrun.launch import pause, tracking
from clusterrun.launch.nccl import NcclWatch
from clusterrun.launch.outcome import NodeOutcome, failures
from clusterrun.logs.view import LogView
from clusterrun.plan.model import LaunchPlan
from clusterrun.remote.shared import layout, stallreport, timing
from clusterrun.runs.journal import Journal
from clusterrun.runs.store import RunDir
from clusterrun.stacks import stallview
from clusterrun.transport import SshOptions

START_SECONDS = 60.0
TEARDOWN_MARGIN = 15.0

# torchrun's own output once a run is ending: its tracebacks and warnings repeat what the root
# cause says, ~25 lines per node. They stay in node.log; the console gets one line for them.
TEARDOWN_OUTPUT = re.compile(
    rb"closing signal|Traceback \(most recent call last\)|ChildFailedError|SignalException"
    rb"|Received Signals\.|failed \(exitcode: ")


class Watcher:
    """One concern of a run in progress; every method does nothing unless overridden."""

    listens: tuple[type, ...] = ()  # the node events (wire.py) handed to ``event``

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        """Node ``name``'s event, after the session recorded it (``arrived``: monotonic)."""

    def data(self, node: str, file: str, data: bytes) -> None:
        """Bytes of a node's log file, from that host's reader thread."""

    def tick(self, now: float) -> None:
        """Every turn of the session's loop (about 5 a second)."""

    def stopping(self) -> None:
        """The session tells the nodes to stop (Ctrl-C, a failure)."""

    def finish(self) -> None:
        """Every node has ended or is lost, and their last events were handled."""


class Run(Protocol):
    """What a watcher sees of the session, and may do with it."""

    plan: LaunchPlan
    specs: dict[str, HostSpec]
    nodes: dict[str, NodeOutcome]
    view: LogView
    notify: Callable[[str], None]  # one line for the user, on stderr
    pauses: pause.Pauses
    abandoned: bool  # this controller fell silent past the lease: the nodes left
    stopping_since: Optional[float]
    last_frame: dict[str, float]  # when each node was last heard from (monotonic)
    silent: set[str]  # nodes lost to silence: their hosts may not answer
    interrupts: list[int]  # signals received (Ctrl-C), filled by the signal handlers
    on_interrupt: Callable[[int, bool], None]  # (signal, first) for each one

    def add(self, watcher: Watcher) -> None: ...

    def send(self, name: str, op: dict[str, Any]) -> None: ...

    def stop_all(self, force: bool = False, reason: Optional[str] = None) -> None: ...

    def lose(self, name: str, why: str) -> None: ...

    def renew(self, gap: float) -> None: ...


class Paused(Watcher):
    """This controller did not run for a while (launch/pause.py): the nodes get a fresh lease,
    and the user hears what the nodes made of it."""

    listens = (wire.End,)

    def __init__(self, run: Run) -> None:
        self.run = run

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        if isinstance(ev, wire.End):
            self.run.pauses.unseen(ev.cause, self.run.abandoned, self.run.notify)

    def tick(self, now: float) -> None:
        paused = self.run.pauses.turn()
        if paused is None:
            return
        gap, silent = paused
        # That silence was this controller's own: every node gets a fresh lease to be heard
        # from (their reports are on their way).
        self.run.renew(gap)
        self.run.abandoned = self.run.abandoned or silent > self.run.plan.lease
        text = pause.notice(gap, silent, self.run.plan.lease)
        if text:
            self.run.notify(text)


class Teardown(Watcher):
    """Ctrl-C (a second one kills), or the first failure or lost node: every node is told to
    stop."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.seen = 0  # interrupts handled

    def tick(self, now: float) -> None:
        run = self.run
        while self.seen < len(run.interrupts):
            first = self.seen == 0
            run.on_interrupt(run.interrupts[self.seen], first)
            run.stop_all(force=not first, reason="interrupted on the controller")
            self.seen += 1
        if run.stopping_since is None:
            found = failures(list(run.nodes.values()))
            if found and not run.abandoned:  # if it was, the user has been told
                run.notify(f"{found[0].detail}; stopping every node")
            if found:
                run.stop_all(reason=f"stopped after {found[0].detail}")


class Leases(Watcher):
    """A node is lost when its supervisor does not start, is not heard from for the lease, or
    does not confirm a stop in time."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def tick(self, now: float) -> None:
        run = self.run
        for name, node in run.nodes.items():
            if node.done:
                continue
            heard = run.last_frame.get(name, now)
            quiet = now - heard
            if node.started is None and timing.over(now, heard, START_SECONDS):
                run.lose(name, f"its supervisor did not start within {START_SECONDS:g} s")
            elif timing.over(now, heard, run.plan.lease):
                run.silent.add(name)
                run.lose(name, f"no word from it for {quiet:.0f} s (host down or network "
                         "partitioned; its supervisor ends the run there when its lease runs "
                         "out)")
            elif run.stopping_since is not None and timing.over(
                    now, run.stopping_since, run.plan.grace + TEARDOWN_MARGIN):
                run.lose(name, "it did not confirm the stop in time")


class Untracked(Watcher):
    """Once every node has started: the hosts whose job runs without a cgroup (tracking.py)."""

    listens = (wire.Started,)

    def __init__(self, run: Run) -> None:
        self.run = run

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        if all(n.started is not None for n in self.run.nodes.values()):
            note = tracking.untracked_note(self.run.nodes, self.run.specs)
            if note:
                self.run.notify(note)


class Nccl(Watcher):
    """What NCCL chose on each host, told once (launch/nccl.py)."""

    listens = (wire.NcclReport,)

    def __init__(self, run: Run) -> None:
        self.watch = NcclWatch({n.name: n.ranks for n in run.plan.nodes}, run.notify)

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        if isinstance(ev, wire.NcclReport):
            self.watch.update(name, ev, arrived)

    def tick(self, now: float) -> None:
        self.watch.tick(now)

    def finish(self) -> None:
        self.watch.finish()


class Fold:
    """Shows node.log (torchrun's own output) line by line until the node's teardown begins,
    then only counts it."""

    def __init__(self, view: LogView, nodes: dict[str, NodeOutcome]) -> None:
        self.view = view
        self.nodes = nodes
        self.quiet: set[str] = set()
        self.pending: dict[str, bytes] = {}

    def feed(self, node: str, file: str, data: bytes) -> None:
        if file != layout.NODE_LOG:
            self.view.feed(node, file, data)
            return
        text = self.pending.pop(node, b"") + data
        *lines, rest = text.split(b"\n")
        shown = []
        for line in lines:
            if stallreport.is_note(line):
                continue  # the master's copy of a stall report the controller prints itself
            if node not in self.quiet and TEARDOWN_OUTPUT.search(line):
                self.quiet.add(node)
            if node in self.quiet:
                self.nodes[node].folded += 1
            else:
                shown.append(line + b"\n")
        if shown:
            self.view.feed(node, file, b"".join(shown))
        if rest:
            self.pending[node] = rest

    def hush(self, node: Optional[str] = None) -> None:
        """The node's (or every node's) teardown has begun."""
        self.quiet.update([node] if node is not None else self.nodes)

    def close(self) -> None:
        for node, rest in self.pending.items():
            if node in self.quiet:
                self.nodes[node].folded += 1
            else:
                self.view.feed(node, layout.NODE_LOG, rest)
        self.pending.clear()


class Logs(Watcher):
    """The log view: every node's lines as they come, torchrun's own folded once a node's
    teardown begins (its own rank failed, or the session stops them all)."""

    listens = (wire.RankExit,)

    def __init__(self, run: Run) -> None:
        self.view = run.view
        self.fold = Fold(run.view, run.nodes)

    def data(self, node: str, file: str, data: bytes) -> None:
        self.fold.feed(node, file, data)

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        if isinstance(ev, wire.RankExit) and ev.code != 0 and not ev.stopping:
            self.fold.hush(name)

    def stopping(self) -> None:
        self.fold.hush()

    def tick(self, now: float) -> None:
        self.view.tick()

    def finish(self) -> None:
        self.fold.close()


class Stalls(Watcher):
    """An attached run's stalls (stacks/stallview.py): the nodes' quiet times passed on to the
    master's supervisor, which decides; what it asks for fetched, and what it decided shown."""

    listens = (wire.Progress, wire.StallAsk, wire.Stalled, wire.Resumed)

    def __init__(self, run: Run, view: stallview.StallView) -> None:
        self.run = run
        self.view = view

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        if isinstance(ev, wire.Progress):
            self.view.progress(name, ev.quiet)
        elif isinstance(ev, wire.StallAsk):
            self.view.ask(ev.what)
        elif isinstance(ev, wire.Stalled):
            self.view.stalled(ev)
        elif isinstance(ev, wire.Resumed):
            self.view.resumed()

    def finish(self) -> None:
        self.view.close()  # what is still being fetched when the attempt ended stays unsaid


def standard(run: Run) -> list[Watcher]:
    """Every session's watchers, in the order they tick. The pause detector comes first: a
    paused controller's own silence must not count against the nodes' leases."""
    return [Paused(run), Teardown(run), Leases(run), Untracked(run), Nccl(run), Logs(run)]


def watch_stalls(run: Run, folder: RunDir, journal: Journal, ssh: SshOptions, *,
                 say: Callable[[str], None]) -> None:
    """The attempt's stall view, where it has one (--stall-timeout, attached)."""
    view = stallview.for_session(run.plan, folder, journal, run.send, ssh, say=say)
    if view is not None:
        run.add(Stalls(run, view))
