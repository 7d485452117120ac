"""clusterrun file manifest: runs on a host with the host's own Python (stdlib only, 3.6+).

Reads one JSON request ({"root", "files", "mkdir", "write"}) and prints the size and SHA-256 of
each listed file under root that exists: how the controller proves every host has the same
bytes. With "write" ([[path, size, mode], ...]), those files' bytes follow the request back to
back on stdin and are written first (each beside its target, then renamed into place, so a
reader never sees half a file); the manifest is then read back from the disk, as a separate
check would read it. One program run both copies and verifies a small change.
"""

import errno
import hashlib
import json
import os
import socket
import sys

from clusterrun.remote.probe import pathcheck


def _target(root, rel):
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts:
        raise ValueError("refusing to write outside %s: %r" % (root, rel))
    return os.path.join(root, *parts)


def _write(stdin, root, entries):
    for rel, size, mode in entries:
        target = _target(root, rel)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        # A name of this host's and process's own: where the workdir is on a filesystem the
        # hosts share (an NFS home), every host writes the same file at once.
        tmp = os.path.join(parent, ".%s.%s-%d.clusterrun-tmp"
                           % (os.path.basename(target), socket.gethostname(), os.getpid()))
        with open(tmp, "wb") as out:
            left = size
            while left:
                block = stdin.read(min(left, 1 << 20))
                if not block:
                    raise EOFError("the copy of %s ended after %d of %d bytes"
                                   % (rel, size - left, size))
                out.write(block)
                left -= len(block)
        os.chmod(tmp, mode & 0o777)
        os.replace(tmp, target)


def _digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main():
    stdin = sys.stdin.buffer
    req = json.loads(stdin.readline())
    root = os.path.abspath(os.path.expanduser(req["root"]))
    entries = req.get("write") or []
    if req.get("mkdir") or entries:
        old = os.umask(0o077)
        try:
            os.makedirs(root, exist_ok=True)
            _write(stdin, root, entries)
        except OSError as exc:
            # Said as facts, not a traceback: the controller names what is in the way and the
            # fix (clusterrun/preflight/hostpaths.py).
            # A directory where a file goes: os.replace names the temporary file first.
            at = exc.filename2 if exc.errno == errno.EISDIR else exc.filename
            at = at if isinstance(at, str) else root
            _reply({"root": root, "error": pathcheck.failure(at, exc)})
            sys.exit(1)
        finally:
            os.umask(old)
    manifest = {}
    for rel in req.get("files", []):
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        manifest[rel] = [os.path.getsize(path), _digest(path)]
    _reply({"root": root, "manifest": manifest})


def _reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


main()
