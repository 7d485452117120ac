"""A run's attempts on this machine. Attempt 1 is the run folder itself, so a run that never
restarted looks exactly as it always did; attempt K >= 2 is runs/<run-id>/attempt-K/
(remote/shared/layout.py says so for both ends), a run folder of its own (plan, state, summary,
mirrors). The run folder's state.json says which attempt is the current one (``attempt``,
absent: 1) and keeps the ``attempts`` and ``quarantined`` lists."""

from __future__ import annotations

import os

from clusterrun.remote.shared import layout
from clusterrun.runs.records import AttemptRecord, Json, PlanRecord, RunStatus
from clusterrun.runs.store import RunDir


def top(run: RunDir) -> RunDir:
    """The run folder, given it or one of its attempt folders."""
    return RunDir(run.path.parent) if run.attempt > 1 else run


def attempt_dir(run: RunDir, k: int) -> RunDir:
    if k < 1:
        raise ValueError(f"attempts count from 1, not {k}")
    run = top(run)
    return run if k == 1 else RunDir(run.path / layout.attempt_folder(k))


def create_attempt(run: RunDir, k: int) -> RunDir:
    """Attempt k's folder, made private (0700) as `store.create` makes a run's; an attempt
    folder that is already there is refused, as a run id that is already taken is."""
    folder = attempt_dir(run, k)
    if k > 1:
        folder.path.mkdir(mode=0o700)
        os.chmod(folder.path, 0o700)
    return folder


def count(run: RunDir) -> int:
    """How many attempts the run has had so far (the current one included)."""
    return RunStatus.of(top(run)).attempt


def current(run: RunDir) -> RunDir:
    """The folder of the attempt the run's state names: where its live hosts are."""
    return attempt_dir(run, count(run))


def most(run: RunDir) -> int:
    """How many attempts the run may have at most (``--max-restarts`` + 1)."""
    status = RunStatus.of(top(run))
    return max(status.max_restarts + 1, status.attempt)


def records(run: RunDir) -> tuple[AttemptRecord, ...]:
    """The run's attempts as its state lists them (none for a run from before restarts, or
    one whose launcher has not written them)."""
    return RunStatus.of(top(run)).attempts


def entries(run: RunDir) -> list[Json]:
    """The run's ``attempts`` list as JSON (``ps --json``, summary.json)."""
    return [e.to_json() for e in records(run)]


def quarantined(run: RunDir) -> list[Json]:
    return list(RunStatus.of(top(run)).quarantined)


def hosts(run: RunDir, k: int) -> list[str]:
    """Attempt k's hosts: its plan's nodes, else what the attempts list recorded."""
    nodes = PlanRecord.of(attempt_dir(run, k)).nodes
    if nodes:
        return [n.name for n in nodes]
    for entry in records(run):
        if entry.attempt == k:
            return list(entry.hosts)
    return []


def quarantine_text(entry: Json) -> str:
    """``gpu-c (lost (no word for 30 s), attempt 1)``"""
    details = [str(entry["reason"])] if entry.get("reason") else []
    if entry.get("attempt") is not None:
        details.append(f"attempt {entry['attempt']}")
    host = str(entry.get("host") or "?")
    return f"{host} ({', '.join(details)})" if details else host


def started_text(run: RunDir, k: int) -> str:
    """What `logs -f` says when it moves on to attempt k:
    ``attempt 2/3 started: gpu-a, gpu-b, gpu-e (attempt 1: gpu-c lost (no word for 30 s))``"""
    text = f"attempt {k}/{most(run)} started: {', '.join(hosts(run, k)) or 'no hosts yet'}"
    earlier = next((e for e in records(run) if e.attempt == k - 1), None)
    if earlier is not None and earlier.root_cause:
        text += f" (attempt {k - 1}: {earlier.root_cause})"
    return text
