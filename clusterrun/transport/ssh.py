"""Reaching a host over SSH: one paramiko connection per host (through fabric, for ~/.ssh/config),
strict host keys, timeouts, no agent forwarding; every failure classified into one sentence."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any, Optional

import fabric
import paramiko

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport import banners, hostkeys, openssh
from clusterrun.transport.base import ConnectError, Process, SshOptions

# paramiko logs every failed handshake with a traceback from its own thread; with no handler
# configured, Python prints that to stderr. Each failure is already reported as one sentence.
logging.getLogger("paramiko").addHandler(logging.NullHandler())



class SshProcess:
    def __init__(self, channel: paramiko.Channel) -> None:
        self._chan = channel

    def write(self, data: bytes) -> None:
        self._chan.sendall(data)

    def close_stdin(self) -> None:
        self._chan.shutdown_write()

    def recv(self, size: int) -> bytes:
        return self._chan.recv(size)

    def recv_stderr(self, size: int) -> bytes:
        return self._chan.recv_stderr(size)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        if not self._chan.status_event.wait(timeout):
            return None
        # paramiko reports -1 when the server sent no exit status (e.g. killed by a signal).
        return self._chan.exit_status

    def close(self) -> None:
        self._chan.close()


class SshTransport:
    """One SSH connection to one host; every command is a new channel on it."""

    def __init__(self, spec: HostSpec, options: SshOptions) -> None:
        self.spec = spec
        self.options = options
        self._cxn: Optional[fabric.Connection] = None
        self._jump: Optional[SshTransport] = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """The address SSH connects to, after ~/.ssh/config (HostName)."""
        return self._cxn.host if self._cxn is not None else self.spec.host

    def connect(self) -> None:
        spec = self.spec
        connect_kwargs: dict[str, object] = {
            "banner_timeout": self.options.connect_timeout,
            "auth_timeout": self.options.connect_timeout,
            "channel_timeout": self.options.connect_timeout,
        }
        if spec.identity_file:
            key = Path(os.path.expanduser(spec.identity_file))
            if not key.is_file():
                raise ConnectError(Outcome.AUTH,
                    f"{spec.name}: identity_file {key} does not exist. "
                                   "Fix the path in the inventory or create the key (ssh-keygen).")
            connect_kwargs["key_filename"] = [str(key)]
        if spec.jump is not None:
            connect_kwargs["sock"] = self._through_jump()
        cxn = _Connection(
            spec.host, user=spec.user, port=spec.port, forward_agent=False,
            connect_timeout=self.options.connect_timeout, connect_kwargs=connect_kwargs,
            config=_fabric_config(),
        )
        # fabric truncates the timeout to whole seconds, and treats 0 as no timeout at all:
        # `--connect-timeout 0.5` would wait for TCP's own give-up (minutes) on a dead host.
        cxn.connect_timeout = self.options.connect_timeout
        known_hosts = Path(os.path.expanduser(spec.known_hosts))
        if spec.jump is not None:
            cxn.gateway = None  # the inventory's proxy_jump replaces ~/.ssh/config's
        # fabric installs AutoAddPolicy and loads no known_hosts (fabric#2071): replace both,
        # on the connection and on every ProxyJump hop fabric made from ~/.ssh/config, and give
        # the hops the inventory's key and timeouts, as `proxy_jump:` does.
        hop: object = cxn
        while isinstance(hop, fabric.Connection):
            _load_host_keys(hop.client, known_hosts, hop.host, hop.port)
            hop.client.set_missing_host_key_policy(
                hostkeys.Policy(known_hosts, self.options.accept_new_host_keys))
            hop.connect_timeout = self.options.connect_timeout
            for option, value in connect_kwargs.items():
                if option != "sock":
                    hop.connect_kwargs.setdefault(option, value)
            hop = hop.gateway
        try:
            cxn.open()
        except BaseException as exc:
            ssh = cxn.client.get_transport()
            stalled = ssh is not None and not getattr(ssh, "initial_kex_done", True)
            said = banners.greetings.take(ssh.ident if ssh is not None else None)
            cxn.close()
            if ssh is not None:
                # fabric closes only a transport still `active`, and a refused host key can
                # leave one that is not, with its socket open: in a process that lives on (the
                # warm session's daemon) the host's sshd would wait on it for ever.
                with contextlib.suppress(Exception):
                    ssh.close()
                with contextlib.suppress(Exception):
                    ssh.sock.close()
            if self._jump is not None:  # the tunnel was for this connection only
                self._jump.close()
                self._jump = None
            raise _classify(spec, cxn, known_hosts, self.options, exc, stalled=stalled,
                            greeting=said) from None
        transport = cxn.client.get_transport()
        banners.greetings.take(transport.ident if transport is not None else None)
        if transport is not None:
            # Keeps NAT and firewalls from dropping an idle connection; loss is detected by the
            # supervisor's heartbeats, since paramiko's keepalive never notices a dead peer.
            transport.set_keepalive(15)
        self._cxn = cxn

    def _through_jump(self) -> paramiko.Channel:
        """A TCP stream to the host opened by the bastion (`proxy_jump:`), as OpenSSH's
        ProxyJump does: the bastion is an SSH host of its own, with the same identity, the same
        known_hosts and the same strict checking; the host's own key is checked end to end."""
        spec = self.spec
        assert spec.jump is not None
        user, host, port = spec.jump
        jump = SshTransport(HostSpec(
            host=host, name=f"{spec.name}'s proxy_jump {host}", master=False, line=spec.line,
            user=user or spec.user, port=port, identity_file=spec.identity_file,
            known_hosts=spec.known_hosts), self.options)
        jump.connect()
        self._jump = jump
        assert jump._cxn is not None
        ssh = jump._cxn.client.get_transport()
        target = (spec.host, spec.port or 22)
        try:
            assert ssh is not None
            channel: paramiko.Channel = ssh.open_channel(
                "direct-tcpip", dest_addr=target, src_addr=("", 0),
                timeout=self.options.connect_timeout)
            return channel
        except (paramiko.SSHException, OSError, EOFError, AssertionError) as exc:
            jump.close()
            self._jump = None
            why = getattr(exc, "text", None) or str(exc) or type(exc).__name__
            timed_out = "timeout" in why.lower()
            raise ConnectError(
                Outcome.CONNECT_TIMEOUT if timed_out else Outcome.UNREACHABLE,
                f"{spec.name}: the proxy_jump host {host} could not open a connection to "
                f"{target[0]}:{target[1]} ({why}). Check that the host is up and that the "
                "bastion may reach its SSH port.") from None

    def run(self, command: str) -> Process:
        with self._lock:
            if self._cxn is None:
                self.connect()
            assert self._cxn is not None
            transport = self._cxn.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(Outcome.CONNECTION_LOST,
                f"{self.spec.name}: the SSH connection is closed.")
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(Outcome.CONNECTION_LOST,
                f"{self.spec.name}: cannot start a command over SSH: "
                               f"{exc or type(exc).__name__}.") from None
        return SshProcess(chan)

    def ssh_argv(self) -> list[str]:
        """An OpenSSH client command line with the same settings, for rsync's -e."""
        return openssh.argv(self.spec, self.options)

    def close(self) -> None:
        with self._lock:
            if self._cxn is not None:
                self._cxn.close()
                self._cxn = None
            if self._jump is not None:
                self._jump.close()
                self._jump = None


