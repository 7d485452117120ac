"""The command's side of the session: ``SessionTransport``, a Transport whose commands run
through the daemon's socket (one socket per host), and ``connector``, which reaches a host
directly when no daemon answers (starter.py starts one behind the command). Nothing here
imports paramiko: a command that reaches its hosts through a warm daemon never does SSH
itself."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import threading
from collections.abc import Iterable
from typing import Any, Optional

from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import frames
from clusterrun.session import paths, starter
from clusterrun.transport import openssh
from clusterrun.transport.base import ConnectError, SshOptions, Transport

# The fields of a HostSpec that make its connection and its agent: what a client sends.
SPEC_FIELDS = ("host", "name", "master", "line", "user", "port", "identity_file", "known_hosts",
               "python", "setup", "container", "container_engine", "container_user",
               "proxy_jump", "transport")
AGENT = "AGENT"  # an ERROR's outcome when the host has no agent: reach it directly instead
KNOWN_HOSTS = "known_hosts"  # a control request: do these known_hosts files parse?


def spec_fields(spec: HostSpec) -> dict[str, Any]:
    """A host as the daemon needs it: its connection's fields, paths made absolute here."""
    out = {name: getattr(spec, name) for name in SPEC_FIELDS}
    for name in ("identity_file", "known_hosts"):
        if out[name]:
            out[name] = os.path.abspath(os.path.expanduser(out[name]))
    return out


def hello(spec: HostSpec, options: SshOptions) -> dict[str, Any]:
    """A command's first word with a host: what makes its connection, no secret in it (a
    command that went direct hands the same to the daemon, starter.hand_over)."""
    return {"host": spec_fields(spec), "options": {
        "connect_timeout": options.connect_timeout,
        "accept_new_host_keys": options.accept_new_host_keys}}


