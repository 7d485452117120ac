"""Reaching this machine itself without sshd (the localhost demo and tests)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from typing import Optional

from clusterrun.errors import InventoryError
from clusterrun.inventory import HostSpec
from clusterrun.inventory.ranges import fold
from clusterrun.transport.base import Process


def require_linux(hosts: Iterable[HostSpec], inventory: str) -> None:
    """A local node runs clusterrun's host side (remote/) on this machine itself, and that
    side is Linux's: it finds the ranks, their state and its own open files in /proc. Elsewhere
    (a macOS laptop) refuse before anything starts, rather than fail deep inside a supervisor."""
    if str(sys.platform).startswith("linux"):  # str(): else mypy calls the rest unreachable
        return
    # In a container, the host side runs in the container's Linux, not on this machine.
    here = [h.name for h in hosts if h.local and not h.container]
    if not here:
        return
    system = platform.system() or sys.platform
    raise InventoryError(
        f"{inventory}: {fold(here)} {'is a local node' if len(here) == 1 else 'are local nodes'} "
        f"(host: localhost), run on this machine without SSH, and a local node needs Linux "
        f"(clusterrun's host side reads /proc there); this machine is {system}. Run the demo "
        "on a Linux machine or VM, or list Linux hosts reached over SSH in the inventory: "
        "this machine can drive them as the controller.")


class LocalProcess:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._stdin = proc.stdin
        self._out = proc.stdout.fileno()
        self._err = proc.stderr.fileno()

    def write(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):  # already gone: the reader has exited
            self._stdin.close()

    def recv(self, size: int) -> bytes:
        return os.read(self._out, size)

    def recv_stderr(self, size: int) -> bytes:
        return os.read(self._err, size)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        # Report signal deaths the way a remote shell would (128 + signal number).
        return 128 - code if code < 0 else code

    def close(self) -> None:
        self.close_stdin()


class LocalTransport:
    """This machine, without sshd: the command runs under /bin/sh from the home directory, as
    sshd would run it, in its own session so a Ctrl-C in this terminal does not reach it (a
    remote host would not get it either: teardown goes through the supervisor)."""

    address = "127.0.0.1"

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec

    def connect(self) -> None:
        return None

    def run(self, command: str) -> Process:
        # sshd starts in / when the user's home directory is missing: so does this, and the
        # probe then names the missing home and the fix (preflight/hostpaths.py).
        home = os.path.expanduser("~")
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=home if os.path.isdir(home) else "/",
            start_new_session=True, restore_signals=True,
        )
        return LocalProcess(proc)

    def close(self) -> None:
        return None


