"""The benchmarks' results as Markdown tables (quoted by docs/performance.md) and a PNG of time
against host count."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional

from common import Sample, markdown_table, median, provenance_lines
from fanout import CHECK, CLUSH, EXEC, PDSH


def machine() -> str:
    mem = 0.0
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 1024 / 1024
    return f"{os.cpu_count()} CPUs, {mem:.0f} GB of memory"


def fanout_table(by_size: dict[int, dict[str, list[Sample]]]) -> str:
    rows = []
    for n, results in sorted(by_size.items()):
        clush = median(results[CLUSH]) if CLUSH in results else float("nan")
        for name, samples in results.items():
            wall = median(samples)
            rows.append([n, name, wall, "-" if math.isnan(clush) else f"{wall / clush:.2f}x",
                         median(samples, "cpu"), median(samples, "remote_cpu"),
                         int(median(samples, "threads")), median(samples, "peak_rss_mb")])
    return markdown_table(["hosts", "command", "median s", "vs clush", "CPU here s",
                           "CPU on hosts s", "threads", "peak RSS MB"], rows)


def launch_table(results: dict[str, list[Sample]]) -> str:
    floor = median(results["parallel ssh + torchrun"])
    rows = [[name, median(s), f"{median(s) / floor:.2f}x", median(s, "cpu"),
             median(s, "remote_cpu"), int(median(s, "threads")), median(s, "peak_rss_mb")]
            for name, s in results.items()]
    return markdown_table(["command (4 hosts x 1 rank, gloo all-reduce)", "median s",
                           "vs floor", "CPU here s", "CPU on hosts s", "threads",
                           "peak RSS MB"], rows)


def start_table(by_size: dict[int, dict[str, list[Sample]]]) -> str:
    """One row per host count and clusterrun measured (this checkout's first, then a
    --baseline's), each against this checkout's start on the fewest hosts."""
    base = min(by_size)
    first = median(next(iter(by_size[base].values())), "started")
    rows = [[n, name, median(s, "started"), f"{median(s, 'started') / first:.2f}x", median(s),
             median(s, "cpu"), int(median(s, "threads")), median(s, "peak_rss_mb")]
            for n, by_name in sorted(by_size.items()) for name, s in by_name.items()]
    return markdown_table(["hosts", "command", "all ranks started s", f"vs {base} hosts",
                           "whole launch s", "controller CPU s", "threads",
                           "peak RSS MB"], rows)


def throughput_table(samples: list[Sample]) -> str:
    rows = [[f"{median(samples, 'megabytes'):.0f} MB", median(samples, "console_mb_s"),
             median(samples, "end_to_end_mb_s"), median(samples),
             median(samples, "cpu"), median(samples, "remote_cpu"),
             median(samples, "peak_rss_mb"), "none (console and mirrors)"]]
    return markdown_table(["4 hosts x 2 ranks", "console MB/s", "MB/s over the whole launch",
                           "launch s", "controller CPU s", "CPU on hosts s", "peak RSS MB",
                           "lines lost"], rows)


def logins_table(by_size: dict[int, dict[str, list[Sample]]]) -> str:
    """Each command with the heavy rc file, against the tool a user would pick instead: clush
    for exec and check, the hand-typed floor for launch."""
    from logins import CLUSH as RC_CLUSH
    from logins import FLOOR, LAUNCH

    rows = []
    for n, results in sorted(by_size.items()):
        for name, samples in results.items():
            against = FLOOR if name == LAUNCH else RC_CLUSH
            base = median(results[against]) if against in results else float("nan")
            ratio = "-" if name in (FLOOR, RC_CLUSH) or math.isnan(base) else (
                f"{median(samples) / base:.2f}x {'floor' if against == FLOOR else 'clush'}")
            rows.append([n, name, median(samples), ratio, int(median(samples, "logins")),
                         median(samples, "cpu"), median(samples, "remote_cpu")])
    return markdown_table(["hosts", "command (heavy ~/.bashrc)", "median s", "vs",
                           "logins per host", "CPU here s", "CPU on hosts s"], rows)


def plot(by_size: dict[int, dict[str, list[Sample]]], path: Path) -> Optional[str]:
    """Median time against host count, one line per command; None when matplotlib is missing
    (`pip install 'clusterrun[bench]'`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'clusterrun[bench]'): no plot"
    names = [EXEC, CLUSH, PDSH, CHECK]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    for name, style in zip(names, ("o-", "s--", "^--", "d-")):
        points = [(n, median(r[name])) for n, r in sorted(by_size.items()) if name in r]
        if points:
            ax.plot(*zip(*points), style, label=name)
    ax.set_xlabel("hosts")
    ax.set_ylabel("median seconds")
    ax.set_xticks(sorted(by_size))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"hostname on every host, and a full check ({machine()})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def document(prov: dict[str, object], sections: list[tuple[str, str]], notes: list[str]) -> str:
    """The tables under the commit, command and machine they were measured with
    (``common.provenance``)."""
    parts: list[Any] = [*provenance_lines(prov), ""]
    for title, table in sections:
        parts += [f"### {title}", "", table, ""]
    parts += [f"- {note}" for note in notes]
    return "\n".join(parts).rstrip() + "\n"
