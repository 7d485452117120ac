"""`clusterrun exec`: one shell command on every host at once, its output fed to a sink as it
comes (prefixed lines by default; kept whole for `-b` and `--json`: execview.py).

Each host's command runs under a small supervisor (clusterrun/remote/tools/command.py): its own
session, stdin as the lifeline, heartbeats both ways. So `--timeout`, Ctrl-C, SIGTERM, a `kill -9`
of this process or a dead connection end the command on every host and leave nothing behind, and
a host whose network dies mid-command is reported lost within the lease instead of waited for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol

from clusterrun.console import Printer
from clusterrun.errors import ClusterrunError, ExitStatus, Outcome, UsageError
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.inventory.values import CONTAINER_RE, CONTAINER_RULE
from clusterrun.logs.view import LogView
from clusterrun.remote.shared import protocol, timing
from clusterrun.transport import Process, SshOptions, connect, parallel, shell
from clusterrun.transport.programs import drain, send

if TYPE_CHECKING:
    from clusterrun import wire

HEARTBEAT = 2.0
LEASE = protocol.LEASE  # a host's command runs on this long without hearing this machine
GRACE = 5.0  # between SIGTERM and SIGKILL when a command is stopped
MARGIN = 10.0  # how long past its own deadline a host may take to confirm the end
# Commands running at once unless -f/--fanout says fewer. Handshakes have their own, smaller cap
# (transport.connect): a host that has connected frees its handshake slot for the next one while
# its command runs.
RUNNING = 512


class Sink(Protocol):
    """Where the hosts' output goes as it arrives: a LogView (prefixed lines) or a collector."""

    def feed(self, node: str, name: str, data: bytes) -> None: ...

    def close(self, node: Optional[str] = None) -> None: ...

    def ticking(self) -> contextlib.AbstractContextManager[Any]: ...


@dataclass(frozen=True)
class ExecResult:
    code: int  # the command's exit status: 128+N when killed by signal N, 124 timed out
    state: str = "exited"  # exited, timeout, stopped, lost (as the host's supervisor says)
    reason: Optional[str] = None
    elapsed: Optional[float] = None  # seconds, as the host's supervisor counted them


@dataclass
class ExecRun:
    """What every host did, and whether the user interrupted it."""

    results: parallel.GroupResult[HostSpec, ExecResult]
    timeout: Optional[float] = None
    interrupted: Optional[int] = None

    def __iter__(self) -> Iterator[parallel.HostResult[HostSpec, ExecResult]]:
        return iter(self.results)


@dataclass
class _Control:
    """Shared by every host's thread: the user's interrupts (filled by the main thread)."""

    interrupts: list[int] = field(default_factory=list)


def placed(inv: Inventory, container: Optional[str], *, on_host: bool) -> Inventory:
    """Where the command runs: ``--container NAME`` on every host, ``--on-host`` on none, else
    each host's own `container:`."""
    if container is not None and not CONTAINER_RE.fullmatch(container):
        raise UsageError(f"--container {container!r} is not allowed: {CONTAINER_RULE}")
    if container is None and not on_host:
        return inv
    hosts = tuple(dataclasses.replace(h, container=None if on_host else container)
                  for h in inv.hosts)
    return dataclasses.replace(inv, hosts=hosts)


class HostLost(ClusterrunError):
    outcome = Outcome.NODE_LOST


def _send(proc: Process, op: str) -> None:
    with contextlib.suppress(OSError, EOFError):  # the stream's end says what happened
        proc.write(json.dumps({protocol.OP: op}).encode() + b"\n")


class _Host:
    """One host's supervised command, seen from here."""

    def __init__(self, spec: HostSpec, proc: Process, view: Sink) -> None:
        self.spec = spec
        self.proc = proc
        self.view = view
        self.end: Optional[wire.End] = None
        self.error: Optional[str] = None
        self.last = time.monotonic()
        self.finished = threading.Event()
        threading.Thread(target=self._read, daemon=True,
                         name=f"clusterrun-exec-{spec.name}").start()

    def _read(self) -> None:
        # Here, not at the top: the wire's dataclasses are ~10 ms of a command's start, before
        # its first request; here they load while the hosts start the command.
        from clusterrun import wire

        try:
            for header, data in wire.frames(self.proc):
                self.last = time.monotonic()
                if data is not None:
                    self.view.feed(self.spec.name, str(header[protocol.FILE]), data)
                    continue
                event = wire.parse(header)
                if isinstance(event, wire.End):
                    self.end = event
        except (wire.ProtocolError, OSError, ValueError, KeyError) as exc:
            self.error = str(exc)
        self.finished.set()


