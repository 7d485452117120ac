"""Local run state under $CLUSTERRUN_HOME/runs/<run-id>/: the plan, the state, the summary and
byte-exact mirrors of every host's log files. Directories 0700, files 0600, whatever the umask;
no symlink is followed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from clusterrun.errors import UsageError

LIVE_STATES = ("starting", "running", "stopping")


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"{path} is not a directory; remove it and try again.")
    os.chmod(path, 0o700)


def open_private(path: Path, flags: int) -> int:
    """A file descriptor for a 0600 file that is not a symlink."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as handle:
        json.dump(obj, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def node_dir(self, node: str) -> Path:
        return self.path / "nodes" / node

    def mirror(self, node: str, name: str) -> Path:
        return self.node_dir(node) / name

    @property
    def plan(self) -> dict[str, Any]:
        return read_json(self.file("plan.json")) or {}

    @property
    def state(self) -> dict[str, Any]:
        return read_json(self.file("state.json")) or {}

    def update_state(self, **fields: Any) -> dict[str, Any]:
        with self.locked("state.lock"):
            state = self.state
            state.update(fields)
            write_json(self.file("state.json"), state)
            return state

    @contextlib.contextmanager
    def locked(self, name: str, blocking: bool = True) -> Iterator[bool]:
        """An flock on runs/<id>/<name>; yields whether it was taken."""
        fd = open_private(self.file(name), os.O_RDWR | os.O_CREAT)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def lock_fd(self, name: str) -> Optional[int]:
        """Take and keep an flock (released when the process exits); None if someone has it."""
        fd = open_private(self.file(name), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd


def runs_root(home: Path) -> Path:
    return home / "runs"


def create(home: Path, run_id: str) -> RunDir:
    _private_dir(home)
    _private_dir(runs_root(home))
    path = runs_root(home) / run_id
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    run = RunDir(path)
    return run


def make_node_dir(run: RunDir, node: str) -> Path:
    path = run.node_dir(node)
    _private_dir(path.parent)
    _private_dir(path)
    return path


def all_runs(home: Path) -> list[RunDir]:
    """Newest first."""
    root = runs_root(home)
    if not root.is_dir():
        return []
    found = [RunDir(p) for p in root.iterdir() if p.is_dir() and (p / "plan.json").exists()]
    return sorted(found, key=lambda r: (r.plan.get("created", 0), r.id), reverse=True)


def resolve(home: Path, run_id: Optional[str]) -> RunDir:
    runs = all_runs(home)
    if not runs:
        raise UsageError(f"no runs in {runs_root(home)} yet; start one with `clusterrun launch`.")
    if run_id is None:
        return runs[0]
    exact = [r for r in runs if r.id == run_id]
    matches = exact or [r for r in runs if r.id.startswith(run_id) or r.id.endswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no run {run_id!r} in {runs_root(home)}; `clusterrun ps` lists them.")
    shown = ", ".join(r.id for r in matches[:4])
    raise UsageError(f"{run_id!r} matches {len(matches)} runs ({shown}...); give more of the id.")


def pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def now() -> float:
    return time.time()
