"""Host-key verification against known_hosts: strict by default, accept-new only when asked."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import paramiko

from clusterrun.errors import LocalFilesError, UnreachableError

GLOBAL_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_append_lock = threading.Lock()
# Files check_files read without fault, each by path, inode, modification time and size.
_read_fine: set[tuple[tuple[object, ...], ...]] = set()


class HostKeyError(UnreachableError):
    """The server's key is unknown (and accept-new was not asked for) or has changed."""


def known_host_name(hostname: str, port: int) -> str:
    """The name known_hosts uses for a host, as OpenSSH writes it."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def check_files(paths: Iterable[str]) -> None:
    """Read every known_hosts file the inventory names before any host is contacted: a bad line
    is the user's file to fix (exit 2), not a property of one host."""
    for raw in sorted(set(paths)):
        path = Path(os.path.expanduser(raw))
        if path.is_file():
            load_into(paramiko.SSHClient(), path)


def readable(paths: Iterable[str]) -> bool:
    """Whether ``check_files`` passes, remembered while the files stay the same: the session's
    daemon asks before each warm command, and paramiko reads a long known_hosts at ~0.1 ms a
    line."""
    files = sorted({os.path.expanduser(p) for p in paths})
    key = tuple(_identity(p) for p in [str(GLOBAL_KNOWN_HOSTS), *files])
    if key in _read_fine:
        return True
    try:
        check_files(files)
    except LocalFilesError:
        return False
    if len(_read_fine) >= 64:
        _read_fine.clear()
    _read_fine.add(key)
    return True


def _identity(path: str) -> tuple[object, ...]:
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def load_into(client: paramiko.SSHClient, known_hosts: Path) -> None:
    """Load the user's and the system's known_hosts into ``client`` without letting paramiko
    rewrite either file (``SSHClient.load_host_keys`` would save over it on every new key)."""
    keys = client.get_host_keys()
    for path in (GLOBAL_KNOWN_HOSTS, known_hosts):
        if not path.is_file():
            continue
        try:
            keys.load(str(path))
        # InvalidHostKey (a bad base64 key) derives from Exception alone.
        except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey,
                ValueError) as exc:
            where, why = str(path), str(exc)
            if isinstance(exc, paramiko.hostkeys.InvalidHostKey):
                where, why = _locate(path, exc.line), f"the key is not valid base64 ({exc.exc})"
            raise LocalFilesError(
                f"{where}: cannot read this known_hosts file: {why}. Fix or remove the bad "
                "line; `ssh-keygen -F HOST -f FILE` shows a host's entries."
            ) from None


def _locate(path: Path, line: str) -> str:
    """``file:line`` of a bad known_hosts line, for the message."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return str(path)
    found = next((n for n, text in enumerate(lines, 1) if text.strip() == line.strip()), None)
    return f"{path}:{found}" if found else str(path)


class Policy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for hosts with no key on file; changed keys never get here."""

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise HostKeyError(
                f"the host key of {hostname} is not in {self.known_hosts} ({key.get_name()} "
                f"{key.fingerprint}). Nothing was run there. If that fingerprint is right "
                "(compare with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` on the host), run "
                "again with --accept-new-host-keys, or add it with `ssh-keyscan`."
            )
        append(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def changed_key_message(hostname: str, got: paramiko.PKey, expected: paramiko.PKey,
                        known_hosts: Path) -> str:
    return (
        f"the host key of {hostname} has CHANGED: it presented {got.get_name()} {got.fingerprint} "
        f"but {known_hosts} has {expected.get_name()} {expected.fingerprint}. Someone may be "
        "intercepting the connection, or the host was reinstalled. Nothing was run there and the "
        "file was left unchanged. If the change is expected, remove the old entry with "
        f"`ssh-keygen -R {hostname} -f {known_hosts}` and connect again."
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on the file's directory: the file itself is replaced by a rename, so
    it cannot carry the lock, and a lock file would be left lying next to it."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def append(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Add one key to known_hosts atomically, keeping the file's mode; safe across threads and
    processes (another clusterrun may be adding keys to the same file)."""
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    # A symlinked known_hosts (dotfile managers) is updated where it lives, not replaced.
    path = Path(os.path.realpath(path))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _append_lock, _locked(path):
        try:
            old = path.read_bytes()
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            old, mode = b"", 0o600
        if old and not old.endswith(b"\n"):
            old += b"\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(old + line.encode())
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
