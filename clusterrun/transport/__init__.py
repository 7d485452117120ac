"""How commands reach a host: SSH, a Slurm job step, or this machine directly; and running many
hosts at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, Process, SshOptions, Transport
from clusterrun.transport.local import LocalTransport
from clusterrun.transport.openssh import OverOpenSsh
from clusterrun.transport.srun import SrunTransport

if TYPE_CHECKING:
    from clusterrun.transport.ssh import SshTransport

__all__ = ["ConnectError", "LocalTransport", "Process", "SshOptions", "SshTransport", "Transport",
           "connect", "direct", "route", "ssh_of"]


def __getattr__(name: str) -> Any:
    # SshTransport on first use: paramiko and fabric cost a command ~0.3 s to import, and one
    # that reaches its hosts through the warm session never makes an SSH connection itself.
    if name == "SshTransport":
        from clusterrun.transport.ssh import SshTransport

        return SshTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ssh_of(transport: Transport) -> Optional[OverOpenSsh]:
    """``transport`` when OpenSSH can reach its host with the same settings (rsync's -e): a
    direct SSH connection or one through the warm session; else None (a local host, a job
    step, a stand-in)."""
    return transport if isinstance(transport, OverOpenSsh) else None


# SSH handshakes at once in this process, whatever the callers' fan-out: the key exchange (in
# Python, here) is what costs this machine CPU, while a host that is connected and working is a
# few idle threads and a socket, so a caller may wait on many more hosts than connect at once.
HANDSHAKES = 64
_handshakes = threading.BoundedSemaphore(HANDSHAKES)


# How a command reaches its hosts when the warm session is on (clusterrun.session.client's
# connector, set by the command line); None: directly, as ``direct`` does.
route: Optional[Callable[[HostSpec, SshOptions], Transport]] = None


def connect(spec: HostSpec, options: SshOptions) -> Transport:
    if route is not None:
        return route(spec, options)
    return direct(spec, options)


def direct(spec: HostSpec, options: SshOptions) -> SshTransport | LocalTransport | SrunTransport:
    """A connection of this process's own: SSH, srun, or none for a local host."""
    transport: SshTransport | LocalTransport | SrunTransport
    if spec.transport == "srun":
        transport = SrunTransport(spec)
    elif spec.local:
        transport = LocalTransport(spec)
    else:
        from clusterrun.transport.ssh import SshTransport

        transport = SshTransport(spec, options)
    # Here, not in SshTransport.connect: a proxy_jump connects its bastion from inside that,
    # and must not wait for a slot its own host holds.
    with _handshakes:
        transport.connect()
    return transport

