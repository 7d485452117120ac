"""clusterrun's own programs as they are sent to a host: one piece of Python holding a program
(clusterrun/remote/*.py) and the shared modules it imports, compiled for interpreters like this
one. Built once per process, and kept under $CLUSTERRUN_HOME by what it was built from, so a
command does not compile ~150 KB of source on every start."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.util
import marshal
import os
import re
import threading
import zlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from clusterrun.home import home

if TYPE_CHECKING:
    from importlib.abc import Traversable

# A remote program's `from clusterrun.remote import a, b` (or the same in parentheses over
# several lines): modules shipped along with it.
_SHARED = re.compile(rb"^from clusterrun\.remote import (?:\(([\w,\s]+)\)|([\w, ]+)$)", re.M)

# Registers the shipped modules under their real names before the program runs, so the programs
# import them exactly as they do on this machine (and tests and linters see plain imports).
# Each piece comes compiled, for a host whose interpreter has this one's bytecode format (the
# same magic number: the same Python minor version), and as source, which any other interpreter
# compiles: compiling the ~30 KB of source is a fifth of a program's start-up on every host.
# Both are compressed and in base64 (a third of the size of a bytes literal's escapes): the
# source is unpacked only where it is compiled, and every host is sent half the bytes.
_LOADER = b"""import sys, types
import binascii, zlib
try:
    import marshal
    from _frozen_importlib_external import MAGIC_NUMBER as _clusterrun_magic
except ImportError:
    _clusterrun_magic = None
def _clusterrun_code(source, magic, code, filename):
    if code is not None and magic == _clusterrun_magic:
        try:
            return marshal.loads(zlib.decompress(binascii.a2b_base64(code)))
        except (ValueError, EOFError, TypeError, zlib.error, binascii.Error):
            pass
    return compile(zlib.decompress(binascii.a2b_base64(source)), filename, "exec")
def _clusterrun_module(name, source, magic=None, code=None):
    mod = types.ModuleType(name)
    mod.__file__ = "<clusterrun %s>" % name
    if source is None:
        mod.__path__ = []
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    if source is not None:
        exec(_clusterrun_code(source, magic, code, mod.__file__), mod.__dict__)
_clusterrun_module("clusterrun", None)
_clusterrun_module("clusterrun.remote", None)
"""


def _packed(data: bytes) -> bytes:
    """``data`` compressed, in base64, as a Python string literal (see _LOADER)."""
    return b"%r" % base64.b64encode(zlib.compress(data, 9)).decode()


def _pieces(source: bytes, filename: str) -> bytes:
    """``source, magic, code`` for the loader: the source and this interpreter's bytecode of
    it (marshalled), each packed."""
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    return b"%s, %r, %s" % (_packed(source), importlib.util.MAGIC_NUMBER,
                            _packed(marshal.dumps(code)))


@functools.lru_cache(maxsize=1)
def _remote_files() -> dict[str, Traversable]:
    # clusterrun.remote is a namespace package: its files() is a MultiplexedPath, which lists
    # the folder again on every joinpath. One listing serves the whole build.
    return {item.name: item for item in resources.files("clusterrun.remote").iterdir()}


def _remote_source(name: str) -> bytes:
    return _remote_files()[name].read_bytes()


def _shared_modules(source: bytes, found: Optional[list[str]] = None) -> list[str]:
    """The clusterrun.remote modules ``source`` imports, dependencies first."""
    found = [] if found is None else found
    for match in _SHARED.finditer(source):
        names = (match.group(1) or match.group(2)).decode()
        for module in "".join(names.split()).split(","):
            if module and module not in found:
                _shared_modules(_remote_source(f"{module}.py"), found)
                if module not in found:
                    found.append(module)
    return found


# How every built program ends: a kept one that does not was cut short or changed.
_END = b", {'__name__': '__main__'})\n"

_built: dict[str, bytes] = {}
_building = threading.Lock()


def program_source(name: str) -> bytes:
    """A remote program as one piece of Python: itself, or a loader with the shared modules it
    imports (clusterrun/remote/common.py ...) followed by it. Built once per process (under a
    lock: every host's thread asks at the same moment) and the same bytes for every host."""
    with _building:
        if name not in _built:
            _built[name] = _kept(name)
        return _built[name]


def _kept(name: str) -> bytes:
    """The built program from $CLUSTERRUN_HOME/cache/programs when one was built there from the
    same sources, by the same code and for the same bytecode; else built now and kept."""
    source = _remote_source(name)
    shared = _shared_modules(source)
    if not shared:
        return source
    texts = [(module, _remote_source(f"{module}.py")) for module in shared]
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    digest.update(Path(__file__).read_bytes())  # how it is built
    for part in (name.encode(), source, *(t for m, t in texts for t in (m.encode(), t))):
        digest.update(b"%d:" % len(part) + part)
    stem = name.removesuffix(".py")
    file = home() / "cache" / "programs" / f"{stem}-{digest.hexdigest()[:24]}.py"
    with contextlib.suppress(OSError):
        kept = file.read_bytes()
        if kept.startswith(_LOADER) and kept.endswith(_END):  # whole, as _build wrote it
            return kept
    built = _build(name, source, texts)
    _keep(file, stem, built)
    return built


def _keep(file: Path, stem: str, built: bytes) -> None:
    # Only a shortcut: a home that cannot be written costs the build next time, nothing else.
    # Written whole and renamed, so a command reading it meanwhile sees all of it or none.
    temporary = file.with_name(f".{file.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary.write_bytes(built)
        os.replace(temporary, file)
        for old in file.parent.glob(f"{stem}-*.py"):  # built from an earlier clusterrun
            if old != file:
                old.unlink(missing_ok=True)
    except OSError:  # a full disk: no half-written file is left behind
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def _build(name: str, source: bytes, texts: list[tuple[str, bytes]]) -> bytes:
    parts = [_LOADER]
    for module, text in texts:
        filename = f"<clusterrun clusterrun.remote.{module}>"
        parts.append(b'_clusterrun_module("clusterrun.remote.%s", %s)\n' % (
            module.encode(), _pieces(text, filename)))
    filename = f"<clusterrun {name}>"
    parts.append(b"exec(_clusterrun_code(%s, %r)%s" % (
        _pieces(source, filename), filename.encode(), _END))
    return b"".join(parts)
