"""clusterrun's own programs as they are sent to a host: one piece of Python holding a program
(a file of clusterrun/remote/'s rooms, named by its file name: "run.py", "pyenv.py") and the
clusterrun.remote modules it imports, compiled for interpreters like this one. Built once per
process, and kept under $CLUSTERRUN_HOME by what it was built from, so a command does not
compile ~150 KB of source on every start."""

from __future__ import annotations

import ast
import base64
import contextlib
import functools
import hashlib
import importlib.util
import marshal
import os
import threading
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from clusterrun.home import home

if TYPE_CHECKING:
    from importlib.abc import Traversable

_PACKAGE = "clusterrun.remote"

# Registers the shipped modules under their real names before the program runs (the rooms of
# remote/ as empty packages first), so the programs import them exactly as they do on this
# machine (and tests and linters see plain imports).
# Each piece comes compiled, for a host whose interpreter has this one's bytecode format (the
# same magic number: the same Python minor version), and as source, which any other interpreter
# compiles: compiling the ~30 KB of source is a fifth of a program's start-up on every host.
# Both are compressed and in base64 (a third of the size of a bytes literal's escapes): the
# source is unpacked only where it is compiled, and every host is sent half the bytes.
# A warm session's agent that keeps this program runs it with ``_clusterrun_kept``: each
# piece's code, unpacked there once by these definitions (the agent is sent them: LOADER_DEFS),
# by its packed source (hostlib/warmrun.py).
LOADER_DEFS = b"""import sys, types
import binascii, zlib
try:
    import marshal
    from _frozen_importlib_external import MAGIC_NUMBER as _clusterrun_magic
except ImportError:
    _clusterrun_magic = None
_clusterrun_kept = globals().get("_clusterrun_kept") or {}
def _clusterrun_code(source, magic, code, filename):
    kept = _clusterrun_kept.get(source)
    if kept is not None and kept.co_filename == filename:
        return kept
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
"""
_LOADER = LOADER_DEFS + b"""_clusterrun_module("clusterrun", None)
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
    """Every module of remote/'s rooms by its path there ("hostlib/procs.py"). One listing
    serves the whole build."""
    from importlib import resources  # here: a warm command's start need not load it

    found: dict[str, Traversable] = {}
    for room in resources.files(_PACKAGE).iterdir():
        if room.is_dir() and not room.name.startswith(("_", ".")):
            for item in room.iterdir():
                if item.name.endswith(".py") and item.name != "__init__.py":
                    found[f"{room.name}/{item.name}"] = item
    return found


def program_names() -> list[str]:
    """The file names programs are asked for by: unique across the rooms (tests hold them so)."""
    return sorted(path.rpartition("/")[2] for path in _remote_files())


def _program_path(name: str) -> str:
    """The path in remote/ of the program a caller names by its file name ("run.py")."""
    found = [path for path in _remote_files() if path.rpartition("/")[2] == name]
    if len(found) != 1:
        raise LookupError(f"no one clusterrun.remote program is named {name!r}: {found}")
    return found[0]


def _remote_source(path: str) -> bytes:
    return _remote_files()[path].read_bytes()


def _imported(tree: ast.AST) -> list[str]:
    """The clusterrun.remote modules a module's code imports, as paths in remote/ (the top
    level's first): ``from clusterrun.remote.ROOM import a, b``, ``from
    clusterrun.remote.ROOM.MODULE import name`` and ``import clusterrun.remote.ROOM.MODULE``,
    wherever they stand (in a function too). What the interpreter will import, read from the code as
    mitogen's scan_code_imports does, never from the text's layout."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[:2] != ["clusterrun", "remote"] or len(parts) < 3:
                continue
            if len(parts) == 3:  # from clusterrun.remote.ROOM import a, b: modules of ROOM
                out.extend(f"{parts[2]}/{alias.name}.py" for alias in node.names)
            else:
                out.append("/".join(parts[2:]) + ".py")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["clusterrun", "remote"] and len(parts) > 3:
                    out.append("/".join(parts[2:]) + ".py")
    return out


def _shared_modules(source: bytes, found: Optional[list[str]] = None) -> list[str]:
    """The clusterrun.remote modules ``source`` imports (paths in remote/), dependencies
    first."""
    found = [] if found is None else found
    for path in _imported(ast.parse(source)):
        if path not in found:
            _shared_modules(_remote_source(path), found)
            if path not in found:
                found.append(path)
    return found


# How every built program ends: a kept one that does not was cut short or changed.
_END = b", {'__name__': '__main__'})\n"

_built: dict[str, bytes] = {}
_building = threading.Lock()


def program_source(name: str) -> bytes:
    """A remote program as one piece of Python: itself, or a loader with the shared modules it
    imports (clusterrun/remote/hostlib/hostio.py ...) followed by it. Built once per process (under
    a lock: every host's thread asks at the same moment) and the same bytes for every host."""
    with _building:
        if name not in _built:
            _built[name] = _kept(name)
        return _built[name]


def _kept(name: str) -> bytes:
    """The built program from $CLUSTERRUN_HOME/cache/programs when one was built there from the
    same sources, by the same code and for the same bytecode; else built now and kept."""
    path = _program_path(name)
    # Keyed by every file of remote/, not only those the program imports: finding those parses
    # them (a tenth of a second per start), which is what a kept program spares. A change to
    # any host module builds every program anew once.
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    digest.update(Path(__file__).read_bytes())  # how it is built
    for part in (name.encode(), *(t for p in sorted(_remote_files())
                                  for t in (p.encode(), _remote_source(p)))):
        digest.update(b"%d:" % len(part) + part)
    stem = name.removesuffix(".py")
    file = home() / "cache" / "programs" / f"{stem}-{digest.hexdigest()[:24]}.py"
    with contextlib.suppress(OSError):
        kept = file.read_bytes()
        if kept.startswith(_LOADER) and kept.endswith(_END):  # whole, as _build wrote it
            return kept
    source = _remote_source(path)
    shared = _shared_modules(source)
    if not shared:
        return source
    built = _build(name, source, [(module, _remote_source(module)) for module in shared])
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
    rooms: list[str] = []
    for path, _text in texts:
        room = path.partition("/")[0]
        if room not in rooms:
            rooms.append(room)
            parts.append(b'_clusterrun_module("%s.%s", None)\n' % (
                _PACKAGE.encode(), room.encode()))
    for path, text in texts:
        module = f"{_PACKAGE}.{path.removesuffix('.py').replace('/', '.')}"
        filename = f"<clusterrun {module}>"
        parts.append(b'_clusterrun_module("%s", %s)\n' % (
            module.encode(), _pieces(text, filename)))
    filename = f"<clusterrun {name}>"
    parts.append(b"exec(_clusterrun_code(%s, %s)%s" % (
        _pieces(source, filename), repr(filename).encode(), _END))
    return b"".join(parts)
