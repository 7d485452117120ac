"""A conversation with the preflight probe (clusterrun/remote/probe.py) on one host."""

from __future__ import annotations

import json
import queue
import threading
from typing import Any, Optional

from clusterrun import command
from clusterrun.errors import ClusterrunError
from clusterrun.inventory import HostSpec
from clusterrun.transport import Process, Transport

_EOF = object()


class ProbeError(ClusterrunError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


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


class ProbeSession:
    """Starts the probe, then asks it questions; every answer has a timeout."""

    def __init__(self, transport: Transport, spec: HostSpec, timeout: float) -> None:
        self.spec = spec
        self.timeout = timeout
        self._proc = transport.run(command.remote_python(spec.python, spec.setup))
        self._stderr_thread, self._stderr = drain(self._proc)
        self._lines: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="clusterrun-probe").start()
        self._proc.write(command.program_input("probe.py", {"workdir": spec.workdir}))
        self.facts: dict[str, Any] = self._answer("facts")

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._proc.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._lines.put(_EOF)
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                self._lines.put(line)

    def _answer(self, key: str) -> Any:
        try:
            line = self._lines.get(timeout=self.timeout)
        except queue.Empty:
            raise ProbeError("timeout", f"{self.spec.name}: the probe gave no answer within "
                             f"{self.timeout:g} s.") from None
        if line is _EOF:
            raise self._died()
        try:
            return json.loads(line)[key]
        except (ValueError, KeyError, TypeError):
            raise ProbeError("error", f"{self.spec.name}: unexpected output from the probe: "
                             f"{line[:200]!r}. Does `setup:` print to stdout?") from None

    def _died(self) -> ProbeError:
        code = self._proc.wait(5)
        self._stderr_thread.join(2)
        err = self._stderr.decode("utf-8", "replace").strip()
        last = err.splitlines()[-5:] if err else []
        detail = ("\n    " + "\n    ".join(last)) if last else ""
        if code == 127:
            return ProbeError("exit", f"{self.spec.name}: the interpreter `{self.spec.python}` "
                              "was not found there. Set `python:` in the inventory to the host's "
                              f"Python 3 (or a `setup:` that puts it on PATH).{detail}")
        if code == command.SETUP_FAILED:
            return ProbeError("exit", f"{self.spec.name}: the inventory's `setup:` snippet failed "
                              f"there; fix it or the host's environment.{detail}")
        return ProbeError("exit", f"{self.spec.name}: the probe exited with status {code} "
                          f"before answering.{detail}")

    def ask(self, op: str, **fields: Any) -> Any:
        try:
            self._proc.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        except OSError:
            raise self._died() from None
        return self._answer(op)

    def close(self) -> None:
        try:
            self._proc.write(b'{"op": "exit"}\n')
            self._proc.close_stdin()
        except OSError:
            pass
        self._proc.wait(2)
        self._proc.close()


def first_ipv4(iface: Optional[dict[str, Any]]) -> Optional[str]:
    if not iface:
        return None
    for cidr in iface.get("addrs", []):
        addr = cidr.split("/")[0]
        if ":" not in addr:
            return addr
    return None


def call(transport: Transport, spec: HostSpec, program: str, request: dict[str, Any],
         timeout: float) -> dict[str, Any]:
    """Run a helper program on a host with one request; return its last JSON reply."""
    proc = transport.run(command.remote_python(spec.python, spec.setup))
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
    try:
        proc.write(command.program_input(program, request))
        proc.close_stdin()
    except OSError:
        pass
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
    raise ProbeError("error", f"{spec.name}: {program} failed ({why})"
                     + (": " + " | ".join(err) if err else "."))
