"""What every way of reaching a host offers: a Transport runs commands, a Process is one of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from clusterrun.errors import Outcome, UnreachableError
from clusterrun.inventory import HostSpec


@dataclass(frozen=True)
class SshOptions:
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False


class Process(Protocol):
    """A running command: bytes in and out, an exit status. Closing it does not kill the command
    (as with sshd and a no-pty command); the remote side sees EOF on its stdin."""

    def write(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def recv(self, size: int) -> bytes: ...  # stdout; b"" at EOF
    def recv_stderr(self, size: int) -> bytes: ...  # b"" at EOF
    def wait(self, timeout: Optional[float] = None) -> Optional[int]: ...
    def close(self) -> None: ...


class Transport(Protocol):
    spec: HostSpec

    def run(self, command: str) -> Process: ...
    def close(self) -> None: ...


class ConnectError(UnreachableError):
    """Connecting to a host, or opening a channel on its connection, failed."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message, outcome=outcome)


