"""One host in the daemon: its SSH connection, the agent on one channel of it, and which
client's request each of the agent's requests is."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Optional, Protocol

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import frames
from clusterrun.session.client import SPEC_FIELDS
from clusterrun.transport import bundle, programs, shell
from clusterrun.transport.base import ConnectError, SshOptions, Transport

log = logging.getLogger("clusterrun.session")

AGENT = "hostagent.py"
PING_EVERY = 10.0  # seconds between the daemon's pings of each agent
SILENCE = 3 * PING_EVERY  # the agent exits after this long without a frame (hostagent.py)

Connector = Callable[[HostSpec, SshOptions], Transport]

class AgentUnavailable(ConnectError):
    """The host was reached but the agent did not start there (no usable Python before its
    setup, say): the client reaches that host directly instead."""

    def __init__(self, message: str) -> None:
        super().__init__(Outcome.PROBE_FAILED, message)


class Peer(Protocol):
    """A client of the daemon, as a host sees it: where its requests' frames go."""

    def deliver(self, kind: int, rid: int, payload: bytes) -> None: ...


def spec_from(fields: dict[str, Any]) -> HostSpec:
    return HostSpec(**{name: fields[name] for name in SPEC_FIELDS if name in fields})


def _stamp(path: str) -> Optional[list[int]]:
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def connection_key(fields: dict[str, Any], options: dict[str, Any]) -> str:
    """Everything that makes a host's connection and its agent: an inventory (or an
    ~/.ssh/config) that changes any of it never reuses a connection made before the change."""
    made = {name: fields.get(name) for name in SPEC_FIELDS if name not in ("name", "line",
                                                                             "master")}
    made["accept_new_host_keys"] = bool(options.get("accept_new_host_keys"))
    made["ssh_config"] = [_stamp("~/.ssh/config"), _stamp("/etc/ssh/ssh_config")]
    made["identity"] = _stamp(fields["identity_file"]) if fields.get("identity_file") else None
    return json.dumps(made, sort_keys=True)


def agent_command(spec: HostSpec) -> str:
    """The agent runs on the host itself: a `container:` host's commands enter the container
    on their own (shell.container_exec), so its agent uses the host's python3; elsewhere the
    inventory's interpreter, after `setup:` (which may be what puts it on the PATH)."""
    if spec.container:
        return shell.join(["exec", "python3", "-S", "-u", "-c", shell.BOOTSTRAP])
    return shell.with_setup(spec.setup, shell.join(
        ["exec", spec.python, "-S", "-u", "-c", shell.BOOTSTRAP]))


def run_request(spec: HostSpec, command: str) -> dict[str, Any]:
    """The agent's RUN for ``command``: one of clusterrun's programs started the plain way
    (shell.remote_python, no `setup:` or container to go through) is marked with its
    interpreter, which the agent may be itself (hostlib/warmrun.py)."""
    request: dict[str, Any] = {"command": command}
    if not spec.setup and not spec.container:
        for site in (False, True):
            if command == shell.remote_python(spec, site=site):
                request.update({frames.PYTHON: spec.python, frames.SITE: site})
    return request


