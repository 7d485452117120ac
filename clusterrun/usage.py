"""What a mistyped or misplaced command line meant: unknown options with the spelling that exists
(torchrun's own options answered from plan/torchrun.py's table), options after INVENTORY,
directories where a file belongs. Every answer is a UsageError, shown like any other error."""

from __future__ import annotations

import os
import shlex
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
    import difflib  # here: only a mistyped option needs it; every command loads this module

    names = [n for n in option_names(command) if n.startswith("--")]
    dashed = word.split("=", 1)[0].replace("_", "-")
    if dashed in names:
        return dashed
    match = difflib.get_close_matches(dashed, names, n=1, cutoff=0.6)
    return match[0] if match else None


def torchrun_hint(name: str) -> Optional[str]:
    """What to do instead of torchrun's option ``name`` (either spelling), where launch's
    closest option would mislead (plan/torchrun.py holds the table)."""
    from clusterrun.plan import torchrun

    return torchrun.on_launch(name)


def unknown_option(word: str, command: click.Command, path: str, *,
                   before_inventory: bool = False, remote_command: bool = False) -> UsageError:
    """``before_inventory``: the command is launch, whose options go before INVENTORY and
    which answers torchrun's options from the table; ``remote_command``: the command takes a
    CMD whose own options (`ls -la`) need `--` before them, or they are read as its options."""
    name = word.split("=", 1)[0]
    hint = closest_option(name, command)
    text = f"unknown option {name} for `{path}`"
    torchrun = torchrun_hint(word) if before_inventory else None
    if torchrun is not None:
        text += f": {torchrun}."
    elif hint and "_" in name and hint == name.replace("_", "-"):
        text += f"; did you mean {hint} (clusterrun spells torchrun's options with '-')?"
    elif hint:
        text += f"; did you mean {hint}?"
    else:
        text += "."
    if before_inventory and torchrun is None:  # the option has no place anywhere
        text += f" All options go before INVENTORY: {path} [OPTIONS] INVENTORY SCRIPT [ARGS]..."
    if remote_command:
        text += (f" If {name} is the command's own, put `--` before the command: {path} "
                 "[OPTIONS] INVENTORY -- CMD [ARGS]...")
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


def _before_dashes(args: list[str], command: click.Command) -> Optional[int]:
    """How many words that are not options (nor an option's value) come before ``--``; None
    when there is no ``--``. Everything after it is literal."""
    words = iter(args)
    count = 0
    for word in words:
        if word == "--":
            return count
        if not word.startswith("-") or word == "-":
            count += 1
        elif "=" not in word and _takes_value(word, command):
            next(words, None)
    return None


class RemoteCommand(click.Command):
    """A command of the form ``[INVENTORY] [--] CMD...``: notes where ``--`` came, which tells
    ``exec -w 'gpu[01-04]' -- hostname`` (no INVENTORY) from ``exec inv.yaml -- hostname``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        before = _before_dashes(args, self)
        ctx.meta["clusterrun.before_dashes"] = before
        ctx.meta["clusterrun.dashes_first"] = before == 0
        return list(super().parse_args(ctx, args))


def exec_words(ctx: click.Context, first: Optional[str], rest: tuple[str, ...],
               hosts: Optional[str]) -> tuple[Optional[str], tuple[str, ...]]:
    """``exec``'s INVENTORY (None: -w alone names the hosts) and CMD. With -w, the words are
    all CMD when ``--`` comes first, or when there is no ``--`` and the first word is not an
    inventory file (an existing path, `slurm`, a name ending in .yaml/.yml/.txt or holding a
    '/'); otherwise, and always without -w, the first word is INVENTORY."""
    from clusterrun.inventory.adhoc import names_a_file

    words = ((first,) if first is not None else ()) + rest
    before = ctx.meta.get("clusterrun.before_dashes")
    if hosts is not None and words and (
            before == 0 or (before is None and not names_a_file(words[0]))):
        return None, words
    return (words[0], words[1:]) if words else (None, ())


def missing_command(ctx: click.Context, inventory: Optional[str],
                    hosts: Optional[str]) -> UsageError:
    """``exec`` given one word or none: the inventory with no command, or (more often) a
    command with no hosts before it."""
    path = ctx.command_path
    if inventory is None:
        return UsageError(f"missing CMD: give the command to run: {path} INVENTORY -- CMD "
                          f"[ARGS]..., or {path} -w HOSTS -- CMD [ARGS]...")
    from clusterrun.inventory.adhoc import names_a_file

    if ctx.meta.get("clusterrun.dashes_first") or not names_a_file(inventory):
        return UsageError(f"exec needs the hosts before the command ({inventory!r} was taken "
                          f"for them): {path} INVENTORY -- {shlex.quote(inventory)}, or {path} "
                          f"-w HOSTS -- {shlex.quote(inventory)} (HOSTS: a NodeSet such as "
                          "gpu[01-04], each reached as ~/.ssh/config says).")
    return UsageError(f"missing CMD: give the command to run after the inventory: {path} "
                      f"{inventory} -- CMD [ARGS]...")


def from_click(exc: click.UsageError) -> UsageError:
    """click's own usage errors, worded as clusterrun's."""
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "clusterrun"
    if isinstance(exc, click.NoSuchOption) and ctx is not None:
        return unknown_option(exc.option_name, ctx.command, path,
                              before_inventory=ctx.command.name == "launch",
                              remote_command=ctx.command.name == "exec")
    return UsageError(f"{exc.format_message()} See `{path} --help`.")
