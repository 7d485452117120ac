"""Copying the script's directory to every host, and proving each host has the same bytes.

rsync over the same SSH settings moves only changed files and is what users already trust for
this; where rsync is missing on either side, changed files go over SFTP; into a container or
onto a Slurm node, on the stdin of a receiver there. Every file's SHA-256 on the host is
compared with this machine's afterwards.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

from clusterrun.errors import PreflightError, SyncError
from clusterrun.inventory import HostSpec
from clusterrun.plan.model import LaunchPlan
from clusterrun.transport import SshTransport, Transport, parallel, shell
from clusterrun.transport.programs import ProgramError, call

# Never code. `.env` files hold secrets: they are read here (--env-file, `env_file:`) and their
# values reach the ranks through the supervisor's stdin, never as a file on the hosts.
DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache",
                    ".pytest_cache", ".ruff_cache", "*.egg-info", ".ipynb_checkpoints", ".env",
                    ".env.*")


def env_file_excludes(code_dir: Path, env_files: Sequence[Optional[str]]) -> tuple[str, ...]:
    """The env files of a launch that lie inside the copied directory, as exclude patterns
    (anchored: rsync's leading '/' means "at the top of the copy")."""
    root = code_dir.resolve()
    out = []
    for raw in env_files:
        if raw is None:
            continue
        path = Path(raw).resolve()
        if path.is_relative_to(root):
            out.append("/" + path.relative_to(root).as_posix())
    return tuple(sorted(set(out)))
SYNC_SECONDS = 600.0


def gitignored(root: Path) -> tuple[str, ...]:
    """The simple patterns of a .gitignore in the script's directory: what git leaves out
    (checkpoints, datasets) is not code, and copying a stale local checkpoint over a host's
    newer one would be worse than useless. Negations (`!`) and anchors are not interpreted."""
    try:
        lines = (root / ".gitignore").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return ()
    out = []
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith(("#", "!")):
            out.append(line.strip("/") or line)
    return tuple(out)


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    """As rsync reads --exclude: a pattern matches any path component, or the whole relative
    path; one that starts with '/' only the whole path from the top of the copy."""
    parts = rel.split("/")
    anchored = [p[1:] for p in patterns if p.startswith("/")]
    loose = [p for p in patterns if not p.startswith("/")]
    return (any(fnmatch.fnmatch(part, pat) for part in parts for pat in loose)
            or any(fnmatch.fnmatch(rel, pat) for pat in loose)
            or any(fnmatch.fnmatch(rel, pat) for pat in anchored))


def manifest(root: Path, excludes: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Relative path -> (size, sha256) of every regular file to copy."""
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(d for d in dirnames if not _excluded(rel_dir + d, excludes))
        for name in sorted(filenames):
            rel = rel_dir + name
            path = os.path.join(dirpath, name)
            if _excluded(rel, excludes) or os.path.islink(path) or not os.path.isfile(path):
                continue
            digest = hashlib.sha256()
            size = 0
            try:
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
                        size += len(block)
            except OSError as exc:
                raise SyncError(f"cannot read {path} to copy it to the hosts: {exc.strerror}. "
                                "Fix its permissions, or leave it out with --exclude-files."
                                ) from None
            out[rel] = (size, digest.hexdigest())
    return out


def _remote(transport: Transport, spec: HostSpec, dest: str, files: list[str],
            mkdir: bool) -> dict[str, tuple[int, str]]:
    try:
        reply = call(transport, spec, "files.py", {"root": dest, "files": files, "mkdir": mkdir},
                     timeout=SYNC_SECONDS)
    except ProgramError as exc:  # e.g. the workdir's disk is full or read-only
        raise SyncError(f"{spec.name}: cannot prepare or read {dest}: {exc.message}") from None
    return {k: (v[0], v[1]) for k, v in reply["manifest"].items()}


def _rsync(transport: SshTransport, spec: HostSpec, src: Path, dest: str,
           excludes: Sequence[str]) -> None:
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    argv = ["rsync", "-a", "--protect-args", "-e", shell.join(transport.ssh_argv())]
    argv += [f"--exclude={pattern}" for pattern in excludes]
    argv += ["--", f"{src}/", f"{host}:{dest}/"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=SYNC_SECONDS,
                          check=False)
    if proc.returncode != 0:
        raise SyncError(f"{spec.name}: rsync failed (exit {proc.returncode}): "
                        f"{proc.stderr.strip()[-500:]}")


def _sftp(transport: SshTransport, src: Path, dest: str, files: list[str]) -> None:
    sftp = transport.sftp()
    try:
        made: set[str] = set()
        for rel in files:
            target = posixpath.join(dest, rel)
            parent = posixpath.dirname(target)
            if parent not in made:
                _sftp_makedirs(sftp, parent)
                made.add(parent)
            tmp = posixpath.join(parent, f".{posixpath.basename(target)}.clusterrun-tmp")
            local = src / rel
            with open(local, "rb") as handle:
                sftp.putfo(handle, tmp, confirm=True)
            sftp.chmod(tmp, os.stat(local).st_mode & 0o777)
            sftp.posix_rename(tmp, target)
    finally:
        sftp.close()


def _sftp_makedirs(sftp: object, path: str) -> None:
    parts = []
    head = path
    while head not in ("", "/"):
        parts.append(head)
        head = posixpath.dirname(head)
    for part in reversed(parts):
        try:
            sftp.stat(part)  # type: ignore[attr-defined]
        except OSError:
            sftp.mkdir(part, 0o700)  # type: ignore[attr-defined]


def _through_stdin(transport: Transport, spec: HostSpec, src: Path, dest: str, *,
                   files: list[str], local: dict[str, tuple[int, str]]) -> None:
    """Where neither rsync nor SFTP reaches (into a container through `docker/podman exec -i`,
    onto a Slurm node through a job step): the files' bytes on the stdin of a small receiver
    run there, which needs nothing but the Python the job runs with."""
    entries = [(rel, local[rel][0], os.stat(src / rel).st_mode) for rel in files]

    def payload() -> Iterator[bytes]:
        for rel, size, _mode in entries:
            left = size
            with open(src / rel, "rb") as handle:
                while left:
                    block = handle.read(min(left, 1 << 20))
                    if not block:  # shrank since it was hashed: keep the stream in step
                        block = bytes(min(left, 1 << 20))
                    yield block
                    left -= len(block)

    try:
        call(transport, spec, "unpack.py", {"root": dest, "files": entries},
             timeout=SYNC_SECONDS, payload=payload())
    except ProgramError as exc:
        into = f" into container {spec.container!r}" if spec.container else ""
        raise SyncError(f"{spec.name}: copying{into} failed: {exc.message}") from None


def require_present(plan: LaunchPlan, transports: dict[str, Transport],
                    specs: dict[str, HostSpec]) -> None:
    """With --no-sync the script must already be at its path on every host (or in its
    container); say so before anything starts rather than as torchrun's exit 127."""
    if plan.module is not None:
        return  # a module may live anywhere on the host's sys.path
    script = plan.script.name

    def one(spec: HostSpec) -> None:
        node = next(n for n in plan.nodes if n.name == spec.name)
        if script not in _remote(transports[spec.name], spec, node.cwd, [script], mkdir=False):
            where = f"in container {spec.container!r} there" if spec.container else "there"
            raise PreflightError(f"{spec.name}: --no-sync, but {node.cwd}/{script} is not "
                                 f"{where}. Put the code there (a shared filesystem or a volume "
                                 "at the same path), or launch without --no-sync to copy it.")

    remote = [specs[n.name] for n in plan.nodes if not n.local]
    parallel.run(one, remote, SYNC_SECONDS).raise_if_failed(
        "the script is missing on some hosts; nothing was started")


def sync(plan: LaunchPlan, transports: dict[str, Transport], specs: dict[str, HostSpec],
         facts: dict[str, dict[str, Any]], excludes: Sequence[str]) -> dict[str, str]:
    """Copy the script's directory to every remote host; return per host how it went."""
    src = plan.code_dir
    patterns = tuple(DEFAULT_EXCLUDES) + gitignored(src) + tuple(excludes)
    local = manifest(src, patterns)
    files = sorted(local)
    force_sftp = os.environ.get("CLUSTERRUN_SYNC") == "sftp"
    have_rsync = shutil.which("rsync") is not None

    def one(spec: HostSpec) -> str:
        node = next(n for n in plan.nodes if n.name == spec.name)
        transport = transports[spec.name]
        dest = node.code_dest or node.cwd
        before = _remote(transport, spec, dest, files, mkdir=True)
        changed = [rel for rel in files if before.get(rel) != local[rel]]
        method = "unchanged"
        if changed and (spec.container or spec.transport == "srun"):
            method = f"{spec.container_engine or 'engine'} exec" if spec.container else "srun"
            _through_stdin(transport, spec, src, dest, files=changed, local=local)
        elif changed:
            assert isinstance(transport, SshTransport)
            use_rsync = have_rsync and facts[spec.name].get("rsync") and not force_sftp
            method = "rsync" if use_rsync else "sftp"
            if use_rsync:
                _rsync(transport, spec, src, dest, patterns)
            else:
                _sftp(transport, src, dest, changed)
        after = _remote(transport, spec, dest, files, mkdir=False)
        bad = [rel for rel in files if after.get(rel) != local[rel]]
        if bad:
            raise SyncError(f"{spec.name}: after copying, {len(bad)} file(s) differ "
                            f"from this machine's: {', '.join(bad[:5])}. Is something else "
                            f"writing to {dest} on that host?")
        return f"{method}: {len(changed)} of {len(files)} files copied, all {len(files)} verified"

    remote = [specs[n.name] for n in plan.nodes if not n.local]
    results = parallel.run(one, remote, SYNC_SECONDS)
    results.raise_if_failed("copying the script's directory failed; nothing was started")
    return results.values()
