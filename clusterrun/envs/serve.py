"""The master's wheel store served to the other hosts for one sync (remote/tools/wheelserve.py): a
fresh port on its data address, a random token, ended with the sync."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator, Mapping

from clusterrun.envs.hoststatus import HostStatus, Json
from clusterrun.errors import PreflightError
from clusterrun.inventory import AUTO, HostSpec, Inventory
from clusterrun.remote.shared import protocol
from clusterrun.transport import programs
from clusterrun.transport.base import Transport


def address(inv: Inventory, relay: HostSpec, status: Mapping[str, object]) -> str:
    """Where ``relay`` serves: its data address, as preflight picks the master's
    (preflight/decide.py's master_addr_from_facts): the inventory's master_addr, 127.0.0.1 when
    every host is this machine, its `interface:`'s IPv4 address (its status reports it), else
    the address SSH reached it on."""
    if inv.master_addr != AUTO and relay.name == inv.master.name:
        return inv.master_addr
    if all(h.local for h in inv.hosts):
        return "127.0.0.1"
    found = HostStatus.from_json(status)
    return found.interface_address or found.ssh_server_address or relay.host


@contextlib.contextmanager
def serving(transport: Transport, spec: HostSpec, bind: str,
            timeout: float) -> Iterator[tuple[str, str]]:
    """(the store's URL, the token its requests carry) while the master serves it."""
    token = secrets.token_hex(16)
    interp = programs.start(transport, spec, "wheelserve.py",
                            {"workdir": spec.workdir, "bind": bind, "token": token}, site=False)
    try:
        port = _first_reply(interp, timeout).get("port")
        if not port:
            raise PreflightError(f"{spec.name}: could not serve its wheels to the other "
                                 f"hosts on {bind}.")
        host = f"[{bind}]" if ":" in bind else bind
        yield f"http://{host}:{port}", token
    finally:
        with contextlib.suppress(OSError, EOFError):
            interp.proc.close_stdin()
            interp.proc.wait(5)
        interp.proc.close()


def _first_reply(interp: programs.Interpreter, timeout: float) -> Json:
    """The first JSON reply of a program that goes on running (wheelserve.py's port)."""
    out = bytearray()
    end = time.monotonic() + timeout
    while b"\n" not in out and time.monotonic() < end:
        chunk = interp.proc.recv(4096)
        if not chunk:
            break
        out.extend(chunk)
    line = bytes(out).split(b"\n", 1)[0]
    if line.startswith(protocol.EVENT):
        line = line[len(protocol.EVENT):]
    try:
        reply = json.loads(line)
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}
