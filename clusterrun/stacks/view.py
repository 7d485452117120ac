"""Grouping ranks by identical stacks, by the stall report's rule (remote/shared/stallreport.py),
and the text `stacks` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from clusterrun.inventory.ranges import fold, fold_numbers
from clusterrun.remote.shared import flight, stallreport  # the same rules the hosts apply
from clusterrun.stacks.model import Collected, RankStack, Thread, as_sent

MAX_FRAMES = 14  # deep stacks: the innermost frames say where it is; --json has them all


@dataclass(frozen=True)
class Group:
    ranks: tuple[RankStack, ...]

    @property
    def first(self) -> RankStack:
        return self.ranks[0]

    @property
    def label(self) -> str:
        numbers = [r.rank for r in self.ranks]
        nodes = fold(sorted({r.node for r in self.ranks}))
        word = "rank" if len(numbers) == 1 else "ranks"
        return f"{word} {fold_numbers(numbers)} ({nodes})"


def groups(collected: Collected) -> list[Group]:
    """The ranks whose stacks were read, grouped by the stall report's rule
    (remote/shared/stallreport.py
    ``groups``): the same stack together, the odd ones out first (ranks outside any collective,
    then the smallest groups), the biggest group waiting in a collective last. A rank whose
    stack could not be read is in none (``unread``): not seeing it makes it no odd one out."""
    read = [(as_sent(rank), rank) for rank in collected.ranks if not rank.error]
    of = {id(sent): rank for sent, rank in read}
    found = stallreport.groups([sent for sent, _rank in read])
    return [Group(tuple(of[id(sent)] for sent in members)) for members in found]


def unread(collected: Collected) -> list[Group]:
    """The ranks whose stacks could not be read, by the reason, in rank order."""
    by_error: dict[str, list[RankStack]] = {}
    for rank in sorted(collected.ranks, key=lambda r: r.rank):
        if rank.error:
            by_error.setdefault(rank.error, []).append(rank)
    return [Group(tuple(members)) for members in by_error.values()]


def _frame_lines(rank: RankStack, indent: str) -> list[str]:
    lines = _thread_lines(rank.threads, rank.main, indent)
    for child in rank.children:  # DataLoader workers: where the rank's wait may really be
        main = next((t for t in child.threads if t.name == "MainThread"),
                    child.threads[0] if child.threads else None)
        lines.append(f"{indent}{child.label} (pid {child.pid}):")
        lines.extend(_thread_lines(child.threads, main, indent + "  "))
    return lines


def _thread_lines(threads: tuple[Thread, ...], main: Optional[Thread], indent: str) -> list[str]:
    lines: list[str] = []
    for thread in threads:
        frames = thread.frames
        if thread is not main:
            where = frames[-1].short if frames else "no Python frames"
            lines.append(f"{indent}thread {thread.name}: {where}")
            continue
        lines.append(f"{indent}{thread.name}:")
        if len(frames) > MAX_FRAMES:
            lines.append(f"{indent}  ... {len(frames) - MAX_FRAMES} outer frames")
            frames = frames[-MAX_FRAMES:]
        lines.extend(f"{indent}  {f.function}  {f.file}:{f.line}" for f in frames)
    return lines


def _rank_head(rank: RankStack) -> str:
    extra = {"T": ", STOPPED (SIGSTOP: resume it with kill -CONT)",
             "D": ", in uninterruptible I/O (state D)"}.get(rank.state or "", "")
    return f"rank {rank.rank} ({rank.node}, pid {rank.pid}{extra})"


def flight_lines(collected: Collected) -> list[str]:
    """torch's Flight Recorder, where it dumped (a collective timed out, or `stacks` asked an
    NCCL rank through its pipe): the last collective each rank entered, then the ranks that
    fell behind their process group (remote/shared/flight.py ``behind``)."""
    lines = [f"  flight recorder: rank {f['rank']} ({f['node']}) last entered {f['collective']} "
             f"#{f['seq']} ({f['state']})" for f in collected.flight]
    for late in flight.behind(collected.flight):
        ahead = late["ahead"]
        lines.append(f"  flight recorder: rank {late['rank']} ({late['node']}) is behind in "
                     f"{late['group']}: it last entered {late['collective']} #{late['seq']}, "
                     f"the others got to {ahead['collective']} #{ahead['seq']}")
    return lines


def render(collected: Collected, *, frames: bool = True) -> list[str]:
    """`clusterrun stacks`: odd ranks out first, each with node, pid and last line; then the
    biggest group."""
    found = groups(collected)
    lines: list[str] = []
    nodes = {r.node for r in collected.ranks}
    lines.append(f"run {collected.run}: {len(collected.ranks)} ranks on {len(nodes)} nodes, "
                 f"{len(found)} different stack{'s' if len(found) != 1 else ''}")
    for name, why in sorted(collected.problems.items()):
        lines.append(f"  no stacks from {name}: {why}")
    lines.extend(flight_lines(collected))
    for index, group in enumerate(found):
        odd = len(found) > 1 and index < len(found) - 1
        lines.append("")
        first = as_sent(group.first)
        wait = stallreport.waits_in(first)
        # Outside a collective: the user's own line where there is one
        # (remote/shared/stallreport.py).
        inner = stallreport.innermost(first)
        what = f"waiting in {wait}" if wait else group.first.at or inner
        tag = "odd one out: " if odd else ""
        lines.append(f"{tag}{group.label}: {what}")
        for rank in group.ranks if (odd or len(group.ranks) <= 4) else group.ranks[:1]:
            lines.append(f"  {_rank_head(rank)} last line: {rank.last_line!r}")
            if odd and rank.where:
                lines.append(f"  {rank.where}")
        if len(group.ranks) > 4 and not odd:
            lines.append(f"  ... and {len(group.ranks) - 1} more with the same stack")
        if frames:
            lines.extend(_frame_lines(group.first, "    "))
    for group in unread(collected):
        lines.append("")
        lines.append(f"no stack from {group.label}: {group.first.error}")
        lines.extend(f"  {_rank_head(rank)} last line: {rank.last_line!r}"
                     for rank in group.ranks[:4])
        if len(group.ranks) > 4:
            lines.append(f"  ... and {len(group.ranks) - 4} more")
    return lines
