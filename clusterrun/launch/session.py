"""A run in progress: one supervisor per host, their streams, heartbeats, and gang teardown.

Every host's supervisor reports typed events (wire.py) and streams its log files; this side
mirrors the files, prints the lines, and watches for the first failure or lost host, at which
point every other host is told to stop (SIGTERM, grace, SIGKILL, done by the supervisors
themselves). Heartbeats flow both ways on the same channel.

Detached runs have no controller after the start: the master's supervisor is started first as
the gang's hub (it reports the port it listens on), then every worker's supervisor with the
hub's address and the run's secret, on stdin (clusterrun/remote/gang.py).
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from clusterrun import wire
from clusterrun.inventory import HostSpec
from clusterrun.launch import pause, tracking
from clusterrun.launch.nccl import NcclWatch
from clusterrun.launch.outcome import Clock, NodeOutcome, failures, node_failures
from clusterrun.logs.mirror import Mirror, receive
from clusterrun.logs.view import LogView
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.remote.protocol import OP, Lifeline
from clusterrun.stacks.watchdog import Watchdog
from clusterrun.transport import Process, Transport, parallel
from clusterrun.transport.programs import call, release, start

HEARTBEAT = 2.0
LOST_CLEANUP = 10.0  # seconds to end what a lost node left, on a host that still answers
START_SECONDS = 60.0
TEARDOWN_MARGIN = 15.0

# torchrun's own output once a run is ending: its tracebacks and warnings repeat what the root
# cause says, ~25 lines per node. They stay in node.log; the console gets one line for them.
TEARDOWN_OUTPUT = re.compile(
    rb"closing signal|Traceback \(most recent call last\)|ChildFailedError|SignalException"
    rb"|Received Signals\.|failed \(exitcode: ")


@dataclass(frozen=True)
class _Eof:
    pass


@dataclass(frozen=True)
class _Broken:
    error: str


Item = Union[wire.Event, _Eof, _Broken]


def request(plan: LaunchPlan, node: NodePlan,
            gang: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """remote/run.py's request: everything it needs, user data included (on stdin only)."""
    public = dict(node.public(), run_id=plan.run_id, script=str(plan.script),
                  args=list(plan.args), world_size=plan.world_size)
    req = {"node": node.name, "rundir": node.rundir, "cwd": node.cwd,
           "argv": list(node.argv), "env": dict(node.env), "public": public,
           "detach": plan.detach, "grace": plan.grace, "lease": plan.lease,
           "heartbeat": HEARTBEAT, "stall_timeout": plan.stall_timeout, "on_stall": plan.on_stall,
           # A Slurm step ends, with every process in it, when its first process exits.
           "hold_step": dict(node.connection).get("transport") == "srun"}
    if node.processes:  # --no-torchrun: the supervisor starts each process itself
        req["ranks"] = [{"argv": list(p.argv), "env": dict(p.env)} for p in node.processes]
        req["python"] = node.python
    if gang is not None:
        req["gang"] = gang
    return req


class Fold:
    """Shows node.log (torchrun's own output) line by line until the node's teardown begins,
    then only counts it."""

    def __init__(self, view: LogView, nodes: dict[str, NodeOutcome]) -> None:
        self.view = view
        self.nodes = nodes
        self.quiet: set[str] = set()
        self.pending: dict[str, bytes] = {}

    def feed(self, node: str, file: str, data: bytes) -> None:
        if file != "node.log":
            self.view.feed(node, file, data)
            return
        text = self.pending.pop(node, b"") + data
        *lines, rest = text.split(b"\n")
        shown = []
        for line in lines:
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
                self.view.feed(node, "node.log", rest)
        self.pending.clear()


