"""What a mistyped or misplaced command line meant: unknown options with the spelling that exists
(also for torchrun's ``--nproc_per_node`` spellings), options after INVENTORY, directories where a
file belongs. Every answer is a UsageError, shown like any other error."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Optional

import click

from clusterrun.errors import UsageError


def option_names(command: click.Command) -> list[str]:
    return [name for param in command.params if isinstance(param, click.Option)
            for name in (*param.opts, *param.secondary_opts)]


def closest_option(word: str, command: click.Command) -> Optional[str]:
    """The command's own option ``word`` most likely meant: torchrun's underscores read as
    dashes first, then the closest spelling."""
    names = [n for n in option_names(command) if n.startswith("--")]
    dashed = word.split("=", 1)[0].replace("_", "-")
    if dashed in names:
        return dashed
    match = difflib.get_close_matches(dashed, names, n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_option(word: str, command: click.Command, path: str, *,
                   before_inventory: bool = False) -> UsageError:
    name = word.split("=", 1)[0]
    hint = closest_option(name, command)
    text = f"unknown option {name} for `{path}`"
    if hint and "_" in name and hint == name.replace("_", "-"):
        text += f"; did you mean {hint} (clusterrun spells torchrun's options with '-')?"
    elif hint:
        text += f"; did you mean {hint}?"
    else:
        text += "."
    if before_inventory:
        text += f" All options go before INVENTORY: {path} [OPTIONS] INVENTORY SCRIPT [ARGS]..."
    return UsageError(f"{text} See `{path} --help`.")


def _takes_value(name: str, command: click.Command) -> bool:
    return any(isinstance(p, click.Option) and not p.is_flag and name in p.opts
               for p in command.params)


def check_launch_words(inventory: str, script: str, args: tuple[str, ...],
                       command: click.Command, path: str) -> None:
    """INVENTORY and SCRIPT are the first words that are not options, so an option clusterrun
    does not know (or one given after INVENTORY) lands in their place: say so, with the fix."""
    if inventory.startswith("-") and not os.path.exists(inventory):
        raise unknown_option(inventory, command, path, before_inventory=True)
    if script.startswith("-") and not os.path.exists(script):
        name = script.split("=", 1)[0]
        if name not in option_names(command):
            raise unknown_option(script, command, path, before_inventory=True)
        words = [script, *args]
        if _takes_value(name, command) and "=" not in script:
            words = words[:2] if len(words) > 1 else [script, "VALUE"]
        else:
            words = words[:1]
        rest = args[len(words) - 1:] or ("SCRIPT",)
        raise UsageError(f"{name} came after INVENTORY, where SCRIPT belongs; options go before "
                         f"INVENTORY: {path} {' '.join(words)} {inventory} {' '.join(rest)}")
    if os.path.isdir(script):
        found = sorted(p.name for p in Path(script).glob("*.py"))[:3]
        example = f" ({', '.join(found)} there?)" if found else ""
        raise UsageError(f"{script} is a directory; SCRIPT is the training script itself{example}."
                         " clusterrun copies the directory the script is in to every host.")


def from_click(exc: click.UsageError) -> UsageError:
    """click's own usage errors, worded as clusterrun's."""
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "clusterrun"
    if isinstance(exc, click.NoSuchOption) and ctx is not None:
        return unknown_option(exc.option_name, ctx.command, path,
                              before_inventory=ctx.command.name == "launch")
    return UsageError(f"{exc.format_message()} See `{path} --help`.")
