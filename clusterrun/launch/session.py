"""A run in progress: one supervisor per host, their streams, heartbeats, and gang teardown.

Every host's supervisor reports typed events (wire.py) and streams its log files; this side
mirrors the files, records each node's events, and hands them, the lines and every turn of its
loop to its watchers (launch/watchers.py): the log view, the leases, NCCL's lines, the stall
watchdog, the pause detector, and the teardown, which tells every other host to stop at the
first failure or lost host (SIGTERM, grace, SIGKILL, done by the supervisors themselves).
Heartbeats flow both ways on the same channel.

Detached runs have no controller after the start: the master's supervisor is started first as
the gang's hub (it reports the port it listens on), then every worker's supervisor with the
hub's address and the run's secret, on stdin (clusterrun/remote/node/gang.py).
"""

from __future__ import annotations

import contextlib
import json
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from clusterrun import wire
from clusterrun.inventory import HostSpec
from clusterrun.launch import pause, watchers
from clusterrun.launch.outcome import Clock, NodeOutcome, node_failures
from clusterrun.launch.watchers import START_SECONDS, Watcher
from clusterrun.logs.mirror import Mirror, receive
from clusterrun.logs.view import LogView
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.remote.shared.protocol import OP, Lifeline
from clusterrun.transport import Process, Transport, parallel
from clusterrun.transport.programs import call, release, start

HEARTBEAT = 2.0
LOST_CLEANUP = 10.0  # seconds to end what a lost node left, on a host that still answers
READERS_JOIN = 5.0  # seconds the streams of ended nodes get to reach their end


@dataclass(frozen=True)
class _Eof:
    pass


@dataclass(frozen=True)
class _Broken:
    error: str


Item = Union[wire.Event, _Eof, _Broken]


