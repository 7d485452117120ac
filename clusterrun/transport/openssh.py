"""The OpenSSH client command line that reaches a host with the settings clusterrun's own
connection uses (strict host keys, known_hosts, identity, timeouts, the bastion): rsync's -e.
Built from the host's spec alone, so a command that reaches its hosts through the warm session
gets it without loading paramiko."""

from __future__ import annotations

import math
import os
from typing import Optional, Protocol, runtime_checkable

from clusterrun.inventory import HostSpec
from clusterrun.transport import shell
from clusterrun.transport.base import SshOptions


@runtime_checkable
class OverOpenSsh(Protocol):
    """A connection to a plain SSH host: rsync can reach the same host with ``ssh_argv()``."""

    spec: HostSpec

    def ssh_argv(self) -> list[str]: ...


def argv(spec: HostSpec, options: SshOptions) -> list[str]:
    base = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ForwardAgent=no",
            "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes",
            "-o", f"ConnectTimeout={max(1, math.ceil(options.connect_timeout))}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", "StrictHostKeyChecking=" + ("accept-new" if options.accept_new_host_keys
                                              else "yes"),
            "-o", "UserKnownHostsFile=" + os.path.expanduser(spec.known_hosts)]
    if spec.identity_file:
        base += ["-i", os.path.expanduser(spec.identity_file)]
    out = [*base, *_login(spec.user, spec.port)]
    if spec.jump is not None:
        # Not -J: the jump's own ssh would not get these options (strict host keys,
        # known_hosts, timeouts, identity); a ProxyCommand of the same ssh gets them all.
        user, host, port = spec.jump
        jump = [*base, *_login(user or spec.user, port), "-W", "[%h]:%p", host]
        out += ["-o", "ProxyCommand=" + shell.join(jump)]
    return out


def _login(user: Optional[str], port: Optional[int]) -> list[str]:
    return [*(["-l", user] if user else []), *(["-p", str(port)] if port else [])]
