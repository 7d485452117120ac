"""A directory on a host that cannot be used, in words a user can act on: what is in the way,
on which host, and the fix. The facts come from the host (clusterrun/remote/pathcheck.py): the
probe's workdir check (exit 3, preflight) and the code copy (exit 6, sync) both use them.

docs/troubleshooting.md ("The workdir on a host") lists the cases.
"""

from __future__ import annotations

import posixpath
from typing import Any


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def cause(found: dict[str, Any]) -> str:
    """Why ``found["path"]`` cannot be created or written, naming the path in the way."""
    path = str(found.get("path"))
    code = found.get("errno")
    user = found.get("user") or "this user"
    existing = str(found.get("existing") or path)
    home = found.get("home")
    if home and found.get("home_exists") is False and _under(path, str(home)):
        return f"the home directory {home} of {user} does not exist there"
    if code == "EISDIR":
        return f"{path} is a directory where a file should be"
    if code in ("ENOTDIR", "EEXIST") or found.get("existing_is_dir") is False:
        if existing == path:
            return f"{path} is a file, not a directory"
        return f"{existing} is a file, not a directory, and {path} would be inside it"
    if code == "EROFS":
        return f"{existing} is on a read-only filesystem"
    if code in ("EACCES", "EPERM"):
        where = existing if found.get("writable") is False else (
            found.get("failed_at") or existing)
        return f"{user} may not write to {where} (permission denied)"
    if code == "ENOSPC":
        return f"the disk that holds {existing} is full"
    if code == "EDQUOT":
        return f"{user}'s disk quota on the filesystem of {existing} is used up"
    return f"{found.get('error') or 'it failed'} ({found.get('failed_at') or path})"


def fix(found: dict[str, Any], *, local: bool = False) -> str:
    """What to change: `workdir:` to a directory the user can write, or what is in the way."""
    user = found.get("user") or "that user"
    setting = (f"Set `workdir:` in the inventory to a directory {user} can create and write "
               f"there (for example `workdir: /tmp/clusterrun-{user}`)")
    if local:
        setting += (", or point CLUSTERRUN_HOME at one: hosts on this machine keep their files "
                    "under it")
    path = str(found.get("path"))
    existing = str(found.get("existing") or path)
    if found.get("errno") == "EISDIR":
        return f"Move {path} out of the way, or: {setting[0].lower()}{setting[1:]}."
    if found.get("errno") in ("ENOTDIR", "EEXIST") or found.get("existing_is_dir") is False:
        return f"Move {existing} out of the way, or: {setting[0].lower()}{setting[1:]}."
    if found.get("errno") in ("ENOSPC", "EDQUOT"):
        return f"Free space there, or: {setting[0].lower()}{setting[1:]}."
    return setting + "."


def explain(host: str, found: dict[str, Any], *, doing: str = "use workdir",
            local: bool = False) -> str:
    """``cannot use workdir PATH on HOST: CAUSE. FIX.`` (one paragraph, no traceback)."""
    path = posixpath.normpath(str(found.get("path")))
    return f"cannot {doing} {path} on {host}: {cause(found)}. {fix(found, local=local)}"
