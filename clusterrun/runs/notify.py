"""`launch --notify CMD`: a command on this machine run for each event of a run, the event's
JSON on its stdin (one event per run of CMD, in the order of events.jsonl).

CMD runs through this user's shell, one event at a time on a thread of its own, so a slow hook
never holds up the run or its journal, and for at most ``TIMEOUT`` seconds (then it is killed).
A hook that fails is said once and otherwise ignored: the run's outcome never depends on it.
Its output goes to the run's notify.log. What it receives is masked already: the run's journal
masks every event before it writes it or hands it on (runs/masking.py).

Who runs it: the clusterrun process that records the event (runs/journal.py builds the hooks
with the journal, the one place they are built). For an attached
run that is the launch; for a detached run, the launch records its start, and a watcher it
leaves on this machine (`clusterrun logs -f RUN` with no output, started in its own session)
records the rest as the hosts report it, also after the launching terminal is gone.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

from clusterrun.runs import store
from clusterrun.runs.masking import Masks
from clusterrun.runs.records import Json
from clusterrun.runs.store import RunDir

TIMEOUT = 30.0  # seconds one run of the hook may take
DRAIN = 30.0  # seconds a finishing command waits for its queued hooks


def mask_text(text: str, values: tuple[str, ...] = ()) -> str:
    """``text`` with every one of ``values`` and every ``SECRET_NAME=value`` masked."""
    return Masks.of(values).text(text)


def masked(obj: Any, values: tuple[str, ...] = ()) -> Any:
    """A JSON value with every string in it masked (``mask_text``)."""
    return Masks.of(values).json(obj)


class Notifier:
    """Runs ``command`` for each event it is given, in order, on one thread."""

    def __init__(self, command: str, log: Path, *,
                 say: Optional[Callable[[str], None]] = None) -> None:
        self.command = command
        self.log = log
        self.say = say
        self._queue: queue.Queue[Optional[Json]] = queue.Queue()
        self._failed = False
        self._thread = threading.Thread(target=self._work, name="notify", daemon=True)
        self._thread.start()

    def __call__(self, event: Json) -> None:
        self._queue.put(event)  # masked already: the journal masks what it writes and tells

    def close(self, wait: float = DRAIN) -> None:
        """Deliver what is queued (for at most ``wait`` seconds), then stop."""
        self._queue.put(None)
        self._thread.join(wait)

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            self._deliver(event)

    def _deliver(self, event: Json) -> None:
        data = json.dumps(event, sort_keys=True) + "\n"
        try:
            # The user's own command line, for the user's own shell: as they typed it.
            argv = [os.environ.get("SHELL") or "/bin/sh", "-c", self.command]
            fd = store.open_private(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            with os.fdopen(fd, "ab") as out:
                done = subprocess.run(argv, input=data.encode(), stdout=out,
                                      stderr=subprocess.STDOUT, timeout=TIMEOUT, check=False)
            problem = f"exited with {done.returncode}" if done.returncode else None
        except subprocess.TimeoutExpired:
            problem = f"ran longer than {TIMEOUT:.0f} s and was killed"
        except OSError as exc:
            problem = f"could not run ({exc.strerror or exc})"
        if problem and not self._failed and self.say is not None:
            self._failed = True  # said once: a hook that always fails is no news each event
            self.say(f"warning: --notify hook {problem} for event {event.get('event')} (the "
                     f"run goes on; its output: {self.log})")


@contextmanager
def hooks(command: Optional[str], log: Path, *, say: Optional[Callable[[str], None]] = None
          ) -> Iterator[tuple[Callable[[Json], None], ...]]:
    """The listeners a journal calls for ``command`` (none without one); on leaving, the
    queued events are delivered, for at most ``DRAIN`` seconds."""
    if not command:
        yield ()
        return
    notifier = Notifier(command, log, say=say)
    try:
        yield (notifier,)
    finally:
        notifier.close()


def watch(run: RunDir, say: Callable[[str], None]) -> None:
    """For a detached run with a hook: a `clusterrun logs -f RUN` in its own session on this
    machine, its output to the run's watch.log, so the run's events (and its logs) are
    recorded as the hosts report them, with no terminal open. It ends with the run."""
    log = store.open_private(run.file("watch.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        subprocess.Popen([sys.executable, "-m", "clusterrun", "logs", "-f", run.id],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, env=dict(os.environ, CLUSTERRUN_HOME=str(
                             run.path.parent.parent)))
    except OSError as exc:
        say(f"warning: cannot start the watcher that runs --notify for this detached run "
            f"({exc.strerror or exc}); `clusterrun logs -f {run.id}` does the same")
    finally:
        os.close(log)
