"""Which wheels fit a host: its Python (major.minor), CPU and glibc, as its status reports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from clusterrun.envs.hoststatus import HostStatus
from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory.pylock import PythonEnv

# manylinux2014 and older names (PEP 599/571/513) stand for glibc 2.17, 2.12 and 2.5.
_LEGACY = (("manylinux2014", 17, ("x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le",
                                  "s390x")),
           ("manylinux2010", 12, ("x86_64", "i686")),
           ("manylinux1", 5, ("x86_64", "i686")))


class PlatformError(ClusterrunError):
    """A host whose platform clusterrun cannot gather wheels for (not glibc Linux)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, outcome=Outcome.PROBE_FAILED)


@dataclass(frozen=True, order=True)
class Platform:
    python: str  # major.minor: 3.11
    machine: str  # uname -m: x86_64, aarch64
    glibc: tuple[int, int]
    # major.minor.micro (3.11.7): a lock's marker may compare it (python_full_version).
    full: str = ""

    @property
    def label(self) -> str:
        """In words, for messages: cp311 manylinux x86_64 (glibc 2.36)."""
        return (f"cp{self.python.replace('.', '')} manylinux {self.machine} "
                f"(glibc {self.glibc[0]}.{self.glibc[1]})")

    @property
    def key(self) -> str:
        major, minor = self.glibc
        return f"cp{self.python.replace('.', '')}-{self.machine}-glibc{major}.{minor}"

    def markers(self) -> dict[str, str]:
        """The PEP 508 marker values of a host of this platform, as pip and uv evaluate a lock's
        markers there (a CPython on Linux: the platform's is the only kind `environment:`
        builds for)."""
        full = self.full or f"{self.python}.0"
        return {"python_version": self.python, "python_full_version": full,
                "implementation_version": full, "platform_machine": self.machine,
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "platform_release": "", "platform_version": "", "extra": ""}

    def wheel_tags(self) -> list[tuple[str, str, str]]:
        """Every (interpreter, abi, platform) tag of a wheel that installs here, best first,
        as pip orders them: the lock's own wheels are chosen by it (envs/locked.py)."""
        from packaging import tags  # only where the lock lists its wheels: a few ms otherwise

        version = tuple(int(x) for x in self.python.split("."))
        platforms = [*self.tags(), f"linux_{self.machine}"]
        found = [*tags.cpython_tags(version, platforms=platforms),
                 *tags.compatible_tags(version, f"cp{self.python.replace('.', '')}", platforms)]
        return [(t.interpreter, t.abi, t.platform) for t in found]

    def tags(self) -> list[str]:
        """Every platform tag whose wheels run here, newest first: pip's --platform takes only
        the tags it is given, not the older manylinux ones a glibc also runs."""
        major, minor = self.glibc
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 4, -1)]
        tags += [name + "_" + self.machine for name, at, cpus in _LEGACY
                 if minor >= at and self.machine in cpus]
        return tags

    def pip_args(self) -> list[str]:
        out = ["--only-binary=:all:", "--no-deps", "--implementation", "cp",
               "--python-version", self.python]
        for tag in self.tags():
            out += ["--platform", tag]
        return out


def from_status(name: str, status: Mapping[str, object]) -> Platform:
    """The platform a host's pyenv.py status reports; a host not on glibc Linux is refused."""
    found = HostStatus.from_json(status)
    libc = found.libc
    if found.system != "Linux" or not libc or not libc.startswith("glibc "):
        raise PlatformError(
            f"{name}: `environment:` needs a glibc Linux host (manylinux wheels); this one is "
            f"{found.system} with {libc or 'no glibc'}. Leave `environment:` out for it "
            "and install its packages there.")
    try:
        major, minor = (int(x) for x in libc.split()[1].split(".")[:2])
    except ValueError:
        raise PlatformError(f"{name}: cannot read its glibc version ({libc!r}).") from None
    return Platform(".".join(found.python.split(".")[:2]), str(found.machine), (major, minor),
                    found.python)


def python_refused(name: str, status: Mapping[str, object], env: PythonEnv) -> Optional[str]:
    """Why the host's Python is not one the lock allows (a uv project's requires-python), or
    None. A requirements lock says no Python of its own: its wheels do (wheels.py's message
    where none fits the host's)."""
    if not env.requires_python:
        return None
    # Only for a lock with requires-python: a few ms of every other launch's start.
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    found = HostStatus.from_json(status)
    python = found.python
    try:
        allowed = SpecifierSet(env.requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:  # uvlock.py read it already: not reached
        return None
    if allowed:
        return None
    where = found.python_path or "its `python:`"
    return (f"{name}: its Python is {python} ({where}), and the lock ({env.lock}) allows only "
            f"Python {env.requires_python} (requires-python). Point the host's `python:` at an "
            "interpreter the lock allows, or change requires-python in the project's "
            "pyproject.toml to include it and run `uv lock` again.")
