"""Moving files from a host to this machine: rsync over OpenSSH (with the settings of the
connection: host keys, bastion, timeouts), or outputs.py's frames on the SSH channel (or the
container's, or the Slurm job step's) where rsync cannot go. Each returns the paths that moved."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

from clusterrun.errors import SyncError
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import protocol
from clusterrun.remote.shared.filedigest import size_and_sha256
from clusterrun.transport import Transport, shell
from clusterrun.transport.openssh import OverOpenSsh
from clusterrun.transport.programs import chunks, start

PULL_SECONDS = 3600.0  # a copy that moves nothing for this long has failed
PART = ".clusterrun-part"


def local_path(dest: Path, rel: str) -> Path:
    """Where a host's file goes here; a path from the host that would land outside ``dest`` is
    refused (outputs.py never lists one, but this side does not take that on trust)."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SyncError(f"refusing to write {rel!r} outside {dest}")
    return dest.joinpath(*parts)


def digest(path: Path) -> Optional[tuple[int, str]]:
    """(size, sha256) of a file here; None when there is none (or it cannot be read)."""
    try:
        return size_and_sha256(str(path))
    except OSError:
        return None


def rsync(transport: OverOpenSsh, spec: HostSpec, root: str, files: Sequence[str],
          dest: Path) -> set[str]:
    """rsync of ``files`` (relative to ``root`` there) into ``dest``. -I: the listing already
    chose what differs, so rsync's own size-and-time check must not skip any of it; its delta
    transfer still moves only the changed blocks, and --partial keeps an interrupted file as
    the basis of the next try."""
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    argv = ["rsync", "-tp", "-I", "-8", "--partial", "--protect-args", "--from0", "--files-from=-",
            "--out-format=%n", "-e", shell.join(transport.ssh_argv()),
            "--", f"{host}:{root}/", f"{dest}/"]
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(argv, input=b"\0".join(f.encode() for f in files),
                          capture_output=True, timeout=PULL_SECONDS, check=False)
    # 24: files vanished there since they were listed (the caller lists those again)
    if proc.returncode not in (0, 24):
        err = proc.stderr.decode("utf-8", "replace").strip()[-500:]
        raise SyncError(f"{spec.name}: rsync from {root} failed (exit {proc.returncode}): {err}")
    said = proc.stdout.decode("utf-8", "replace").splitlines()
    return {line for line in said if line and not line.endswith("/")}


@dataclass
class _Open:
    """The file being received: written beside its target, renamed into place once whole."""

    rel: str
    handle: BinaryIO
    part: Path
    target: Path
    left: int


class _Receiver:
    """outputs.py's frames, as they arrive, written to files under ``dest``."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.buf = bytearray()
        self.open: Optional[_Open] = None
        self.moved: set[str] = set()
        self.reply: Optional[dict[str, Any]] = None

    def feed(self, data: bytes) -> None:
        self.buf.extend(data)
        while self.buf and self.reply is None:
            if self.open is not None:
                self._body(self.open)
            elif not self._header():
                return

    def _body(self, into: _Open) -> None:
        take = bytes(self.buf[:into.left])
        del self.buf[:len(take)]
        into.handle.write(take)
        into.left -= len(take)
        if into.left == 0:
            self._done(into)

    def _done(self, into: _Open) -> None:
        into.handle.close()
        self.open = None
        os.replace(into.part, into.target)
        self.moved.add(into.rel)

    def _header(self) -> bool:
        end = self.buf.find(b"\n")
        if end < 0:
            return False
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        if not line.startswith(protocol.EVENT):
            return True  # not a frame (a `setup:` line on stdout): not the program's
        frame = json.loads(line[len(protocol.EVENT):])
        if "path" not in frame:
            self.reply = frame
            return True
        if frame.get("missing"):
            return True
        rel = str(frame["path"])
        target = local_path(self.dest, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}{PART}")
        into = _Open(rel, open(part, "wb"), part, target, int(frame["size"]))  # noqa: SIM115
        self.open = into
        if into.left == 0:
            self._done(into)
        return True

    def abandon(self) -> None:
        """Close and remove a file left unfinished (the stream broke off)."""
        if self.open is not None:
            self.open.handle.close()
            with contextlib.suppress(OSError):
                os.unlink(self.open.part)
            self.open = None


def stream(transport: Transport, spec: HostSpec, root: str, files: Sequence[str],
           dest: Path) -> set[str]:
    """``files`` sent by outputs.py on the host over the connection clusterrun already holds."""
    request = {protocol.OP: protocol.Outputs.SEND, "root": root, "files": list(files)}
    interp = start(transport, spec, "outputs.py", request, site=False)
    receiver = _Receiver(dest)
    try:
        for chunk in chunks(interp.proc.recv):
            receiver.feed(chunk)
    except (OSError, ValueError) as exc:
        receiver.abandon()
        interp.proc.close()
        raise SyncError(f"{spec.name}: the copy from {root} failed: {exc}") from None
    receiver.abandon()
    code = interp.proc.wait(10)
    interp.proc.close()
    if receiver.reply is None:
        interp.stderr_read.join(1)
        err = interp.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise SyncError(f"{spec.name}: the copy from {root} ended early (exit status {code})"
                        + (": " + " | ".join(err) if err else "."))
    return receiver.moved
