"""A uv project (`pyproject.toml` + `uv.lock`) as `environment:`'s lock: the pins every host
builds, read on the controller from uv.lock itself (no uv needed here).

uv.lock is universal: it holds every distribution any platform may need, with markers on the
dependency edges. The project's dependencies are walked from the project (or the workspace's
members) once for each Linux CPython host the lock allows (every Python version it allows, on
x86_64 and on aarch64), every edge's marker evaluated there, as `uv sync` does on that host. A
distribution every such host needs is a plain pin; one that only some need (a backport for older
Pythons, a version per Python, a CPU's own package) is a pin with a marker naming those hosts,
evaluated for each real host's platform when its wheels are gathered (envs/wheels.py). Markers
are evaluated at each Python's .0 release: a marker on the micro version (`python_full_version
< '3.11.4'`) is read as its minor version's.

What is installed matches `uv sync --frozen --no-dev --no-install-project`: the project's own
code is what clusterrun copies to the hosts, not a package; its extras and dependency groups,
and the workspace's members themselves, are left out. Each pin keeps the sha256s uv.lock records
and where the lock says its wheels are (its `registry`, `path` or `url` source, resolved against
the project's directory, and the index's name in pyproject.toml for its credentials): they are
fetched from there, on this machine (envs/locked.py). A git, directory or editable source is a
package uv builds from source; clusterrun builds nothing, and refuses it with the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional
from urllib.parse import unquote, urlsplit

from clusterrun.inventory.pylock import LockedWheel, Pin, PythonEnv, canonical

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
        self._parsed: dict[str, Any] = {}
        requires = str(data.get("requires-python") or "")
        allowed = specifiers.SpecifierSet(requires) if requires else None
        self.pythons = [p for p in PYTHONS if allowed is None or allowed.contains(f"{p}.0")]
        if not self.pythons:
            raise LockProblem(f"its requires-python ({requires}) allows no CPython 3.8 to 3.15")

    def hosts(self) -> Iterator[dict[str, str]]:
        """The marker values of every Linux CPython host the lock allows."""
        for python in self.pythons:
            for machine in MACHINES:
                yield {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                       "platform_machine": machine, "python_version": python,
                       "python_full_version": f"{python}.0", "implementation_name": "cpython",
                       "platform_python_implementation": "CPython", "extra": ""}

    def holds(self, edge: dict[str, Any], host: dict[str, str]) -> bool:
        """Whether the dependency ``edge`` is needed on ``host``."""
        text = edge.get("marker")
        if not text:
            return True
        marker = self._parsed.get(text)
        if marker is None:
            marker = self._parsed[text] = self.marker_type(text)
        return bool(marker.evaluate(host))

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


class _Sources:
    """Where uv.lock's wheels are, on this machine: paths resolved against the project's
    directory, and the indexes pyproject.toml names (for their credentials)."""

    def __init__(self, project: Path) -> None:
        self.project = project
        self.indexes: dict[str, str] = {}  # an index's URL (no trailing /) -> its name
        try:
            tool = _toml((project / "pyproject.toml").read_text(encoding="utf-8")).get("tool")
        except (OSError, UnicodeDecodeError, LockProblem):
            tool = None  # the lock says all that is built; the names only find credentials
        for index in ((tool or {}).get("uv") or {}).get("index") or []:
            if isinstance(index, dict) and index.get("name") and index.get("url"):
                self.indexes[str(index["url"]).rstrip("/")] = str(index["name"])

    def place(self, where: str) -> str:
        """A lock's path or file:// URL as an absolute path here; an http(s) URL as it is."""
        if where.startswith("file:"):
            where = unquote(urlsplit(where).path)
        elif re.match(r"^https?://", where):
            return where
        return str((self.project / where).resolve())

    def wheels(self, name: str, source: dict[str, Any],
               listed: list[dict[str, Any]]) -> tuple[LockedWheel, ...]:
        registry = str(source.get("registry") or "")
        remote = registry if re.match(r"^https?://", registry) else None
        out = []
        for wheel in listed:
            recorded = str(wheel.get("hash", ""))
            sha = recorded.split(":", 1)[1].lower() if recorded.startswith("sha256:") else None
            if wheel.get("url"):
                location = self.place(str(wheel["url"]))
            elif wheel.get("path") and registry and not remote:  # a flat index, a find-links dir
                location = self.place(str(Path(self.place(registry)) / str(wheel["path"])))
            elif source.get("path"):  # `{ path = "x.whl" }` in [tool.uv.sources]
                location = self.place(str(source["path"]))
            else:
                continue
            # A URL's name is its path's last part (a signed URL's query is not part of it).
            filename = (unquote(urlsplit(location).path.rsplit("/", 1)[-1])
                        if re.match(r"^https?://", location) else os.path.basename(location))
            stamp = ""
            if sha is None and not location.startswith(("http://", "https://")):
                with contextlib.suppress(OSError):
                    st = os.stat(location)
                    stamp = f"{st.st_size}:{st.st_mtime_ns}"
            out.append(LockedWheel(filename, location, sha, remote,
                                   self.indexes.get(registry.rstrip("/")) if remote else None,
                                   stamp))
        return tuple(out)


