"""The commands of the group, each imported when it is first looked up: a command that runs
imports its own module only, not every other command's (a warm `exec` has no use for `launch`'s
or `top`'s imports). `--help` and completion of command names look every command up, and
import them all, as before."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

import click


class Commands(MutableMapping[str, click.Command]):
    """click's ``Group.commands``, holding ``"module:attribute"`` for a command not yet
    imported. Every way click or a caller reads it (``get``, ``[]``, ``items``) gives the
    command; iterating gives the names without importing anything."""

    def __init__(self, where: dict[str, str]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            module, _, attribute = self._where[name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command) or command.name != name:
                raise TypeError(f"{self._where[name]} is not the command {name!r}")
            self._loaded[name] = command
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._where.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._where and name not in self._loaded:
            raise KeyError(name)
        self._where.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*self._where, *self._loaded}))

    def __len__(self) -> int:
        return len({*self._where, *self._loaded})

    def __contains__(self, name: object) -> bool:
        return name in self._where or name in self._loaded
