"""A run's journal: the one writer of its state.json, summary.json and events.jsonl.

Every change of a run goes through one method here (started, attempt begun, host quarantined,
attempt ended, detached, stalled, resumed, finished), under the run folder's ``state.lock``,
and each change that happens appends one event to ``events.jsonl`` in the same step. So the
state a reader sees and the events it can replay never disagree, and an event is written
exactly once: a change that the one run-state rule refuses (``runs.state.merge``: an ended run
keeps the end it had) writes neither state nor event.

Whoever records a change is the writer: the attached launch while it runs, or, for a run
nobody watches (detached, or its controller was killed), the first later command that sees its
end (`ps`, `logs`, `stop`; logs.settle). Readers (`ps`, `logs`, `stop`) use runs.lifecycle and
runs.attempts; nothing else writes these files.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from clusterrun.errors import Outcome
from clusterrun.inventory.slots import Quarantine
from clusterrun.runs import attempts, notify, store
from clusterrun.runs.masking import Masks
from clusterrun.runs.records import AttemptRecord, Event, EventKind, Json, RunStatus
from clusterrun.runs.state import RunState, merge
from clusterrun.runs.store import RunDir
from clusterrun.runs.summary import Summary
from clusterrun.wire import root_cause

EVENTS = "events.jsonl"

Listener = Callable[[Json], None]


@dataclass(frozen=True)
class RunRecord:
    """What a run started as: the fields its state.json opens with."""

    id: str
    name: str
    hosts: tuple[str, ...]
    inventory: str
    detached: bool = False
    controller_pid: Optional[int] = None
    max_restarts: int = 0
    notify: Optional[str] = None  # `launch --notify CMD`: run for each event (runs/notify.py)
    started_at: float = field(default_factory=store.now)


class Journal:
    """The writer of one run's files. ``listeners`` hear every event after it is written (the
    `--notify` hook); a listener never changes what is recorded. ``masks``: the run's secrets
    (default: as its folder keeps them), masked in every event, stall report, root cause and
    summary it writes, so every writer of a run masks alike."""

    def __init__(self, run: RunDir, listeners: tuple[Listener, ...] = (),
                 masks: Optional[Masks] = None) -> None:
        self.run = attempts.top(run)
        self.listeners = listeners
        self.masks = masks if masks is not None else Masks.load(self.run)
        self.handed_over = False  # detached(): no launching process watches the run now

    # -- built with its hooks, once per command ---------------------------------------------

    @classmethod
    @contextmanager
    def launching(cls, home: Path, record: RunRecord, plan: Json, env: Iterable[tuple[str, str]],
                  say: Optional[Callable[[str], None]] = None, *,
                  listeners: tuple[Listener, ...] = ()) -> Iterator[Journal]:
        """A new run's journal (``start``) with the run's `--notify` hook, for the launch;
        on leaving, the hook's queued events are delivered. ``env``: what the ranks get (name,
        value); the secret values among it are masked in all that the run writes from now.
        A run handed over (``detached``) with a hook gets its watcher then (notify.watch), which
        runs the hook from here on. ``listeners``: more to hear the launch's events, before the
        hook (`launch --json`)."""
        log = store.runs_root(home) / record.id / "notify.log"
        with notify.hooks(record.notify, log, say=say) as hooks:
            journal = cls.start(home, record, plan, (*listeners, *hooks), Masks.of_env(env))
            yield journal
        if journal.handed_over and record.notify:
            notify.watch(journal.run, say or (lambda _line: None))

    @classmethod
    @contextmanager
    def of(cls, run: RunDir, say: Optional[Callable[[str], None]] = None, *,
           hooks: bool = True) -> Iterator[Journal]:
        """The journal of a run that exists, with the hook its launch was given (``hooks``:
        False for a process that only reads) and the secrets its launch kept."""
        run = attempts.top(run)
        command = RunStatus.of(run).notify if hooks else None
        with notify.hooks(command, run.file("notify.log"), say=say) as listeners:
            yield cls(run, listeners)

    # -- a run's life ----------------------------------------------------------------------

    @classmethod
    def start(cls, home: Path, record: RunRecord, plan: Json,
              listeners: tuple[Listener, ...] = (), masks: Optional[Masks] = None) -> Journal:
        """A new run folder with its plan, its secrets' masks and its first state (running)."""
        masks = masks or Masks()
        journal = cls(store.create(home, record.id), listeners, masks)
        masks.save(journal.run)  # before any event: whoever writes next masks the same way
        store.write_json(journal.run.file("plan.json"), plan)
        with journal._changing() as change:
            change.state = change.state.with_(**{
                **asdict(record), "hosts": list(record.hosts), "state": RunState.RUNNING.value,
                "attempts": [], "quarantined": []})
            change.event(EventKind.STARTED, hosts=list(record.hosts), detached=record.detached)
        return journal

    def attempt_begun(self, k: int, hosts: list[str], plan: Json) -> RunDir:
        """Attempt k starts on ``hosts``: its folder (attempt 1: the run folder itself, whose
        plan.json is written already), listed in the run's state as the current attempt."""
        folder = attempts.attempt_dir(self.run, k)
        if k > 1:
            folder = attempts.create_attempt(self.run, k)
            store.write_json(folder.file("plan.json"), plan)
            own = RunStatus().with_(id=self.run.id, name=plan.get("name"),
                                    state=RunState.RUNNING.value, attempt=k,
                                    started_at=store.now(), hosts=hosts,
                                    inventory=plan.get("inventory"))
            store.write_json(folder.file("state.json"), own.to_json())
        entry = AttemptRecord(k, tuple(hosts), store.now())
        with self._changing() as change:
            listed = [e.to_json() for e in change.state.attempts]
            change.state = change.state.with_(attempt=k, attempts=[*listed, entry.to_json()])
            change.event(EventKind.RESTARTED if k > 1 else EventKind.ATTEMPT_BEGUN, attempt=k,
                         hosts=hosts)
        return folder

    def host_quarantined(self, entry: Quarantine) -> None:
        with self._changing() as change:
            change.state = change.state.with_(
                quarantined=[*change.state.quarantined, entry.public()])
            change.event(EventKind.HOST_QUARANTINED, **entry.public())

    def attempt_ended(self, k: int, *, status: int, root: Optional[Json],
                      summary: Optional[Summary] = None,
                      seen: Optional[RunState] = None, ended_at: Optional[float] = None) -> None:
        """Attempt k is over: its summary (in its folder), its own state (attempt folders only:
        attempt 1's state is the run's), and its entry in the attempts list. An entry that has
        ended already keeps what it has, and no second event is written: whoever saw the end
        first knew it best. ``root``: the root cause as RootCause.public() gives it."""
        folder = attempts.attempt_dir(self.run, k)
        ended_at = ended_at or store.now()
        root = self.masks.json(root)  # a rank's own words may be in its detail
        if summary is not None:
            store.write_json(folder.file("summary.json"), self.masks.json(summary.to_json()))
        if k > 1 and seen is not None:
            self._record(folder, seen, {"exit_status": status, "ended_at": ended_at})
        with self._changing() as change:
            entries = list(change.state.attempts)
            open_ = [i for i, e in enumerate(entries) if e.attempt == k and e.ended_at is None]
            if not open_:
                change.keep = True
                return
            entries[open_[0]] = entries[open_[0]].ended(status, ended_at, root)
            change.state = change.state.with_(attempts=[e.to_json() for e in entries])
            change.root_event(k, root)
            change.event(EventKind.ATTEMPT_ENDED, attempt=k, exit_status=status)

    def first_line_of(self, k: int) -> Callable[[str, int, str], None]:
        """What attempt k's mirror calls with each rank's first line (node, rank, line)."""
        return functools.partial(self.first_line, k)

    def first_line(self, k: int, node: str, rank: int, line: str) -> None:
        """A rank of attempt k printed its first line: it is up (an event, no state)."""
        with self._changing() as change:
            change.event(EventKind.FIRST_LINE, attempt=k, node=node, rank=rank, line=line)

    def detached(self) -> None:
        """Every node started and the launching process leaves: nobody watches the run now."""
        with self._changing() as change:
            change.state = change.state.with_(controller_pid=None)
            change.event(EventKind.DETACHED)
        self.handed_over = True

    def stalled(self, k: int, report: Json) -> bool:
        """No rank of attempt k has made progress for the stall timeout (#21): the run is
        ``stalled`` until it moves again; the report is kept in the state. False when the run
        has ended or is stalled already (one report per stall)."""
        with self._changing() as change:
            if change.state.state is not RunState.RUNNING:
                change.keep = True
                return False
            report = self.masks.json(report)  # the ranks' last lines and stacks
            change.state = change.state.with_(state=RunState.STALLED.value, stall=report)
            change.event(EventKind.STALLED, attempt=k, report=report)
            return True

    def resumed(self, k: int) -> bool:
        """A stalled run made progress again: running (its last stall report stays)."""
        with self._changing() as change:
            if change.state.state is not RunState.STALLED:
                change.keep = True
                return False
            change.state = change.state.with_(state=RunState.RUNNING.value)
            change.event(EventKind.RESUMED, attempt=k)
            return True

    def stragglers(self, k: int, ranks: list[int], shares: dict[str, float]) -> bool:
        """A profile of attempt k (`stacks --profile`, `top --profile`) named these stragglers:
        an event when they differ from the last ones named (none: an even run again)."""
        with self._changing() as change:
            if list(change.state.stragglers) == ranks:
                change.keep = True
                return False
            change.state = change.state.with_(stragglers=ranks)
            change.event(EventKind.STRAGGLER, attempt=k, ranks=ranks, wait_share=shares)
            return True

    def ended(self, k: int, seen: RunState, *, status: int,
              root: Optional[Json] = None, summary: Optional[Summary] = None,
              ended_at: Optional[float] = None, **fields: object) -> RunState:
        """The one end of a run, however it ends (it succeeded or failed, its copy or its
        detached start failed, Ctrl-C, a stopped stall, `stop`): attempt k, its last, is closed
        (``summary``: the attempt's, kept in its folder too), then the run, whose summary adds
        the run's attempts and quarantined hosts. Returns the state the run ended with."""
        ended_at = ended_at or store.now()
        stall = stopped_stall(root)
        if stall is not None:  # not "failed" like a rank that exits 7: it stalled
            fields.update(stall)
            summary = summary.with_(**stall) if summary is not None else None
        self.attempt_ended(k, status=status, root=root, summary=summary if k > 1 else None,
                           seen=seen, ended_at=ended_at)
        if summary is not None:
            summary = summary.with_(**({"attempt": k} if k > 1 else {}),
                                    attempts=self.attempts(), quarantined=self.quarantined())
        return self.finished(seen, status=status, summary=summary, ended_at=ended_at, **fields)

    def finished(self, seen: RunState, *, status: int, summary: Optional[Summary] = None,
                 ended_at: Optional[float] = None, **fields: object) -> RunState:
        """The run ended as ``seen`` (its summary in the run folder). Returns the state it
        ended with: the one recorded first, when someone saw the end before."""
        if summary is not None:
            stall = RunStatus.of(self.run).stall  # the last stall report (#21), if there was one
            summary = summary.with_(stall=stall) if stall and summary.stall is None else summary
            store.write_json(self.run.file("summary.json"), self.masks.json(summary.to_json()))
        return self._record(self.run, seen,
                            {"exit_status": status, "ended_at": ended_at or store.now(),
                             **self.masks.json(fields)})

    # -- what it has recorded ---------------------------------------------------------------

    def attempts(self) -> list[Json]:
        return attempts.entries(self.run)

    def quarantined(self) -> list[Json]:
        return attempts.quarantined(self.run)

    # -- the writing itself ----------------------------------------------------------------

    def _record(self, folder: RunDir, seen: RunState, fields: Json) -> RunState:
        """``seen`` in ``folder``'s state by the one rule; the run folder's end is an event."""
        with self._changing(folder) as change:
            recorded = change.state.state
            now = merge(recorded, seen)
            if now is not seen or recorded is seen:
                change.keep = True  # an ended run keeps its end; a repeat changes nothing
                return now
            change.state = change.state.with_(**{**fields, "state": seen.value})
            if seen.final:
                if change.state.ended_at is None:
                    change.state = change.state.with_(ended_at=store.now())
                if folder == self.run:
                    change.event(EventKind.FINISHED, state=seen.value,
                                 exit_status=fields.get("exit_status"))
            return now

    @contextmanager
    def _changing(self, folder: Optional[RunDir] = None) -> Iterator[_Change]:
        """The state of ``folder`` (default: the run's) to change, under the run's lock; written
        back with the change's events appended, unless the change keeps it as it was."""
        folder = folder or self.run
        with self.run.locked("state.lock"):
            change = _Change(self.run.id, RunStatus.of(folder), self.masks)
            yield change
            if change.keep:
                return
            store.write_json(folder.file("state.json"), change.state.to_json())
            if change.events:
                fd = store.open_private(self.run.file(EVENTS),
                                        os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                with os.fdopen(fd, "a") as handle:
                    handle.write("".join(json.dumps(e, sort_keys=True) + "\n"
                                         for e in change.events))
        for event in change.events:  # outside the lock: a slow listener holds up no writer
            for listener in self.listeners:
                listener(event)


@dataclass
class _Change:
    """One change of a state.json in the making: the state and the events it appends."""

    run_id: str
    state: RunStatus
    masks: Masks
    events: list[Json] = field(default_factory=list)
    keep: bool = False  # True: write nothing after all

    def event(self, kind: EventKind, **fields: object) -> None:
        """An event of this change. ``seq`` counts the run's events, so a reader can tell a
        repeated delivery from a new event."""
        seq = self.state.events + 1
        self.state = self.state.with_(events=seq)
        # Text from the job (a first line, a stall report's last lines) may hold a secret.
        self.events.append(Event(kind, self.run_id, seq, store.now(),
                                 self.masks.json(fields)).to_json())

    def root_event(self, k: int, root: Optional[Json]) -> None:
        if root:
            kind = EventKind.HOST_LOST if root.get("lost") else EventKind.RANK_FAILED
            self.event(kind, attempt=k, root_cause=root)


def stopped_stall(root: Optional[Json]) -> Optional[Json]:
    """What state.json and summary.json add for a run that `--on-stall stop` ended:
    ``{"outcome": "stalled", "stalled": {"node": blamed host, "rank": blamed rank or None}}``
    (a stall in which no rank stood out and no link failed, or no stack could be read,
    blames no host: ``node`` None, and ``why`` says what the report found instead);
    None for any other end. (The run's state stays ``failed``: it has ended, and the one
    run-state rule knows a stall only as a run still going.)"""
    cause = root_cause(root)
    if cause is None or not cause.stalled:
        return None
    blamed: Json = {"node": cause.blamed_node, "rank": cause.blamed_rank}
    if cause.blamed_node is None:  # the report named no host: why
        blamed["why"] = cause.detail.partition(": stalled, ")[2] or cause.detail
    return {"outcome": Outcome.STALLED.label, "stalled": blamed}


def events(run: RunDir) -> list[Json]:
    """The run's events in the order they were written (a torn last line is left out)."""
    try:
        text = attempts.top(run).file(EVENTS).read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found
