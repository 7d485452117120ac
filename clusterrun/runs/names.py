"""Finding a run from what a user types: its id, its `--name`, or a unique start or end of its
id. No argument means the newest run."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from clusterrun.errors import UsageError
from clusterrun.runs import attempts
from clusterrun.runs.store import RunDir, all_runs, runs_root


def resolve(home: Path, ref: Optional[str], *, note: Callable[[str], None],
            prefer: Optional[Callable[[RunDir], bool]] = None) -> RunDir:
    """The run ``ref`` names. A name several runs share means the newest of them (or the newest
    that ``prefer`` accepts, if any does); ``note`` then says which, and which others there are.
    A run whose plan or state (or its current attempt's) cannot be read is refused, named."""
    run = _find(home, ref, note=note, prefer=prefer)
    run.require()
    current = attempts.current(run)
    if current.path != run.path:
        current.require()
    return run


def _find(home: Path, ref: Optional[str], *, note: Callable[[str], None],
          prefer: Optional[Callable[[RunDir], bool]]) -> RunDir:
    runs = all_runs(home)  # newest first
    if not runs:
        raise UsageError(f"no runs in {runs_root(home)} yet; start one with `clusterrun launch`.")
    if ref is None:
        return runs[0]
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    named = [r for r in runs if r.plan.get("name") == ref]
    if named:
        preferred = [r for r in named if prefer is not None and prefer(r)]
        chosen = (preferred or named)[0]
        if len(named) > 1:
            which = "the newest still running" if preferred else "the newest"
            others = [r.id for r in named if r is not chosen]
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            note(f"{ref!r} names {len(named)} runs; using {which}, {chosen.id} (give the id for "
                 f"another: {shown}).")
        return chosen
    matches = [r for r in runs if r.id.startswith(ref) or r.id.endswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no run {ref!r} in {runs_root(home)}, by id or by name; "
                         "`clusterrun ps` lists them.")
    shown = ", ".join(r.id for r in matches[:4])
    raise UsageError(f"{ref!r} matches {len(matches)} runs ({shown}...); give more of the id.")
