"""A uv project (`pyproject.toml` + `uv.lock`) as `environment:`'s lock: the pins every host
builds, read on the controller from uv.lock itself (no uv needed here).

uv.lock is universal: it holds every distribution any platform may need, with markers on the
dependency edges. The hosts build one marker-free list, so the project's dependencies are walked
from the project (or the workspace's members), every edge's marker evaluated for a Linux CPython
host: an edge that is true (or false) for every Python the lock allows and both x86_64 and
aarch64 is kept (or dropped); one that depends on the hosts' Python version or CPU is refused,
naming the package, since every host builds the same lock. What is installed matches `uv sync
--frozen --no-dev --no-install-project`: the project's own code is what clusterrun copies to the
hosts, not a package; its extras and dependency groups are left out. Each pin keeps the sha256s
uv.lock records for its wheels, so the wheel pip gathers for a host must be one uv locked.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from clusterrun.inventory.pylock import Pin, PythonEnv, canonical

# The Linux CPython hosts a marker is evaluated for (platform_machine x python_version).
MACHINES = ("x86_64", "aarch64")
PYTHONS = tuple(f"3.{minor}" for minor in range(8, 16))


class LockProblem(Exception):
    """uv.lock cannot be the hosts' one lock; the message says why and what to do, ``line`` is
    uv.lock's line it is about (0: the file)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


