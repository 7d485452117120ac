"""Parsing one inventory value: each parser reports its problem with the value's line and
returns None, so one pass finds every mistake in the file."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Optional, Union

from clusterrun.inventory.checker import Checker as _Checker
from clusterrun.inventory.hosts import PER_HOST
from clusterrun.inventory.yaml_lines import Located

USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
# Docker's and podman's rule for container names (a container id matches it too).
CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
CONTAINER_RULE = ("a container name or id is letters, digits, '_', '.' and '-', starting with "
                  "a letter or digit.")
ENGINES = ("docker", "podman")
# `exec -u` takes a name or uid, with an optional group or gid.
_ID = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}"
CONTAINER_USER_RE = re.compile(rf"^{_ID}(:{_ID})?$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What the Linux kernel accepts as an interface name (dev_valid_name): 1-15 bytes, no '/', ':'
# or whitespace, not '.' or '..'. Such a name may still hold '$' or ';': it is quoted everywhere.
_IFNAME_RE = re.compile(r"^[^/:\s]{1,15}$")


def text(chk: _Checker, loc: Located, what: str, pattern: Optional[re.Pattern[str]] = None,
         rule: str = "") -> Optional[str]:
    value = loc.value
    if isinstance(value, bool):
        key = what.rsplit(".", 1)[-1]
        chk.fail(loc.line, f"{what} must be a string, but YAML reads an unquoted yes/no/on/off/"
                 f"true/false as a boolean ({value}); quote it: {key}: \"...\".")
        return None
    if not isinstance(value, str) or not value:
        chk.fail(loc.line, f"{what} must be a non-empty string, got {show(value)}"
                 f"{'; quote it' if value is not None else ''}.")
        return None
    if pattern is not None and not pattern.fullmatch(value):
        chk.fail(loc.line, f"{what} {value!r} is not allowed: {rule}")
        return None
    return value


def show(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    return f"{type(value).__name__} {value!r}"


def _shown(value: Any) -> str:
    """A scalar as YAML gave it; a list or mapping by its kind, not by its insides."""
    return show(value) if isinstance(value, (list, dict)) else repr(value)


def port(chk: _Checker, loc: Located, what: str) -> Optional[int]:
    value = loc.value
    if isinstance(value, str) and value.strip().isdigit():
        chk.fail(loc.line, f"{what}: {value!r} is a string; write the number without quotes "
                 f"({what}: {value.strip()}).")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        chk.fail(loc.line, f"{what}: {_shown(value)} is not a valid port; use a number from 1 "
                 "to 65535.")
        return None
    return value


def nproc(chk: _Checker, loc: Located) -> Union[int, str, None]:
    value = loc.value
    if value in PER_HOST:
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        chk.fail(loc.line, f"nproc_per_node: {_shown(value)} must be a positive integer or "
                 "`auto` (the host's GPUs, else 1), `gpu` (its GPUs) or `cpu` (its CPUs).")
        return None
    return value


def interface(chk: _Checker, loc: Located) -> Optional[str]:
    return text(chk, loc, "interface", _IFNAME_RE,
                "an interface name is 1-15 characters without '/', ':' or spaces, or `auto`.")


def env(chk: _Checker, loc: Located) -> Optional[dict[str, str]]:
    if loc.value is None:  # `env:` with every entry commented out
        return {}
    if not isinstance(loc.value, dict):
        chk.fail(loc.line, "env must be a mapping of NAME: value.")
        return None
    out: dict[str, str] = {}
    for key, val in loc.value.items():
        if not _ENV_KEY_RE.fullmatch(key):
            chk.fail(val.line, f"env: {key!r} is not a valid environment variable name "
                     "(letters, digits and '_', not starting with a digit).")
            continue
        raw = val.value
        if isinstance(raw, bool) or raw is None or isinstance(raw, (list, dict)):
            chk.fail(val.line, f"env: {key} must be a string or number, got {show(raw)}; "
                     "quote it, e.g. \"true\" or \"\".")
            continue
        out[key] = str(raw)
    return out


def path(chk: _Checker, loc: Located, what: str) -> Optional[str]:
    value = text(chk, loc, what)
    if value is not None and ("\0" in value or "\n" in value):
        chk.fail(loc.line, f"{what} must not contain NUL or newline characters.")
        return None
    return value


def kind(found: Path) -> str:
    """"file", "directory", "missing", "other" (a device, a socket), or why the path cannot be
    looked at: pathlib's is_file() raises for a name too long or a directory closed to us."""
    try:
        mode = found.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def local_file(chk: _Checker, loc: Located, what: str, *, may_be_missing: bool = False
               ) -> Optional[str]:
    """A file on this machine that SSH reads (identity_file, known_hosts): checked here, before
    any host is contacted, since a connection would only fail with it on every host. `~` is
    expanded; a relative path is from the current directory, as ssh -i reads it."""
    value = path(chk, loc, what)
    if value is None:
        return None
    found = Path(os.path.expanduser(value))
    where = f" ({os.path.abspath(found)})" if not found.is_absolute() else ""
    found_kind = kind(found)
    if found_kind in ("directory", "other"):
        shown = "a directory" if found_kind == "directory" else "not a regular file"
        chk.fail(loc.line, f"{what} {value!r}{where} is {shown}; {what} is a file"
                 f"{_EXAMPLE.get(what, '')}.")
        return None
    if found_kind == "file" and not os.access(found, os.R_OK):
        chk.fail(loc.line, f"{what} {value!r}{where}: this user cannot read it; make it "
                 "readable for this user (chmod 600 keeps it private).")
        return None
    if found_kind not in ("file", "missing"):
        chk.fail(loc.line, f"{what} {value!r}{where}: cannot look at it: {found_kind}.")
        return None
    if found_kind == "missing" and not may_be_missing:
        chk.fail(loc.line, f"{what} {value!r}{where}: no such file. Fix the path, or create "
                 "the key (ssh-keygen -t ed25519) and install its .pub on the hosts.")
        return None
    return value


