"""Placeholders in script arguments: ``{node_rank}`` and friends, replaced per host or process.

Only the exact tokens below are replaced; every other byte arrives untouched, so a JSON argument
such as ``{"lr": 0.1}`` or a shell brace expansion passes through as it was typed. ``{{`` stands
for a literal ``{`` (so ``{{node_rank}`` arrives as ``{node_rank}``); ``}`` never needs escaping,
which is why this is not ``str.format``: it would mangle ``{"a": {"b": 1}}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from clusterrun.errors import UsageError

PER_HOST = ("node_rank", "nnodes", "master_addr", "master_port")
PER_PROCESS = ("rank", "local_rank", "world_size")

_TOKEN = re.compile(r"\{\{|\{(" + "|".join(PER_HOST + PER_PROCESS) + r")\}")


def expand(arg: str, values: Mapping[str, object]) -> str:
    """``arg`` with every known placeholder present in ``values`` replaced and ``{{`` unescaped.
    A placeholder missing from ``values`` is left as it is (it is filled later, per process)."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:  # "{{"
            return "{"
        return str(values[name]) if name in values else match.group(0)

    return _TOKEN.sub(one, arg)


def used(args: Sequence[str]) -> set[str]:
    """The placeholder names the arguments use (escaped ones do not count)."""
    return {m.group(1) for a in args for m in _TOKEN.finditer(a) if m.group(1) is not None}


def check(args: Sequence[str], *, per_process: bool) -> None:
    """Per-process placeholders need one process per copy of the script: `--no-torchrun`."""
    if per_process:
        return
    wrong = sorted(used(args) & set(PER_PROCESS))
    if wrong:
        names = ", ".join("{" + w + "}" for w in wrong)
        raise UsageError(f"{names} in the script's arguments differ per process, and torchrun "
                         "starts the processes with the same arguments: launch with "
                         "--no-torchrun to have clusterrun start each process itself, or read "
                         "RANK / LOCAL_RANK / WORLD_SIZE from the environment in the script.")
