"""How commands reach a host: SSH, or this machine directly; and running many hosts at once."""

from __future__ import annotations

from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, Process, SshOptions, Transport
from clusterrun.transport.local import LocalTransport
from clusterrun.transport.ssh import SshTransport

__all__ = ["ConnectError", "LocalTransport", "Process", "SshOptions", "SshTransport", "Transport",
           "connect"]


def connect(spec: HostSpec, options: SshOptions) -> SshTransport | LocalTransport:
    transport: SshTransport | LocalTransport = (
        LocalTransport(spec) if spec.local else SshTransport(spec, options))
    transport.connect()
    return transport

