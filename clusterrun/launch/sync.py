"""Copying the script's directory to every host, and proving each host has the same bytes.

Per host, files.py reads the SHA-256 of every file there; when all match, that was the check
and nothing else runs. Otherwise the changed files go:

- up to STREAM_BYTES (16 MiB) in all: on the stdin of files.py, over the connection preflight
  opened, which writes them and reads the whole manifest back in the same run: one round trip
  and no new connection, where rsync costs an OpenSSH client per host (~130 ms of the
  controller's CPU each) and a second round trip to check. For a few source files on 16 hosts
  the copy takes a third to a quarter of rsync's time, and still half at 8 MiB;
- beyond that, through rsync over OpenSSH with the same settings (it moves only what changed,
  block by block, and its ssh's crypto outruns paramiko's on bulk data), then files.py checks;
- into a container or onto a Slurm node, always on the stdin of files.py run there (through
  `docker/podman exec -i` or a job step), which needs nothing but the job's Python.

Where rsync is missing on either side, any size goes on stdin.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from clusterrun.errors import PreflightError, SyncError
from clusterrun.home import home as state_home
from clusterrun.inventory import HostSpec
from clusterrun.plan.model import LaunchPlan
from clusterrun.preflight import hostpaths
from clusterrun.remote.shared.filedigest import size_and_sha256
from clusterrun.transport import Transport, parallel, shell, ssh_of
from clusterrun.transport.openssh import OverOpenSsh
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
# Changes up to this size in all go on the stdin of files.py (see the module's docstring).
STREAM_BYTES = 16 << 20


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
            try:
                out[rel] = size_and_sha256(path)
            except OSError as exc:
                raise SyncError(f"cannot read {path} to copy it to the hosts: {exc.strerror}. "
                                "Fix its permissions, or leave it out with --exclude-files."
                                ) from None
    return out


def home_excludes(src: Path) -> tuple[str, ...]:
    """$CLUSTERRUN_HOME when it lies inside ``src``, as an anchored pattern: its runs, mirrored
    logs and caches are not code, and each launch would copy the copy's own logs again."""
    root, home = os.path.realpath(src), os.path.realpath(state_home())
    if home == root or not Path(home).is_relative_to(root):
        return ()
    return ("/" + Path(home).relative_to(root).as_posix(),)


def patterns(src: Path, excludes: Sequence[str]) -> tuple[str, ...]:
    """What a sync of ``src`` leaves out: the defaults, its .gitignore, ``--exclude``, and
    $CLUSTERRUN_HOME when it is inside."""
    return tuple(DEFAULT_EXCLUDES) + gitignored(src) + tuple(excludes) + home_excludes(src)


def remote_manifest(transport: Transport, spec: HostSpec, dest: str,
                    files: list[str]) -> dict[str, tuple[int, str]]:
    """The manifest of ``files`` under ``dest`` on the host, creating nothing."""
    return _remote(transport, spec, dest, files, mkdir=False)


def _remote(transport: Transport, spec: HostSpec, dest: str, files: list[str], *,
            mkdir: bool, src: Optional[Path] = None, write: Sequence[str] = (),
            local: Optional[dict[str, tuple[int, str]]] = None) -> dict[str, tuple[int, str]]:
    """files.py on the host: the manifest of ``files`` under ``dest``, after writing the
    ``write`` files' bytes (from ``src``) there, sent on its stdin over the open connection."""
    base = src or Path()
    try:
        entries = [(rel, local[rel][0], os.stat(base / rel).st_mode)
                   for rel in write] if write and local is not None else []
    except OSError as exc:  # removed or made unreadable here since it was hashed
        why = (f"{spec.name}: cannot read {exc.filename} to copy it: {exc.strerror}. Launch "
               "again once the directory stops changing.")
        raise SyncError(why) from None

    def payload() -> Iterator[bytes]:
        for rel, size, _mode in entries:
            left = size
            with open(base / rel, "rb") as handle:
                while left:
                    block = handle.read(min(left, 1 << 20))
                    if not block:  # shrank since it was hashed: keep the stream in step
                        block = bytes(min(left, 1 << 20))
                    yield block
                    left -= len(block)

    request: dict[str, Any] = {"root": dest, "files": files, "mkdir": mkdir}
    if entries:
        request["write"] = entries
    try:
        reply = call(transport, spec, "files.py", request, timeout=SYNC_SECONDS,
                     payload=payload(), site=False)
    except ProgramError as exc:  # the copy ended without an answer (a lost connection)
        into = f" in container {spec.container!r}" if spec.container else ""
        what = "copy files into" if entries else "prepare or read"
        raise SyncError(f"{spec.name}: cannot {what} {dest}{into}: {exc.message}") from None
    found = reply.get("error")
    if isinstance(found, dict):  # a path there it cannot create or write
        into = f" in container {spec.container!r}" if spec.container else ""
        raise SyncError(f"{spec.name}: cannot copy the code to {dest}{into}: "
                        f"{hostpaths.cause(found)}. {hostpaths.fix(found, local=spec.local)}")
    return {k: (v[0], v[1]) for k, v in reply["manifest"].items()}


