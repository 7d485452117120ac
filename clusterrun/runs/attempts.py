"""A run's attempts on this machine. Attempt 1 is the run folder itself, so a run that never
restarted looks exactly as it always did; attempt K >= 2 is runs/<run-id>/attempt-K/, a run
folder of its own (plan, state, summary, mirrors). The run folder's state.json says which
attempt is the current one (``attempt``, absent: 1) and keeps the ``attempts`` and
``quarantined`` lists."""

from __future__ import annotations

import os
from typing import Any

from clusterrun.runs.store import RunDir


def top(run: RunDir) -> RunDir:
    """The run folder, given it or one of its attempt folders."""
    return RunDir(run.path.parent) if run.attempt > 1 else run


def attempt_dir(run: RunDir, k: int) -> RunDir:
    if k < 1:
        raise ValueError(f"attempts count from 1, not {k}")
    run = top(run)
    return run if k == 1 else RunDir(run.path / f"attempt-{k}")


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
    value = top(run).state.get("attempt")
    return value if isinstance(value, int) and value >= 1 else 1


def current(run: RunDir) -> RunDir:
    """The folder of the attempt the run's state names: where its live hosts are."""
    return attempt_dir(run, count(run))


def most(run: RunDir) -> int:
    """How many attempts the run may have at most (``--max-restarts`` + 1)."""
    restarts = top(run).state.get("max_restarts")
    allowed = restarts + 1 if isinstance(restarts, int) and restarts >= 0 else 1
    return max(allowed, count(run))


def entries(run: RunDir) -> list[dict[str, Any]]:
    """The run's ``attempts`` list as its state holds it (empty for a run from before
    restarts, or one whose launcher has not written it)."""
    found = top(run).state.get("attempts")
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def quarantined(run: RunDir) -> list[dict[str, Any]]:
    found = top(run).state.get("quarantined")
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def hosts(run: RunDir, k: int) -> list[str]:
    """Attempt k's hosts: its plan's nodes, else what the attempts list recorded."""
    nodes = attempt_dir(run, k).plan.get("nodes") or []
    if nodes:
        return [str(n.get("name")) for n in nodes]
    for entry in entries(run):
        if entry.get("attempt") == k:
            return [str(h) for h in entry.get("hosts") or []]
    return []


def quarantine_text(entry: dict[str, Any]) -> str:
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
    earlier = next((e for e in entries(run) if e.get("attempt") == k - 1), {})
    if earlier.get("root_cause"):
        text += f" (attempt {k - 1}: {earlier['root_cause']})"
    return text
