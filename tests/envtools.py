"""Helpers of the `environment:` tests: a wheel built here, and a host's files from this
machine's side."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from tests.conftest import Cluster


def tiny_wheel(folder: Path) -> Path:
    """A one-module wheel built here, found only through the inventory's find_links."""
    folder.mkdir()
    path = folder / "clusterrun_tinypkg-0.1-py3-none-any.whl"
    files = {"tinypkg.py": b"WORD = 'tiny'\n",
             "clusterrun_tinypkg-0.1.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: clusterrun-tinypkg\nVersion: 0.1\n",
             "clusterrun_tinypkg-0.1.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
        record.append("clusterrun_tinypkg-0.1.dist-info/RECORD,,")
        wheel.writestr("clusterrun_tinypkg-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def host_path(cluster: Cluster, name: str, path: str) -> Path:
    """Where a path under a host's own /tmp lies on this machine."""
    return cluster.sb.root / name / "tmp" / os.path.relpath(path, "/tmp")
