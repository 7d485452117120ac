"""The session daemon: one per user, started on demand by the first command that reaches an
SSH host (``python -m clusterrun.session.daemon FD``, FD the socket the command bound; see
starter.py). It listens on a Unix socket in a mode-0700 folder, serves only peers of its own
uid (SO_PEERCRED), holds one HostLink per connection key (made for a command's first word with
a host, or ahead of it for the hosts a command reached directly: ``prewarm``), relays frames
between the clients and the agents, and exits after a while with no client.

It never makes a heartbeat of its own: a run's lifeline is its command's stdin, and what the
CLI writes there is relayed as it comes. A client whose socket closes (the CLI exited or was
killed) has every open request ended for it, EOF then CLOSE, as sshd does for a connection
that drops."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional

from clusterrun.errors import Outcome
from clusterrun.remote.shared import frames
from clusterrun.session import paths, starter
from clusterrun.session.client import KNOWN_HOSTS
from clusterrun.session.hostlink import (
    PING_EVERY,
    AgentUnavailable,
    Connector,
    HostLink,
    connection_key,
    spec_from,
)
from clusterrun.session.outbox import Outbox, peer_uid
from clusterrun.transport import hostkeys
from clusterrun.transport.base import ConnectError, SshOptions

log = logging.getLogger("clusterrun.session")
AGENT = "AGENT"  # an ERROR's outcome when the host has no agent: the client goes direct
listen = starter.listen  # the socket as a command binds it for the daemon it starts


class Client:
    """One connection from a command: the host it is bound to, its open requests."""

    def __init__(self, daemon: Daemon, sock: socket.socket) -> None:
        self.daemon = daemon
        self.sock = sock
        self.link: Optional[HostLink] = None
        self.key = ""
        self.fields: dict[str, Any] = {}
        self.options = SshOptions()
        self.open: dict[int, tuple[HostLink, int]] = {}  # client id -> (link, agent id)
        self.outbox = Outbox(sock)
        # In Daemon.clients until it shows itself a control request (`session --json` in a
        # loop is no use); ``uses``: it named a host, and its end restarts the idle time.
        self.counted, self.uses = True, False

    def deliver(self, kind: int, rid: int, payload: bytes) -> None:
        if kind in (frames.EXIT, frames.ERROR):
            self.open.pop(rid, None)
        self.outbox.put(frames.encode(kind, rid, payload))

    def error(self, rid: int, outcome: Outcome, message: str) -> None:
        self.deliver(frames.ERROR, rid, json.dumps(
            {"outcome": outcome.name, "message": message}).encode())

    def serve(self) -> None:
        try:
            while True:
                frame = frames.read_frame(self.sock.recv)
                if frame is None:
                    return
                self.on_frame(*frame)
        except (OSError, frames.FrameError) as exc:
            log.info("a client's connection failed: %s", exc)
        finally:
            for link, rid in list(self.open.values()):
                link.end(rid)
            self.open.clear()
            self.outbox.close()  # what is queued still goes: a `session` answer, say

    def on_frame(self, kind: int, rid: int, payload: bytes) -> None:
        if kind == frames.RUN:
            self.on_run(rid, frames.loads(payload))
            return
        found = self.open.get(rid)
        if found is None:
            return
        link, agent_rid = found
        if kind == frames.CLOSE:
            self.open.pop(rid, None)
            link.end(agent_rid)
            return
        if kind in (frames.STDIN, frames.EOF):
            # A failure: the link's reader ends this request as a lost connection.
            with contextlib.suppress(OSError):
                link.send(kind, agent_rid, payload)

    def on_run(self, rid: int, request: dict[str, Any]) -> None:
        asked = request.get(frames.CONTROL)
        if asked is not None:
            if self.counted and not self.uses:
                self.counted = self.daemon.count(-1)
            self.daemon.control(self, rid, str(asked), request)
            return
        try:
            if "host" in request:
                self.counted = self.counted or self.daemon.count(+1)
                self.uses = True
                self.fields = dict(request["host"])
                self.options = SshOptions(**request.get("options", {}))
                self.key = connection_key(self.fields, request.get("options", {}))
                self.link = self.daemon.link(self.key, self.fields, self.options)
                self.deliver(frames.EXIT, rid, json.dumps(
                    {"status": 0, "address": self.link.address,
                     "agent_pid": self.link.agent_pid}).encode())
                return
            if not self.key:
                self.error(rid, Outcome.INTERNAL, "a command before its host was named")
                return
            self.start(rid, str(request.get("command", "")))
        except ConnectError as exc:
            outcome = AGENT if isinstance(exc, AgentUnavailable) else exc.outcome.name
            self.deliver(frames.ERROR, rid, json.dumps(
                {"outcome": outcome, "message": exc.message}).encode())

    def start(self, rid: int, command: str) -> None:
        """Run the command on this client's host; a host whose agent or connection died since
        is connected again, once."""
        for attempt in (1, 2):
            link = self.link
            if link is None or link.dead:
                link = self.link = self.daemon.link(self.key, self.fields, self.options)
            try:
                agent_rid = link.start(self, rid, command)
            except OSError:
                if attempt == 2:
                    raise ConnectError(Outcome.CONNECTION_LOST,
                        f"{self.fields.get('name')}: the session lost its connection to the "
                        "host and could not start the command.") from None
                continue
            self.open[rid] = (link, agent_rid)
            self.deliver(frames.PONG, rid, b"")
            return


class Daemon:
    def __init__(self, listener: socket.socket, connector: Connector, idle: float,
                 uid: Optional[int] = None) -> None:
        self.listener = listener
        self.connector = connector
        self.idle = idle
        self.uid = os.getuid() if uid is None else uid
        self.since = time.time()
        self.last_client = time.monotonic()
        self.clients = 0  # connections that are, or may yet be, commands (Client.counted)
        self.links: dict[str, HostLink] = {}
        self._lock = threading.Lock()
        self._connecting: dict[str, threading.Lock] = {}
        self.connecting: dict[str, str] = {}  # key -> the host's name, while it connects
        self.stopping = threading.Event()

    def link(self, key: str, fields: dict[str, Any], options: SshOptions) -> HostLink:
        """The live link for ``key``, made now when there is none (or it died)."""
        with self._lock:
            gate = self._connecting.setdefault(key, threading.Lock())
        with gate:  # two clients of one host wait for one handshake
            with self._lock:
                found = self.links.get(key)
            # Each command's first word with a host checks that its agent still answers, so a
            # cut network or a rebooted host shows within the command's connect timeout.
            if found is not None and not found.dead and found.answers(options.connect_timeout):
                return found
            if found is not None:
                log.info("%s: the agent or its connection ended; connecting again",
                         fields.get("name"))
                found.close()
            with self._lock:
                self.connecting[key] = str(fields.get("name"))
            try:
                made = HostLink(spec_from(fields), options, self.connector)
            finally:
                with self._lock:
                    self.connecting.pop(key, None)
            with self._lock:
                stopped = self.stopping.is_set()
                if not stopped:
                    self.links[key] = made
            if stopped:  # stop() has closed every link it held: this one too
                made.close()
                raise ConnectError(Outcome.CONNECTION_LOST, "the session daemon is stopping")
            log.info("%s: connected, agent pid %s", fields.get("name"), made.agent_pid)
            return made

    def prewarm(self, entry: dict[str, Any]) -> None:
        """Connect a host a command reached directly, before any command asks for it: counted
        as a client meanwhile, so the daemon does not idle out halfway."""
        self.count(+1)
        try:
            fields = dict(entry["host"])
            options = dict(entry.get("options") or {})
            self.link(connection_key(fields, options), fields, SshOptions(**options))
        except Exception as exc:  # whatever it is, the next command with this host says it
            log.info("a host not connected ahead of time: %s", getattr(exc, "message", exc))
        finally:
            self.count(-1, used=True)

    def count(self, change: int, used: bool = False) -> bool:
        """A client counted (+1) or no longer (-1); whether it now is."""
        with self._lock:
            self.clients += change
            if used:
                self.last_client = time.monotonic()
        return change > 0

    def control(self, client: Client, rid: int, asked: str, request: dict[str, Any]) -> None:
        if asked == KNOWN_HOSTS:
            # Read here, where paramiko is loaded: the command need not load it. A bad file is
            # the command's to name (cli/common.py reads them again).
            said = {"ok": hostkeys.readable([str(p) for p in request.get("paths", [])])}
            client.deliver(frames.STDOUT, rid, json.dumps(said).encode())
            client.deliver(frames.EXIT, rid, json.dumps({"status": 0}).encode())
        elif asked == frames.STATUS:
            client.deliver(frames.STDOUT, rid, json.dumps(self.status()).encode())
            client.deliver(frames.EXIT, rid, json.dumps({"status": 0}).encode())
        elif asked == starter.PREWARM:
            hosts = request.get("hosts") or []
            log.info("connecting %d hosts a command reached directly", len(hosts))
            for entry in hosts:
                threading.Thread(target=self.prewarm, args=(entry,), daemon=True,
                                 name="prewarm").start()
            client.deliver(frames.EXIT, rid, json.dumps({"status": 0}).encode())
        elif asked == frames.STOP:
            client.deliver(frames.EXIT, rid, json.dumps({"status": 0}).encode())
            self.stop("asked to stop")
        else:
            client.error(rid, Outcome.USAGE, f"unknown request {asked!r}")

    def status(self) -> dict[str, Any]:
        with self._lock:
            links = list(self.links.values())
            connecting = sorted(set(self.connecting.values()))
        idle = 0.0 if self.clients else time.monotonic() - self.last_client
        return {"pid": os.getpid(), "since": self.since, "idle": round(idle, 1),
                "idle_limit": self.idle, "hosts": [
                    {"name": h.spec.name, "address": h.address, "agent_pid": h.agent_pid,
                     "since": h.since, "alive": not h.dead, "requests": h.open_requests()}
                    for h in sorted(links, key=lambda h: h.spec.name)],
                "connecting": connecting}

    def serve(self) -> None:
        threading.Thread(target=self._ping, daemon=True, name="ping").start()
        threading.Thread(target=self._expire, daemon=True, name="idle").start()
        with contextlib.suppress(OSError):  # stopped before it began: the loop ends at once
            self.listener.settimeout(1.0)
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            sock.settimeout(None)
            self.count(+1)  # from here: a command's connection never sees the daemon expire
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        uid = peer_uid(sock)
        if uid != self.uid:
            self.count(-1)
            log.warning("refused a client of uid %d (this session is uid %d's)", uid, self.uid)
            with contextlib.suppress(OSError):
                sock.sendall(frames.encode_json(frames.ERROR, 0, {
                    "outcome": Outcome.LOCAL_FILES.name,
                    "message": "this clusterrun session belongs to another user"}))
            # What it sent unread would turn the close into a reset, losing the answer.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(2)
                while sock.recv(65536):
                    pass
            sock.close()
            return
        client = Client(self, sock)
        try:
            client.serve()
        finally:
            if client.counted:
                self.count(-1, used=client.uses)

    def _expire(self) -> None:
        """Checked apart from the accept loop: status requests arriving every moment keep
        that loop busy, and are no use."""
        while not self.stopping.wait(0.5):
            if self.clients == 0 and time.monotonic() - self.last_client > self.idle:
                self.stop(f"idle for {self.idle:g} s")

    def _ping(self) -> None:
        while not self.stopping.wait(PING_EVERY):
            with self._lock:
                links = list(self.links.values())
            for link in links:
                with contextlib.suppress(OSError):  # dead: connected again on its next command
                    link.send(frames.PING, 0)

    def stop(self, why: str) -> None:
        if self.stopping.is_set():
            return
        log.info("stopping: %s", why)
        # Its name goes first: a command that finds none binds a new socket there, which this
        # daemon, on its way out, must not remove.
        with contextlib.suppress(OSError, TypeError):
            os.unlink(self.listener.getsockname())
        with self._lock:
            self.stopping.set()
            links, self.links = list(self.links.values()), {}
        for link in links:
            link.close()
        with contextlib.suppress(OSError):
            self.listener.close()


def main() -> None:
    """Started by a command (starter.spawn) in a session of its own, with the socket it bound
    as descriptor argv[1]: forks again at once (the command never waits), stdio to /dev/null,
    the log under $CLUSTERRUN_HOME/session/. Commands that connected meanwhile are queued on
    the socket and served once it accepts."""
    listener = socket.socket(fileno=int(sys.argv[1]))
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    logging.basicConfig(filename=str(paths.log_path()), level=logging.INFO,
                        format="%(asctime)s %(process)d %(message)s")
    from clusterrun.transport import direct

    daemon = Daemon(listener, direct, paths.idle_seconds())
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop("SIGTERM"))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.info("listening on %s, idle limit %g s", listener.getsockname(), daemon.idle)
    try:
        daemon.serve()
    finally:
        daemon.stop("exiting")
        log.info("exited")
    sys.exit(0)


if __name__ == "__main__":
    main()
