"""What `clusterrun exec` says when every host is done: the hosts grouped by how their command
ended (``exit 0: node[1-30] (30)``), with `-b` each distinct output once under the hosts that
printed it (clush -b, dshbak -c), and with `--json` one document holding everything."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, TextIO

from clusterrun.errors import Outcome, Result, exit_status
from clusterrun.exec import ExecResult, ExecRun
from clusterrun.inventory.ranges import fold
from clusterrun.logs.view import LogView
from clusterrun.remote.shared import layout
from clusterrun.transport import parallel

SEPARATOR = "-" * 15  # clush's, above and below each group's hosts


def nodes(names: Sequence[str]) -> str:
    """``gpu[01-03,05] (4)``: the hosts folded by ClusterShell's NodeSet, with their count when
    more than one (as clush writes its headers)."""
    return fold(names) + (f" ({len(names)})" if len(names) > 1 else "")


class Collected:
    """Every host's stdout and stderr kept whole, for `-b` and `--json`. ``echo`` shows the
    streams named in ``shown`` as they come (`-b`: stderr, prefixed, as clush -b does)."""

    def __init__(self, echo: Optional[LogView] = None,
                 shown: frozenset[str] = frozenset()) -> None:
        self.echo = echo
        self.shown = shown
        self._data: dict[tuple[str, str], bytearray] = {}
        self._lock = threading.Lock()

    def feed(self, node: str, name: str, data: bytes) -> None:
        with self._lock:
            self._data.setdefault((node, name), bytearray()).extend(data)
        if self.echo is not None and name in self.shown:
            self.echo.feed(node, name, data)

    def close(self, node: Optional[str] = None) -> None:
        if self.echo is not None:
            self.echo.close(node)

    def ticking(self) -> contextlib.AbstractContextManager[Any]:
        return self.echo.ticking() if self.echo is not None else contextlib.nullcontext()

    def output(self, node: str, name: str = layout.EXEC_OUT) -> bytes:
        with self._lock:
            return bytes(self._data.get((node, name), b""))

    def text(self, node: str, name: str = layout.EXEC_OUT) -> str:
        return self.output(node, name).decode("utf-8", "replace")


@dataclass(frozen=True)
class Group:
    """Hosts whose stdout was byte for byte the same, in inventory order."""

    names: tuple[str, ...]
    output: bytes

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", "replace")


def gather(names: Sequence[str], collected: Collected) -> list[Group]:
    """Each distinct non-empty stdout once, with the hosts (``names``, in inventory order) that
    printed it: the largest group first, then by its first host, as clush -b orders them. A host
    that printed nothing is in no group (clush -b shows none either); the summary names it."""
    by_output: dict[bytes, list[str]] = {}
    for name in names:
        output = collected.output(name)
        if output:
            by_output.setdefault(output, []).append(name)
    place = {name: index for index, name in enumerate(names)}
    groups = [Group(tuple(hosts), output) for output, hosts in by_output.items()]
    return sorted(groups, key=lambda g: (-len(g.names), place[g.names[0]]))


def render_gathered(groups: Sequence[Group], out: TextIO) -> None:
    """clush -b's layout: the hosts between two rules, then their output once."""
    for group in groups:
        body = group.text[:-1] if group.text.endswith("\n") else group.text
        out.write(f"{SEPARATOR}\n{nodes(group.names)}\n{SEPARATOR}\n{body}\n")
    out.flush()


def _ended(result: ExecResult) -> str:
    if result.state == "timeout":
        return f"{result.reason} (exit {result.code})"
    if result.state in ("stopped", "lost"):
        return f"{result.state} (exit {result.code})"
    return f"exit {result.code}" if result.code >= 0 else "exit status unknown"


def _heading(failure: parallel.Failure) -> str:
    """A host that never ran the command: ``unreachable`` when it could not be reached (the
    outcome then leads the detail), else its outcome."""
    return "unreachable" if not failure.outcome.reached else failure.outcome.label


def _detail(failure: parallel.Failure, name: str) -> str:
    detail = parallel.strip_name(failure.message, name)
    return f"{failure.outcome.label}: {detail}" if not failure.outcome.reached else detail


def summarize(run: ExecRun) -> tuple[list[str], Result]:
    """The hosts grouped by how their command ended, one line per group: every exit status in
    increasing order (``exit 0: node[1-30] (30)``, then timeouts and stops by their status),
    then hosts where it could not run, then unreachable hosts, each with why. And what the
    command came to: the largest remote exit status, as `pdsh -S` and `clush -S` report it
    (124 for a host that timed out, a host's own failure's status), a host that could not be
    reached, the user's signal."""
    groups: dict[tuple[int, int, str, str], list[str]] = {}
    worst = 0
    unreachable = False
    for r in run.results:
        if r.failure is not None:
            reached = r.failure.outcome.reached
            unreachable = unreachable or not reached
            worst = max(worst, int(r.failure.outcome.status))
            key = (1 if reached else 2, 0, _heading(r.failure), _detail(r.failure, r.name))
            groups.setdefault(key, []).append(r.name)
            continue
        assert r.value is not None
        code = r.value.code
        groups.setdefault((0, code if code >= 0 else 1 << 16, _ended(r.value), ""),
                          []).append(r.name)
        worst = max(worst, code if code > 0 else (255 if code < 0 else 0))
    lines = [f"{heading}: {nodes(names)}" + (f": {detail}" if detail else "")
             for (_rank, _code, heading, detail), names in sorted(groups.items())]
    return lines, Result(interrupted=run.interrupted, unreachable=unreachable, code=worst)


def _state(failure: parallel.Failure) -> str:
    if not failure.outcome.reached:
        return "unreachable"
    if failure.outcome is Outcome.INTERRUPTED:
        return "not started"
    return "lost" if failure.outcome is Outcome.NODE_LOST else "failed"


def _host(r: parallel.HostResult[Any, ExecResult], collected: Collected) -> dict[str, Any]:
    value, failure = r.value, r.failure
    return {
        "name": r.name, "host": getattr(r.item, "host", r.name),
        "state": value.state if value is not None else _state(failure) if failure else None,
        "exit_status": value.code if value is not None and value.code >= 0 else None,
        "stdout": collected.text(r.name), "stderr": collected.text(r.name, layout.EXEC_ERR),
        "time": round(value.elapsed, 3) if value is not None and value.elapsed is not None
        else None,
        "reason": value.reason if value is not None else failure.message if failure else None,
    }


def document(run: ExecRun, collected: Collected, result: Result, *,
             gathered: bool = False) -> dict[str, Any]:
    """`exec --json`: ``{"ok", "exit_status", "hosts": [...]}`` (docs/commands.md), with
    ``"groups"`` as `-b` gathers them when ``gathered``."""
    status = exit_status(result)
    doc: dict[str, Any] = {"ok": status == 0, "exit_status": status,
                           "hosts": [_host(r, collected) for r in run.results]}
    if gathered:
        doc["groups"] = [{"nodes": fold(g.names), "hosts": list(g.names), "stdout": g.text}
                         for g in gather([r.name for r in run.results], collected)]
    return doc
