"""How a run's journal masks secrets in everything it writes and hands to its `--notify` hook:
every ``NAME=value`` whose name is a secret's (plan/secrets.py), and every value of a secret
variable the launch passed to the ranks (`--env HF_TOKEN=...`), wherever it appears.

The values must be known to every process that writes for the run (the attached launch, the
watcher a detached launch leaves, a later `ps`/`logs`/`stop`, `stacks --profile`), and yet no
file of the run may hold them (a run folder is read, copied and attached to bug reports). So
the launch keeps, in the run's private folder (``masks.json``, 0600), only keyed digests of the
values and their lengths; a writer finds a value in a text by the digest of each stretch of the
text that long. The launch masks with the same digests, so every writer masks alike.

The key is kept apart from the run, under ``$CLUSTERRUN_HOME/keys/<run id>`` (0600): with the
key, anyone holding the digests could test guesses offline, and a run folder is what gets
copied. A copied run folder masks only ``SECRET_NAME=value`` where the key is not. A run made
before the key moved keeps it in masks.json, and is read as it is.

Values shorter than ``MIN_LENGTH`` are not masked as values (they would mask ordinary words
everywhere); only as ``SECRET_NAME=value``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from clusterrun.plan.secrets import MASK, is_secret
from clusterrun.runs import store
from clusterrun.runs.store import RunDir

FILE = "masks.json"
KEYS = "keys"  # under $CLUSTERRUN_HOME, beside runs/: one key file per run
MIN_LENGTH = 4  # shorter values would mask ordinary words

_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)(\s*[=:]\s*)(\S+)")

J = TypeVar("J")


def _digest(key: bytes, text: str) -> str:
    return hashlib.blake2b(text.encode(), key=key, digest_size=16).hexdigest()


def assignments(text: str) -> str:
    """``text`` with the value of every ``SECRET_NAME=value`` (or ``: value``) masked."""
    return _ASSIGNMENT.sub(
        lambda m: m.group(1) + m.group(2) + (MASK if is_secret(m.group(1)) else m.group(3)),
        text)


@dataclass(frozen=True)
class Masks:
    """The secret values of one run, as keyed digests per length."""

    key: bytes = b""
    digests: dict[int, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Iterable[str]) -> Masks:
        """From the values themselves (the launch, which has them)."""
        key = os.urandom(16)
        by_length: dict[int, set[str]] = {}
        for value in values:
            if len(value) >= MIN_LENGTH:
                by_length.setdefault(len(value), set()).add(_digest(key, value))
        return cls(key, {n: frozenset(d) for n, d in by_length.items()})

    @classmethod
    def of_env(cls, env: Iterable[tuple[str, str]]) -> Masks:
        """The values of the secret variables among ``env`` (name, value pairs)."""
        return cls.of(v for k, v in env if is_secret(k) and v)

    def text(self, text: str) -> str:
        """``text`` with every known value and every ``SECRET_NAME=value`` masked."""
        if self.digests:
            text = self._values(text)
        return assignments(text)

    def json(self, obj: J) -> J:
        """A JSON value with every string in it masked (keys are clusterrun's own)."""
        if isinstance(obj, str):
            return self.text(obj)  # type: ignore[return-value]
        if isinstance(obj, dict):
            return {k: self.json(v) for k, v in obj.items()}  # type: ignore[return-value]
        if isinstance(obj, list):
            return [self.json(v) for v in obj]  # type: ignore[return-value]
        return obj

    def _values(self, text: str) -> str:
        lengths = sorted((n for n in self.digests if n <= len(text)), reverse=True)
        out: list[str] = []
        i = plain = 0
        while i < len(text):
            for n in lengths:  # the longest value first: one that holds another is masked whole
                if i + n <= len(text) and _digest(self.key, text[i:i + n]) in self.digests[n]:
                    out.append(text[plain:i] + MASK)
                    i = plain = i + n
                    break
            else:
                i += 1
        return "".join(out) + text[plain:] if out else text

    # -- kept in the run's folder, the key apart --------------------------------------------

    def save(self, run: RunDir) -> None:
        if self.digests:
            _save_key(run, self.key)  # first: digests without their key mask nothing
            store.write_json(run.file(FILE), {
                "digests": {str(n): sorted(d) for n, d in sorted(self.digests.items())}})

    @classmethod
    def load(cls, run: RunDir) -> Masks:
        """The run's masks; none for a run without secrets (or from before they were kept),
        nor for a run folder whose key is not in this $CLUSTERRUN_HOME (a copied one)."""
        found = store.read_json(run.file(FILE))
        if not isinstance(found, dict):
            return cls()
        try:
            kept = found.get("key")  # a run from before the key moved out of its folder
            key = bytes.fromhex(str(kept)) if kept is not None else _load_key(run)
            if not key:
                return cls()
            return cls(key, {int(n): frozenset(str(x) for x in d)
                             for n, d in dict(found["digests"]).items()})
        except (KeyError, TypeError, ValueError):
            return cls()


def key_path(run: RunDir) -> Path:
    """Where a run's key is kept: ``$CLUSTERRUN_HOME/keys/<run id>``, outside its folder."""
    return run.path.parent.parent / KEYS / run.path.name


def _save_key(run: RunDir, key: bytes) -> None:
    """Written whole under a temporary name and moved into place: a reader never sees a part."""
    path = key_path(run)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path.parent, 0o700)  # whatever the umask made of it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = store.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(fd, key.hex().encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _load_key(run: RunDir) -> bytes:
    try:
        fd = store.open_private(key_path(run), os.O_RDONLY)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        return bytes.fromhex(handle.read(256).decode("ascii", "replace").strip())
