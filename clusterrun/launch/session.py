"""A run in progress: one supervisor per host, their streams, heartbeats, and gang teardown.

Every host's supervisor reports events (started, rank_exit, torchrun_exit, end) and streams its
log files; this side mirrors the files, prints the lines, and watches for the first failure or
lost host, at which point every other host is told to stop (SIGTERM, grace, SIGKILL, done by
the supervisors themselves). Heartbeats flow both ways on the same channel.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from typing import Any, Callable, Optional

from clusterrun.inventory import HostSpec
from clusterrun.launch.outcome import NodeOutcome, failures
from clusterrun.logs.mirror import Mirror, receive
from clusterrun.logs.view import LogView
from clusterrun.logs.wire import ProtocolError
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.transport import Process, Transport, parallel, shell
from clusterrun.transport.programs import drain

HEARTBEAT = 2.0
START_SECONDS = 60.0
TEARDOWN_MARGIN = 15.0


def request(plan: LaunchPlan, node: NodePlan, mode: str = "run") -> dict[str, Any]:
    public = dict(node.public(), run_id=plan.run_id, script=str(plan.script),
                  args=list(plan.args), world_size=plan.world_size)
    return {"mode": mode, "rundir": node.rundir, "cwd": node.cwd, "argv": list(node.argv),
            "env": dict(node.env), "public": public, "detach": plan.detach,
            "grace": plan.grace, "lease": plan.lease, "heartbeat": HEARTBEAT}


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
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.last_frame: dict[str, float] = {}
        self.stopping_since: Optional[float] = None
        self.forced = False
        self.broken: dict[str, str] = {}

    # -- starting ------------------------------------------------------------------------

    def start(self) -> None:
        """Start every host's supervisor at once; a host that cannot start counts as lost."""
        def one(spec: HostSpec) -> None:
            node = self.nodes[spec.name].plan
            proc = self.transports[spec.name].run(shell.remote_python(node.python, node.setup))
            self.stderr[spec.name] = drain(proc)[1]
            self.procs[spec.name] = proc
            self.last_frame[spec.name] = time.monotonic()
            threading.Thread(target=self._read, args=(spec.name, proc), daemon=True,
                             name=f"clusterrun-read-{spec.name}").start()
            proc.write(shell.program_input("supervisor.py", request(self.plan, node)))

        specs = [self.specs[n.name] for n in self.plan.nodes]
        for result in parallel.run(one, specs, START_SECONDS):
            if result.failure is not None:
                self._lose(result.spec.name, result.failure.message)
        if not self.plan.detach:
            threading.Thread(target=self._heartbeats, daemon=True,
                             name="clusterrun-heartbeat").start()

    def _read(self, name: str, proc: Process) -> None:
        def on_event(event: dict[str, Any]) -> None:
            self.last_frame[name] = time.monotonic()
            self.events.put((name, event))

        def on_data(node: str, file: str, data: bytes) -> None:
            self.last_frame[name] = time.monotonic()
            self.view.feed(node, file, data)

        try:
            receive(name, proc, self.mirror, on_event, on_data)
        except (ProtocolError, OSError, ValueError, KeyError) as exc:
            self.events.put((name, {"ev": "broken", "error": str(exc)}))
        self.events.put((name, {"ev": "eof"}))

    def _heartbeats(self) -> None:
        while not self.all_done():
            for name in list(self.procs):
                if not self.nodes[name].done:
                    self._send(name, {"op": "hb"})
            time.sleep(HEARTBEAT)

    def _send(self, name: str, op: dict[str, Any]) -> None:
        proc = self.procs.get(name)
        if proc is None:
            return
        # If the write fails, the stream's end tells us what happened to that host.
        with contextlib.suppress(OSError, EOFError):
            proc.write(json.dumps(op).encode() + b"\n")

    # -- watching ------------------------------------------------------------------------

    def all_done(self) -> bool:
        return all(n.done for n in self.nodes.values())

    def stop_all(self, force: bool = False) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
        if force:
            self.forced = True
        for name, node in self.nodes.items():
            if not node.done:
                self._send(name, {"op": "kill" if force else "stop"})

    def _lose(self, name: str, why: str) -> None:
        node = self.nodes[name]
        if node.done:
            return
        node.lost, node.lost_at = why, time.time()
        proc = self.procs.get(name)
        if proc is not None:
            proc.close()  # if the host can still hear us, its supervisor now sees EOF

    def _lost_reason(self, name: str) -> str:
        tail = bytes(self.stderr.get(name, b"")).decode("utf-8", "replace").strip()
        last = tail.splitlines()[-3:]
        why = self.broken.get(name) or "its connection closed before the run ended"
        return why + (": " + " | ".join(last) if last else "")

    def handle(self, name: str, ev: dict[str, Any]) -> None:
        node = self.nodes[name]
        kind = ev.get("ev")
        if kind == "started":
            node.started = True
        elif kind == "rank_exit":
            node.rank_exits[int(ev["rank"])] = ev
        elif kind == "torchrun_exit":
            node.torchrun_exit = ev
        elif kind == "end":
            node.end = ev
        elif kind == "broken":
            self.broken[name] = f"its stream broke ({ev.get('error')})"
        elif kind == "eof" and not node.done and not (self.plan.detach and node.started):
            self._lose(name, self._lost_reason(name))

    def check_timers(self, lease: float) -> None:
        now = time.monotonic()
        for name, node in self.nodes.items():
            if node.done:
                continue
            quiet = now - self.last_frame.get(name, now)
            if not node.started and quiet > START_SECONDS:
                self._lose(name, f"its supervisor did not start within {START_SECONDS:g} s")
            elif quiet > lease:
                self._lose(name, f"no word from it for {quiet:.0f} s (host down or network "
                           "partitioned; its supervisor ends the run there when its lease runs "
                           "out)")
            elif self.stopping_since is not None and now - self.stopping_since > (
                    self.plan.grace + TEARDOWN_MARGIN):
                self._lose(name, "it did not confirm the stop in time")

    def watch(self, interrupts: list[int], on_interrupt: Callable[[int, bool], None]) -> None:
        """Until every node has ended or is lost. ``interrupts`` fills from signal handlers."""
        seen = 0
        while not self.all_done():
            try:
                name, ev = self.events.get(timeout=0.2)
                self.handle(name, ev)
            except queue.Empty:
                pass
            while seen < len(interrupts):
                first = seen == 0
                on_interrupt(interrupts[seen], first)
                self.stop_all(force=not first)
                seen += 1
            if self.stopping_since is None:
                found = failures(list(self.nodes.values()))
                if found:
                    self.notify(f"{found[0].detail}; stopping every node")
                    self.stop_all()
            self.check_timers(self.plan.lease)
            self.view.tick()
        while True:  # what is already queued (e.g. each node's end-of-stream)
            try:
                self.handle(*self.events.get_nowait())
            except queue.Empty:
                break

    def watch_start(self) -> None:
        """For --detach: until every supervisor has reported that its node started."""
        deadline = time.monotonic() + START_SECONDS
        while not all(n.started or n.done for n in self.nodes.values()):
            try:
                self.handle(*self.events.get(timeout=0.2))
            except queue.Empty:
                if time.monotonic() > deadline:
                    for name, node in self.nodes.items():
                        if not node.started:
                            self._lose(name, "its supervisor did not start in time")
