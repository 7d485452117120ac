"""--node and --rank as every command that selects takes them: a NodeSet (`node[1-4]`,
`a,b`) and a rank list (`0-3,8`), each repeatable. A single name or number is the smallest
of each, so the old forms keep working."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from clusterrun.cli import complete
from clusterrun.errors import UsageError

if TYPE_CHECKING:
    from clusterrun.runs.records import PlanRecord

_RANKS = re.compile(r"(\d+)(?:-(\d+))?")
# A typo such as --rank 0-100000000 must not build a list that size; no run has this many.
MAX_RANKS = 1 << 20
T = TypeVar("T")


def parse_ranks(text: str) -> list[int]:
    """``0-3,8`` -> [0, 1, 2, 3, 8]; ValueError with a plain message if it is not a list of
    ranks and ranges."""
    found: list[int] = []
    for piece in text.split(","):
        match = _RANKS.fullmatch(piece.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a rank list: give ranks and ranges such as 3, "
                             "0-3 or 0,2,8-11.")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"{piece.strip()!r} in {text!r} runs backwards; write "
                             f"{high}-{low}.")
        if high - low + len(found) >= MAX_RANKS:
            raise ValueError(f"{text!r} names more than {MAX_RANKS} ranks.")
        found.extend(range(low, high + 1))
    return found


def ranks(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
          ) -> tuple[int, ...]:
    """Callback of a repeatable --rank: every rank named, each once, in order."""
    return tuple(sorted(_each(values, parse_ranks)))


def nodes(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
          ) -> tuple[str, ...]:
    """Callback of a repeatable --node: every node name its NodeSets stand for, each once."""
    from clusterrun.inventory.ranges import expand

    return tuple(_each(values, expand))


def _each(values: tuple[str, ...], parse: Callable[[str], list[T]]) -> dict[T, None]:
    """What every value of a repeatable option stands for, each once, in the order named; a
    value ``parse`` refuses (ValueError) is the option's usage error."""
    chosen: dict[T, None] = {}
    for text in values:
        try:
            chosen.update(dict.fromkeys(parse(text)))
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return chosen


def rank_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--rank R, as every command that selects ranks takes it (the value arrives as
    ``ranks_``, a tuple of ints)."""
    return click.option("--rank", "ranks_", multiple=True, callback=ranks,
                        metavar="RANKS", help="Only these global ranks: a rank, a range or a "
                        "list (3, 0-3, 0,2,8-11); repeatable.")(fn)


def node_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--node NODESET, repeatable (the value arrives as ``nodes``, a tuple of names)."""
    return click.option("--node", "nodes", multiple=True, callback=nodes, metavar="NODESET",
                        shell_complete=complete.node_names,
                        help="Only these nodes: a name or a NodeSet (node[1-4], a,b); "
                        "repeatable.")(fn)


def check(plan: PlanRecord, nodes: tuple[str, ...], ranks_: tuple[int, ...], of: str) -> None:
    """Refuse (exit 2) a selection that picks nothing the run has, saying which nodes and ranks
    it has; ``of`` names the run (or attempt) in the message."""
    from clusterrun.inventory.ranges import fold, fold_numbers

    known = [n.name for n in plan.nodes]
    unknown = [n for n in nodes if n not in plan.node_names]
    if unknown:
        raise UsageError(f"{of} has no node {fold(unknown)}; its nodes: {fold(known)}.")
    world = plan.world_size
    missing = [r for r in ranks_ if not 0 <= r < world] if world else []
    if missing:
        raise UsageError(f"{of} has no rank {fold_numbers(missing)}; it has ranks "
                         f"{fold_numbers(range(world))}.")
    picked = [plan.node(n) for n in nodes]
    held = [n for n in picked if n is not None and n.ranks and len(n.ranks) == 2]
    if ranks_ and held and len(held) == len(picked) and \
            not any(n.holds(r) for n in held for r in ranks_):
        where = "; ".join(f"{n.name} holds {fold_numbers(range(n.ranks[0], n.ranks[1] + 1))}"
                          for n in held if n.ranks)
        asked = (f"rank {ranks_[0]} does not run" if len(set(ranks_)) == 1
                 else f"none of ranks {fold_numbers(ranks_)} runs")
        raise UsageError(f"{of}: {asked} on {fold(nodes)} "
                         f"({where}); give ranks of those nodes, or leave --rank or --node "
                         "out.")


def holding(plan: PlanRecord, nodes: tuple[str, ...], ranks_: tuple[int, ...]) -> list[str]:
    """The plan's nodes a selection reaches, in plan order: those named (all when none are)
    that hold a rank named (any when none are)."""
    return [n.name for n in plan.nodes if (not nodes or n.name in nodes)
            and (not ranks_ or any(map(n.holds, ranks_)))]


def refused(why: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--node and --rank on a command that acts on the whole run: taken, so that the answer is
    ``why`` rather than click's "no such option", and refused (exit 2)."""
    def refuse(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
        if values:
            raise UsageError(f"--{param.name} {values[0]}: {why}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in ("rank", "node"):
            fn = click.option(f"--{name}", name, multiple=True, hidden=True, callback=refuse,
                              expose_value=False)(fn)
        return fn
    return decorate
