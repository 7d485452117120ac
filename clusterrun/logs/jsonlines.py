"""`logs --json`: each line of a run's output as one JSON object on a line of its own,
``{"node", "rank", "stream", "time", "text"}`` (docs/commands.md has the table)."""

from __future__ import annotations

import json
from typing import Optional, TextIO

from clusterrun.console import Printer
from clusterrun.remote.shared import layout

RANK_STREAM = "rank"  # a rank's output: its stdout and stderr, in the order it wrote them
NODE_STREAM = "node"  # the node's own: torchrun's (or clusterrun's launcher's) output


def label(node: str, name: str) -> str:
    """The label a LogView gives this printer: the file's name, which says rank and stream."""
    return name


class JsonLines(Printer):
    """A Printer whose lines are JSON objects; built with ``label`` as its view's label, so
    the ``prefix`` it is given is the file's name."""

    def __init__(self, out: Optional[TextIO] = None) -> None:
        super().__init__(out, color=False)

    def line(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        rank = layout.rank_of(prefix)
        self.write(json.dumps({
            "node": key, "rank": rank, "stream": NODE_STREAM if rank is None else RANK_STREAM,
            "time": round(at, 3) if at is not None else None, "text": text}) + "\n")

    def block(self, key: str, prefix: str, text: str, at: Optional[float] = None) -> None:
        for one in text.split("\n"):
            self.line(key, prefix, one, at)
