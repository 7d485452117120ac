"""A conversation with the preflight probe (clusterrun/remote/probe/probe.py) on one host."""

from __future__ import annotations

import contextlib
import enum
import json
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Union

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import protocol
from clusterrun.transport import shell
from clusterrun.transport.base import Transport
from clusterrun.transport.programs import ProgramError, park, read_lines, start


class _End(enum.Enum):
    EOF = "eof"  # the probe's output ended
    NEXT = "next"  # the probe has ended and its interpreter waits for the next program


class ProbeSession:
    """Starts the probe, then asks it questions; every answer has a timeout."""

    def __init__(self, transport: Transport, spec: HostSpec, timeout: float) -> None:
        self.spec = spec
        self.timeout = timeout
        self._transport = transport
        # Chained: once it has answered, the same interpreter can run the command's next
        # program on this host (a manifest read, the copy, the supervisor) with no new login.
        # `environment:`: the probe also reports the lock's environment there (envs/warm.py).
        request = {"workdir": spec.workdir,
                   **({"lock": spec.environment.digest} if spec.environment else {})}
        self._interp = start(transport, spec, "probe.py", request, chain=True)
        self._proc, self._stderr = self._interp.proc, self._interp.stderr
        self._lines: queue.Queue[Union[bytes, _End]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="clusterrun-probe").start()
        # As it came: HostReport.facts, which plan and launch read too (preflight reads it
        # into typed facts, preflight/facts.py).
        self.facts: dict[str, Any] = dict(self._answer(protocol.Probe.FACTS))

    def _read(self) -> None:
        for line in read_lines(self._proc):
            if line == shell.NEXT:  # the last line of its output: stop reading there
                self._lines.put(_End.NEXT)
                return
            self._lines.put(line)
        self._lines.put(_End.EOF)

    def _answer(self, key: str) -> Mapping[str, object]:
        """The probe's answer to ``key``: a JSON object, read into typed values by the
        question's asker (answers.py, net_facts.py, facts.py)."""
        try:
            line = self._lines.get(timeout=self.timeout)
        except queue.Empty:
            raise ProgramError(Outcome.PROBE_TIMEOUT,
                f"{self.spec.name}: the probe gave no answer within "
                             f"{self.timeout:g} s.") from None
        if isinstance(line, _End):
            raise self._died()
        try:
            found = json.loads(line)[key]
            if not isinstance(found, dict):
                raise TypeError(key)
            return found
        except (ValueError, KeyError, TypeError):
            raise ProgramError(Outcome.PROBE_FAILED,
                f"{self.spec.name}: unexpected output from the probe: "
                             f"{line[:200]!r}. Does `setup:` print to stdout?") from None

    def _died(self) -> ProgramError:
        code = self._proc.wait(5)
        self._interp.stderr_read.join(2)
        err = self._stderr.decode("utf-8", "replace").strip()
        last = err.splitlines()[-5:] if err else []
        detail = ("\n    " + "\n    ".join(last)) if last else ""
        if code == 127 and self.spec.container:
            return ProgramError(Outcome.PROBE_FAILED,
                f"{self.spec.name}: the interpreter `{self.spec.python}` was not found in "
                f"container {self.spec.container!r}. Set `python:` to the container's Python 3 "
                f"(or a `setup:` that puts it on PATH there).{detail}")
        if code == shell.ENGINE_MISSING:
            return ProgramError(Outcome.PROBE_FAILED,
                f"{self.spec.name}: neither docker nor podman is installed there, and the "
                f"inventory runs it in container {self.spec.container!r}.{detail}")
        if code == 127:
            return ProgramError(Outcome.PROBE_FAILED,
                f"{self.spec.name}: the interpreter `{self.spec.python}` "
                              "was not found there. Set `python:` in the inventory to the host's "
                              f"Python 3 (or a `setup:` that puts it on PATH).{detail}")
        if code == shell.SETUP_FAILED:
            return ProgramError(Outcome.PROBE_FAILED,
                f"{self.spec.name}: the inventory's `setup:` snippet "
                                f"failed there; fix it or the host's environment.{detail}")
        return ProgramError(Outcome.PROBE_FAILED,
            f"{self.spec.name}: the probe exited with status {code} "
                          f"before answering.{detail}")

    def ask(self, op: str, **fields: object) -> Mapping[str, object]:
        """``fields``: the request's JSON fields, sent as they are."""
        return self.ask_all([(op, fields)])[0]

    def ask_all(self, requests: Sequence[tuple[str, Mapping[str, object]]]
                ) -> list[Mapping[str, object]]:
        """Every request sent in one write, then their answers, in order: the probe runs the
        ones it can at the same time (protocol.Probe.CONCURRENT)."""
        lines = b"".join(json.dumps({protocol.OP: op, **fields}).encode() + b"\n"
                         for op, fields in requests)
        try:
            self._proc.write(lines)
        except OSError:
            raise self._died() from None
        return [self._answer(op) for op, _fields in requests]

    def close(self) -> None:
        """End the probe. Its interpreter is parked on the connection for the command's next
        program there (``programs.park``); connections closing end it."""
        with contextlib.suppress(OSError):
            self._proc.write(json.dumps({protocol.OP: protocol.Probe.EXIT}).encode() + b"\n")
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is _End.NEXT:
                park(self._transport, self._interp)
                return
            if line is _End.EOF:
                break
        with contextlib.suppress(OSError):
            self._proc.close_stdin()
        self._proc.wait(2)
        self._proc.close()
