"""Local run state under $CLUSTERRUN_HOME/runs/<run-id>/: the plan, the state, the summary and
byte-exact mirrors of every host's log files. Directories 0700, files 0600, whatever the umask;
no symlink is followed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from clusterrun.errors import LocalFilesError, UsageError
from clusterrun.home import DEFAULT_HOME
from clusterrun.remote.shared import layout


def unusable(home: Path, path: Union[str, Path]) -> LocalFilesError:
    """The error for a $CLUSTERRUN_HOME (or a file in it) this user may not use: another user's,
    or one whose mode shuts its owner out."""
    user = _user(os.geteuid())
    try:
        st = os.stat(home)
        whose = f"it belongs to {_user(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}"
    except OSError:
        whose = "a directory on its path is closed to you"
    example = "$HOME/.clusterrun"
    own_home = os.path.expanduser("~")
    if not os.path.isdir(own_home):  # a user without a home directory here
        whose = f"your home directory {own_home} does not exist"
        example = f"/tmp/clusterrun-{user}"  # noqa: S108 - words of the message
    return LocalFilesError(
        f"cannot use {path}: permission denied for user {user}. clusterrun keeps every run's "
        f"plan, state and logs in {home} ($CLUSTERRUN_HOME, default {DEFAULT_HOME}), and {whose}. "
        f"Point CLUSTERRUN_HOME at a directory of your own (e.g. `export "
        f"CLUSTERRUN_HOME={example}`), or make this one yours (`sudo chown -R "
        f"{user} {home} && chmod 700 {home}`).")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def home_error(home: Path, exc: OSError) -> LocalFilesError:
    """The error for a $CLUSTERRUN_HOME whose path cannot be used: it runs through a file, a
    symlink loop, a name too long, a read-only or broken filesystem."""
    where = exc.filename or home
    why = exc.strerror or str(exc)
    if isinstance(exc, NotADirectoryError):
        why = "a file stands where a directory belongs on its path"
    return LocalFilesError(
        f"cannot use {where}: {why}. clusterrun keeps every run's plan, state and logs in "
        f"{home} ($CLUSTERRUN_HOME, default {DEFAULT_HOME}). Point CLUSTERRUN_HOME at a "
        "directory of your own that can be made (e.g. `export CLUSTERRUN_HOME=$HOME/"
        ".clusterrun`), or fix the path.")


def _foreign(home: Path, path: Path, owner: int) -> LocalFilesError:
    user = _user(os.geteuid())
    return LocalFilesError(
        f"cannot use {path}: it belongs to {_user(owner)}, not to you ({user}). clusterrun "
        f"keeps every run's plan, state and logs in {home} ($CLUSTERRUN_HOME, default "
        f"{DEFAULT_HOME}), and its owner could change what your runs do (their hosts, the "
        "command a run notifies). Point CLUSTERRUN_HOME at a directory of your own (e.g. "
        f"`export CLUSTERRUN_HOME=$HOME/.clusterrun`), or make this one yours (`sudo chown -R "
        f"{user} {home} && chmod 700 {home}`).")


def check_home(home: Path, *, write: bool) -> None:
    """Refuse, before anything else happens, a $CLUSTERRUN_HOME this user cannot read (or, with
    ``write``, write), one another user owns, or one whose path cannot be used at all: the
    error says whose it is or what is wrong, and how to get one of one's own."""
    need = os.R_OK | os.X_OK | (os.W_OK if write else 0)
    for path in (home, runs_root(home)):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            break  # made by the first launch
        except PermissionError:
            raise unusable(home, path) from None
        except OSError as exc:
            raise home_error(home, exc) from None
        if not stat.S_ISDIR(st.st_mode):
            raise LocalFilesError(f"{path} is not a directory; clusterrun keeps its runs there "
                                  "($CLUSTERRUN_HOME). Move it away, or point CLUSTERRUN_HOME "
                                  "at a directory.")
        if not os.access(path, need):
            raise unusable(home, path)
        if st.st_uid != os.geteuid():
            raise _foreign(home, path, st.st_uid)
    if write and not _exists(home, home):
        # Not created here: a failed preflight or a dry run records no run (they may still
        # write cache/ and local-nodes/). The nearest existing parent must let this user
        # create the home later.
        parent = home.parent
        while not _exists(parent, home) and parent != parent.parent:
            parent = parent.parent
        if not os.access(parent, os.W_OK | os.X_OK):
            raise unusable(home, parent)


def _exists(path: Path, home: Path) -> bool:
    """Whether ``path`` exists (FileNotFound: no); any other OSError is the home's error."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except PermissionError:
        return True  # os.access on it or below says the rest
    except OSError as exc:
        raise home_error(home, exc) from None
    return True


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


def unreadable(path: Path) -> Optional[str]:
    """Why the JSON object a run keeps in ``path`` (its plan.json, its state.json) cannot be
    used; None when it can."""
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return "it is missing"
    except OSError as exc:
        return exc.strerror or str(exc)
    except ValueError as exc:  # not JSON, or not UTF-8
        return f"it is not JSON ({exc})"
    return None if isinstance(raw, dict) else f"it holds a JSON {type(raw).__name__}, not an object"


@dataclass(frozen=True)
class RunDir:
    """A run's folder, or one attempt's folder inside it: both hold the same files."""

    path: Path

    @property
    def attempt(self) -> int:
        """1 for the run folder, K for its attempt-K folder (remote/shared/layout.py)."""
        return layout.attempt_of(self.path.parts)

    @property
    def id(self) -> str:
        """The run's id, also for an attempt's folder: messages name the run."""
        return self.path.parent.name if self.attempt > 1 else self.path.name

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

    @property
    def problem(self) -> Optional[str]:
        """What keeps this run from being read (``its plan.json cannot be read: it is
        missing``); None for a run whose plan and state are there."""
        for name in ("plan.json", "state.json"):
            why = unreadable(self.file(name))
            if why is not None:
                return f"its {name} cannot be read: {why}"
        return None

    def require(self) -> None:
        """Refuse a run whose plan or state cannot be read: without them its hosts are not
        known, nor whether it still runs."""
        problem = self.problem
        if problem is not None:
            raise LocalFilesError(
                f"run {self.id}: {problem} ({self.path}). Nothing was contacted: clusterrun "
                "finds a run's hosts and state there. Put the file back, or remove the run's "
                f"folder (`rm -r {self.path}`) once nothing of the run runs on its hosts.")

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
    return home / layout.RUNS


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
    # A folder with either file is a run: one that lost the other is listed, and named as such.
    found = [RunDir(p) for p in root.iterdir() if p.is_dir() and (
        (p / "plan.json").exists() or (p / "state.json").exists())]
    return sorted(found, key=lambda r: (_created(r), r.id), reverse=True)


def _created(run: RunDir) -> float:
    """When the run was made, as its plan says, else its state; else its folder's time."""
    for value in (run.plan.get("created"), run.state.get("started_at")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    try:
        return run.path.stat().st_mtime
    except OSError:
        return 0.0


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
