"""A JSON file in a rundir, written whole or not at all (stdlib only, Python 3.6+): the node's
state (nodestate.py) and the plan's word on it (spec.json)."""

import contextlib
import json
import os
from typing import Any


def write(path: str, obj: Any) -> None:
    """Atomic and private: readers (ps, stop) never see half a file."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(obj, handle)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk: leave no half-written file behind
            os.unlink(tmp)
        raise


def read(path: str) -> Any:
    """The file's value, or None where it is missing or not JSON."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
