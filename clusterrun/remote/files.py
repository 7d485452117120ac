"""clusterrun file manifest: runs on a host with the host's own Python (stdlib only, 3.6+).

Reads one JSON request ({"root", "files", "mkdir"}) and prints the size and SHA-256 of each
listed file under root that exists: how the controller proves every host has the same bytes.
"""

import hashlib
import json
import os
import sys


def main():
    req = json.loads(sys.stdin.buffer.readline())
    root = os.path.abspath(os.path.expanduser(req["root"]))
    if req.get("mkdir"):
        old = os.umask(0o077)
        try:
            os.makedirs(root, exist_ok=True)
        finally:
            os.umask(old)
    manifest = {}
    for rel in req.get("files", []):
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        manifest[rel] = [os.path.getsize(path), digest.hexdigest()]
    sys.stdout.write(json.dumps({"root": root, "manifest": manifest}) + "\n")
    sys.stdout.flush()


main()