def _rsync(transport: OverOpenSsh, spec: HostSpec, src: Path, dest: str,
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


def require_present(plan: LaunchPlan, transports: dict[str, Transport],
                    specs: dict[str, HostSpec]) -> None:
    """With --no-sync the script must already be at its path on every host (or in its
    container); say so before anything starts rather than as torchrun's exit 127."""
    if plan.module is not None:
        return  # a module may live anywhere on the host's sys.path
    script = plan.script.name

    def one(spec: HostSpec) -> None:
        node = next(n for n in plan.nodes if n.name == spec.name)
        if script not in _remote(transports[spec.name], spec, node.cwd, [script],
                                 mkdir=False):
            where = f"in container {spec.container!r} there" if spec.container else "there"
            raise PreflightError(f"{spec.name}: --no-sync, but {node.cwd}/{script} is not "
                                 f"{where}. Put the code there (a shared filesystem or a volume "
                                 "at the same path), or launch without --no-sync to copy it.")

    remote = [specs[n.name] for n in plan.nodes if not n.local]
    parallel.run(one, remote, SYNC_SECONDS).raise_if_failed(
        "the script is missing on some hosts; nothing was started")


def _stream_method(spec: HostSpec) -> str:
    if spec.container:
        return f"{spec.container_engine or 'engine'} exec"
    return "srun" if spec.transport == "srun" else "ssh"


@dataclass(frozen=True)
class Early:
    """Manifests read before the sync (launch/headstart.py): this machine's, of ``src`` without
    ``patterns``, and ``hosts``: {host: (destination, its manifest there)}."""

    src: Path
    patterns: tuple[str, ...]
    local: dict[str, tuple[int, str]]
    hosts: dict[str, tuple[str, dict[str, tuple[int, str]]]]


def sync(plan: LaunchPlan, transports: dict[str, Transport], specs: dict[str, HostSpec],
         facts: dict[str, dict[str, Any]], excludes: Sequence[str], *,
         early: Optional[Callable[[], Early]] = None) -> dict[str, str]:
    """Copy the script's directory to every remote host; return per host how it went.
    ``early``: the manifests read during preflight, when they are of the same files."""
    src = plan.code_dir
    left_out = patterns(src, excludes)
    known = early() if early is not None else None
    ahead: dict[str, tuple[str, dict[str, tuple[int, str]]]] = {}
    if known is not None and known.src == src.resolve() and known.patterns == left_out:
        local, ahead = known.local, known.hosts
    else:
        local = manifest(src, left_out)
    files = sorted(local)
    forced = os.environ.get("CLUSTERRUN_SYNC")  # "rsync" or "stream": the tests take each path
    have_rsync = shutil.which("rsync") is not None

    def one(spec: HostSpec) -> str:
        node = next(n for n in plan.nodes if n.name == spec.name)
        transport = transports[spec.name]
        dest = node.code_dest or node.cwd
        found = ahead.get(spec.name)
        read_early = found is not None and found[0] == dest
        before = found[1] if found is not None and read_early else _remote(
            transport, spec, dest, files, mkdir=True)
        changed = [rel for rel in files if before.get(rel) != local[rel]]
        if not changed:  # that manifest was the verification: every file already matched
            return f"unchanged: 0 of {len(files)} files copied, all {len(files)} verified"
        size = sum(local[rel][0] for rel in changed)
        ssh = ssh_of(transport)
        use_rsync = (ssh is not None and not spec.container
                     and spec.transport != "srun" and have_rsync
                     and bool(facts[spec.name].get("rsync")) and forced != "stream"
                     and (size > STREAM_BYTES or forced == "rsync"))
        if use_rsync:
            assert ssh is not None
            method = "rsync"
            if read_early:  # that read created nothing: rsync needs the parents (0700)
                _remote(transport, spec, dest, [], mkdir=True)
            _rsync(ssh, spec, src, dest, left_out)
            after = _remote(transport, spec, dest, files, mkdir=False)
        else:
            method = _stream_method(spec)
            after = _remote(transport, spec, dest, files, mkdir=True, src=src, write=changed,
                            local=local)
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
