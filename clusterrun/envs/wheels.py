"""The controller's wheels: a content-addressed cache under ``$CLUSTERRUN_HOME/wheels/``, filled by
``pip download`` for one host platform at a time.

pip is asked, not reimplemented: it honours this machine's pip configuration (an index, a
find-links directory, certificates, a proxy), takes only wheels (``--only-binary=:all:``) for the
host's platform, never the controller's, and nothing the lock does not name (``--no-deps``).
Layout: ``<sha256>/<file name>`` per wheel, and ``resolved/<key>.json`` per (pin, platform,
sources): which wheel pip chose, so a warm launch asks pip nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from clusterrun.envs import locked
from clusterrun.envs.platforms import Platform
from clusterrun.errors import PreflightError
from clusterrun.inventory.pylock import Pin, PythonEnv, canonical

# uv builds each host's environment; it is a wheel like any other (one static binary inside).
UV = Pin("uv", "0.13.9", 0)
PIP_SECONDS = 1800.0
_MISSING_RE = re.compile(r"No matching distribution found for (\S+)")
# pip: "Package 'newpy' requires a different Python: 3.11.0 not in '>=3.12'"
_PYTHON_RE = re.compile(r"Package '([^']+)' requires a different Python: \S+ not in '([^']*)'")


@dataclass(frozen=True)
class Wheel:
    name: str  # canonical
    version: str  # as its file name says (2.13.0+cpu)
    filename: str
    sha: str
    size: int

    @property
    def item(self) -> dict[str, object]:
        """As the host programs take it."""
        return {"sha": self.sha, "name": self.filename, "size": self.size}

    @property
    def dist(self) -> str:
        return f"{self.name}=={self.version}"


def parse_filename(filename: str) -> tuple[str, str]:
    """(canonical name, version) from a wheel's file name (PEP 427)."""
    parts = filename[:-4].split("-")
    return canonical(parts[0]), parts[1]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, wheel: Wheel) -> Path:
        return self.root / wheel.sha / wheel.filename

    def _key(self, pin: Pin, platform: Platform, env: PythonEnv) -> Path:
        body = json.dumps([pin.requirement, sorted(pin.hashes), platform.key,
                           list(env.find_links), env.index_url]
                          + [[f.location, f.sha, f.stamp] for f in pin.files])
        return self.root / "resolved" / (hashlib.sha256(body.encode()).hexdigest()[:32] + ".json")

    def known(self, pin: Pin, platform: Platform, env: PythonEnv) -> Optional[Wheel]:
        try:
            wheel = Wheel(**json.loads(self._key(pin, platform, env).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return wheel if self.path(wheel).is_file() else None

    def add(self, file: Path, pin: Pin, platform: Platform, env: PythonEnv,
            locked_sha: Optional[str] = None) -> Wheel:
        """A downloaded wheel into the cache (moved, under its sha256), remembered as the answer
        for ``pin`` on ``platform``. ``locked_sha``: the one the lock records for this very
        file."""
        name, version = parse_filename(file.name)
        sha = sha256_of(file)
        if (locked_sha and sha != locked_sha) or (pin.hashes and sha not in pin.hashes):
            raise PreflightError(
                f"{file.name}'s sha256 ({sha}) is not one the lock ({env.lock}, line "
                f"{pin.line}) allows for {pin.requirement}, so no host was sent it. Either the "
                "lock's --hash is wrong (write the lock again: `pip-compile --generate-hashes`, "
                "`uv pip compile --generate-hashes`, `uv lock`) or the wheel that find_links: "
                "or the index holds is not the one locked; replace it.")
        wheel = Wheel(name, version, file.name, sha, file.stat().st_size)
        target = self.path(wheel)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)
        key = self._key(pin, platform, env)
        key.parent.mkdir(parents=True, exist_ok=True)
        tmp = key.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(wheel)))
        os.replace(tmp, key)
        return wheel


def for_platform(env: PythonEnv, platform: Platform) -> list[Pin]:
    """The lock's pins for the hosts of ``platform`` (their markers hold there), uv's last."""
    pins = env.pins_for(platform.markers())
    seen: dict[str, Pin] = {}
    for pin in pins:
        if pin.name in seen:  # two lines whose markers both hold: the lock is not one list here
            first = seen[pin.name]
            raise PreflightError(
                f"{env.lock}: lines {first.line} ({first.shown}) and {pin.line} ({pin.shown}) "
                f"both apply to Python {platform.full or platform.python} on {platform.machine}; "
                "make their markers exclusive, so that each host gets one version.")
        seen[pin.name] = pin
    return [*pins, UV]


def resolve(cache: Cache, env: PythonEnv, platform: Platform, hosts: Sequence[str]) -> list[Wheel]:
    """The lock's wheels for ``platform``, and uv's last: from the cache, else from where the
    lock says (envs/locked.py), else from pip."""
    pins = for_platform(env, platform)
    found = {p.name: cache.known(p, platform, env) for p in pins}
    # Why a wheel the lock locates could not be taken from there, and what fixes that.
    tried: dict[str, tuple[str, str]] = {}
    for pin in pins:
        if found[pin.name] is None and pin.files:
            found[pin.name] = _from_lock(cache, env, platform, pin, tried)
    missing = [p for p in pins if found[p.name] is None]
    if missing:
        found.update(_download(cache, env, platform, missing, hosts=hosts, tried=tried))
    return [w for w in found.values() if w is not None]


def cached(cache: Cache, env: PythonEnv, platform: Platform) -> Optional[list[Wheel]]:
    """The lock's wheels for ``platform`` as ``resolve`` gives them, from the cache alone: None
    where pip would have to be asked."""
    try:
        found = [cache.known(p, platform, env) for p in for_platform(env, platform)]
    except PreflightError:  # said by the sync, which asks resolve
        return None
    return None if any(w is None for w in found) else [w for w in found if w is not None]


