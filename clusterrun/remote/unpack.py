"""clusterrun file receiver: runs on a host with the host's own Python (stdlib only, 3.6+).

Reads one JSON request ({"root", "files": [[path, size, mode], ...]}), then the files' bytes
back to back on stdin. Each file is written beside its target and renamed into place, so a
reader never sees half a file. This is how code reaches a container, where neither rsync nor
SFTP can: through the engine's `exec -i`, with nothing but the container's Python.
"""

import json
import os
import sys


def _target(root, rel):
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts:
        raise ValueError("refusing to write outside %s: %r" % (root, rel))
    return os.path.join(root, *parts)


def main():
    stdin = sys.stdin.buffer
    req = json.loads(stdin.readline())
    root = os.path.abspath(os.path.expanduser(req["root"]))
    old = os.umask(0o077)
    written = 0
    try:
        for rel, size, mode in req["files"]:
            target = _target(root, rel)
            parent = os.path.dirname(target)
            os.makedirs(parent, exist_ok=True)
            tmp = os.path.join(parent, ".%s.clusterrun-tmp" % os.path.basename(target))
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
            written += 1
    finally:
        os.umask(old)
    sys.stdout.write(json.dumps({"root": root, "written": written}) + "\n")
    sys.stdout.flush()


main()
