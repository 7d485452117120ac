"""What a command that failed says: one paragraph on stderr, and with `--json` one JSON document
on stdout as well (``{"ok": false, "error": {"exit_status", "outcome", "message"}}``), so a
script reading stdout gets the error exactly when it needs it."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Optional, TextIO

import click

# Commands whose --json output is a stream of JSON lines: an error ends the stream with one more
# line, whatever came before it. command: the option that makes it one document instead (None:
# always a stream)
STREAMS: dict[str, Optional[str]] = {"top": "--once", "logs": None, "launch": "--dry-run"}


@dataclass(frozen=True)
class Failure:
    """How a command ended when it did not succeed: its status, outcome (Outcome.label) and
    the paragraph a user reads."""

    exit_status: int
    outcome: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": False, "error": {"exit_status": self.exit_status, "outcome": self.outcome,
                                       "message": self.message}}


def wants_json(group: click.Group, argv: list[str]) -> bool:
    """Whether ``argv`` runs a command that takes --json, with --json (before any ``--``)."""
    name, words = _options(group, argv)
    command = group.commands.get(name) if name is not None else None
    if command is None or not any("--json" in getattr(p, "opts", ()) for p in command.params):
        return False
    return "--json" in words


def is_stream(group: click.Group, argv: list[str]) -> bool:
    name, words = _options(group, argv)
    return name in STREAMS and STREAMS[name] not in words


def _options(group: click.Group, argv: list[str]) -> tuple[Optional[str], list[str]]:
    """The command's name and the words that may be its options: those before any ``--``, and
    for a command whose options all come first (`launch`: the script's own arguments follow),
    those before its first argument."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    name = next((w for w in words if not w.startswith("-")), None)
    if name is None:
        return None, []
    rest = words[words.index(name) + 1:]
    command = group.commands.get(name)
    if command is None or command.context_settings.get("allow_interspersed_args",
                                                        command.allow_interspersed_args):
        return name, rest
    valued = {opt for p in command.params if isinstance(p, click.Option) and not p.is_flag
              for opt in p.opts}
    for i, word in enumerate(rest):
        if not word.startswith("-") and (i == 0 or rest[i - 1] not in valued):
            return name, rest[:i]
    return name, rest


class Watched:
    """A text stream that remembers whether anything was written to it (stdout, under --json:
    a command that printed its document already gets no second one)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.written = False

    def write(self, text: str) -> int:
        if text:
            self.written = True
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def emit(failure: Failure, *, stream: bool) -> None:
    """The JSON error on stdout: one document (a JSON line in a stream)."""
    try:
        sys.stdout.write(json.dumps(failure.to_json(), indent=None if stream else 2) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # stdout closed: the paragraph on stderr is all
        pass
