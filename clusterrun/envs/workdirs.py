"""Each host's absolute workdir as the controller last heard it, so that a warm launch can ask
the environment's own interpreter (``<workdir>/envs/<lock hash>/bin/python``) first."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from clusterrun.inventory import HostSpec


class Workdirs:
    """Each host's absolute workdir as its last status said (`~/clusterrun` is only known
    there), one small file per host under the controller's wheel cache: where its built
    environments' interpreters are, before anything is asked."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _file(self, spec: HostSpec) -> Path:
        key = json.dumps([spec.name, spec.host, spec.port, spec.user, spec.workdir,
                          spec.container])
        return self.root / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")

    def get(self, spec: HostSpec) -> Optional[str]:
        if spec.workdir.startswith("/"):
            return spec.workdir.rstrip("/") or "/"
        try:
            found = json.loads(self._file(spec).read_text()).get("workdir")
        except (OSError, ValueError, AttributeError):
            return None
        return found if isinstance(found, str) and found.startswith("/") else None

    def remember(self, spec: HostSpec, workdir: str) -> None:
        if not workdir.startswith("/") or spec.workdir.startswith("/"):
            return
        path = self._file(spec)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp.{os.getpid()}")
            tmp.write_text(json.dumps({"workdir": workdir}))
            os.replace(tmp, path)
