"""What a command that failed says: one paragraph on stderr, and with `--json` one JSON document
on stdout as well (``{"ok": false, "error": {"exit_status", "outcome", "message"}}``), so a
script reading stdout gets the error exactly when it needs it."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import click

# Commands whose --json output is a stream of JSON lines: an error ends the stream with one more
# line, whatever came before it.
STREAMS = {"top": "--once"}  # command: the option that makes it one document instead


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
    words = argv[:argv.index("--")] if "--" in argv else argv
    name = next((w for w in words if not w.startswith("-")), None)
    command = group.commands.get(name) if name is not None else None
    if command is None or not any("--json" in getattr(p, "opts", ()) for p in command.params):
        return False
    return "--json" in words[words.index(str(name)) + 1:]


def is_stream(argv: list[str]) -> bool:
    words = argv[:argv.index("--")] if "--" in argv else argv
    name = next((w for w in words if not w.startswith("-")), None)
    return name in STREAMS and STREAMS[name] not in words


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