def request(plan: LaunchPlan, node: NodePlan,
            gang: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """remote/node/run.py's request: everything it needs, user data included (on stdin only)."""
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
    if not plan.detach and node.node_rank == 0:  # the stall decider (remote/node/stallhub.py)
        req["stall_nodes"] = [n.name for n in plan.nodes]
    return req


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
        self.procs: dict[str, Process] = {}
        self.stderr: dict[str, bytearray] = {}
        self.events: queue.Queue[tuple[str, Item, float]] = queue.Queue()
        self.last_frame: dict[str, float] = {}
        self.stopping_since: Optional[float] = None
        self.broken: dict[str, str] = {}
        self.silent: set[str] = set()  # nodes lost to silence: their hosts may not answer
        self.pauses = pause.Pauses()
        self.abandoned = False  # this controller fell silent past the lease: the nodes left
        self.interrupts: list[int] = []  # watch()'s, for the teardown watcher
        self.on_interrupt: Callable[[int, bool], None] = lambda signum, first: None
        self.threads: dict[str, threading.Thread] = {}  # each node's reader, the heartbeats
        self.over = threading.Event()  # the watch has ended
        self.writing: dict[str, threading.Lock] = {}  # per node: send()'s
        self.watchers: list[Watcher] = []
        for watcher in watchers.standard(self):
            self.add(watcher)

    def add(self, watcher: Watcher) -> None:
        """Registers a watcher (launch/watchers.py), before start(): it ticks after those
        registered before it."""
        self.watchers.append(watcher)

    # -- starting ------------------------------------------------------------------------

    def _start_one(self, spec: HostSpec, gang: Optional[dict[str, Any]] = None) -> None:
        node = self.nodes[spec.name].plan
        # -S: stdlib only. Where the probe ran, when it waits here (programs.start): no login.
        started = start(self.transports[spec.name], spec, "run.py",
                        request(self.plan, node, gang), site=False)
        proc, self.stderr[spec.name] = started.proc, started.stderr
        self.writing[spec.name] = threading.Lock()
        self.procs[spec.name] = proc
        self.last_frame[spec.name] = time.monotonic()
        self._thread(spec.name, f"clusterrun-read-{spec.name}", self._read, spec.name, proc)

    def _thread(self, key: str, name: str, target: Callable[..., None], *args: Any) -> None:
        self.threads[key] = threading.Thread(target=target, args=args, daemon=True, name=name)
        self.threads[key].start()

    def _start_all(self, names: list[str], gang: Optional[dict[str, Any]] = None) -> None:
        """Start these hosts' supervisors at once; a host that cannot start counts as lost."""
        specs = [self.specs[name] for name in names]
        for result in parallel.run(lambda spec: self._start_one(spec, gang), specs,
                                   START_SECONDS):
            if result.failure is not None:
                self.lose(result.spec.name, result.failure.message)
        release(*(self.transports[spec.name] for spec in specs))  # the idle ones left there

    def start(self) -> None:
        names = [n.name for n in self.plan.nodes]
        if not self.plan.detach:
            self._start_all(names)
            self._thread("", "clusterrun-heartbeat", self._heartbeats)
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
                self.lose(name, f"not started: the master's supervisor failed ({why})")
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
            for watcher in self.watchers:
                watcher.data(node, file, data)

        try:
            receive(name, proc, self.mirror, on_event, on_data)
        except (wire.ProtocolError, OSError, ValueError, KeyError) as exc:
            self.events.put((name, _Broken(str(exc)), time.monotonic()))
        self.events.put((name, _Eof(), time.monotonic()))

    def _heartbeats(self) -> None:
        while not self.all_done() and not self.over.is_set():
            self.pauses.beating()
            for name in list(self.procs):
                if not self.nodes[name].done:
                    self.send(name, {OP: Lifeline.HEARTBEAT})
            self.over.wait(HEARTBEAT)

    def send(self, name: str, op: dict[str, Any]) -> None:
        """An operation for one host's supervisor (a heartbeat, a stop, the watchdog's)."""
        proc = self.procs.get(name)
        if proc is None:
            return
        # If the write fails, the stream's end tells us what happened to that host. One line at
        # a time: the heartbeats' thread and the stall view's (stacks/stallview.py) both send,
        # and a long line goes out in several writes.
        with self.writing[name], contextlib.suppress(OSError, EOFError):
            proc.write(json.dumps(op).encode() + b"\n")

    # -- watching ------------------------------------------------------------------------

    def all_done(self) -> bool:
        return all(n.done for n in self.nodes.values())

    def stop_all(self, force: bool = False, reason: Optional[str] = None) -> None:
        """Ask every node still going to stop. A node whose own rank failed is left to its
        supervisor, which ends it as failed (unless this is a second Ctrl-C: kill it all)."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
        for watcher in self.watchers:
            watcher.stopping()
        for name, node in self.nodes.items():
            if node.done or (node_failures(node) and not force):
                continue
            op: dict[str, Any] = {OP: Lifeline.KILL if force else Lifeline.STOP}
            if reason:
                op["reason"] = reason
            self.send(name, op)

    def lose(self, name: str, why: str) -> None:
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
        """Records a node's event, then hands it to the watchers that listen to its kind."""
        node = self.nodes[name]
        if isinstance(ev, _Broken):
            self.broken[name] = f"its stream broke ({ev.error})"
            return
        if isinstance(ev, _Eof):
            if not node.done and not (self.plan.detach and node.started is not None):
                self.lose(name, self._lost_reason(name))
            return
        if isinstance(ev, wire.Started):
            node.started = ev
            node.clock = Clock.handshake(arrived, ev.elapsed)
        elif isinstance(ev, wire.RankExit):
            node.rank_exits[ev.rank] = ev
        elif isinstance(ev, wire.NodeFailure):
            node.failure = ev
        elif isinstance(ev, wire.TorchrunExit):
            node.torchrun_exit = ev
        elif isinstance(ev, wire.NcclReport):
            node.nccl = ev
        elif isinstance(ev, wire.End):
            node.end = ev
        for watcher in self.watchers:
            if isinstance(ev, watcher.listens):
                watcher.event(name, ev, arrived)

    def _pump(self, timeout: float) -> None:
        with contextlib.suppress(queue.Empty):
            self.handle(*self.events.get(timeout=timeout))

    def _pump_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_SECONDS
        while not done() and time.monotonic() < deadline:
            self._pump(0.2)

    def watch(self, interrupts: list[int], on_interrupt: Callable[[int, bool], None]) -> None:
        """Until every node has ended or is lost. ``interrupts`` fills from signal handlers."""
        self.interrupts, self.on_interrupt = interrupts, on_interrupt
        while not self.all_done():
            self._pump(0.2)
            for watcher in self.watchers:
                watcher.tick(time.monotonic())
        self.over.set()
        # The heartbeats stop, and the ended nodes' streams reach their end, before the logs
        # and their mirror are closed: none of their bytes arrives after. A lost node's stream
        # is not waited for (its host may not answer).
        deadline = time.monotonic() + READERS_JOIN
        for key, thread in self.threads.items():
            if key not in self.nodes or self.nodes[key].lost is None:
                thread.join(max(0.0, deadline - time.monotonic()))
        while True:  # what is already queued (e.g. each node's end-of-stream)
            try:
                self.handle(*self.events.get_nowait())
            except queue.Empty:
                break
        for watcher in reversed(self.watchers):
            watcher.finish()

    def renew(self, gap: float) -> None:
        """This controller did not run for ``gap`` seconds (watchers.Paused): every node gets a
        fresh lease to be heard from, and a stop in progress as long again to be confirmed."""
        now = time.monotonic()
        for name in list(self.last_frame):
            self.last_frame[name] = now
        if self.stopping_since is not None:
            self.stopping_since += gap

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
                self.lose(name, "its supervisor did not start in time")
