"""The controller's py-spy binary (a dependency of clusterrun), shipped to hosts lacking one.

py-spy is one static binary: a Linux host with the controller's machine type runs the same file,
so nothing needs installing on the hosts. A host's own py-spy (in its Python's bin/ or on PATH)
always wins; a shipped copy is kept under ``<workdir>/runs/.tools/`` for next time. Where pip has
no py-spy for the controller's platform, clusterrun installs without it (pyproject.toml's marker)
and only hosts with their own py-spy can be read.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from typing import Optional

INSTALL = "pip install py-spy"


@dataclass(frozen=True)
class Binary:
    path: str
    sha: str
    size: int
    machine: str  # as a Linux host's `uname -m` says it; "" when it cannot run on Linux


@functools.lru_cache(maxsize=1)
def local() -> Optional[Binary]:
    """py-spy beside this Python (the same venv) or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    path = here if os.path.isfile(here) else shutil.which("py-spy")
    if not path:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    # A macOS or Windows py-spy cannot run on a Linux host, whatever its machine type.
    machine = platform.machine() if sys.platform.startswith("linux") else ""
    return Binary(path, digest.hexdigest(), os.path.getsize(path), machine)


def can_ship_to(binary: Optional[Binary], machine: Optional[str]) -> bool:
    """Whether this py-spy runs on a Linux host whose `uname -m` is ``machine``."""
    return binary is not None and bool(binary.machine) and binary.machine == machine


def chunks(binary: Binary) -> list[bytes]:
    with open(binary.path, "rb") as handle:
        return [handle.read()]
