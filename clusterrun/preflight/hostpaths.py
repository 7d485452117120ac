"""A directory on a host that cannot be used, in words a user can act on: what is in the way,
on which host, and the fix. The facts come from the host (clusterrun/remote/probe/pathcheck.py): the
probe's workdir check (exit 3, preflight) and the code copy (exit 6, sync) both use them.

docs/troubleshooting.md ("The workdir on a host") lists the cases.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from clusterrun.jsonfields import flag, text


@dataclass(frozen=True)
class PathFailure:
    """What the host found in the way of ``path`` (clusterrun/remote/probe/pathcheck.py): the
    errno's name, the nearest part of the path that exists, whose home. None: not said."""

    path: Optional[str] = None
    errno: Optional[str] = None
    error: Optional[str] = None
    failed_at: Optional[str] = None
    existing: Optional[str] = None
    existing_is_dir: Optional[bool] = None
    writable: Optional[bool] = None
    user: Optional[str] = None
    home: Optional[str] = None
    home_exists: Optional[bool] = None

    @classmethod
    def from_json(cls, found: Mapping[str, object]) -> PathFailure:
        return cls(text(found.get("path")), text(found.get("errno")), text(found.get("error")),
                   text(found.get("failed_at")), text(found.get("existing")),
                   flag(found.get("existing_is_dir")), flag(found.get("writable")),
                   text(found.get("user")), text(found.get("home")),
                   flag(found.get("home_exists")))


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def cause(found: Mapping[str, object]) -> str:
    """Why ``found["path"]`` cannot be created or written, naming the path in the way."""
    return _cause(PathFailure.from_json(found))


def _cause(found: PathFailure) -> str:
    path = str(found.path)
    code = found.errno
    user = found.user or "this user"
    existing = str(found.existing or path)
    home = found.home
    if home and found.home_exists is False and _under(path, home):
        return f"the home directory {home} of {user} does not exist there"
    if code == "EISDIR":
        return f"{path} is a directory where a file should be"
    if code in ("ENOTDIR", "EEXIST") or found.existing_is_dir is False:
        if existing == path:
            return f"{path} is a file, not a directory"
        return f"{existing} is a file, not a directory, and {path} would be inside it"
    if code == "EROFS":
        return f"{existing} is on a read-only filesystem"
    if code in ("EACCES", "EPERM"):
        where = existing if found.writable is False else (found.failed_at or existing)
        return f"{user} may not write to {where} (permission denied)"
    if code == "ENOSPC":
        return f"the disk that holds {existing} is full"
    if code == "EDQUOT":
        return f"{user}'s disk quota on the filesystem of {existing} is used up"
    return f"{found.error or 'it failed'} ({found.failed_at or path})"


def fix(found: Mapping[str, object], *, local: bool = False) -> str:
    """What to change: `workdir:` to a directory the user can write, or what is in the way."""
    return _fix(PathFailure.from_json(found), local=local)


def _fix(found: PathFailure, *, local: bool) -> str:
    user = found.user or "that user"
    setting = (f"Set `workdir:` in the inventory to a directory {user} can create and write "
               f"there (for example `workdir: /tmp/clusterrun-{user}`)")
    if local:
        setting += (", or point CLUSTERRUN_HOME at one: hosts on this machine keep their files "
                    "under it")
    path = str(found.path)
    existing = str(found.existing or path)
    if found.errno == "EISDIR":
        return f"Move {path} out of the way, or: {setting[0].lower()}{setting[1:]}."
    if found.errno in ("ENOTDIR", "EEXIST") or found.existing_is_dir is False:
        return f"Move {existing} out of the way, or: {setting[0].lower()}{setting[1:]}."
    if found.errno in ("ENOSPC", "EDQUOT"):
        return f"Free space there, or: {setting[0].lower()}{setting[1:]}."
    return setting + "."


def explain(host: str, found: Mapping[str, object], *, doing: str = "use workdir",
            local: bool = False) -> str:
    """``cannot use workdir PATH on HOST: CAUSE. FIX.`` (one paragraph, no traceback).
    ``found``: the host's record as it sent it (the probe's workdir check, the copy's)."""
    failure = PathFailure.from_json(found)
    path = posixpath.normpath(str(failure.path))
    return f"cannot {doing} {path} on {host}: {_cause(failure)}. {_fix(failure, local=local)}"