# Every host's connection reads the same ~/.ssh/config and known_hosts: parsed once per
# command, not once per host (known_hosts alone cost O(hosts) per connection, O(hosts^2) in all:
# about a second of CPU at 128 hosts). Keyed by the files' identity, so an edited or appended
# file (accept-new) is read again.
_cache_lock = threading.Lock()
_config_cache: dict[tuple[object, ...], fabric.Config] = {}
_keys_cache: dict[tuple[object, ...], tuple[dict[str, list[Any]], list[Any]]] = {}


def _stamp(path: str) -> Optional[tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class _Connection(fabric.Connection):  # type: ignore[misc]
    # A real attribute: fabric's Connection would otherwise store it in its config, which is
    # shared by every connection (_fabric_config) and must stay read-only across threads.
    inline_ssh_env = None


def _fabric_config() -> fabric.Config:
    """fabric's settings (~/.ssh/config among them), shared by every connection of this process
    while the files are unchanged. A Connection only reads it."""
    files = (os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config")
    key = tuple((f, _stamp(f)) for f in files)
    with _cache_lock:
        config = _config_cache.get(key)
        if config is None:
            _config_cache.clear()
            config = _config_cache[key] = fabric.Config()
        return config


def ssh_config_says(host: str) -> str:
    """What ~/.ssh/config (and /etc/ssh/ssh_config) give ``host``, as its connection reads
    them, in OpenSSH's words: `HostName 10.0.0.5, User ops, Port 2222, ...`; empty if nothing."""
    found = _fabric_config().base_ssh_config.lookup(host)
    said = [f"HostName {found['hostname']}"] if found.get("hostname", host) != host else []
    for key, word in (("user", "User"), ("port", "Port"), ("identityfile", "IdentityFile"),
                      ("proxyjump", "ProxyJump")):
        value = found.get(key)
        if value:
            said.append(f"{word} {' '.join(value) if isinstance(value, list) else value}")
    return ", ".join(said)


def _load_host_keys(client: paramiko.SSHClient, known_hosts: Path, host: str,
                    port: Optional[int]) -> None:
    """``hostkeys.load_into`` for one host: the entries that can match its name (plain ones
    under that name, every hashed one), parsed once per file. paramiko only ever looks a host
    up by its name, so it decides exactly as with the whole file."""
    key = (str(known_hosts), _stamp(str(known_hosts)), _stamp(str(hostkeys.GLOBAL_KNOWN_HOSTS)))
    with _cache_lock:
        index = _keys_cache.get(key)
    if index is None:
        scratch = paramiko.SSHClient()
        hostkeys.load_into(scratch, known_hosts)  # the error for a bad file is raised here
        plain: dict[str, list[Any]] = {}
        hashed: list[Any] = []
        for entry in scratch.get_host_keys()._entries:  # type: ignore[attr-defined]
            if any(h.startswith("|1|") for h in entry.hostnames):
                hashed.append(entry)
            for name in set(entry.hostnames):
                plain.setdefault(name, []).append(entry)
        index = (plain, hashed)
        with _cache_lock:
            _keys_cache.clear()
            _keys_cache[key] = index
    plain, hashed = index
    found = plain.get(hostkeys.known_host_name(host, port or 22), [])
    entries = [*found, *(e for e in hashed if e not in found)]
    # Copies: paramiko may replace an entry's key in place (HostKeys.add).
    client.get_host_keys()._entries.extend(  # type: ignore[attr-defined]
        paramiko.hostkeys.HostKeyEntry(list(e.hostnames), e.key) for e in entries)


# What paramiko says when its handshake wait (bounded by the connect timeout) ends before the
# server's banner or key exchange arrived: start_client() returns as if it had succeeded, and
# the next step finds no session.
_STALLED = frozenset({"No existing session", "Negotiation failed."})
# ...or, when paramiko's own banner timeout (the same length) fires first, this.
_NO_BANNER = banners.NO_BANNER


def _classify(spec: HostSpec, cxn: fabric.Connection, known_hosts: Path, options: SshOptions,
              exc: BaseException, *, stalled: bool = False,
              greeting: Optional[str] = None) -> ConnectError:
    """Turn whatever paramiko raised into one sentence naming the host, the cause and the fix.
    ``stalled``: the SSH handshake had not finished when it failed; ``greeting``: the first
    line the server sent in place of SSH's."""
    where = f"{spec.name} ({cxn.user}@{cxn.host}:{cxn.port})"
    timeout = options.connect_timeout
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, hostkeys.HostKeyError):
        return ConnectError(Outcome.HOST_KEY, f"{spec.name}: {exc.message}")
    if isinstance(exc, paramiko.BadHostKeyException):
        # The changed key may be a ProxyJump hop's from ~/.ssh/config, not the host's own:
        # name the machine whose key it is, or the fix would remove the wrong entry.
        hop = _hop(cxn, exc.hostname)
        msg = hostkeys.changed_key_message(
            hostkeys.known_host_name(hop.host, hop.port), exc.key, exc.expected_key, known_hosts)
        who = (spec.name if hop is cxn
               else f"{spec.name}'s ProxyJump {hop.host} (from ~/.ssh/config)")
        return ConnectError(Outcome.HOST_KEY, f"{who}: {msg}")
    said = banners.not_ssh(exc, greeting) if stalled else None
    if said is not None:
        return ConnectError(Outcome.UNREACHABLE,
            f"{where}: answered, but not with SSH ({said}): is this port sshd's? Check "
                            "`port:` in the inventory (or Port in ~/.ssh/config).")
    if stalled and isinstance(exc, paramiko.SSHException) and (
            str(exc) in _STALLED or str(exc).startswith(_NO_BANNER)):
        return ConnectError(Outcome.CONNECT_TIMEOUT,
            f"{where}: no SSH answer within {timeout:g} s: the TCP "
                            "connection opened but the SSH handshake did not finish (connect "
                            "timeout). Something other than sshd may hold that port, or the host "
                            "is overloaded.")
    if isinstance(exc, socket.gaierror):
        return ConnectError(Outcome.DNS, f"{where}: cannot resolve the host name ({exc.strerror}). "
                            "Check the spelling, ~/.ssh/config, or use the IP address.")
    if isinstance(exc, paramiko.AuthenticationException):
        return ConnectError(Outcome.AUTH, f"{where}: authentication failed ({exc}). Make sure your "
                            "public key is in ~/.ssh/authorized_keys for that user on the host, "
                            "and set `user:` / `identity_file:` in the inventory if they differ.")
    if isinstance(exc, (socket.timeout, TimeoutError)) or "banner" in str(exc).lower():
        return ConnectError(Outcome.CONNECT_TIMEOUT,
            f"{where}: no SSH answer within {timeout:g} s (connect "
                            "timeout). The host is down, a firewall drops the port, or the address "
                            "is wrong.")
    network = _network_error(where, exc)
    if network is not None:
        return network
    if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
        return ConnectError(Outcome.UNREACHABLE,
            f"{where}: SSH failed: {exc or type(exc).__name__}.")
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    return ConnectError(Outcome.UNREACHABLE, f"{where}: SSH failed: {type(exc).__name__}: {exc}.")


def _hop(cxn: fabric.Connection, hostname: str) -> fabric.Connection:
    """The connection to ``hostname``: ``cxn`` itself, or a ProxyJump hop fabric made for it
    from ~/.ssh/config (``cxn`` when none is)."""
    hop: object = cxn
    while isinstance(hop, fabric.Connection):
        if hop.host == hostname:
            return hop
        hop = hop.gateway
    return cxn


def _network_error(where: str, exc: BaseException) -> Optional[ConnectError]:
    """A TCP-level failure: refused, or no route."""
    refused = ConnectError(Outcome.REFUSED, f"{where}: connection refused. Is sshd running and "
                           "listening on that port?")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes <= {errno.ECONNREFUSED}:
            return refused
        return ConnectError(Outcome.UNREACHABLE, f"{where}: cannot connect ({exc}).")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return ConnectError(Outcome.UNREACHABLE,
            f"{where}: no route to host ({exc.strerror}). Check the "
                            "address and the network between this machine and the host.")
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return refused
    return None


