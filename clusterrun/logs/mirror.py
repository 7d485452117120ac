"""Byte-exact local mirrors of a run's remote log files.

Each data frame names a file and the byte offset it starts at. The mirror appends only bytes it
does not have yet, so a resumed stream (same or overlapping offsets) never duplicates and never
loses.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from clusterrun.logs.view import rank_of
from clusterrun.remote.shared import protocol
from clusterrun.runs.store import RunDir, make_node_dir, open_private
from clusterrun.transport import Process
from clusterrun.wire import ProtocolError, frames


class Mirror:
    """Local copies of one run's remote files, plus the order chunks arrived in (``arrivals``),
    which `clusterrun logs` replays to show the interleaving the live console showed."""

    def __init__(self, run: RunDir,
                 first_line: Optional[Callable[[str, int, str], None]] = None) -> None:
        self.run = run
        self.first_line = first_line  # hears each rank's first line: (node, rank, line)
        self._lock = threading.Lock()
        self._fds: dict[tuple[str, str], int] = {}
        self._sizes: dict[tuple[str, str], int] = {}
        # A rank file's bytes until its first line is complete (None: told, or not ours to
        # tell: the file had bytes before this mirror opened it).
        self._heads: dict[tuple[str, str], Optional[bytes]] = {}
        self._arrivals = open_private(run.file("arrivals"),
                                      os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def _fd(self, node: str, name: str) -> int:
        key = (node, name)
        if key not in self._fds:
            make_node_dir(self.run, node)
            if "/" in name or name.startswith("."):
                raise ProtocolError(f"refusing a log file name from {node}: {name!r}")
            fd = open_private(self.run.mirror(node, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self._fds[key] = fd
            self._sizes[key] = os.fstat(fd).st_size
            telling = self.first_line is not None and rank_of(name) is not None
            self._heads[key] = b"" if telling and self._sizes[key] == 0 else None
        return self._fds[key]

    def size(self, node: str, name: str) -> int:
        with self._lock:
            self._fd(node, name)
            return self._sizes[(node, name)]

    def offsets(self, node: str) -> dict[str, int]:
        """What we already have of a node's files: where a resumed stream starts."""
        folder = self.run.node_dir(node)
        if not folder.is_dir():
            return {}
        return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}

    def append(self, node: str, name: str, offset: int, data: bytes) -> bytes:
        """Store a chunk that starts at ``offset``; return the part that was new."""
        with self._lock:
            fd = self._fd(node, name)
            have = self._sizes[(node, name)]
            if offset > have:
                raise ProtocolError(f"{node}: {name} jumped from byte {have} to {offset}")
            fresh = data[have - offset:]
            if fresh:
                os.write(fd, fresh)
                self._sizes[(node, name)] = have + len(fresh)
                # node, file, its size now, and when (`logs --json` gives each line's time)
                os.write(self._arrivals, f"{node}\t{name}\t{have + len(fresh)}\t"
                                         f"{time.time():.3f}\n".encode())
                self._first(node, name, fresh)
            return fresh

    def _first(self, node: str, name: str, fresh: bytes) -> None:
        head = self._heads.get((node, name))
        if head is None or self.first_line is None:
            return
        head += fresh
        if b"\n" not in head and len(head) < 4096:  # a long first line is told in part
            self._heads[(node, name)] = head
            return
        self._heads[(node, name)] = None
        rank = rank_of(name)
        line = head.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
        if rank is not None:
            self.first_line(node, rank, line)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            os.close(self._arrivals)


def receive(node: str, proc: Process, mirror: Mirror,
            on_event: Callable[[dict[str, Any]], None],
            on_data: Optional[Callable[[str, str, bytes], None]] = None) -> None:
    """Copy a supervisor's stream into the mirror until it ends: events go to ``on_event``,
    the bytes the mirror did not have yet to ``on_data(node, file, bytes)``."""
    for header, data in frames(proc):
        if data is None:
            on_event(header)
            continue
        name = header[protocol.FILE]
        fresh = mirror.append(node, name, header[protocol.OFFSET], data)
        if fresh and on_data is not None:
            on_data(node, name, fresh)


def verify(run: RunDir, checksums: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Compare each node's log files as its supervisor reported them ({file: [size, sha256]})
    with this machine's mirrors: ``{"files", "identical", "differ": ["node/file", ...]}``."""
    checked: dict[str, Any] = {"files": 0, "identical": 0, "differ": []}
    for node, files in sorted(checksums.items()):
        for name, (size, digest) in sorted((files or {}).items()):
            checked["files"] += 1
            if _sha256(run.mirror(node, name), size) == digest:
                checked["identical"] += 1
            else:
                checked["differ"].append(f"{node}/{name}")
    return checked


def _sha256(path: Path, size: int) -> Optional[str]:
    """The file's SHA-256 if it has ``size`` bytes (a missing file is empty: it was never sent),
    read in blocks: a rank's log can be larger than the memory this machine can spare."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return hashlib.sha256().hexdigest() if size == 0 else None
    with handle:
        if os.fstat(handle.fileno()).st_size != size:
            return None
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest()