_EXAMPLE = {"identity_file": " (the private key, e.g. ~/.ssh/id_ed25519)",
            "known_hosts": " (e.g. ~/.ssh/known_hosts)"}


HOST_RULE = ("use a host name, an IP address or an ~/.ssh/config alias: letters, digits, '.', "
              "'_' and '-', not starting with '-' (no spaces, quotes or shell characters).")
USER_RULE = ("a user name is letters, digits, '.', '_' and '-', not starting with '-'.")


_GLOB_RE = re.compile(r"[A-Za-z0-9_*?]+")


def globs(chk: _Checker, loc: Located) -> Optional[tuple[str, ...]]:
    items = loc.value if isinstance(loc.value, list) else None
    values = [i.value for i in items] if items is not None else None
    if values is None or not all(isinstance(v, str) and _GLOB_RE.fullmatch(v) for v in values):
        chk.fail(loc.line, "forward_env must be a list of variable names or globs, e.g. "
                 "[MY_*, DATA_DIR] (letters, digits, '_', '*' and '?').")
        return None
    return tuple(values)


def env_file(chk: _Checker, loc: Located) -> Optional[str]:
    """A dotenv file on this machine, relative to the inventory's directory."""
    value = path(chk, loc, "env_file")
    if value is None:
        return None
    found = chk.path.parent / os.path.expanduser(value)
    found_kind = kind(found)
    if found_kind == "directory":
        chk.fail(loc.line, f"env_file {value!r} ({found}) is a directory; env_file is a "
                 "dotenv file of NAME=value lines.")
        return None
    if found_kind not in ("file", "missing", "other"):
        chk.fail(loc.line, f"env_file {value!r} ({found}): cannot look at it: {found_kind}.")
        return None
    if found_kind != "file":
        chk.fail(loc.line, f"env_file {value!r}: no such file ({found}). The path is relative to "
                 "the inventory's directory.")
        return None
    return str(found.resolve())


def engine(chk: _Checker, loc: Located) -> Optional[str]:
    if loc.value not in ENGINES:
        chk.fail(loc.line, f"container_engine: {loc.value!r} must be docker or podman (leave it "
                 "out to use whichever the host has, docker when it has both).")
        return None
    return str(loc.value)


def flag(chk: _Checker, loc: Located, what: str) -> Optional[bool]:
    """`true` or `false`; anything else (a quoted "true", 1) is refused rather than guessed at."""
    if not isinstance(loc.value, bool):
        chk.fail(loc.line, f"{what} must be true or false, got {show(loc.value)}.")
        return None
    return loc.value