def _from_lock(cache: Cache, env: PythonEnv, platform: Platform, pin: Pin,
               tried: dict[str, tuple[str, str]]) -> Optional[Wheel]:
    """``pin``'s wheel from where the lock says, into the cache; None (the reason in ``tried``)
    where the lock lists none for the platform or it cannot be taken from there."""
    wheel = locked.choose(pin, platform)
    if wheel is None:
        tried[pin.name] = (f"the lock has wheels of it only for other platforms "
                           f"({locked.listed(pin)})", "")
        return None
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".take-", dir=cache.root) as folder:
        try:
            file = locked.take(wheel, env.find_links, Path(folder))
        except locked.Unavailable as exc:
            tried[pin.name] = (str(exc), exc.fix)
            return None
        return cache.add(file, pin, platform, env, wheel.sha)


def _download(cache: Cache, env: PythonEnv, platform: Platform, pins: list[Pin], *,
              hosts: Sequence[str], tried: dict[str, tuple[str, str]]) -> dict[str, Wheel]:
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache.root) as folder:
        reqs = Path(folder) / "requirements.txt"
        reqs.write_text("".join(f"{p.requirement}\n" for p in pins))
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                *platform.pip_args(), "-d", folder, "-r", str(reqs)]
        for link in env.find_links:
            argv += ["--find-links", link]
        if env.index_url:
            argv += ["--index-url", env.index_url]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_SECONDS,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PreflightError(f"pip download could not run here ({exc}); clusterrun gathers "
                                 "the hosts' wheels with this Python's pip.") from None
        files = {parse_filename(f.name)[0]: f for f in Path(folder).glob("*.whl")}
        absent = [p for p in pins if p.name not in files]
        if proc.returncode != 0 or absent:
            raise PreflightError(_no_wheel(env, platform, pins, absent, said=proc.stderr,
                                           hosts=hosts, tried=tried))
        return {p.name: cache.add(files[p.name], p, platform, env) for p in pins}


def _no_wheel(env: PythonEnv, platform: Platform, pins: list[Pin], absent: list[Pin], *,
              said: str, hosts: Sequence[str], tried: dict[str, tuple[str, str]]) -> str:
    hosts_text = ", ".join(hosts[:4]) + (" ..." if len(hosts) > 4 else "")
    python = _PYTHON_RE.search(said)
    if python:  # a wheel for the platform, whose Requires-Python excludes the hosts' Python
        pin = next((p for p in pins if p.name == canonical(python.group(1))), None)
        which = pin.requirement if pin else python.group(1)
        return (f"{which}{_where(env, pin)} needs Python {python.group(2)}, and {hosts_text} "
                f"run{'s' if len(hosts) == 1 else ''} Python {platform.python}: point their "
                f"`python:` at an interpreter it allows, or lock a version of "
                f"{pin.name if pin else which} that supports Python {platform.python}.")
    named = _MISSING_RE.search(said)
    which = named.group(1).strip("'\"") if named else (absent[0].requirement if absent else None)
    pin = next((p for p in pins if which and p.requirement == which), None)
    if pin is not None and pin.name == UV.name:
        return _no_uv(env, platform, hosts_text)
    where = _where(env, pin)
    if pin is not None and pin.name in tried:  # the lock's own place first: its reason
        reason, fix = tried[pin.name]
        return (f"{pin.requirement}{where}, for {hosts_text} ({platform.label}): {reason}. "
                + (f"{fix} " if fix else "") + "(pip, asked next, found no wheel of it "
                "either; a directory holding one in the inventory's `environment: {lock: ..., "
                "find_links: [DIR]}` serves too.)")
    if which:
        head = (f"no wheel of {which}{where} for Python {platform.python} on {platform.label}, "
                f"the platform of {hosts_text}")
        others = _other_platforms(env, pin) if pin else []
        if others:
            head += (f" (find_links holds only {', '.join(others[:3])}, for another Python or "
                     "platform)")
    else:
        head = f"pip could not gather the wheels for {platform.label} ({hosts_text})"
    tail = " | ".join(line.strip() for line in said.strip().splitlines()[-3:])
    return (f"{head}. Put a directory holding one in the inventory's `environment: "
            f"{{lock: ..., find_links: [DIR]}}` (or give an index_url: that has it)"
            + (f"; pip said: {tail}" if tail and not named else "") + ".")


def _where(env: PythonEnv, pin: Optional[Pin]) -> str:
    return f" ({env.lock}, line {pin.line})" if pin and pin.line else ""


def _other_platforms(env: PythonEnv, pin: Pin) -> list[str]:
    """The wheels of ``pin`` in the inventory's find_links, which pip passed over."""
    found = []
    for folder in env.find_links:
        for path in sorted(Path(folder).glob("*.whl")):
            name, version = parse_filename(path.name)
            if name == pin.name and version == pin.version:
                found.append(path.name)
    return found


def _no_uv(env: PythonEnv, platform: Platform, hosts_text: str) -> str:
    """uv is no pin of the lock: it is clusterrun's own builder, gathered like the lock's."""
    return (f"no wheel of uv=={UV.version} for {platform.machine} ({platform.label}), the "
            f"platform of {hosts_text}: uv is what clusterrun builds each host's environment "
            f"with, shipped to the hosts as a wheel like the lock's. Put uv {UV.version}'s "
            f"wheel for {platform.machine} (uv-{UV.version}-py3-none-manylinux_..."
            f"_{platform.machine}.whl, from PyPI) in a directory named in the inventory's "
            "`environment: {lock: ..., find_links: [DIR]}`"
            + (f" (now {', '.join(env.find_links)})" if env.find_links else "") + ".")