def _toml(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - older controllers: the same parser, from PyPI
        import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
    except ValueError as exc:
        raise LockProblem(f"not valid TOML ({exc})") from None
    except RecursionError:  # tomllib parses nested arrays by recursion: `x = [[[[...`
        raise LockProblem("not valid TOML (values nested too deeply)") from None


def _markers() -> Any:
    from packaging import markers, specifiers

    return markers, specifiers


def project_lock(path: Path) -> Optional[Path]:
    """uv.lock for ``path`` when it names a uv project (its pyproject.toml, its uv.lock or its
    directory); None for anything else (a requirements file)."""
    folder = path if path.is_dir() else path.parent
    if path.is_dir() or path.name in ("pyproject.toml", "uv.lock"):
        return folder / "uv.lock"
    return None


def _lines(text: str) -> dict[str, int]:
    """Each package's line in uv.lock (its ``name = ...`` under ``[[package]]``), for messages."""
    found: dict[str, int] = {}
    in_package = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("["):
            in_package = line.strip() == "[[package]]"
        match = re.match(r'^name\s*=\s*"([^"]+)"', line)
        if in_package and match:
            found.setdefault(canonical(match.group(1)), number)
    return found


class _Graph:
    def __init__(self, data: dict[str, Any], lines: dict[str, int]) -> None:
        self.lines = lines
        self.packages: dict[str, list[dict[str, Any]]] = {}
        for package in data.get("package") or []:
            self.packages.setdefault(canonical(str(package.get("name"))), []).append(package)
        markers, specifiers = _markers()
        self.marker_type = markers.Marker
        requires = str(data.get("requires-python") or "")
        allowed = specifiers.SpecifierSet(requires) if requires else None
        self.pythons = [p for p in PYTHONS if allowed is None or allowed.contains(f"{p}.0")]
        if not self.pythons:
            raise LockProblem(f"its requires-python ({requires}) allows no CPython 3.8 to 3.15")

    def _hosts(self) -> Iterator[dict[str, str]]:
        for python in self.pythons:
            for machine in MACHINES:
                yield {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                       "platform_machine": machine, "python_version": python,
                       "python_full_version": f"{python}.0", "implementation_name": "cpython",
                       "platform_python_implementation": "CPython", "extra": ""}

    def wanted(self, edge: dict[str, Any], owner: str) -> bool:
        """Whether the dependency ``edge`` of ``owner`` holds on every Linux host (True), on
        none (False); refused when it depends on the host."""
        text = edge.get("marker")
        if not text:
            return True
        marker = self.marker_type(text)
        answers = {marker.evaluate(host) for host in self._hosts()}
        if len(answers) == 1:
            return bool(answers.pop())
        name = canonical(str(edge.get("name")))
        raise LockProblem(
            f"{owner} needs {name} only where `{text}`: that depends on the hosts' Python "
            "version or CPU, and every host builds the same lock. Narrow the project's "
            "requires-python (and `[tool.uv] environments`) to the hosts' one Python and "
            "`uv lock` again", self.lines.get(name, 0))

    def package(self, edge: dict[str, Any]) -> dict[str, Any]:
        name = canonical(str(edge.get("name")))
        choices = self.packages.get(name) or []
        if edge.get("version"):
            choices = [p for p in choices if p.get("version") == edge["version"]] or choices
        if len(choices) != 1:
            raise LockProblem(
                f"{name} is locked at {len(choices) or 'no'} version"
                f"{'' if len(choices) == 1 else 's'} without saying which the hosts need; "
                "narrow the project's requires-python to the hosts' one Python and `uv lock` "
                "again", self.lines.get(name, 0))
        return choices[0]


def _roots(graph: _Graph, data: dict[str, Any]) -> list[dict[str, Any]]:
    members = {canonical(str(m)) for m in (data.get("manifest") or {}).get("members") or []}
    roots = []
    for versions in graph.packages.values():
        for package in versions:
            source = package.get("source") or {}
            local = source.get("editable") or source.get("virtual") or source.get("directory")
            if canonical(str(package.get("name"))) in members or local == ".":
                roots.append(package)
    if not roots:
        raise LockProblem("it names no project (a package whose source is the project's own "
                          "directory); is it the uv.lock of a `uv init` project?")
    return roots


def _pin(graph: _Graph, package: dict[str, Any]) -> Pin:
    name = canonical(str(package.get("name")))
    line = graph.lines.get(name, 0)
    source = package.get("source") or {}
    wheels = package.get("wheels") or []
    if "registry" not in source and not str(source.get("path", "")).endswith(".whl"):
        kind = next(iter(source), "unknown")
        raise LockProblem(f"{name} comes from a {kind} source, not a wheel: build its wheel, "
                          "put it in a directory named in `find_links:` and lock it from there",
                          line)
    if not package.get("version"):
        raise LockProblem(f"{name} has no version in the lock", line)
    hashes = tuple(sorted({str(w["hash"]).split(":", 1)[1].lower() for w in wheels
                           if str(w.get("hash", "")).startswith("sha256:")}))
    return Pin(name, str(package["version"]), line, hashes)


def read(path: Path) -> PythonEnv:
    """The project's pins from ``path`` (its uv.lock), or LockProblem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockProblem(f"cannot read it ({exc}); run `uv lock` in the project") from None
    data = _toml(text)
    try:
        return _pins(path, data, _Graph(data, _lines(text)))
    # uv writes uv.lock; one edited by hand or cut short may hold any TOML value anywhere (a
    # number for a table, a marker that does not parse), met as one of these by the code below.
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise LockProblem(f"it is not a uv.lock as uv writes it ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); run `uv lock` in "
                          "the project to write it again") from None


def _pins(path: Path, data: dict[str, Any], graph: _Graph) -> PythonEnv:
    roots = _roots(graph, data)
    root_names = {canonical(str(r.get("name"))) for r in roots}
    pins: dict[str, Pin] = {}
    followed: set[tuple[str, str]] = set()  # (package, extra): an extra's edges walked once
    todo: list[tuple[dict[str, Any], str]] = [
        (edge, str(root.get("name"))) for root in roots for edge in root.get("dependencies") or []]
    while todo:
        edge, owner = todo.pop()
        if not graph.wanted(edge, owner):
            continue
        package = graph.package(edge)
        name = canonical(str(package.get("name")))
        extras = [canonical(str(e)) for e in edge.get("extra") or []]
        optional = package.get("optional-dependencies") or {}
        more = [e for extra in extras if (name, extra) not in followed
                for e in optional.get(extra) or []]
        followed.update((name, extra) for extra in extras)
        if name not in root_names and name not in pins:
            pins[name] = _pin(graph, package)
            more += package.get("dependencies") or []
        todo.extend((e, name) for e in more)
    if not pins:
        raise LockProblem("the project depends on nothing; add its dependencies (`uv add "
                          "torch`) first")
    return PythonEnv(str(path), tuple(sorted(pins.values(), key=lambda p: p.name)),
                     requires_python=str(data.get("requires-python") or "") or None)
