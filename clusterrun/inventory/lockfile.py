"""Reading `environment:`: a pinned lock (a requirements file of `==` pins, or a uv project's
uv.lock: inventory/uvlock.py) and where its wheels come from.

Read and checked with the inventory, before any host is contacted: every line that is not a pin
is refused with the lock's own file and line, since a host builds exactly what the lock names,
offline, and a range (`numpy>=2`) would let two hosts differ.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

from clusterrun.inventory import uvlock, values
from clusterrun.inventory.checker import Checker
from clusterrun.inventory.pylock import LockedWheel, Pin, PythonEnv, canonical
from clusterrun.inventory.yaml_lines import Located

KEYS = ("lock", "system_site_packages", "find_links", "index_url")
# PEP 508 names; the lock's pin is `name[extras]==version`, nothing else.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIN_RE = re.compile(rf"^(?P<name>{_NAME})\s*(?:\[[A-Za-z0-9._,\s-]*\])?\s*"
                     r"===?\s*(?P<version>[A-Za-z0-9.+!_-]+)$")
_HASH_RE = re.compile(r"^--hash[=\s]\s*(?P<algo>sha256):(?P<digest>[0-9a-fA-F]{64})$")
_URL_RE = re.compile(r"^(https?|file)://[^\s'\"\\]+$")
_DIRECT_RE = re.compile(rf"^(?P<name>{_NAME})\s*(?:\[[^\]]*\])?\s*@\s*(?P<url>\S+)$")
UV_PROJECT = "`environment: <uv project dir>`"
FIX = ("a lock pins every distribution with `==` (pip freeze, pip-compile or `uv pip compile` "
       "write one)")


def parse(chk: Checker, loc: Located) -> Optional[PythonEnv]:
    """`environment: PATH` or `environment: {lock: PATH, ...}`."""
    if isinstance(loc.value, str):
        path = _lock_path(chk, loc)
        return _read(chk, loc, path) if path else None
    if not isinstance(loc.value, dict):
        chk.fail(loc.line, "environment: give the path of a lock file (relative to the "
                 "inventory), or a mapping {lock: PATH, system_site_packages: true|false, "
                 "find_links: [DIR], index_url: URL}.")
        return None
    found = chk.keys(loc, KEYS, "environment")
    if "lock" not in found:
        chk.fail(loc.line, "environment: missing `lock:` (the path of a lock file with == pins, "
                 "relative to the inventory).")
        return None
    path = _lock_path(chk, found["lock"])
    site = found.get("system_site_packages")
    if site is not None and not isinstance(site.value, bool):
        chk.fail(site.line, "environment.system_site_packages must be true or false.")
    links = _find_links(chk, found["find_links"]) if "find_links" in found else ()
    index = found.get("index_url")
    if index is not None and not (isinstance(index.value, str) and _URL_RE.match(index.value)):
        chk.fail(index.line, "environment.index_url must be an http(s):// or file:// URL "
                 "(a package index with the simple API), without spaces or quotes.")
        index = None
    env = _read(chk, found["lock"], path) if path else None
    if env is None:
        return None
    return dataclasses.replace(env, system_site_packages=bool(site and site.value is True),
                               find_links=links or (), index_url=index.value if index else None)


def _lock_path(chk: Checker, loc: Located) -> Optional[Path]:
    value = loc.value
    if not isinstance(value, str) or not value or "\0" in value or "\n" in value:
        chk.fail(loc.line, "environment: the lock must be a path (a string), relative to the "
                 "inventory's directory.")
        return None
    path = chk.path.parent / os.path.expanduser(value)
    found = values.kind(path)
    if found not in ("file", "directory", "missing", "other"):
        chk.fail(loc.line, f"environment: {value!r}: cannot look at it: {found}.")
        return None
    project = uvlock.project_lock(path)
    if project is not None:
        if values.kind(project) != "file":
            chk.fail(loc.line, f"environment: {value!r}: a uv project needs its uv.lock beside "
                     f"pyproject.toml ({project} is missing); run `uv lock` there.")
            return None
        return project.resolve()
    if found != "file":
        chk.fail(loc.line, f"environment: {value!r}: no such file ({path}). The path is "
                 "relative to the inventory's directory.")
        return None
    return path.resolve()


def _find_links(chk: Checker, loc: Located) -> Optional[tuple[str, ...]]:
    items = loc.value if isinstance(loc.value, list) else [loc]
    out = []
    for item in items:
        if not isinstance(item.value, str) or not item.value:
            chk.fail(item.line, "environment.find_links must be a list of directories holding "
                     "wheels, relative to the inventory.")
            return None
        folder = chk.path.parent / os.path.expanduser(item.value)
        if values.kind(folder) != "directory":
            chk.fail(item.line, f"environment.find_links: {item.value!r}: no such directory "
                     f"({folder}).")
            return None
        out.append(str(folder.resolve()))
    return tuple(out)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with comments dropped and `\\` continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole:
            out.append((start, whole))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _read(chk: Checker, loc: Located, path: Path) -> Optional[PythonEnv]:
    where = str(path)
    if path.name == "uv.lock":
        try:
            return uvlock.read(path)
        except uvlock.LockProblem as exc:
            if exc.line:  # the message's place is uv.lock's line
                chk.fail(exc.line, f"{exc}.", where)
            else:
                chk.fail(loc.line, f"environment: the uv project's lock {path}: {exc}.")
            return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        chk.fail(loc.line, f"environment: cannot read the lock {path}: {exc}.")
        return None
    pins: list[Pin] = []
    bad = False
    for number, line in _logical_lines(text):
        pin = _pin(chk, path, number, line)
        if pin is None:
            bad = True
            continue
        twice = next((p for p in pins if p.name == pin.name
                      and (p.marker is None or pin.marker is None)), None)
        if twice is not None:  # two lines with markers may be for different hosts
            chk.fail(number, f"{pin.name} is pinned twice (also on line {twice.line}); keep one, "
                     "or give each line a marker saying which hosts it is for.", where)
            bad = True
            continue
        pins.append(pin)
    if not pins and not bad:
        chk.fail(loc.line, f"environment: the lock {path} pins nothing; {FIX}.")
    if bad or not pins:
        return None
    return PythonEnv(str(path), tuple(sorted(pins, key=lambda p: (p.name, p.line))))


def _pin(chk: Checker, path: Path, number: int, line: str) -> Optional[Pin]:
    where = str(path)
    words = line.split()
    if words[0] in ("-e", "--editable"):
        source = words[1] if len(words) > 1 else "its source"
        chk.fail(number, f"`{line}`: an editable install (pip freeze writes one for `pip install "
                 "-e`, often your own project): clusterrun builds nothing on the hosts. Leave "
                 "the line out where it is the code you launch (launch copies your script's "
                 f"directory to the hosts), or build its wheel (`pip wheel --no-deps {source} -w "
                 "wheels/`) and write `NAME @ file:///ABSOLUTE/PATH/TO/THE.whl` instead.", where)
        return None
    if words[0].startswith("-"):
        chk.fail(number, f"`{words[0]}` options are not read in a lock; name wheel sources in the "
                 "inventory (environment: {lock: ..., find_links: [DIR], index_url: URL}).",
                 where)
        return None
    body, *options = line.split(" --")
    requirement, marker = _split_marker(body)
    if marker and not _marker_ok(chk, where, number, line, marker):
        return None
    hashes = []
    for option in options:
        found = _HASH_RE.match("--" + option.strip())
        if found is None:
            chk.fail(number, f"`--{option.strip()}`: only --hash=sha256:DIGEST may follow a pin.",
                     where)
            return None
        hashes.append(found.group("digest").lower())
    head = requirement.strip()
    match = _PIN_RE.match(head)
    direct = _DIRECT_RE.match(head) if match is None else None
    if direct is not None:
        return _direct(chk, path, number, direct, (tuple(hashes), marker or None))
    if match is None:
        chk.fail(number, f"`{head}` is not pinned: write NAME==VERSION; {FIX}.", where)
        return None
    return Pin(canonical(match.group("name")), match.group("version"), number, tuple(hashes),
               marker or None)


def _split_marker(body: str) -> tuple[str, str]:
    """(requirement, marker). A URL may hold `;`: its marker is the one after a space."""
    if "@" in body:
        found = re.split(r"\s;", body, maxsplit=1)
        return found[0], (found[1] if len(found) > 1 else "").strip()
    requirement, _, marker = body.partition(";")
    return requirement, marker.strip()


def _marker_ok(chk: Checker, where: str, number: int, line: str, marker: str) -> bool:
    from packaging.markers import InvalidMarker, Marker

    try:
        Marker(marker)
    except InvalidMarker as exc:
        chk.fail(number, f"`{line}`: its environment marker does not parse "
                 f"({str(exc).splitlines()[0]}).", where)
        return False
    return True


def _direct(chk: Checker, path: Path, number: int, found: re.Match[str],
            rest: tuple[tuple[str, ...], Optional[str]]) -> Optional[Pin]:
    """`name @ URL` (pip freeze, for a package installed from a file or URL): a wheel taken
    from there on this machine, its hash checked where the line gives one. ``rest``: the
    line's hashes and marker."""
    hashes, marker = rest
    where, name, url = str(path), canonical(found.group("name")), found.group("url")
    address, _, fragment = url.partition("#")
    hashes += tuple(m.group(1).lower() for m in
                    [re.fullmatch(r"sha256=([0-9a-fA-F]{64})", fragment)] if m)
    try:
        parts = urlsplit(address)
    except ValueError as exc:  # `http://[::1/...`: a host part that does not parse
        chk.fail(number, f"`{found.group(0)}`: not a URL ({exc}).", where)
        return None
    scheme, filename = parts.scheme, unquote(parts.path.rsplit("/", 1)[-1])
    if ";" in address and ".whl;" in address:
        chk.fail(number, f"`{found.group(0)}`: a marker after a URL needs a space before its "
                 "`;` (`NAME @ URL ; MARKER`), or it is read as part of the URL.", where)
        return None
    if scheme not in ("file", "http", "https") or not filename.endswith(".whl"):
        chk.fail(number, f"`{found.group(0)}` is not a wheel (a {scheme or 'local'} source): "
                 "clusterrun ships wheels and builds nothing on the hosts. Build its wheel here "
                 f"(`pip wheel --no-deps '{url}' -w wheels/`) and write the line as `{name} @ "
                 "file:///ABSOLUTE/PATH/TO/THE.whl`, or pin it as NAME==VERSION with that "
                 "directory in `find_links:`.", where)
        return None
    fields = filename[:-4].split("-")
    if len(fields) not in (5, 6) or canonical(fields[0]) != name:
        chk.fail(number, f"`{found.group(0)}`: {filename} is not a wheel of {name} (a wheel's "
                 "file name starts with its distribution's name and version).", where)
        return None
    stamp, location = "", address
    if scheme == "file":
        local = Path(unquote(parts.path))
        local = local if local.is_absolute() else path.parent / local
        try:
            st = local.stat()
        except OSError as exc:
            chk.fail(number, f"`{found.group(0)}`: {local}: {exc.strerror or exc}. A file:// "
                     "wheel is read on this machine: put it back, or write the line again "
                     "(pip freeze) where the wheel is.", where)
            return None
        location, stamp = str(local), "" if hashes else f"{st.st_size}:{st.st_mtime_ns}"
    return Pin(name, fields[1], number, hashes, marker,
               (LockedWheel(filename, location, stamp=stamp),))
