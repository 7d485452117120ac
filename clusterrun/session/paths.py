"""Where the session lives on this machine, and whether a command uses it."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path

import clusterrun
from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.home import home

IDLE = 600.0  # seconds without a client before the daemon exits ($CLUSTERRUN_SESSION_IDLE)
_SOCKET_MAX = 100  # a Unix socket's path holds at most 107 bytes (Linux); keep clear of it
_PREFIX = "sock-"


def enabled() -> bool:
    """On unless ``CLUSTERRUN_SESSION=0`` (or ``--no-session``, which sets it): then every
    command makes its own connections."""
    return os.environ.get("CLUSTERRUN_SESSION", "1").strip().lower() not in (
        "0", "no", "off", "false")


def cold_waits() -> bool:
    """``CLUSTERRUN_SESSION_COLD=wait``: a command that finds no daemon starts one and reaches
    its hosts through it (its first command pays the daemon's start and each agent's). By
    default it reaches them directly and the daemon is started behind it (session/starter.py)."""
    return os.environ.get("CLUSTERRUN_SESSION_COLD", "").strip().lower() == "wait"


def idle_seconds() -> float:
    value = os.environ.get("CLUSTERRUN_SESSION_IDLE")
    try:
        return max(1.0, float(value)) if value else IDLE
    except ValueError:
        return IDLE


def folder() -> Path:
    """$CLUSTERRUN_HOME/session: the daemon's log, lock and (when its path is short enough)
    socket. Made mode 0700 and checked to be this user's: the socket's directory is the first
    of the two locks on it (the daemon's uid check is the second)."""
    return _private(home() / "session")


# What the daemon and its agents run: a change to any of it makes another daemon.
_DAEMON_CODE = ("session", "transport", "remote/shared/frames.py", "remote/tools/hostagent.py",
                "errors.py")


@functools.cache
def code_stamp() -> str:
    """The daemon's code, as a short digest of clusterrun's version and of each of its files'
    path, size and modification time (stat, no reads: well under a millisecond). The socket
    carries it, so a command never talks to a daemon started from other code (an upgrade, an
    edit in a checkout); that one idles out, or `session stop` ends it."""
    root = Path(clusterrun.__file__).parent
    digest = hashlib.sha256(clusterrun.__version__.encode())
    for part in _DAEMON_CODE:
        files = sorted((root / part).glob("*.py")) if (root / part).is_dir() else [root / part]
        for path in files:
            st = path.stat()
            digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n"
                          .encode())
    return digest.hexdigest()[:10]


# What a new connection takes from the environment of the process that makes it: ~/.ssh/config
# and the default user (fabric reads them through HOME and the login name), the ssh-agent
# (paramiko asks SSH_AUTH_SOCK). The daemon makes connections long after the command that
# started it, so a command whose values differ (a new login's forwarded agent, another HOME)
# gets a daemon of its own, never one that would authenticate as the old login did.
_CONNECTION_ENV = ("HOME", "USER", "LOGNAME", "SSH_AUTH_SOCK")


def stamp() -> str:
    """``code_stamp``, and the values of _CONNECTION_ENV in this process."""
    digest = hashlib.sha256(code_stamp().encode())
    for name in _CONNECTION_ENV:
        value = os.environ.get(name)
        digest.update(b"-\n" if value is None else f"={value}\n".encode())
    return digest.hexdigest()[:10]


def socket_path() -> Path:
    """The socket of this code's daemon for this environment (see ``stamp``)."""
    return _socket_folder() / f"{_PREFIX}{stamp()}"


def sockets() -> list[Path]:
    """Every daemon socket of this home, this code's and others' (``session``/``session stop``
    see them all)."""
    found = {socket_path()}
    for place in {folder(), _socket_folder()}:
        found.update(p for p in place.glob(f"{_PREFIX}*") if p.is_socket())
    return sorted(found, key=lambda p: (p != socket_path(), str(p)))


def _socket_folder() -> Path:
    if len(str(folder() / _PREFIX)) + 10 <= _SOCKET_MAX:
        return folder()
    # A deep $CLUSTERRUN_HOME: a short private folder of its own, one per home.
    digest = hashlib.sha256(str(home()).encode()).hexdigest()[:12]
    import tempfile  # here: every command through the session loads this module

    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return _private(Path(base) / f"clusterrun-{os.getuid()}-{digest}")


def lock_path() -> Path:
    return folder() / "lock"


def log_path() -> Path:
    return folder() / "daemon.log"


def _private(path: Path) -> Path:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as exc:
        raise ClusterrunError(f"{path}: cannot create the session's folder ({exc.strerror}). "
                              "Check $CLUSTERRUN_HOME, or run with --no-session.",
                              outcome=Outcome.LOCAL_FILES) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        what = oct(st.st_mode & 0o777) if stat.S_ISDIR(st.st_mode) else "not a directory"
        raise ClusterrunError(
            f"{path}: the session's folder must be a directory of this user's with mode 0700 "
            f"(it is {what}, owner uid {st.st_uid}). Remove it (a new one is made), or run "
            "with --no-session.",
            outcome=Outcome.LOCAL_FILES)
    return path
