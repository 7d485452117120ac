"""The controller's py-spy binary (the `clusterrun[stacks]` extra), shipped to hosts lacking one.

py-spy is one static binary: a host with the controller's machine type runs the same file, so
nothing needs installing on the hosts. A host's own py-spy (in its Python's bin/ or on PATH)
always wins; a shipped copy is kept under ``<workdir>/runs/.tools/`` for next time.
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

INSTALL = "pip install 'clusterrun[stacks]'"


@dataclass(frozen=True)
class Binary:
    path: str
    sha: str
    size: int
    machine: str


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
    return Binary(path, digest.hexdigest(), os.path.getsize(path), platform.machine())


def chunks(binary: Binary) -> list[bytes]:
    with open(binary.path, "rb") as handle:
        return [handle.read()]