class Session:
    def __init__(self, plan: LaunchPlan, transports: dict[str, Transport],
                 specs: dict[str, HostSpec], *, mirror: Mirror, view: LogView,
                 notify: Callable[[str], None]) -> None:
        self.plan = plan
        self.transports = transports
        self.specs = specs
        self.mirror = mirror
        self.view = view
        self.notify = notify  # one line for the user, on stderr
        self.nodes = {n.name: NodeOutcome(n) for n in plan.nodes}
        self.fold = Fold(view, self.nodes)
        self.nccl = NcclWatch({n.name: n.ranks for n in plan.nodes}, notify)
        self.procs: dict[str, Process] = {}
        self.stderr: dict[str, bytearray] = {}
        self.events: queue.Queue[tuple[str, Item, float]] = queue.Queue()
        self.last_frame: dict[str, float] = {}
        self.stopping_since: Optional[float] = None
        self.broken: dict[str, str] = {}
        self.silent: set[str] = set()  # nodes lost to silence: their hosts may not answer
        self.pauses = pause.Pauses()
        self.abandoned = False  # this controller fell silent past the lease: the nodes left
        self.stall: Optional[Watchdog] = None  # the stall watchdog, when it is on

    # -- starting ------------------------------------------------------------------------

    def _start_one(self, spec: HostSpec, gang: Optional[dict[str, Any]] = None) -> None:
        node = self.nodes[spec.name].plan
        # -S: stdlib only. Where the probe ran, when it waits here (programs.start): no login.
        started = start(self.transports[spec.name], spec, "run.py",
                        request(self.plan, node, gang), site=False)
        proc, self.stderr[spec.name] = started.proc, started.stderr
        self.procs[spec.name] = proc
        self.last_frame[spec.name] = time.monotonic()
        threading.Thread(target=self._read, args=(spec.name, proc), daemon=True,
                         name=f"clusterrun-read-{spec.name}").start()

    def _start_all(self, names: list[str], gang: Optional[dict[str, Any]] = None) -> None:
        """Start these hosts' supervisors at once; a host that cannot start counts as lost."""
        specs = [self.specs[name] for name in names]
        for result in parallel.run(lambda spec: self._start_one(spec, gang), specs,
                                   START_SECONDS):
            if result.failure is not None:
                self._lose(result.spec.name, result.failure.message)
        release(*(self.transports[spec.name] for spec in specs))  # the idle ones left there

    def start(self) -> None:
        names = [n.name for n in self.plan.nodes]
        if not self.plan.detach:
            self._start_all(names)
            threading.Thread(target=self._heartbeats, daemon=True,
                             name="clusterrun-heartbeat").start()
            return
        # The hub first: the workers need the port it listens on.
        secret = secrets.token_hex(32)
        master, workers = names[0], names[1:]
        self._start_all([master], {"role": "hub", "secret": secret, "peers": workers,
                                   "addr": self.plan.master_addr,
                                   "port": self.plan.lifeline_port})
        hub = self.nodes[master]
        self._pump_until(lambda: hub.started is not None or hub.done)
        if hub.started is None or hub.started.hub_port is None:
            why = hub.lost or (hub.end.reason if hub.end else None) or "it did not start"
            for name in workers:
                self._lose(name, f"not started: the master's supervisor failed ({why})")
            return
        if workers:
            self._start_all(workers, {"role": "peer", "secret": secret, "hub_node": master,
                                      "addr": self.plan.master_addr,
                                      "port": hub.started.hub_port})

    def _read(self, name: str, proc: Process) -> None:
        def on_event(raw: dict[str, Any]) -> None:
            arrived = time.monotonic()
            self.last_frame[name] = arrived
            self.events.put((name, wire.parse(raw), arrived))

        def on_data(node: str, file: str, data: bytes) -> None:
            self.last_frame[name] = time.monotonic()
            self.fold.feed(node, file, data)

        try:
            receive(name, proc, self.mirror, on_event, on_data)
        except (wire.ProtocolError, OSError, ValueError, KeyError) as exc:
            self.events.put((name, _Broken(str(exc)), time.monotonic()))
        self.events.put((name, _Eof(), time.monotonic()))

    def _heartbeats(self) -> None:
        while not self.all_done():
            self.pauses.beating()
            for name in list(self.procs):
                if not self.nodes[name].done:
                    self.send(name, {OP: Lifeline.HEARTBEAT})
            time.sleep(HEARTBEAT)

    def send(self, name: str, op: dict[str, Any]) -> None:
        """An operation for one host's supervisor (a heartbeat, a stop, the watchdog's)."""
        proc = self.procs.get(name)
        if proc is None:
            return
        # If the write fails, the stream's end tells us what happened to that host.
        with contextlib.suppress(OSError, EOFError):
            proc.write(json.dumps(op).encode() + b"\n")

    # -- watching ------------------------------------------------------------------------

    def all_done(self) -> bool:
        return all(n.done for n in self.nodes.values())

    def stop_all(self, force: bool = False, reason: Optional[str] = None) -> None:
        """Ask every node still going to stop. A node whose own rank failed is left to its
        supervisor, which ends it as failed (unless this is a second Ctrl-C: kill it all)."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
        self.fold.hush()
        for name, node in self.nodes.items():
            if node.done or (node_failures(node) and not force):
                continue
            op: dict[str, Any] = {OP: Lifeline.KILL if force else Lifeline.STOP}
            if reason:
                op["reason"] = reason
            self.send(name, op)

    def _lose(self, name: str, why: str) -> None:
        node = self.nodes[name]
        if node.done:
            return
        node.lost, node.lost_at = why, time.monotonic()
        proc = self.procs.get(name)
        if proc is not None:
            proc.close()  # if the host can still hear us, its supervisor now sees EOF

    def _lost_reason(self, name: str) -> str:
        tail = bytes(self.stderr.get(name, b"")).decode("utf-8", "replace").strip()
        last = tail.splitlines()[-3:]
        why = self.broken.get(name) or ("it ended the run itself when this controller fell "
                                        "silent, and its final report was cut off"
                                        if self.abandoned else
                                        "its connection closed before the run ended")
        return why + (": " + " | ".join(last) if last else "")

    def handle(self, name: str, ev: Item, arrived: float) -> None:
        node = self.nodes[name]
        if isinstance(ev, wire.Started):
            node.started = ev
            node.clock = Clock.handshake(arrived, ev.elapsed)
            if all(n.started is not None for n in self.nodes.values()):
                note = tracking.untracked_note(self.nodes, self.specs)
                if note:
                    self.notify(note)
        elif isinstance(ev, wire.RankExit):
            node.rank_exits[ev.rank] = ev
            if ev.code != 0 and not ev.stopping:
                self.fold.hush(name)
        elif isinstance(ev, wire.NodeFailure):
            node.failure = ev
        elif isinstance(ev, wire.TorchrunExit):
            node.torchrun_exit = ev
        elif isinstance(ev, wire.NcclReport):
            node.nccl = ev
            self.nccl.update(name, ev, arrived)
        elif isinstance(ev, wire.Progress) and self.stall is not None:
            self.stall.update(name, ev.quiet, arrived)
        elif isinstance(ev, wire.End):
            node.end = ev
            self.pauses.unseen(ev.cause, self.abandoned, self.notify)
        elif isinstance(ev, _Broken):
            self.broken[name] = f"its stream broke ({ev.error})"
        elif isinstance(ev, _Eof) and not node.done and not (
                self.plan.detach and node.started is not None):
            self._lose(name, self._lost_reason(name))

    def check_timers(self, lease: float) -> None:
        now = time.monotonic()
        for name, node in self.nodes.items():
            if node.done:
                continue
            quiet = now - self.last_frame.get(name, now)
            if node.started is None and quiet > START_SECONDS:
                self._lose(name, f"its supervisor did not start within {START_SECONDS:g} s")
            elif quiet > lease:
                self.silent.add(name)
                self._lose(name, f"no word from it for {quiet:.0f} s (host down or network "
                           "partitioned; its supervisor ends the run there when its lease runs "
                           "out)")
            elif self.stopping_since is not None and now - self.stopping_since > (
                    self.plan.grace + TEARDOWN_MARGIN):
                self._lose(name, "it did not confirm the stop in time")

    def _pump(self, timeout: float) -> None:
        with contextlib.suppress(queue.Empty):
            self.handle(*self.events.get(timeout=timeout))

    def _pump_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_SECONDS
        while not done() and time.monotonic() < deadline:
            self._pump(0.2)

    def watch(self, interrupts: list[int], on_interrupt: Callable[[int, bool], None]) -> None:
        """Until every node has ended or is lost. ``interrupts`` fills from signal handlers."""
        seen = 0
        while not self.all_done():
            self._pump(0.2)
            paused = self.pauses.turn()
            if paused is not None:
                self._resumed(*paused)
            while seen < len(interrupts):
                first = seen == 0
                on_interrupt(interrupts[seen], first)
                self.stop_all(force=not first, reason="interrupted on the controller")
                seen += 1
            if self.stopping_since is None:
                found = failures(list(self.nodes.values()))
                if found and not self.abandoned:  # if it was, the user has been told
                    self.notify(f"{found[0].detail}; stopping every node")
                if found:
                    self.stop_all(reason=f"stopped after {found[0].detail}")
            self.check_timers(self.plan.lease)
            self.nccl.tick(time.monotonic())
            if self.stall is not None and self.stopping_since is None:
                self.stall.tick(time.monotonic())
            self.view.tick()
        while True:  # what is already queued (e.g. each node's end-of-stream)
            try:
                self.handle(*self.events.get_nowait())
            except queue.Empty:
                break
        self.fold.close()
        self.nccl.finish()

    def _resumed(self, gap: float, silent: float) -> None:
        """This controller did not run for ``gap`` seconds: that silence was its own, so every
        node gets a fresh lease to be heard from (their reports are on their way)."""
        now = time.monotonic()
        for name in list(self.last_frame):
            self.last_frame[name] = now
        if self.stopping_since is not None:
            self.stopping_since += gap
        self.abandoned = self.abandoned or silent > self.plan.lease
        text = pause.notice(gap, silent, self.plan.lease)
        if text:
            self.notify(text)

    def stop_started(self) -> list[str]:
        """Detached, when not every node started: end it on those that did (their daemons no
        longer read the lifeline). Returns the nodes where it was stopped."""
        started = [self.specs[n] for n, node in self.nodes.items() if node.started is not None]

        def one(spec: HostSpec) -> None:
            node = self.nodes[spec.name].plan
            call(self.transports[spec.name], spec, "stop.py",
                 {"rundir": node.rundir, "grace": self.plan.grace}, timeout=self.plan.grace + 30)

        results = parallel.run(one, started, self.plan.grace + 40)
        return [r.spec.name for r in results if r.failure is None]

    def end_lost(self) -> None:
        """A node lost with its host still answering (its supervisor was killed, or its
        connection alone broke) may have left ranks running: end them with stop.py, which
        kills what the supervisor recorded and the job's cgroup. A silent host is not tried:
        its own supervisor ends the run when the lease runs out."""
        tried = [self.specs[n] for n, node in self.nodes.items()
                 if node.lost is not None and node.started is not None
                 and n not in self.silent]

        def one(spec: HostSpec) -> None:
            call(self.transports[spec.name], spec, "stop.py",
                 {"rundir": self.nodes[spec.name].plan.rundir, "grace": 0, "force": True},
                 timeout=LOST_CLEANUP)

        for result in parallel.run(one, tried, LOST_CLEANUP + 5):
            name = result.spec.name
            if result.failure is None:
                self.notify(f"{name}: ended what the run had left running there")
            else:
                self.notify(f"{name}: could not end what the run may have left running there "
                            f"({result.failure.message}); once it answers: clusterrun stop "
                            f"{self.plan.run_id}")

    def watch_start(self) -> None:
        """For --detach: until every supervisor has reported that its node started."""
        self._pump_until(lambda: all(n.started is not None or n.done
                                     for n in self.nodes.values()))
        for name, node in self.nodes.items():
            if node.started is None:
                self._lose(name, "its supervisor did not start in time")
