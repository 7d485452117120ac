"""An in-memory stand-in for SSH, shipped with the package for tests (as fabric ships
``fabric.testing`` and invoke ``MockContext``): every layer above the transport can be tested
without root, sshd or a network.

A ``FakeNetwork`` holds scripted hosts; its ``connect`` is a connector for
``Connections(options, connector=network.connect)``. A host can refuse the connection with any
outcome, be slow to connect, or answer. Commands that run clusterrun's own programs
(``shell.remote_python`` + ``shell.program_input``) are recognised by the program they send:
``probe.py`` is played in memory from the JSON request lines written to its stdin (facts, route,
listen, connect, peers), answering from the host's scripted interfaces and the network's
listeners; other programs and plain shell commands answer with scripted ``Reply`` values.

    net = FakeNetwork()
    net.add("10.0.0.1", Interface("eth0", "10.0.0.1/24"))
    net.add("10.0.0.2", Interface("ens5", "10.0.0.2/24"), connect_error="Connection refused")
    with Connections(SshOptions(), connector=net.connect) as pool:
        report = preflight.run(inventory, pool)

What crosses a real wire (SSH, host keys, rsync, the supervisor) is tested against real sshd.
"""

from __future__ import annotations

import errno
import functools
import json
import threading
import time
from typing import Any, Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared.protocol import OP, Probe
from clusterrun.transport import bundle
from clusterrun.transport.base import ConnectError, Process, SshOptions
from clusterrun.transport.fake_hosts import FakeHost, Interface, Reply

__all__ = ["FakeHost", "FakeNetwork", "FakeTransport", "Interface", "Reply"]

# Every remote program's command line contains this (see shell.BOOTSTRAP), however quoted.
_PROGRAM_MARK = "sys.stdin.buffer.readline"

_CONNECT_MESSAGES = {
    Outcome.DNS: "cannot resolve the host name",
    Outcome.REFUSED: "connection refused",
    Outcome.CONNECT_TIMEOUT: "no answer within the connect timeout",
    Outcome.UNREACHABLE: "no route to host",
    Outcome.AUTH: "authentication failed",
    Outcome.HOST_KEY: "the host key does not match known_hosts",
}


class FakeNetwork:
    """Scripted hosts by address (``HostSpec.host``), and the ports their probes listen on."""

    def __init__(self) -> None:
        self.hosts: dict[str, FakeHost] = {}
        self.transports: list[FakeTransport] = []
        self._listening: dict[tuple[str, int], FakeProcess] = {}
        self._next_port = 29500
        self._lock = threading.Lock()

    def add(self, address: str, *interfaces: Interface, **settings: Any) -> FakeHost:
        host = FakeHost(address, list(interfaces), **settings)
        self.hosts[address] = host
        return host

    def connect(self, spec: HostSpec, options: SshOptions) -> FakeTransport:
        """The connector: ``Connections(options, connector=network.connect)``."""
        host = self.hosts.get(spec.host)
        if host is None:
            raise ConnectError(Outcome.DNS, f"{spec.name}: cannot resolve {spec.host!r} "
                               "(not in the fake network).")
        if host.connect_delay:
            time.sleep(host.connect_delay)
        if host.unreachable is not None:
            raise ConnectError(host.unreachable, f"{spec.name}: "
                               f"{_CONNECT_MESSAGES.get(host.unreachable, 'cannot connect')} "
                               f"({spec.host}).")
        transport = FakeTransport(spec, host, self)
        with self._lock:
            self.transports.append(transport)
        return transport

    def owner(self, addr: str) -> Optional[FakeHost]:
        return next((h for h in self.hosts.values() if h.owns(addr)), None)

    def listen(self, proc: FakeProcess, host: FakeHost, port: int) -> dict[str, Any]:
        with self._lock:
            if port and (port in host.ports_in_use or (host.address, port) in self._listening):
                return {"ok": False, "port": port, "errno": errno.EADDRINUSE,
                        "error": "Address already in use"}
            if port and port < 1024 and host.user != "root":
                return {"ok": False, "port": port, "errno": errno.EACCES,
                        "error": "Permission denied"}
            if not port:
                port, self._next_port = self._next_port, self._next_port + 1
            self._listening[(host.address, port)] = proc
            return {"ok": True, "port": port}

    def connect_to(self, source: FakeHost, addr: str, port: int, src: Optional[str],
                   timeout: float) -> dict[str, Any]:
        if source.connect_error:
            return {"ok": False, "error": source.connect_error}
        if src and not source.owns(src):
            return {"ok": False, "error": "Cannot assign requested address"}
        target = self.owner(addr)
        if target is None:
            return {"ok": False, "error": "No route to host"}
        blocked = port in target.firewalled or (target.admits is not None
                                                and port not in target.admits)
        if blocked and target is not source:
            return {"ok": False, "error": f"timed out after {timeout:g} s"}
        with self._lock:
            listener = self._listening.get((target.address, port))
        if listener is None:
            return {"ok": False, "error": "Connection refused"}
        return {"ok": True, "seconds": 0.001}

    def release(self, proc: FakeProcess) -> None:
        with self._lock:
            for key in [k for k, p in self._listening.items() if p is proc]:
                del self._listening[key]