class _Stream:
    """One of a request's output streams, filled by the socket's reader."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.ended = False
        self.cond = threading.Condition()

    def put(self, data: bytes) -> None:
        with self.cond:
            if data:
                self.buf += data
            else:
                self.ended = True
            self.cond.notify_all()

    def get(self, size: int) -> bytes:
        with self.cond:
            while not self.buf and not self.ended:
                self.cond.wait()
            out = bytes(self.buf[:size])
            del self.buf[:size]
            return out


class SessionProcess:
    """A command on the host, through the daemon: the Process protocol of transport/base.py."""

    def __init__(self, channel: _Channel, rid: int) -> None:
        self._channel = channel
        self.rid = rid
        self.out = _Stream()
        self.err = _Stream()
        self.status: Optional[int] = None
        self.reply: dict[str, Any] = {}  # what an EXIT or ERROR said
        self.error: Optional[dict[str, Any]] = None
        self.accepted = threading.Event()  # the daemon started it (PONG), or could not (ERROR)
        self.done = threading.Event()

    def on_frame(self, kind: int, payload: bytes) -> None:
        if kind == frames.STDOUT:
            self.out.put(payload)
        elif kind == frames.STDERR:
            self.err.put(payload)
        elif kind == frames.PONG:
            self.accepted.set()
        elif kind in (frames.EXIT, frames.ERROR):
            with contextlib.suppress(frames.FrameError):
                self.reply = frames.loads(payload)
            if kind == frames.ERROR:
                self.error = self.reply
            self.finish(int(self.reply.get("status", -1)))

    def finish(self, status: int) -> None:
        self.out.put(b"")
        self.err.put(b"")
        self.status = status
        self.done.set()
        self.accepted.set()

    def write(self, data: bytes) -> None:
        if self.done.is_set():
            raise OSError("the command has ended")  # as a closed SSH channel says
        self._channel.send(frames.STDIN, self.rid, data)

    def close_stdin(self) -> None:
        if not self.done.is_set():
            self._channel.send(frames.EOF, self.rid)

    def recv(self, size: int) -> bytes:
        return self.out.get(size)

    def recv_stderr(self, size: int) -> bytes:
        return self.err.get(size)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return self.status if self.done.wait(timeout) else None

    def close(self) -> None:
        if not self.done.is_set():
            with contextlib.suppress(OSError):
                self._channel.send(frames.CLOSE, self.rid)
            self._channel.forget(self.rid)
            self.finish(-1)


class _Channel:
    """One socket to the daemon and the requests on it, its frames read by one thread."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self._send = threading.Lock()
        self._open: dict[int, SessionProcess] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # Started with the first request, not here: a daemon that refuses this client answers
        # before reading anything, and a reader already running could take that answer (and
        # the end of the socket) before the request it answers is registered, leaving it
        # waiting for ever.
        self._reader: Optional[threading.Thread] = threading.Thread(
            target=self._read, daemon=True, name=f"session-{name}")

    def request(self, payload: dict[str, Any], rid: Optional[int] = None) -> SessionProcess:
        proc = SessionProcess(self, next(self._ids) if rid is None else rid)
        with self._lock:
            self._open[proc.rid] = proc
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.start()
        self.send(frames.RUN, proc.rid, json.dumps(payload).encode())
        return proc

    def send(self, kind: int, rid: int, payload: bytes = b"") -> None:
        with self._send:
            self.sock.sendall(frames.encode(kind, rid, payload))

    def forget(self, rid: int) -> None:
        with self._lock:
            self._open.pop(rid, None)

    def _read(self) -> None:
        try:
            while True:
                frame = frames.read_frame(self.sock.recv)
                if frame is None:
                    break
                kind, rid, payload = frame
                with self._lock:
                    proc = self._open.get(rid)
                    if kind in (frames.EXIT, frames.ERROR):
                        self._open.pop(rid, None)
                if proc is not None:
                    proc.on_frame(kind, payload)
                elif kind == frames.ERROR and rid == 0:  # refused before any request
                    with self._lock:
                        waiting = list(self._open.values())
                    for each in waiting:
                        each.on_frame(kind, payload)
        except (OSError, frames.FrameError):
            pass
        # The daemon is gone: as for a lost SSH connection, streams end with no exit status.
        with self._lock:
            lost, self._open = list(self._open.values()), {}
        for proc in lost:
            proc.finish(-1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class SessionTransport:
    """One host reached through the session daemon: ``connect`` names the host (the daemon
    connects it and starts its agent, or says why not), ``run`` starts a command there."""

    def __init__(self, spec: HostSpec, options: SshOptions) -> None:
        self.spec = spec
        self.options = options
        self.address = spec.host
        self.agent_pid: Optional[int] = None
        # Its agent starts clusterrun's programs as forks of itself (hostlib/warmrun.py) where
        # no `setup:` or container stands between: programs.start then prefers that to a
        # parked interpreter.
        self.forks_programs = not spec.setup and not spec.container
        self._channel: Optional[_Channel] = None

    def connect(self) -> None:
        """Names the host to the daemon; starter.NoDaemon when none listens, DaemonGone when
        the daemon ended before it answered (nothing of this command's is on the host)."""
        channel = _Channel(starter.open_socket(), self.spec.name)
        try:
            said = channel.request(hello(self.spec, self.options), rid=0)
            said.done.wait()
        except OSError:  # its socket closed before this was sent
            said = SessionProcess(channel, 0)
        if said.error is None and not said.reply:
            channel.close()
            raise DaemonGone(Outcome.CONNECTION_LOST,
                             f"{self.spec.name}: the session daemon ended before it answered.")
        if said.error is not None or said.status != 0:
            channel.close()
            raise _error(self.spec, said)
        self.address = str(said.reply.get("address") or self.spec.host)
        self.agent_pid = said.reply.get("agent_pid")
        self._channel = channel

    def run(self, command: str) -> SessionProcess:
        if self._channel is None:
            self.connect()
        assert self._channel is not None
        try:
            proc = self._channel.request({"command": command})
        except OSError:
            raise ConnectError(Outcome.CONNECTION_LOST,
                               f"{self.spec.name}: the session daemon closed the connection."
                               ) from None
        proc.accepted.wait()
        if proc.error is not None:
            raise _error(self.spec, proc)
        if proc.done.is_set() and not proc.reply:
            raise ConnectError(Outcome.CONNECTION_LOST,
                               f"{self.spec.name}: the session daemon closed the connection.")
        return proc

    def ssh_argv(self) -> list[str]:
        """rsync's ssh command line: the same as the direct transport's."""
        return openssh.argv(self.spec, self.options)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class AgentMissing(ConnectError):
    """The daemon reached the host but could not start its agent there."""


class DaemonGone(ConnectError):
    """The daemon's socket closed before it answered a host's first word (it died starting,
    or stopped just then): the host is reached directly."""


def _error(spec: HostSpec, proc: SessionProcess) -> ConnectError:
    said = proc.error or {}
    name = str(said.get("outcome", ""))
    message = str(said.get("message") or f"{spec.name}: the session daemon closed the connection.")
    if name == AGENT:
        return AgentMissing(Outcome.PROBE_FAILED, message)
    outcome = Outcome.__members__.get(name, Outcome.CONNECTION_LOST)
    return ConnectError(outcome, message)


def connector(spec: HostSpec, options: SshOptions) -> Transport:
    """``Connections``' connector when the session is on: an SSH host through the daemon;
    directly when no daemon listens (the daemon, started behind the command, is handed the
    host once it is reached: starter.Cold) or the host's agent cannot start; a local or srun
    host as always."""
    from clusterrun.transport import direct

    if spec.local or spec.transport == "srun":
        return direct(spec, options)
    if not starter.COLD.direct:
        transport = SessionTransport(spec, options)
        try:
            transport.connect()
            return transport
        except AgentMissing:
            return direct(spec, options)
        except (starter.NoDaemon, DaemonGone):
            starter.COLD.going_direct()
    reached = direct(spec, options)  # a host it cannot reach raises: never handed over
    starter.COLD.reached(hello(spec, options))
    return reached


def known_hosts_readable(files: Iterable[str]) -> bool:
    """Whether the running daemon (none is started for this) read every one of ``files``
    without fault: the check a command makes before it contacts any host, made where paramiko
    is loaded already. False when no daemon answers or a file is bad: the command then reads
    the files itself, and names the bad one as it does without the session."""
    absolute = sorted({os.path.abspath(os.path.expanduser(f)) for f in files})
    try:
        said = ask(KNOWN_HOSTS, paths=absolute)
    except ClusterrunError:
        return False
    return bool(said and said.get("ok"))


def ask(asked: str, path: Optional[str] = None, **fields: Any) -> Optional[dict[str, Any]]:
    """A request to the running daemon itself (``status``, ``stop``, ``known_hosts``): this
    code's, or the one listening on ``path``; None when none runs."""
    sock = starter.try_connect(path or str(paths.socket_path()))
    if sock is None:
        return None
    channel = _Channel(sock, "control")
    try:
        proc = channel.request({frames.CONTROL: asked, **fields})
    except OSError:  # it stopped listening just now
        channel.close()
        return None
    proc.done.wait(30)
    out = bytearray()
    while True:
        chunk = proc.recv(65536)
        if not chunk:
            break
        out += chunk
    channel.close()
    if proc.error is not None:
        raise ClusterrunError(str(proc.error.get("message")), outcome=Outcome.LOCAL_FILES)
    return json.loads(out) if out else {}
