"""A file's size and SHA-256, read in blocks (stdlib only, Python 3.6+): one definition for the
host that lists a file and the controller that checks its copy (`pull`), and for the code copy's
own listing (launch/sync.py)."""

import hashlib
from typing import Tuple

BLOCK = 1 << 20


def size_and_sha256(path: str) -> Tuple[int, str]:
    """(bytes, hex digest); OSError when the file cannot be read."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            sha.update(block)
            size += len(block)
    return size, sha.hexdigest()
