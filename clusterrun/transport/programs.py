"""Running clusterrun's own programs (the rooms of clusterrun/remote/) on a host, reading their
replies."""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import protocol
from clusterrun.transport import shell
from clusterrun.transport.base import Process, Transport


class ProgramError(ClusterrunError):
    """One of clusterrun's programs on a host failed or gave no answer (the host was reached)."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message, outcome=outcome)


def chunks(recv: Callable[[int], bytes]) -> Iterator[bytes]:
    """One stream of a channel (``proc.recv``, ``proc.recv_stderr``) as it arrives, until it
    ends or fails: a broken connection ends it as EOF does, and the exit status says why."""
    while True:
        try:
            chunk = recv(65536)
        except OSError:
            return
        if not chunk:
            return
        yield chunk


def drain(proc: Process, limit: int = 64 * 1024) -> tuple[threading.Thread, bytearray]:
    """Read a process's stderr in the background (an unread SSH channel stalls its writer),
    keeping the last ``limit`` bytes for error messages."""
    tail = bytearray()

    def pump() -> None:
        for chunk in chunks(proc.recv_stderr):
            tail.extend(chunk)
            del tail[:-limit]

    thread = threading.Thread(target=pump, daemon=True, name="clusterrun-stderr")
    thread.start()
    return thread, tail


def read_lines(proc: Process) -> Iterator[bytes]:
    """A program's stdout line by line (without the newline), as it arrives, until the stream
    ends or fails (an unfinished last line is dropped: it was never written whole)."""
    buf = b""
    for chunk in chunks(proc.recv):
        buf += chunk
        *done, buf = buf.split(b"\n")
        yield from done


def send(proc: Process, program: str, request: dict[str, Any], *, chain: bool = False) -> None:
    """Give a started interpreter one of clusterrun's programs and its request. One that has
    already exited (a failing `setup:`, a missing interpreter) cannot take it: the write fails,
    and its exit status and stderr, which every caller reads next, say why."""
    with contextlib.suppress(OSError):
        proc.write(shell.program_input(program, request, chain=chain))


@dataclass
class Interpreter:
    """A Python running clusterrun's programs on a host, one after the other (shell.BOOTSTRAP):
    the channel, and the last bytes of its stderr (read all along, see ``drain``)."""

    proc: Process
    stderr: bytearray
    stderr_read: threading.Thread  # ends with the channel


# Interpreters that finished a program and wait for the next, by the connection they run on.
# Each SSH channel costs a login on its host (sshd runs the user's shell, which reads
# ~/.bashrc), so the next program a command runs there takes one of these instead.
_parked: weakref.WeakKeyDictionary[Transport, list[Interpreter]] = weakref.WeakKeyDictionary()
_parking = threading.Lock()


def start(transport: Transport, spec: HostSpec, program: str, request: dict[str, Any], *,
          site: bool = True, chain: bool = False) -> Interpreter:
    """Run ``program`` on the host: in an interpreter parked on this connection when there is
    one, else in a new one (a new channel). ``chain``: it will wait for another program after
    this one (``park`` it once it has said NEXT)."""
    with _parking:
        waiting = _parked.get(transport) or []
        found = waiting.pop() if waiting else None
    if found is not None and getattr(transport, "forks_programs", False):
        # A warm session's new request costs no login, and its agent's fork starts the
        # program sooner than the fresh interpreter the parked one would exec.
        with contextlib.suppress(OSError, EOFError):
            found.proc.close_stdin()  # in place of a program: it exits
            found.proc.close()
        found = None
    if found is not None:
        found.stderr.clear()  # what the earlier programs said is not this one's
        try:
            found.proc.write(shell.program_input(program, request, chain=chain, site=site))
            return found
        except OSError:  # it ended meanwhile (its connection broke): start afresh
            found.proc.close()
    proc = transport.run(shell.remote_python(spec, site=site))
    thread, tail = drain(proc)
    interp = Interpreter(proc, tail, thread)
    send(proc, program, request, chain=chain)
    return interp


def park(transport: Transport, interp: Interpreter) -> None:
    """``interp`` has said NEXT: the next program on this connection may run there."""
    with _parking:
        _parked.setdefault(transport, []).append(interp)


def release(*transports: Transport, wait: float = 2.0) -> None:
    """End the interpreters parked on these connections (EOF instead of a program) and wait up
    to ``wait`` s for them to exit, so nothing of this command is left on the hosts when it
    returns."""
    with _parking:
        waiting = [interp for t in transports for interp in _parked.pop(t, [])]
    for interp in waiting:
        with contextlib.suppress(OSError, EOFError):
            interp.proc.close_stdin()
    for interp in waiting:
        with contextlib.suppress(OSError, EOFError):
            interp.proc.wait(wait)
            interp.proc.close()


def call(transport: Transport, spec: HostSpec, program: str, request: dict[str, Any],
         timeout: float, *, payload: Iterable[bytes] = (), site: bool = True) -> dict[str, Any]:
    """Run a helper program on a host with one request (and ``payload`` after it on its stdin);
    return its last JSON reply. ``site``: see ``shell.remote_python``. The interpreter is
    parked on the connection afterwards, for the command's next program on that host."""
    interp = start(transport, spec, program, request, site=site, chain=True)
    proc, stderr = interp.proc, interp.stderr
    out = bytearray()
    done = b"\n" + shell.NEXT + b"\n"

    def said_next() -> bool:
        return out.endswith(done) or out == done[1:]

    def read() -> None:
        for chunk in chunks(proc.recv):
            out.extend(chunk)
            if said_next():
                return  # the interpreter waits for the next program: no EOF is coming

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with contextlib.suppress(OSError):  # a program that died early: its exit status says why
        for chunk in payload:
            proc.write(chunk)
    reader.join(timeout)
    chained = said_next()
    if chained:
        park(transport, interp)
        code: Optional[int] = 0
    else:
        with contextlib.suppress(OSError):
            proc.close_stdin()
        code = proc.wait(5 if not reader.is_alive() else 0.1)
        proc.close()
    if chained:
        del out[-len(done) + 1:]  # the NEXT line is not the program's reply
    for line in reversed(bytes(out).splitlines()):
        text = line[len(protocol.EVENT):] if line.startswith(protocol.EVENT) else line
        try:
            reply = json.loads(text)
        except ValueError:
            continue
        if isinstance(reply, dict):
            return reply
    if not chained:
        interp.stderr_read.join(1)
    err = stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    why = f"no answer within {timeout:g} s" if reader.is_alive() else f"exit status {code}"
    raise ProgramError(Outcome.PROBE_TIMEOUT if reader.is_alive() else Outcome.PROBE_FAILED,
                       f"{spec.name}: {program} failed ({why})"
                     + (": " + " | ".join(err) if err else "."))
