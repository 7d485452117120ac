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
import ipaddress
import json
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, Process, SshOptions

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


@dataclass(frozen=True)
class Interface:
    name: str
    addrs: tuple[str, ...]  # CIDRs, e.g. "10.0.0.1/24"
    up: bool = True

    def __init__(self, name: str, *addrs: str, up: bool = True) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "addrs", tuple(addrs))
        object.__setattr__(self, "up", up)

    def as_fact(self) -> dict[str, Any]:
        return {"name": self.name, "up": self.up, "addrs": list(self.addrs)}

    def ipv4(self) -> Optional[str]:
        return next((a.split("/")[0] for a in self.addrs if ":" not in a), None)


@dataclass
class Reply:
    """What a scripted program or shell command does: its output, then its exit status
    (after ``seconds``; ``None``: it never ends on its own)."""

    stdout: bytes = b""
    stderr: bytes = b""
    code: int = 0
    seconds: Optional[float] = 0.0


Handler = Callable[[dict[str, Any]], Reply]


@dataclass
class FakeHost:
    """One scripted host. ``unreachable``: connecting fails with that outcome. ``probe``:
    "answers", "silent" (started, never answers) or "exits" (``probe_exit``, ``probe_stderr``).
    ``firewalled``: ports whose connections from other hosts time out. ``connect_error``: every
    data-path connect from this host fails so."""

    address: str
    interfaces: list[Interface]
    hostname: str = ""
    user: str = "user"
    unreachable: Optional[Outcome] = None
    connect_delay: float = 0.0
    probe: str = "answers"
    probe_exit: int = 1
    probe_stderr: bytes = b""
    python: str = "3.11.7"
    torch: Optional[str] = "2.4.0"
    gpus: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_route: Optional[str] = None  # interface name for addresses on no subnet of ours
    ports_in_use: set[int] = field(default_factory=set)
    firewalled: set[int] = field(default_factory=set)
    connect_error: Optional[str] = None
    silent_ops: set[str] = field(default_factory=set)  # probe operations never answered
    programs: dict[str, Handler] = field(default_factory=dict)
    shell: Optional[Callable[[str], Reply]] = None

    def owns(self, addr: str) -> bool:
        return any(a.split("/")[0] == addr for i in self.interfaces for a in i.addrs)

    def all_facts(self, request: dict[str, Any], server_address: str) -> dict[str, Any]:
        name = self.hostname or self.address
        first = next((i.ipv4() for i in self.interfaces if i.ipv4()), None)
        workdir = str(request.get("workdir", "~/clusterrun")).replace("~", f"/home/{self.user}", 1)
        facts = {
            "hostname": name, "user": self.user, "python": self.python,
            "python_path": "/usr/bin/python3",
            "torch": {"version": self.torch, "cuda": None, "path": None} if self.torch else None,
            "gpus": self.gpus, "interfaces": [i.as_fact() for i in self.interfaces],
            "ssh_server_address": server_address if self.owns(server_address) else None,
            "dns": {"hostname": name, "seconds": 0.001, "addresses": [first] if first else [],
                    "error": None},
            "workdir": {"path": workdir, "ok": True, "error": None},
            "rsync": True,
        }
        facts.update(self.facts)
        return facts

    def route(self, addr: str) -> dict[str, Any]:
        """As probe.py answers: the device holding ``addr``, else the one on its subnet."""
        if addr in self.routes:
            return self.routes[addr]
        for iface in self.interfaces:
            if any(a.split("/")[0] == addr for a in iface.addrs):
                return {"dev": iface.name, "src": addr, "local": True}
        target = ipaddress.ip_address(addr)
        for iface in self.interfaces:
            for cidr in iface.addrs:
                net = ipaddress.ip_interface(cidr).network
                if iface.up and target.version == net.version and target in net:
                    return {"dev": iface.name, "src": cidr.split("/")[0], "local": False}
        gateway = next((i for i in self.interfaces if i.name == self.default_route), None)
        if gateway is not None and gateway.up and gateway.ipv4():
            return {"dev": gateway.name, "src": gateway.ipv4(), "local": False}
        return {"dev": None, "src": None, "error": f"no route to {addr} (Network is unreachable)"}


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
        if port in target.firewalled and target is not source:
            return {"ok": False, "error": f"timed out after {timeout:g} s"}
        with self._lock:
            listener = self._listening.get((target.address, port))
        if listener is None:
            return {"ok": False, "error": "Connection refused"}
        listener.peers.append(src or addr)
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
    folder = resources.files("clusterrun.remote")
    return {item.read_bytes(): item.name for item in folder.iterdir()
            if item.name.endswith(".py")}


class FakeProcess:
    """One command on a fake host. Output is produced as stdin arrives, as a real program's."""

    def __init__(self, transport: FakeTransport, command: str) -> None:
        self.transport = transport
        self.host = transport.host
        self.command = command
        self.program: Optional[str] = None  # which of clusterrun/remote/*.py, once sent
        self.peers: list[str] = []
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
            if not sep or len(rest) < int(head):
                return False
            source, self._stdin[:] = rest[:int(head)], rest[int(head):]
        self.program = _program_sources().get(source, "<unknown program>")
        return True

    def _probe(self, request: dict[str, Any]) -> None:
        host, network = self.host, self.transport.network
        if not self._started:
            self._started = True
            if host.probe == "exits":
                self._emit(host.probe_stderr, stderr=True)
                self._end(host.probe_exit)
            elif host.probe == "answers":
                self._answer("facts", host.all_facts(request, self.transport.spec.host))
            return  # "silent": started, never answers
        op = str(request.get("op"))
        if op == "exit":
            self._end(0)
        elif op in host.silent_ops:
            return
        elif op == "route":
            self._answer("route", host.route(str(request["addr"])))
        elif op == "listen":
            self._answer("listen", network.listen(self, host, int(request.get("port") or 0)))
        elif op == "connect":
            self._answer("connect", network.connect_to(
                host, str(request["addr"]), int(request["port"]), request.get("src"),
                float(request.get("timeout", 5))))
        elif op == "peers":
            self._answer("peers", list(self.peers))

    def _answer(self, key: str, value: Any) -> None:
        self._emit(json.dumps({key: value}).encode() + b"\n")
