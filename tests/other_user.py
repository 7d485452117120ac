"""Running the real command line as another user of this machine (as root: `nobody`; as a
normal user: that user, whom modes still bind).

That user brings what it needs and depends on no one's home being open: an interpreter of its
own (a venv of the machine's /usr/bin/python3 holding this one's packages, in /var/tmp), and the
files it is meant to read in `shared`, a directory of its own. The checkout may lie where the
user cannot enter (under /root, or in a `mktemp -d`), so nothing is run from there.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import users

NOBODY = 65534


@dataclass(frozen=True)
class OtherUser:
    name: str
    python: str  # an interpreter this user may run, with clusterrun and its dependencies
    prefix: tuple[str, ...]  # what makes a command run as this user

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, self.python, "-m", "clusterrun", *args]

    def run(self, *args: str, home: str, env: dict[str, str] | None = None,
            cwd: str | Path = "/", timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The real CLI as this user with $HOME ``home``; ``env`` goes on top of this process's
        environment, less CLUSTERRUN_HOME (the test's own) unless ``env`` names it."""
        base = {k: v for k, v in os.environ.items()
                if k not in ("CLUSTERRUN_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
        full = {**base, "HOME": home, "USER": self.name, "LOGNAME": self.name, **(env or {})}
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=full, check=False)


@pytest.fixture(scope="session")
def shared_python() -> Iterator[str]:
    """An interpreter every user of this machine (and of the sandbox's hosts, which share its
    /var/tmp) may run, with this one's packages (torch included) and clusterrun."""
    if os.geteuid() != 0:  # the only other user a normal user can be is itself
        yield sys.executable
        return
    place = Path(tempfile.mkdtemp(prefix="clusterrun-python-", dir="/var/tmp"))
    try:
        python = users.shared_python(place / "venv")
        place.chmod(0o755)
        yield str(python)
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.fixture(scope="session")
def other_user(shared_python: str) -> OtherUser:
    if os.geteuid() != 0:
        return OtherUser(getpass.getuser(), shared_python, ())
    return OtherUser("nobody", shared_python, (
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"))


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory any user can enter (pytest's tmp_path is private to its owner, and it may
    lie under a home no one else may enter)."""
    path = Path(tempfile.mkdtemp(prefix="clusterrun-shared-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in [path, *path.rglob("*")]:
            if sub.is_dir() and not sub.is_symlink():
                sub.chmod(0o755)
        shutil.rmtree(path)


def readable_copy(source: Path, folder: Path) -> Path:
    """``source`` copied into ``folder`` (a `shared` one) where any user may read it."""
    target = folder / source.name
    shutil.copyfile(source, target)
    target.chmod(0o644)
    return target
