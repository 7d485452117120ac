"""The controller's py-spy binary (a dependency of clusterrun), shipped to hosts lacking one.

py-spy is one static binary: a host of the same system and CPU as that binary runs the same
file, so nothing needs installing on the hosts. Which system and CPU is read from the file's
own header, not from this machine: a macOS controller's py-spy is a Mach-O program that no Linux
host runs, whatever the CPU. A host's own py-spy (in its Python's bin/ or on PATH) always wins;
a shipped copy is kept under ``<workdir>/runs/.tools/`` for next time. Where pip has no py-spy
for the controller's platform, clusterrun installs without it (pyproject.toml's marker) and only
hosts with their own py-spy can be read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from clusterrun.home import home

INSTALL = "pip install py-spy"

# ELF e_machine values (the System V ABI's registry), named as Linux's `uname -m` names them.
ELF_MACHINES = {3: "i686", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86_64",
                183: "aarch64", 243: "riscv64"}
ELF_SYSTEMS = {0: "Linux", 3: "Linux", 9: "FreeBSD"}  # EI_OSABI: Linux binaries say 0 (System V)
# Mach-O cputype values (<mach/machine.h>): the 64-bit ones carry CPU_ARCH_ABI64 (0x01000000).
MACHO_MACHINES = {7: "i686", 0x01000007: "x86_64", 12: "arm", 0x0100000C: "aarch64"}
MACHO_THIN = {b"\xcf\xfa\xed\xfe": "<I", b"\xce\xfa\xed\xfe": "<I",  # little-endian, 64/32-bit
              b"\xfe\xed\xfa\xcf": ">I", b"\xfe\xed\xfa\xce": ">I"}
MACHO_FAT = b"\xca\xfe\xba\xbe"  # a universal binary: several Mach-O programs in one file
SYSTEM_NAMES = {"Darwin": "macOS"}
# The same CPU by other names: macOS and the BSDs say arm64 and amd64, 32-bit x86 has several.
ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "i386": "i686", "i486": "i686",
           "i586": "i686", "x86": "i686", "armv6l": "arm", "armv7l": "arm", "armv8l": "arm"}


@dataclass(frozen=True)
class Binary:
    path: str
    sha: str
    size: int
    system: Optional[str]  # the kernel it is built for, as uname(2) names it; None: unknown
    machine: Optional[str]  # its CPU, as Linux's `uname -m` names it; None: unknown

    def describe(self) -> str:
        """Its kind in words: 'a macOS (Mach-O) x86_64 program'."""
        if self.system is None:
            return "not a program whose system clusterrun can tell (no ELF or Mach-O header)"
        system = SYSTEM_NAMES.get(self.system, self.system)
        kind = "Mach-O" if self.system == "Darwin" else "ELF"
        return f"a {system} ({kind}) {self.machine or 'unknown-CPU'} program"

    def fits(self, system: Optional[str], machine: Optional[str]) -> bool:
        """Whether a host reporting this uname system and machine can run it."""
        return (self.system is not None and self.machine is not None and system == self.system
                and machine is not None and cpu(machine) == self.machine)


def cpu(machine: str) -> str:
    """One name per CPU type, whichever system reported it."""
    return ALIASES.get(machine, machine)


def header_kind(head: bytes) -> tuple[Optional[str], Optional[str]]:
    """(system, machine) from an executable's first bytes; None for what cannot be told."""
    if head[:4] == b"\x7fELF" and len(head) >= 20:
        order = "<" if head[5] == 1 else ">"  # EI_DATA: 1 little-endian, 2 big-endian
        (number,) = struct.unpack(order + "H", head[18:20])
        machine = ELF_MACHINES.get(number)
        if machine == "ppc64" and order == "<":
            machine = "ppc64le"
        return ELF_SYSTEMS.get(head[7]), machine
    if head[:4] in MACHO_THIN and len(head) >= 8:
        (number,) = struct.unpack(MACHO_THIN[head[:4]], head[4:8])
        return "Darwin", MACHO_MACHINES.get(number)
    if head[:4] == MACHO_FAT:
        return "Darwin", "universal"  # whatever its CPUs, no Linux host runs it
    return None, None


@functools.lru_cache(maxsize=1)
def local() -> Optional[Binary]:
    """py-spy beside this Python (the same venv) or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    path = here if os.path.isfile(here) else shutil.which("py-spy")
    if not path:
        return None
    return read(path, remember=True)


def read(path: str, *, remember: bool = False) -> Binary:
    """The binary at ``path``. With ``remember``, its digest is kept under $CLUSTERRUN_HOME by
    the file's identity (inode, size, mtime), so each launch does not hash 8 MB again; a file
    that changed in any of those is hashed anew."""
    stat = os.stat(path)
    key = {"path": os.path.realpath(path), "ino": stat.st_ino, "size": stat.st_size,
           "mtime_ns": stat.st_mtime_ns}
    remembered = home() / "cache" / "pyspy.json"
    sha = _remembered_sha(remembered, key) if remember else None
    with open(path, "rb") as handle:
        head = handle.read(64)
        if sha is None:
            digest = hashlib.sha256(head)
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            sha = digest.hexdigest()
            if remember:
                _remember(remembered, {**key, "sha": sha})
    system, machine = header_kind(head)
    return Binary(path, sha, stat.st_size, system, machine)


def _remembered_sha(file: Path, key: dict[str, object]) -> Optional[str]:
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or {k: found.get(k) for k in key} != key:
        return None
    sha = found.get("sha")
    return sha if isinstance(sha, str) and len(sha) == 64 else None


def _remember(file: Path, entry: dict[str, object]) -> None:
    # Only a shortcut: a home that cannot be written costs the hash next time, nothing else.
    with contextlib.suppress(OSError):
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = file.with_name(f"{file.name}.{os.getpid()}")
        temporary.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(temporary, file)


def chunks(binary: Binary) -> list[bytes]:
    with open(binary.path, "rb") as handle:
        return [handle.read()]
