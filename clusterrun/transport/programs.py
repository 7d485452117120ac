"""Running clusterrun's own programs (clusterrun/remote/*.py) on a host, reading their replies."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable
from typing import Any

from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport import shell
from clusterrun.transport.base import Process, Transport


class ProgramError(ClusterrunError):
    """One of clusterrun's programs on a host failed or gave no answer (the host was reached)."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message, outcome=outcome)


def drain(proc: Process, limit: int = 64 * 1024) -> tuple[threading.Thread, bytearray]:
    """Read a process's stderr in the background (an unread SSH channel stalls its writer),
    keeping the last ``limit`` bytes for error messages."""
    tail = bytearray()

    def pump() -> None:
        while True:
            try:
                chunk = proc.recv_stderr(65536)
            except OSError:
                return
            if not chunk:
                return
            tail.extend(chunk)
            del tail[:-limit]

    thread = threading.Thread(target=pump, daemon=True, name="clusterrun-stderr")
    thread.start()
    return thread, tail


def send(proc: Process, program: str, request: dict[str, Any]) -> None:
    """Give a started interpreter one of clusterrun's programs and its request. One that has
    already exited (a failing `setup:`, a missing interpreter) cannot take it: the write fails,
    and its exit status and stderr, which every caller reads next, say why."""
    with contextlib.suppress(OSError):
        proc.write(shell.program_input(program, request))


def call(transport: Transport, spec: HostSpec, program: str, request: dict[str, Any],
         timeout: float, *, payload: Iterable[bytes] = (), site: bool = True) -> dict[str, Any]:
    """Run a helper program on a host with one request (and ``payload`` after it on its stdin);
    return its last JSON reply. ``site``: see ``shell.remote_python``."""
    proc = transport.run(shell.remote_python(spec, site=site))
    stderr_thread, stderr = drain(proc)
    out = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = proc.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            out.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    send(proc, program, request)
    with contextlib.suppress(OSError):  # a program that died early: its exit status says why
        for chunk in payload:
            proc.write(chunk)
    with contextlib.suppress(OSError):
        proc.close_stdin()
    reader.join(timeout)
    code = proc.wait(5 if not reader.is_alive() else 0.1)
    proc.close()
    for line in reversed(bytes(out).splitlines()):
        text = line[2:] if line.startswith(b"J ") else line
        try:
            reply = json.loads(text)
        except ValueError:
            continue
        if isinstance(reply, dict):
            return reply
    stderr_thread.join(1)
    err = stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    why = f"no answer within {timeout:g} s" if reader.is_alive() else f"exit status {code}"
    raise ProgramError(Outcome.PROBE_TIMEOUT if reader.is_alive() else Outcome.PROBE_FAILED,
                       f"{spec.name}: {program} failed ({why})"
                     + (": " + " | ".join(err) if err else "."))
