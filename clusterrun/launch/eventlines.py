"""`launch --json`: the run's events on stdout as JSON lines, as its journal writes them to
events.jsonl (the same objects, secrets masked), then one last line, the summary:
``{"event": "summary", "ok", "run", "state", "exit_status", "detached", "summary"}``
(docs/commands.md has the table). The ranks' own lines are not among them: they are in the
run's logs (`clusterrun logs --json RUN`)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Optional, TextIO

from clusterrun.errors import Result, exit_status
from clusterrun.jsonfields import text
from clusterrun.runs import store
from clusterrun.runs.records import EventKind, Json, RunStatus

SUMMARY = "summary"  # the last line's ``event``


class EventLines:
    """A journal listener that writes each event as one line; then ``summary``."""

    def __init__(self, out: Optional[TextIO] = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.run: Optional[str] = None  # the run's id, from its first event
        self.detached = False
        self._lock = threading.Lock()  # events come from the threads that record them

    def __call__(self, event: Json) -> None:
        self.run = self.run or text(event.get("run"))
        if event.get("event") == EventKind.DETACHED.value:
            self.detached = True
        self._write(event)

    def summary(self, result: Result, home: Path) -> Json:
        """The last line, written: how the launch came out, and the run's summary.json
        (null where there is none yet: a detached run that goes on)."""
        status = exit_status(result)
        state, summary = None, None
        if self.run is not None:
            run = store.RunDir(store.runs_root(home) / self.run)
            recorded = RunStatus.of(run).state
            state = recorded.value if recorded is not None else None
            summary = store.read_json(run.file("summary.json"))
        line: Json = {"event": SUMMARY, "ok": status == 0, "run": self.run, "state": state,
                      "exit_status": status, "detached": self.detached, "summary": summary}
        self._write(line)
        return line

    def _write(self, obj: Json) -> None:
        data = json.dumps(obj, sort_keys=True) + "\n"
        with self._lock:
            try:
                self.out.write(data)
                self.out.flush()
            except (BrokenPipeError, ValueError):  # stdout closed: the run goes on regardless
                pass
