"""Drawing one frame of `clusterrun top` with rich: a title line, a table of hosts (GPUs under
their host) and a table of ranks, flagged ranks and lost hosts in red."""

from __future__ import annotations

import time
from typing import Optional

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from clusterrun.observe.frame import LOST, OK, Frame, HostSample, RankSample


def num(value: Optional[float], fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def mem(used: Optional[int], total: Optional[int]) -> str:
    if used is None or total is None:
        return "-"
    return f"{used / 1024:.1f}/{total / 1024:.0f}G"


def title(frame: Frame, live: bool) -> Text:
    state = frame.run_state
    style = {"running": "green", "stalled": "bold red", "failed": "red", "lost": "red"}.get(
        state, "yellow")
    text = Text.assemble(("clusterrun top ", "bold"), (frame.run, "bold cyan"), "  ",
                         (state.upper() if state == "stalled" else state, style))
    lost = [h.node for h in frame.hosts if h.status == LOST]
    if lost:
        text.append(f"  {len(lost)} host{'s' if len(lost) > 1 else ''} lost", "bold red")
    flagged = [r for r in frame.ranks if r.flags]
    if flagged:
        text.append(f"  {len(flagged)} rank{'s' if len(flagged) > 1 else ''} flagged",
                    "bold yellow")
    if frame.stragglers:
        text.append("  straggler: rank " + ", ".join(map(str, frame.stragglers)), "bold red")
    text.append(f"  every {frame.interval:g}s" if live else "", "dim")
    text.append(f"  {time.strftime('%H:%M:%S')}" + ("  q quits" if live else ""), "dim")
    return text


def host_table(hosts: list[HostSample]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    for name, justify in (("HOST", "left"), ("STATE", "left"), ("CPU%", "right"),
                          ("MEM", "right"), ("LOAD", "right"), ("NET", "left"),
                          ("RX MB/s", "right"), ("TX MB/s", "right"), ("DISK FREE", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for host in hosts:
        if host.status != OK:
            style = "bold red" if host.status == LOST else "dim"
            table.add_row(host.node, Text(host.status.upper() if host.status == LOST
                                          else host.status, style),
                          Text(host.reason[:60], style), "", "", "", "", "", "")
            continue
        table.add_row(host.node, host.node_state, num(host.cpu_percent),
                      mem(host.mem_used_mb, host.mem_total_mb),
                      num(host.load[0] if host.load else None, "{:.1f}"),
                      host.interface or "-", num(host.net_rx_mbps, "{:.2f}"),
                      num(host.net_tx_mbps, "{:.2f}"),
                      "-" if host.disk_free_mb is None else f"{host.disk_free_mb / 1024:.1f}G")
        for gpu in host.gpus:
            extra = []
            if gpu.throttle:
                extra.append("throttle " + ",".join(gpu.throttle))
            if gpu.ecc_errors:
                extra.append(f"ECC {gpu.ecc_errors}")
            table.add_row(Text(f"  gpu{num(gpu.index)}", "magenta"),
                          Text(" ".join(extra), "bold red") if extra else "",
                          f"{num(gpu.util_percent)}",
                          "-" if gpu.mem_used_mb is None or gpu.mem_total_mb is None else
                          f"{gpu.mem_used_mb / 1024:.1f}/{gpu.mem_total_mb / 1024:.0f}G",
                          f"{num(gpu.temp_c)}C", f"{num(gpu.power_w)}W", "", "", "")
    return table


def rank_table(ranks: list[RankSample], profiled: bool) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, expand=True)
    columns = [("RANK", "right"), ("HOST", "left"), ("PID", "right"), ("CPU%", "right"),
               ("RSS MB", "right"), ("LINES/MIN", "right"), ("SILENT", "right")]
    if profiled:
        columns.append(("WAIT", "right"))
    columns += [("FLAGS", "left"), ("LAST LINE", "left")]
    for name, justify in columns:
        last = name == "LAST LINE"  # the rest of the width, and at least 30 columns
        table.add_column(name, justify=justify, no_wrap=True,  # type: ignore[arg-type]
                         overflow="ellipsis", ratio=1 if last else None,
                         min_width=30 if last else None)
    for rank in ranks:
        cells: list[RenderableType] = [
            str(rank.rank), rank.node, num(rank.pid), num(rank.cpu_percent),
            num(rank.rss_mb), num(rank.lines_per_min, "{:.1f}"),
            "-" if rank.silent_s is None else f"{rank.silent_s:.0f}s"]
        if profiled:
            cells.append(num(None if rank.wait_share is None else 100 * rank.wait_share,
                             "{:.0f}%"))
        cells += [Text(",".join(rank.flags), "bold red") if rank.flags else "",
                  rank.last_line or ""]
        table.add_row(*cells)
    return table


def render(frame: Frame, *, live: bool = True) -> Group:
    """The whole frame; ``live`` for the full-screen view (the refresh interval, how to quit)."""
    profiled = frame.stragglers is not None
    return Group(title(frame, live), Text(""), host_table(frame.hosts), Text(""),
                 rank_table(frame.ranks, profiled))
