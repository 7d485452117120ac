"""What `clusterrun pull` found and did, per node and in all, as types with their JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# A node's status in the report (and in --json).
PULLED = "pulled"  # every file listed is here and verified (some may have moved)
LISTED = "listed"  # --dry-run: listed and compared, nothing moved
UNREACHABLE = "unreachable"  # the host could not be reached: nothing from it
FAILED = "failed"  # reached, but a copy failed or did not verify


@dataclass(frozen=True)
class RemoteFile:
    """A file on a host as outputs.py lists it: its path under the ranks' working directory."""

    path: str
    size: int
    sha256: str

    def to_json(self, moved: bool) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "moved": moved}


@dataclass
class NodePull:
    """One node: where its files are on the host and here, what was listed, what moved."""

    node: str
    host: str
    root: str  # on the host, as the plan says (outputs.py answers with it resolved)
    dest: Path
    status: str = PULLED
    method: Optional[str] = None  # rsync, ssh, srun, docker exec ...
    files: list[RemoteFile] = field(default_factory=list)
    moved: set[str] = field(default_factory=set)  # what moved (or, with --dry-run, would)
    unmatched: list[str] = field(default_factory=list)  # PATHs that matched nothing there
    began: bool = True  # the run left a trace on the host (default selection only)
    error: Optional[str] = None

    @property
    def bytes_moved(self) -> int:
        return sum(f.size for f in self.files if f.path in self.moved)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "status": self.status,
                "method": self.method, "root": self.root, "dest": str(self.dest),
                "files": [f.to_json(f.path in self.moved) for f in self.files],
                "moved": len(self.moved), "bytes": self.bytes_moved,
                "unmatched": self.unmatched, "error": self.error}


@dataclass
class PullReport:
    run: str
    to: Path
    dry_run: bool
    nodes: list[NodePull] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(n.status in (PULLED, LISTED) for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "run": self.run, "to": str(self.to), "dry_run": self.dry_run,
                "nodes": [n.to_json() for n in self.nodes]}
