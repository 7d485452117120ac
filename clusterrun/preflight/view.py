"""Showing a preflight report: a table on a terminal, plain lines otherwise, or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional, TextIO

from clusterrun.inventory.ranges import fold
from clusterrun.preflight.report import CheckReport, HostReport, Pairs

if TYPE_CHECKING:
    from rich.console import Console

MATRIX_HOSTS = 12  # up to this many hosts, blocked pairs are drawn as a from x to matrix


def problems(report: CheckReport) -> list[tuple[str, bool]]:
    """(line, is a warning) for every failed check and warning, failures first. A problem that
    several hosts share, in the same words, is said once for all of them:
    `node[3,7]: mtu: warning: MTU 1400, others 1500`."""
    groups: dict[tuple[str, bool, str], list[str]] = {}
    for host in report.hosts:
        for c in host.checks:
            if c.ok and not c.warning:
                continue
            text = c.group if c.group else f"{c.detail}\0{host.spec.name}"
            groups.setdefault((c.name, c.warning, text), []).append(host.spec.name)
    details = {(c.name, c.warning, c.group): c.detail for host in report.hosts
               for c in host.checks if c.group}
    lines = []
    for (name, warning, text), names in groups.items():
        # One host: its own words (they name the interface, the other hosts, the fix).
        said = details.get((name, warning, text), text) if len(names) == 1 else text
        lines.append((f"{fold(names)}: {name}: {said.split(chr(0))[0]}", warning))
    return sorted(lines, key=lambda item: item[1])  # stable: failures first, host order kept


def pair_lines(pairs: Pairs) -> list[str]:
    """The blocked pairs: a from x to matrix for a few hosts, else grouped by target."""
    if not pairs.blocked:
        return []
    total = len(pairs.hosts) * (len(pairs.hosts) - 1)
    lines = [f"pairs: {len(pairs.blocked)} of {total} connections between hosts failed "
             "(from -> to, TCP to an ephemeral port on the chosen interface):"]
    bad = {(b.source, b.target) for b in pairs.blocked}
    if len(pairs.hosts) <= MATRIX_HOSTS:
        width = max(len("BLOCKED"), *(len(h) for h in pairs.hosts))
        lines.append("  " + " " * width + "  to: " + " ".join(h.ljust(width)
                                                              for h in pairs.hosts).rstrip())
        for source in pairs.hosts:
            cells = ["-" if source == t else "BLOCKED" if (source, t) in bad else "ok"
                     for t in pairs.hosts]
            lines.append((f"  {source.ljust(width)}  from " + " ".join(
                c.ljust(width) for c in cells)).rstrip())
    else:
        by_target: dict[str, list[str]] = {}
        for b in pairs.blocked:
            by_target.setdefault(b.target, []).append(b.source)
        for target, sources in by_target.items():
            lines.append(f"  {fold(sources)} -> {target}")
    reasons = sorted({b.error for b in pairs.blocked})
    lines.append(f"  ({'; '.join(reasons[:3])}; the hosts' lines above say how to fix it)")
    return lines


def _status(host: HostReport) -> str:
    if host.ok:
        return "ok"
    # A host that answered SSH but whose probe failed (no python, a failing setup:) was reached.
    return "FAIL" if host.reached else "UNREACHABLE"


def render_json(report: CheckReport, out: TextIO,
                extra: Optional[Mapping[str, object]] = None) -> None:
    """``--json``: the report as one JSON object, with ``extra``'s keys added (what other
    checks of the same command found)."""
    json.dump({**report.as_json(), **(extra or {})}, out, indent=2)
    out.write("\n")


def render_table(report: CheckReport, console: Console) -> None:
    # rich is loaded only for a terminal: a launch and `check | less` never pay for it.
    from rich.table import Table
    from rich.text import Text

    table = Table(title=None, show_lines=False)
    for column in ("node", "rank", "status", "interface", "address", "python", "torch", "gpus"):
        table.add_column(column)
    # Text, never markup: details hold remote output and names like `[gpu-a]:2222`, which rich
    # would take for style tags and silently drop.
    for host in report.hosts:
        style = "green" if host.ok else "bold red"
        table.add_row(Text(host.spec.name), str(host.node_rank), Text(_status(host), style=style),
                      Text(host.interface or "-"), Text(host.address or "-"),
                      Text(host.python or "-"), Text(host.torch or "-"), str(host.gpus))
    console.print(table)
    for line, warning in problems(report):
        hosts, rest = line.split(": ", 1)
        console.print(Text.assemble((hosts, "yellow" if warning else "red"), ": ", rest),
                      highlight=False)
    for line in pair_lines(report.pairs) if report.pairs else []:
        console.print(Text(line), highlight=False)
    console.print(Text(summary(report)), highlight=False)


def render_plain(report: CheckReport, out: TextIO) -> None:
    for host in report.hosts:
        out.write(f"{host.spec.name}  rank {host.node_rank}  {_status(host)}  "
                  f"interface {host.interface or '-'} {host.address or '-'}  "
                  f"python {host.python or '-'}  torch {host.torch or '-'}  gpus {host.gpus}\n")
    for line, _warning in problems(report):
        out.write(f"  {line}\n")
    for line in pair_lines(report.pairs) if report.pairs else []:
        out.write(f"{line}\n")
    out.write(summary(report) + "\n")


def summary(report: CheckReport) -> str:
    total = len(report.hosts)
    failed = [h.spec.name for h in report.hosts if not h.ok]
    where = f"master {report.master_addr}:{report.master_port}" if report.master_addr else \
        "master address unknown"
    if not failed:
        return f"{total}/{total} hosts ready; {where}."
    return f"{len(failed)} of {total} hosts failed: {', '.join(failed)}; {where}."