class HostLink:
    """``HostLink(spec, options, connector)`` connects and starts the agent (or raises
    ConnectError); ``start`` runs a client's command there, and the agent's frames for it go
    to that client under the client's own id."""

    def __init__(self, spec: HostSpec, options: SshOptions, connector: Connector) -> None:
        self.spec = spec
        self.since = time.time()
        self.transport = connector(spec, options)
        self.address: str = getattr(self.transport, "address", spec.host)
        self.agent_pid: Optional[int] = None
        self.dead = False
        self._lock = threading.Lock()  # the agent's stdin, and the routes
        self._routes: dict[int, tuple[Peer, int]] = {}
        self._ids = itertools.count(1)
        self._hello = threading.Event()
        self._pings = itertools.count(1 << 31)  # ids of its own: never a request's
        self._pongs: dict[int, threading.Event] = {}
        try:
            self.proc = self.transport.run(agent_command(spec))
        except ConnectError:
            self.transport.close()
            raise
        self._stderr_read, self._stderr = programs.drain(self.proc)
        programs.send(self.proc, AGENT, {"silence": SILENCE, "bootstrap": shell.BOOT_BODY,
                                         "loader": bundle.LOADER_DEFS.decode()})
        threading.Thread(target=self._read, daemon=True, name=f"agent-{spec.name}").start()
        if not self._hello.wait(options.connect_timeout + 20) or self.agent_pid is None:
            self.close()
            self._stderr_read.join(1)
            said = self._stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise AgentUnavailable(f"{spec.name}: the session's agent did not start"
                                   + (": " + " | ".join(said) if said else "."))

    def start(self, peer: Peer, client_rid: int, command: str) -> int:
        """Send a RUN for ``peer``'s request; its id on the agent's channel."""
        with self._lock:
            rid = next(self._ids)
            self._routes[rid] = (peer, client_rid)
        try:
            self.send(frames.RUN, rid, json.dumps(run_request(self.spec, command)).encode())
        except OSError:
            with self._lock:
                self._routes.pop(rid, None)
            raise
        return rid

    def send(self, kind: int, rid: int, payload: bytes = b"") -> None:
        """One frame to the agent; OSError when its channel is gone (the link is then dead)."""
        if self.dead:
            raise OSError("the agent's channel is closed")
        try:
            with self._lock:
                self.proc.write(frames.encode(kind, rid, payload))
        except (OSError, EOFError) as exc:
            self.dead = True
            raise OSError(str(exc) or type(exc).__name__) from None

    def end(self, rid: int) -> None:
        """The client closed this request: the command's stdin closes, its output is no
        longer relayed (tools/hostagent.py); nothing more goes to the client."""
        with self._lock:
            if self._routes.pop(rid, None) is None:
                return
        for kind in (frames.EOF, frames.CLOSE):
            try:
                self.send(kind, rid)
            except OSError:
                return

    def answers(self, timeout: float) -> bool:
        """Whether the agent answers a ping within ``timeout``: a connection that a network
        cut or a rebooted host left half-open looks alive until something crosses it."""
        with self._lock:
            rid = next(self._pings)
            answered = self._pongs[rid] = threading.Event()
        try:
            self.send(frames.PING, rid)
            ok = answered.wait(timeout)
        except OSError:
            ok = False
        finally:
            with self._lock:
                self._pongs.pop(rid, None)
        if not ok:
            self.dead = True
        return ok

    def open_requests(self) -> int:
        with self._lock:
            return len(self._routes)

    def _read(self) -> None:
        reader = frames.Reader()
        try:
            for chunk in programs.chunks(self.proc.recv):
                for kind, rid, payload in reader.feed(chunk):
                    self._route(kind, rid, payload)
        except frames.FrameError:
            pass
        self.dead = True
        self._hello.set()
        said = self._stderr.decode("utf-8", "replace").strip()[-2000:]
        log.info("%s: the agent's channel ended%s", self.spec.name, ": " + said if said else "")
        with self._lock:
            lost, self._routes = list(self._routes.values()), {}
        # As a broken SSH connection looks to a channel: both streams end, no exit status.
        for peer, client_rid in lost:
            peer.deliver(frames.STDOUT, client_rid, b"")
            peer.deliver(frames.STDERR, client_rid, b"")
            peer.deliver(frames.EXIT, client_rid, json.dumps({"status": -1}).encode())

    def _route(self, kind: int, rid: int, payload: bytes) -> None:
        if kind == frames.PONG:
            if rid == 0 and payload:  # the agent's hello (a ping's answer is empty)
                self.agent_pid = int(frames.loads(payload).get("pid") or 0) or None
                self._hello.set()
            with self._lock:
                answered = self._pongs.get(rid)
            if answered is not None:
                answered.set()
            return
        with self._lock:
            route = self._routes.get(rid)
            if kind in (frames.EXIT, frames.ERROR):
                self._routes.pop(rid, None)
        if route is not None:
            route[0].deliver(kind, route[1], payload)

    def close(self) -> None:
        """EOF to the agent (it exits, its children see EOF), then the connection."""
        self.dead = True
        for step in (self.proc.close_stdin, self.proc.close, self.transport.close):
            with contextlib.suppress(OSError, EOFError):
                step()