class FakeTransport:
    """A connection to a ``FakeHost``; ``commands`` records every command run on it."""

    def __init__(self, spec: HostSpec, host: FakeHost, network: FakeNetwork) -> None:
        self.spec = spec
        self.host = host
        self.network = network
        self.address = spec.host
        self.commands: list[str] = []
        self.closed = False

    def connect(self) -> None:
        return None

    def run(self, command: str) -> Process:
        if self.closed:
            raise ConnectError(Outcome.CONNECTION_LOST,
                               f"{self.spec.name}: the SSH connection is closed.")
        self.commands.append(command)
        return FakeProcess(self, command)

    def close(self) -> None:
        self.closed = True


@functools.lru_cache(maxsize=1)
def _program_sources() -> dict[bytes, str]:
    # As shipped: a program that imports shared modules arrives with them, behind a loader.
    return {bundle.program_source(name): name for name in bundle.program_names()}


class FakeProcess:
    """One command on a fake host. Output is produced as stdin arrives, as a real program's."""

    def __init__(self, transport: FakeTransport, command: str) -> None:
        self.transport = transport
        self.host = transport.host
        self.command = command
        self.program: Optional[str] = None  # which program (its file name), once sent
        self._shell = _PROGRAM_MARK not in command
        self._stdin = bytearray()
        self._out = bytearray()
        self._err = bytearray()
        self._code: Optional[int] = None
        self._started = False
        self._cond = threading.Condition()
        if self._shell:
            shell = self.host.shell or (lambda _cmd: Reply(
                stderr=b"fake transport: no shell command is scripted on this host\n", code=127))
            self._reply(shell(command))

    # -- the Process protocol --------------------------------------------------------------

    def write(self, data: bytes) -> None:
        with self._cond:
            if self._code is not None:
                raise OSError(errno.EPIPE, "the command has exited")
            self._stdin.extend(data)
        if not self._shell:
            self._feed()

    def close_stdin(self) -> None:
        if self._shell or (self.program not in (None, "probe.py") and self._started):
            return  # it ends when its reply says so
        # The bootstrap without its program, or a probe told nothing more: it exits.
        self._end(0 if self.program else 1)

    def recv(self, size: int) -> bytes:
        return self._take(self._out, size)

    def recv_stderr(self, size: int) -> bytes:
        return self._take(self._err, size)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        with self._cond:
            self._cond.wait_for(lambda: self._code is not None, timeout)
            return self._code

    def close(self) -> None:
        self.close_stdin()

    # -- internals -------------------------------------------------------------------------

    def _take(self, buf: bytearray, size: int) -> bytes:
        with self._cond:
            self._cond.wait_for(lambda: bool(buf) or self._code is not None)
            chunk = bytes(buf[:size])
            del buf[:size]
            return chunk

    def _emit(self, data: bytes, stderr: bool = False) -> None:
        with self._cond:
            (self._err if stderr else self._out).extend(data)
            self._cond.notify_all()

    def _end(self, code: int) -> None:
        with self._cond:
            if self._code is not None:
                return
            self._code = code
            self._cond.notify_all()
        self.transport.network.release(self)

    def _reply(self, reply: Reply) -> None:
        self._emit(reply.stdout)
        self._emit(reply.stderr, stderr=True)
        if reply.seconds is None:
            return
        if reply.seconds <= 0:
            self._end(reply.code)
            return
        timer = threading.Timer(reply.seconds, self._end, args=(reply.code,))
        timer.daemon = True
        timer.start()

    def _next_request(self) -> Optional[dict[str, Any]]:
        with self._cond:
            if self._code is not None or b"\n" not in self._stdin:
                return None
            line, _, rest = bytes(self._stdin).partition(b"\n")
            self._stdin[:] = rest
        parsed = json.loads(line or b"{}")
        return parsed if isinstance(parsed, dict) else {}

    def _feed(self) -> None:
        if self.program is None and not self._read_program():
            return
        while (request := self._next_request()) is not None:
            if self.program == "probe.py":
                self._probe(request)
            elif not self._started:
                self._started = True
                handler = self.host.programs.get(self.program or "")
                self._reply(handler(request) if handler else Reply(
                    stderr=f"fake transport: {self.program} is not scripted on "
                    f"{self.host.address}\n".encode(), code=1))

    def _read_program(self) -> bool:
        """The bootstrap's input: a length line, then that many bytes of a known program."""
        with self._cond:
            head, sep, rest = bytes(self._stdin).partition(b"\n")
            size = int(head.split()[0]) if sep else 0  # the flags after it are ignored:
            if not sep or len(rest) < size:  # a fake program never waits for a next one
                return False
            source, self._stdin[:] = rest[:size], rest[size:]
        self.program = _program_sources().get(source, "<unknown program>")
        return True

    def _probe(self, request: dict[str, Any]) -> None:
        host = self.host
        if not self._started:
            self._started = True
            if host.probe == "exits":
                self._emit(host.probe_stderr, stderr=True)
                self._end(host.probe_exit)
            elif host.probe == "answers":
                self._answer(Probe.FACTS, host.all_facts(request, self.transport.spec.host))
            return  # "silent": started, never answers
        op = str(request.get(OP))
        if op == Probe.EXIT:
            self._end(0)
        elif op not in host.silent_ops:
            self._answer(op, self._operation(op, request))

    def _operation(self, op: str, request: dict[str, Any]) -> Any:
        host, network = self.host, self.transport.network
        timeout = float(request.get("timeout", 5))
        if op == Probe.ROUTE:
            return host.route(str(request["addr"]))
        if op in (Probe.LISTEN, Probe.MESH_LISTEN):
            return network.listen(self, host, int(request.get("port") or 0))
        if op == Probe.CONNECT:
            return network.connect_to(host, str(request["addr"]), int(request["port"]),
                                      request.get("src"), timeout)
        if op == Probe.MESH_CONNECT:
            return {key: network.connect_to(host, addr, int(port), request.get("src"), timeout)
                    for key, addr, port in request["targets"]}
        if op == Probe.RESOLVE:  # every fake host's name resolves to its first address
            return {name: {"addresses": [h.address for h in network.hosts.values()
                                         if (h.hostname or h.address) == name][:1],
                           "error": None} for name in request["names"]}
        return {"ok": False, "error": "unknown op"}

    def _answer(self, key: str, value: Any) -> None:
        self._emit(json.dumps({key: value}).encode() + b"\n")
