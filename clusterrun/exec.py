"""`clusterrun exec`: one shell command on every host at once, output prefixed per host."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional

from clusterrun.console import Printer
from clusterrun.errors import ExitStatus
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.logs.view import LogView
from clusterrun.transport import SshOptions, connect, parallel, shell


@dataclass(frozen=True)
class ExecResult:
    code: int  # the command's exit status; 128+N when killed by signal N, -1 unknown


def _pump(recv: Callable[[int], bytes], view: LogView, node: str, name: str) -> None:
    while True:
        try:
            chunk = recv(65536)
        except OSError:
            return
        if not chunk:
            return
        view.feed(node, name, chunk)


def run(inv: Inventory, cmd: str, options: SshOptions, printer: Printer,
        timeout: Optional[float] = None) -> list[parallel.HostResult[ExecResult]]:
    # pdsh's `host: line`; stdout and stderr are framed apart so their lines never mix.
    view = LogView(printer, label=lambda node, _stream: f"{node}:")

    def one(spec: HostSpec) -> ExecResult:
        transport = connect(spec, options)
        try:
            proc = transport.run(shell.remote_shell(spec.setup, cmd))
            proc.close_stdin()
            readers = [threading.Thread(target=_pump, args=(recv, view, spec.name, stream),
                                        daemon=True)
                       for recv, stream in ((proc.recv, "stdout"), (proc.recv_stderr, "stderr"))]
            for reader in readers:
                reader.start()
            code = proc.wait()
            for reader in readers:
                reader.join(5)
            view.close(spec.name)
            return ExecResult(code if code is not None else -1)
        finally:
            transport.close()

    with view.ticking():
        return parallel.run(one, list(inv.hosts), timeout)


def summarize(results: list[parallel.HostResult[ExecResult]]) -> tuple[list[str], int]:
    """Per-outcome summary lines (hosts folded) and the exit status: the largest remote exit
    status, as `pdsh -S` and `clush -S` report it, or 4 when a host could not be reached."""
    by_outcome: dict[str, list[str]] = {}
    worst = 0
    unreachable = False
    for r in results:
        if r.failure is not None:
            by_outcome.setdefault(f"{r.failure.kind}: {_strip_name(r.failure.message, r.spec)}",
                                  []).append(r.spec.name)
            unreachable = True
            continue
        assert r.value is not None
        code = r.value.code
        by_outcome.setdefault(f"exit {code}" if code >= 0 else "exit status unknown",
                              []).append(r.spec.name)
        worst = max(worst, code if code > 0 else (255 if code < 0 else 0))
    lines = [f"{parallel.fold(names)}: {outcome}" for outcome, names in sorted(by_outcome.items())]
    return lines, (ExitStatus.UNREACHABLE if unreachable else worst)


def _strip_name(message: str, spec: HostSpec) -> str:
    return message.split(": ", 1)[1] if message.startswith(spec.name) else message