def _pin(graph: _Graph, package: dict[str, Any], sources: _Sources) -> Pin:
    name = canonical(str(package.get("name")))
    line = graph.lines.get(name, 0)
    source = package.get("source") or {}
    wheels = package.get("wheels") or []
    if "git" in source:
        raise LockProblem(
            f"{name} comes from git ({source['git']}): uv builds it from source, and clusterrun "
            "ships wheels and builds nothing on the hosts. Build its wheel here (`uv build "
            "--wheel` in a checkout of it, or `pip wheel --no-deps git+URL -w wheels/`), point "
            f"`[tool.uv.sources]` at the file ({name} = {{ path = \"wheels/FILE.whl\" }}) and "
            "`uv lock` again", line)
    archive = str(source.get("path") or source.get("url") or "")
    if "registry" not in source and not archive.endswith(".whl"):
        kind = next(iter(source), "unknown")
        raise LockProblem(
            f"{name} comes from a {kind} source ({source.get(kind)}), not a wheel: uv builds it "
            "from source, and clusterrun builds nothing on the hosts. Build its wheel here "
            "(`uv build --wheel` in its directory), point `[tool.uv.sources]` at the file "
            f"({name} = {{ path = \"wheels/FILE.whl\" }}) and `uv lock` again; or put that "
            "directory in `find_links:` and lock it from there", line)
    if not package.get("version"):
        raise LockProblem(f"{name} has no version in the lock", line)
    hashes = tuple(sorted({str(w["hash"]).split(":", 1)[1].lower() for w in wheels
                           if str(w.get("hash", "")).startswith("sha256:")}))
    return Pin(name, str(package["version"]), line, hashes,
               files=sources.wheels(name, source, wheels))


def _condition(hosts: set[tuple[str, str]], pythons: list[str]) -> Optional[str]:
    """A marker that holds on ``hosts`` (python, machine) among every host the lock allows;
    None where they are all of them."""
    if hosts == {(p, m) for p in pythons for m in MACHINES}:
        return None

    def among(versions: list[str]) -> str:
        if versions == pythons:
            return ""
        return " or ".join(f"python_version == '{v}'" for v in versions)

    by_machine = {m: [p for p in pythons if (p, m) in hosts] for m in MACHINES}
    if len({tuple(v) for v in by_machine.values()}) == 1:
        return among(by_machine[MACHINES[0]])
    parts = []
    for machine, versions in by_machine.items():
        if versions:
            clause = among(versions)
            parts.append(f"platform_machine == '{machine}'" if not clause
                         else f"(platform_machine == '{machine}' and ({clause}))")
    return " or ".join(parts)


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


def _walk(graph: _Graph, roots: list[dict[str, Any]],
          host: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Every package ``host`` needs, by (name, version): the roots' dependencies, and their
    extras' as the edges ask, as far as they go."""
    root_names = {canonical(str(r.get("name"))) for r in roots}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    followed: set[tuple[str, str]] = set()  # (package, extra): an extra's edges walked once
    todo: list[dict[str, Any]] = [edge for root in roots for edge in root.get("dependencies")
                                  or []]
    while todo:
        edge = todo.pop()
        if not graph.holds(edge, host):
            continue
        package = graph.package(edge)
        name = canonical(str(package.get("name")))
        key = (name, str(package.get("version")))
        extras = [canonical(str(e)) for e in edge.get("extra") or []]
        optional = package.get("optional-dependencies") or {}
        more = [e for extra in extras if (name, extra) not in followed
                for e in optional.get(extra) or []]
        followed.update((name, extra) for extra in extras)
        if name not in root_names and key not in found:
            found[key] = package
            more += package.get("dependencies") or []
        todo.extend(more)
    return found


def _pins(path: Path, data: dict[str, Any], graph: _Graph) -> PythonEnv:
    roots = _roots(graph, data)
    needed: dict[tuple[str, str], tuple[dict[str, Any], set[tuple[str, str]]]] = {}
    for host in graph.hosts():
        for key, package in _walk(graph, roots, host).items():
            needed.setdefault(key, (package, set()))[1].add(
                (host["python_version"], host["platform_machine"]))
    if not needed:
        raise LockProblem("the project depends on nothing; add its dependencies (`uv add "
                          "torch`) first")
    sources = _Sources(path.parent)
    pins = [dataclasses.replace(_pin(graph, package, sources),
                                marker=_condition(hosts, graph.pythons))
            for package, hosts in needed.values()]
    return PythonEnv(str(path), tuple(sorted(pins, key=lambda p: (p.name, p.version))),
                     requires_python=str(data.get("requires-python") or "") or None)
