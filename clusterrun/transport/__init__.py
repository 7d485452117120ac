"""How commands reach a host: SSH, a Slurm job step, or this machine directly; and running many
hosts at once."""

from __future__ import annotations

from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, Process, SshOptions, Transport
from clusterrun.transport.local import LocalTransport
from clusterrun.transport.srun import SrunTransport
from clusterrun.transport.ssh import SshTransport

__all__ = ["ConnectError", "LocalTransport", "Process", "SshOptions", "SshTransport", "Transport",
           "connect"]


def connect(spec: HostSpec, options: SshOptions) -> SshTransport | LocalTransport | SrunTransport:
    transport: SshTransport | LocalTransport | SrunTransport
    if spec.transport == "srun":
        transport = SrunTransport(spec)
    elif spec.local:
        transport = LocalTransport(spec)
    else:
        transport = SshTransport(spec, options)
    transport.connect()
    return transport