def _one(spec: HostSpec, cmd: str, *, options: SshOptions, view: Sink, control: _Control,
         timeout: Optional[float]) -> ExecResult:
    if control.interrupts:  # still waiting for a slot under -f when the user stopped it all
        raise ClusterrunError(f"{spec.name}: not started (interrupted before its turn)",
                              outcome=Outcome.INTERRUPTED)
    transport = connect(spec, options)
    try:
        proc = transport.run(shell.remote_python(spec, site=False))
        _thread, stderr = drain(proc)
        send(proc, "command.py", {
            "command": cmd, "timeout": timeout, "lease": LEASE, "grace": GRACE,
            "heartbeat": HEARTBEAT})
        host = _Host(spec, proc, view)
        _supervise(host, control, timeout)
        view.close(spec.name)
        return _result(host, proc, stderr, timeout)
    finally:
        transport.close()


def _supervise(host: _Host, control: _Control, timeout: Optional[float]) -> None:
    """Heartbeats out, stop requests on interrupt, the lease and the deadline watched here."""
    started = time.monotonic()
    beat = 0.0
    asked = 0  # interrupts passed on to this host
    stop_by = None if timeout is None else started + timeout + GRACE + MARGIN
    while not host.finished.wait(0.2):
        now = time.monotonic()
        if timing.due(now, beat, HEARTBEAT):
            _send(host.proc, protocol.Lifeline.HEARTBEAT)
            beat = now
        while asked < len(control.interrupts):
            _send(host.proc, protocol.Lifeline.STOP if asked == 0 else protocol.Lifeline.KILL)
            asked += 1
            stop_by = min(stop_by or now + GRACE + MARGIN, now + GRACE + MARGIN)
        quiet = now - host.last
        lost = timing.over(now, host.last, LEASE)
        if lost or (stop_by is not None and now > stop_by):
            host.proc.close()  # if the host can still hear us, its supervisor sees EOF
            why = (f"no word from it for {quiet:.0f} s (host down or network partitioned; "
                   "its supervisor ends the command there when its lease runs out)"
                   if lost else "it did not confirm the end of the command in time")
            raise HostLost(f"{host.spec.name}: {why}")


def _result(host: _Host, proc: Process, stderr: bytearray,
            timeout: Optional[float]) -> ExecResult:
    end = host.end
    if end is None:
        code = proc.wait(5)
        tail = bytes(stderr).decode("utf-8", "replace").strip().splitlines()[-3:]
        why = host.error or (f"exit status {code}" if code is not None else "no answer")
        if code == shell.SETUP_FAILED:
            why = "the inventory's setup: failed"
        raise ClusterrunError(f"{host.spec.name}: could not run the command ({why})"
                              + (": " + " | ".join(tail) if tail else ""),
                              outcome=Outcome.PROBE_FAILED)
    if end.state == "timeout":
        return ExecResult(int(ExitStatus.TIMEOUT), "timeout", f"timed out after {timeout:g} s",
                          end.elapsed)
    code = end.exit_code if end.exit_code is not None else -1
    return ExecResult(code, end.state, end.reason, end.elapsed)


class _Interrupts:
    """SIGINT and SIGTERM only recorded (a handler must not take locks); read by the hosts'
    threads."""

    def __init__(self, control: _Control) -> None:
        self.control = control
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum: int, _frame: object) -> None:
        self.control.interrupts.append(signum)

    def __exit__(self, *_exc: object) -> None:
        for sig, old in self.old.items():
            signal.signal(sig, old)


def prefixed(printer: Printer) -> LogView:
    """pdsh's `host: line`; stdout and stderr are framed apart so their lines never mix."""
    return LogView(printer, label=lambda node, _stream: f"{node}:")


def run(inv: Inventory, cmd: str, options: SshOptions, view: Sink,
        timeout: Optional[float] = None, *, fanout: int = RUNNING) -> ExecRun:
    """``cmd`` on every host, at most ``fanout`` hosts at once (a host's slot is held from its
    connection to its command's end), each host's output fed to ``view``."""
    control = _Control()
    box: dict[str, parallel.GroupResult[HostSpec, ExecResult]] = {}

    def every_host() -> None:
        box["results"] = parallel.run(
            lambda spec: _one(spec, cmd, options=options, view=view, control=control,
                              timeout=timeout), list(inv.hosts), None, fanout=fanout)

    worker = threading.Thread(target=every_host, daemon=True, name="clusterrun-exec")
    told = 0
    with view.ticking(), _Interrupts(control):
        worker.start()
        # The summary folds host names with ClusterShell's NodeSet (execview.nodes): imported
        # here while the hosts work, not after the last one has answered.
        import ClusterShell.NodeSet  # noqa: F401
        while worker.is_alive():
            worker.join(0.1)
            if told < len(control.interrupts):
                told = len(control.interrupts)
                _announce(control.interrupts[-1], told == 1)
    return ExecRun(box["results"], timeout,
                   control.interrupts[0] if control.interrupts else None)


def _announce(signum: int, first: bool) -> None:
    name = signal.Signals(signum).name
    text = ("stopping the command on every host (SIGTERM, then SIGKILL); press Ctrl-C again "
            "to kill at once" if first else "killing the command on every host now")
    sys.stderr.write(f"clusterrun: {name}: {text}\n")
    sys.stderr.flush()
