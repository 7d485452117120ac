"""`clusterrun pull` in words: one line per node, and with --dry-run the files that would move."""

from __future__ import annotations

from clusterrun.pull.model import FAILED, LISTED, UNREACHABLE, NodePull, PullReport


def size(n: int) -> str:
    """1536 -> ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _files(n: int) -> str:
    return f"{n} file" + ("" if n == 1 else "s")


def node_line(node: NodePull) -> str:
    if node.status in (UNREACHABLE, FAILED):
        return f"{node.node}: {node.status}: {node.error}"
    listed, moved = len(node.files), len(node.moved)
    if node.status == LISTED:
        line = (f"{node.node}: {_files(moved)} to move ({size(node.bytes_moved)}), "
                f"{listed - moved} already here")
    elif not listed:
        line = f"{node.node}: nothing to pull"
    elif not moved:
        line = (f"{node.node}: up to date: 0 of {_files(listed)} moved, all {listed} verified "
                f"({size(node.total_bytes)})")
    else:
        line = (f"{node.node}: {node.method}: {moved} of {_files(listed)} moved "
                f"({size(node.bytes_moved)}), all {listed} verified ({size(node.total_bytes)})")
    if not node.began:
        line += " (the run left no trace there: it never started on this host)"
    if node.unmatched:
        line += f"; nothing matched {', '.join(node.unmatched)}"
    return line


def render(report: PullReport) -> list[str]:
    verb = "would pull" if report.dry_run else "pulling"
    lines = [f"run {report.run}: {verb} into {report.to}/<node>/"]
    for node in report.nodes:
        lines.append(node_line(node))
        if report.dry_run:
            lines += [f"  {f.path}  {size(f.size)}" for f in node.files if f.path in node.moved]
    return lines
