"""One node's pull: list its files there (sizes and SHA-256, outputs.py), compare them with the
copies here, move the ones that differ, and verify every moved file against the host's digest.

A file that changed on the host while it was copied (a live run still writing it) is listed and
copied once more; one that still differs from the host's then is an error naming it.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from clusterrun.errors import SyncError
from clusterrun.inventory import HostSpec
from clusterrun.pull import channel
from clusterrun.pull.model import LISTED, NodePull, RemoteFile
from clusterrun.runs.records import PlanNode
from clusterrun.transport import Transport, ssh_of
from clusterrun.transport.programs import ProgramError, call

LIST_SECONDS = 1800.0  # hashing a host's checkpoints reads them whole


def _listed(transport: Transport, spec: HostSpec, request: dict[str, Any]) -> dict[str, Any]:
    try:
        reply = call(transport, spec, "outputs.py", request, timeout=LIST_SECONDS, site=False)
    except ProgramError as exc:
        raise SyncError(exc.message) from None
    if reply.get("missing"):
        into = f" in container {spec.container!r}" if spec.container else ""
        raise SyncError(f"{spec.name}: the ranks' working directory {reply.get('root')}{into} "
                        "is not there (removed since the run, or a shared filesystem not "
                        "mounted).")
    return reply


def _files(reply: dict[str, Any]) -> list[RemoteFile]:
    return [RemoteFile(str(p), int(s), str(d)) for p, s, d in reply.get("files") or []]


def method(transport: Transport, spec: HostSpec, host_rsync: bool) -> str:
    """rsync where both ends have it and the host is a plain SSH host; else the channel."""
    forced = os.environ.get("CLUSTERRUN_SYNC")  # "rsync" or "stream": the tests take each path
    if (ssh_of(transport) is not None and not spec.container and spec.transport != "srun"
            and host_rsync and shutil.which("rsync") is not None and forced != "stream"):
        return "rsync"
    if spec.container:
        return f"{spec.container_engine or 'engine'} exec"
    return {"srun": "srun"}.get(spec.transport or "", "local" if spec.local else "ssh")


def differing(files: list[RemoteFile], dest: Path) -> list[RemoteFile]:
    """The files whose copy here is missing or not the host's bytes."""
    out = []
    for f in files:
        path = channel.local_path(dest, f.path)
        here = None
        if path.is_file() and not path.is_symlink() and path.stat().st_size == f.size:
            here = channel.digest(path)
        if here != (f.size, f.sha256):
            out.append(f)
    return out


def _move(transport: Transport, spec: HostSpec, root: str, files: list[RemoteFile],
          result: NodePull) -> set[str]:
    paths = [f.path for f in files]
    ssh = ssh_of(transport)
    if result.method == "rsync":
        assert ssh is not None
        return channel.rsync(ssh, spec, root, paths, result.dest)
    return channel.stream(transport, spec, root, paths, result.dest)


def pull_node(transport: Transport, spec: HostSpec, node: PlanNode, request: dict[str, Any],
              result: NodePull, *, dry_run: bool,
              say: Optional[Callable[[str], None]] = None) -> NodePull:
    """List, compare, move and verify one node's files into ``result.dest``."""
    try:
        return _pull_node(transport, spec, node, request, result, dry_run=dry_run, say=say)
    except OSError as exc:  # here, not there: the host's own failures come back as replies
        where = exc.filename or result.dest
        raise SyncError(f"{spec.name}: cannot write {where} on this machine: "
                        f"{exc.strerror or exc}. Free space there, or pull elsewhere with "
                        "--to DIR.") from None


def _pull_node(transport: Transport, spec: HostSpec, node: PlanNode, request: dict[str, Any],
               result: NodePull, *, dry_run: bool,
               say: Optional[Callable[[str], None]]) -> NodePull:
    reply = _listed(transport, spec, request)
    root = str(reply.get("root") or node.cwd)
    result.root = root  # as the host resolved it (~, symbolic links)
    result.files = _files(reply)
    result.unmatched = [str(p) for p in reply.get("unmatched") or []]
    result.began = request.get("paths") is not None or reply.get("since") is not None
    result.method = method(transport, spec, bool(reply.get("rsync")))
    todo = differing(result.files, result.dest)
    result.moved = {f.path for f in todo}
    if dry_run or not todo:
        if dry_run:
            result.status = LISTED
        return result
    moved = _move(transport, spec, root, todo, result)
    bad = differing(todo, result.dest)
    if bad:  # changed there since it was listed (a rank still writing): list it again
        again = _files(_listed(transport, spec, {**request, "paths": [glob.escape(f.path)
                                                                     for f in bad]}))
        fresh = {f.path: f for f in again}
        gone = {f.path for f in bad} - set(fresh)  # removed there meanwhile (renamed into place)
        result.files = [fresh.get(f.path, f) for f in result.files if f.path not in gone]
        moved -= gone
        still = differing([fresh[f.path] for f in bad if f.path in fresh], result.dest)
        if still:
            if say is not None:
                say(f"{spec.name}: {len(still)} file(s) changed while copied; copying again")
            moved |= _move(transport, spec, root, still, result)
            still = differing(still, result.dest)
        if still:
            names = ", ".join(f.path for f in still[:5])
            raise SyncError(f"{spec.name}: after copying, {names} differ from the host's "
                            f"(size or SHA-256) in {root}: a rank may still be writing them. "
                            "Pull again once they are written.")
    result.moved = moved
    return result
