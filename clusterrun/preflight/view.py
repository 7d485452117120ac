"""Showing a preflight report: a table on a terminal, plain lines otherwise, or JSON."""

from __future__ import annotations

import json
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from clusterrun.preflight.report import CheckReport, HostReport


def _problems(host: HostReport) -> list[str]:
    return [f"{c.name}: {c.detail}" for c in host.checks
            if not c.ok or c.detail.startswith("warning:")]


def _status(host: HostReport) -> str:
    if host.ok:
        return "ok"
    # A host that answered SSH but whose probe failed (no python, a failing setup:) was reached.
    return "FAIL" if host.reached else "UNREACHABLE"


def render_json(report: CheckReport, out: TextIO) -> None:
    json.dump(report.as_json(), out, indent=2)
    out.write("\n")


def render_table(report: CheckReport, console: Console) -> None:
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
    for host in report.hosts:
        for problem in _problems(host):
            color = "yellow" if ": warning:" in problem else "red"
            console.print(Text.assemble((host.spec.name, color), " ", problem), highlight=False)
    console.print(Text(summary(report)), highlight=False)


def render_plain(report: CheckReport, out: TextIO) -> None:
    for host in report.hosts:
        out.write(f"{host.spec.name}  rank {host.node_rank}  {_status(host)}  "
                  f"interface {host.interface or '-'} {host.address or '-'}  "
                  f"python {host.python or '-'}  torch {host.torch or '-'}  gpus {host.gpus}\n")
        for problem in _problems(host):
            out.write(f"  {problem}\n")
    out.write(summary(report) + "\n")


def summary(report: CheckReport) -> str:
    total = len(report.hosts)
    failed = [h.spec.name for h in report.hosts if not h.ok]
    where = f"master {report.master_addr}:{report.master_port}" if report.master_addr else \
        "master address unknown"
    if not failed:
        return f"{total}/{total} hosts ready; {where}."
    return f"{len(failed)} of {total} hosts failed: {', '.join(failed)}; {where}."
