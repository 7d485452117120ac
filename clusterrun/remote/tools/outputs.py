"""`clusterrun pull` on a host: the files the ranks wrote under their working directory, listed
with sizes and SHA-256 digests, and their bytes sent back (stdlib only, Python 3.6+).

One JSON request on stdin (protocol.Outputs names its ops):

- ``{"op": "list", "root", "paths", "run", "skip"}``: the regular files under ``root`` (the
  ranks' working directory). ``paths`` (globs relative to root, expanded here; a directory
  stands for every file under it) picks them; without ``paths``, every file created or changed
  since the run began on this host (the oldest node spec in ``run``, the run's folder here),
  tools' caches (``CACHES``, ``*.pyc``) left out. Folders in ``skip`` (clusterrun's own: run state,
  environments, other copies of code) and symbolic links are never listed. Reply:
  ``{"root", "files": [[rel, size, sha256]], "unmatched": [path], "since", "rsync"}``.
- ``{"op": "send", "root", "files": [rel]}``: each file as one frame line ``{"path", "size"}``
  followed by exactly ``size`` bytes (the size when it was opened), then the reply
  ``{"sent": n}``. A file gone meanwhile is a frame with ``"missing": true`` and no bytes.
"""

import contextlib
import glob
import json
import os
import sys

from clusterrun.remote.shared import layout, protocol
from clusterrun.remote.shared.filedigest import BLOCK, size_and_sha256

# Left out unless asked for by name: what tools write beside code, not what a run produced.
CACHES = ("__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def _inside(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def run_began(run):
    """When the run began on this host: the oldest node spec under its folder (every attempt's
    node writes one as it starts). None when no node of the run started here."""
    found = glob.glob(os.path.join(glob.escape(run), "*", layout.SPEC))
    found += glob.glob(os.path.join(glob.escape(run), "attempt-*", "*", layout.SPEC))
    times = []
    for spec in found:
        with contextlib.suppress(OSError):
            times.append(os.stat(spec).st_ctime)
    return min(times) if times else None


def _walk(top, skip):
    """Every regular file under ``top`` (or ``top`` itself), never through a symbolic link."""
    if os.path.islink(top):
        return
    if os.path.isfile(top):
        yield top
        return
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                             and not any(_inside(os.path.join(dirpath, d), s) for s in skip))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and os.path.isfile(path):
                yield path


def candidates(root, paths, skip, since):
    """{rel: path} of the files asked for, and the paths that matched nothing."""
    found, unmatched = {}, []
    tops = []
    for pattern in paths or ["."]:
        matches = sorted(glob.glob(os.path.join(glob.escape(root), pattern), recursive=True))
        if not matches and paths:
            unmatched.append(pattern)
        tops.extend(matches)
    for top in tops:
        for path in _walk(os.path.normpath(top), skip):
            rel = os.path.relpath(path, root)
            if rel == os.pardir or rel.startswith(os.pardir + os.sep) \
                    or any(_inside(path, s) for s in skip):
                continue
            if not paths:
                parts = rel.split(os.sep)
                if any(p in CACHES for p in parts) or rel.endswith(".pyc"):
                    continue
                try:
                    # The inode's change time, not the modification time a copy may have
                    # kept (cp -p, rsync -a, tar): a file the ranks made or wrote is newer
                    # than the run's start, the code synced before it never is.
                    if since is None or os.stat(path).st_ctime < since:
                        continue
                except OSError:
                    continue
            found[rel.replace(os.sep, "/")] = path
    return found, unmatched


def has_rsync():
    return any(os.access(os.path.join(d, "rsync"), os.X_OK)
               for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep))


def listing(req, root):
    skip = [os.path.realpath(os.path.expanduser(s)) for s in req.get("skip") or []]
    skip = [s for s in skip if not _inside(root, s)]  # never the root itself
    since = run_began(os.path.expanduser(req["run"])) if req.get("run") else None
    found, unmatched = candidates(root, req.get("paths"), skip, since)
    files = []
    for rel, path in sorted(found.items()):
        try:
            size, sha = size_and_sha256(path)
        except OSError:  # removed or made unreadable since it was found
            continue
        files.append([rel, size, sha])
    return {"root": root, "files": files, "unmatched": unmatched, "since": since,
            "rsync": has_rsync()}


def send(out, root, files):
    sent = 0
    for rel in files:
        path = os.path.join(root, *rel.split("/"))
        try:
            handle = open(path, "rb")  # noqa: SIM115 - the frame says whether it opened
        except OSError:
            out.write(protocol.event_frame({"path": rel, "size": 0, "missing": True}))
            continue
        with handle:
            size = os.fstat(handle.fileno()).st_size
            out.write(protocol.event_frame({"path": rel, "size": size}))
            left = size
            while left:
                block = handle.read(min(left, BLOCK))
                if not block:  # shrank while it was read: keep the stream in step
                    block = bytes(min(left, BLOCK))
                out.write(block)
                left -= len(block)
        sent += 1
    return sent


def main():
    req = json.loads(sys.stdin.buffer.readline())
    root = os.path.realpath(os.path.expanduser(req["root"]))
    out = sys.stdout.buffer
    if not os.path.isdir(root):
        out.write(protocol.event_frame({"root": root, "missing": True}))
    elif req.get(protocol.OP) == protocol.Outputs.SEND:
        sent = send(out, root, req.get("files") or [])
        out.write(protocol.event_frame({"sent": sent}))
    else:
        out.write(protocol.event_frame(listing(req, root)))
    out.flush()


main()
