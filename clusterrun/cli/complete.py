"""Shell completion, through click's own mechanism (`_CLUSTERRUN_COMPLETE=bash_source
clusterrun`; docs/commands.md says how to turn it on per shell). Click completes the commands
and options; this module the values: run ids (newest first), the node names of a run, and
inventory files.

Completion runs on every Tab press: it reads only this machine's files, never a host, and never
fails loudly. Whatever goes wrong (an unusable $CLUSTERRUN_HOME, a run folder half written)
gives no candidates rather than a traceback in the middle of the user's command line."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, NoReturn, Optional

import click
from click.shell_completion import (
    BashComplete,
    CompletionItem,
    FishComplete,
    ShellComplete,
    ZshComplete,
    add_completion_class,
)

COMPLETE_VAR = "_CLUSTERRUN_COMPLETE"
INVENTORY_SUFFIXES = (".yaml", ".yml")
# A directory with many files must not make a Tab press slow: beyond this many entries looked
# at, only YAML files and directories are offered.
MAX_SNIFFED = 200
Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


# The words before the one being completed, as the shell gave them: an option's value is
# completed before click has parsed the arguments around it (`logs RUN --node <Tab>`: click
# stops at the option lacking its value), so the RUN typed before it is found here.
_typed: list[str] = []


class _Typed(ShellComplete):
    def get_completion_args(self) -> tuple[list[str], str]:
        args, incomplete = super().get_completion_args()
        _typed[:] = args
        return args, incomplete


class Bash(_Typed, BashComplete):
    pass


class Zsh(_Typed, ZshComplete):
    pass


class Fish(_Typed, FishComplete):
    """fish sorts candidates unless told to keep them as given: run ids newest first, as bash
    (`complete -o nosort`) and zsh (`compadd -V unsorted`) keep them with click's scripts."""

    source_template = FishComplete.source_template.replace(
        "complete --no-files", "complete --keep-order --no-files")


SHELLS: tuple[type[ShellComplete], ...] = (Bash, Zsh, Fish)


def quiet(fn: Completer) -> Completer:
    """``fn``, giving no candidates where it fails."""

    def completer(ctx: click.Context, param: click.Parameter,
                  incomplete: str) -> list[CompletionItem]:
        try:
            return fn(ctx, param, incomplete)
        except Exception:  # a Tab press never shows a traceback
            return []

    return completer


@quiet
def run_ids(_ctx: click.Context, _param: click.Parameter,
            incomplete: str) -> list[CompletionItem]:
    """The ids of this machine's runs that start with ``incomplete``, newest first."""
    from clusterrun.home import home
    from clusterrun.runs.store import all_runs

    return [CompletionItem(run.id) for run in all_runs(home()) if run.id.startswith(incomplete)]


@quiet
def node_names(ctx: click.Context, _param: click.Parameter,
               incomplete: str) -> list[CompletionItem]:
    """The nodes of the run named so far on the command line (its current attempt's; the
    newest run when none is named). After a comma, the names that may follow it."""
    from clusterrun.home import home
    from clusterrun.runs import attempts, names
    from clusterrun.runs.records import PlanRecord

    run = names.resolve(home(), ctx.params.get("run_id") or _run_typed(ctx),
                        note=lambda _text: None)
    head, _, last = incomplete.rpartition(",")
    before = f"{head}," if head else ""
    return [CompletionItem(before + node.name)
            for node in PlanRecord.of(attempts.current(run)).nodes
            if node.name.startswith(last)]


def _run_typed(ctx: click.Context) -> Optional[str]:
    """The first word after the command's name that is neither an option nor an option's
    value: the RUN a user typed."""
    name = ctx.info_name
    words = _typed[_typed.index(name) + 1:] if name in _typed else []
    valued = {opt for p in ctx.command.params if isinstance(p, click.Option) and not p.is_flag
              for opt in p.opts}
    skip = False
    for word in words:
        if word == "--":
            return None
        if skip or word.startswith("-"):
            skip = not skip and word in valued
            continue
        return word
    return None


@quiet
def inventories(_ctx: click.Context, _param: click.Parameter,
                incomplete: str) -> list[CompletionItem]:
    """Inventory files under the directory ``incomplete`` is in: YAML files, hostfiles (by
    their content, as `launch` tells them apart), and directories to go into."""
    folder, slash, start = incomplete.rpartition("/")
    shown = folder + slash  # "", "some/dir/" or "/": as typed, ~ left to the shell
    return [CompletionItem(shown + name)
            for name in _entries(Path(os.path.expanduser(shown or ".")), start)]


def files(_ctx: click.Context, _param: click.Parameter,
          incomplete: str) -> list[CompletionItem]:
    """Any path: the shell's own file completion (a script, its arguments, an env file)."""
    return [CompletionItem(incomplete, type="file")]


def _entries(folder: Path, start: str) -> Iterator[str]:
    from clusterrun.inventory import hostfile

    sniffed = 0
    with os.scandir(folder) as listing:
        for entry in sorted(listing, key=lambda e: e.name):
            if not entry.name.startswith(start) or (entry.name.startswith(".") and not start):
                continue
            if entry.is_dir():
                yield f"{entry.name}/"
            elif entry.name.endswith(INVENTORY_SUFFIXES):
                yield entry.name
            elif sniffed < MAX_SNIFFED and entry.is_file():
                sniffed += 1
                if hostfile.looks_like(Path(entry.path)):
                    yield entry.name


def run(group: click.Group, prog_name: str = "clusterrun") -> NoReturn:
    """Answer the shell's request in $_CLUSTERRUN_COMPLETE (a script to source, or the
    candidates for a command line), then exit: 0, or 1 with nothing said where it fails."""
    for shell in SHELLS:
        add_completion_class(shell)
    status: Optional[int] = 1
    try:
        group.main(args=[], prog_name=prog_name, complete_var=COMPLETE_VAR)
    except SystemExit as exc:  # click exits once it has answered
        status = exc.code if isinstance(exc.code, int) else 1
    except Exception:  # nothing but candidates may reach the shell
        status = 1
    sys.exit(status)
