"""Tools clusterrun ships to a host, kept by content (stdlib only, Python 3.6+).

py-spy is the one: ``<workdir>/runs/.tools/py-spy-<sha>`` (the first 16 hex digits of its
SHA-256), for every run of that workdir. `clusterrun stacks` ships it when a host has none
(stackdump.py), and `launch` does so before a run whose stall watchdog is on, so that the
supervisors can read their ranks' stacks from the start (the supervisors look there:
remote/node/stallwatch.py ``shipped``).

As a program: the request ``{"path", "size"}``, then ``size`` bytes on stdin; the answer says
where it went.
"""

import json
import os
import sys

from clusterrun.remote.hostlib import hostio
from clusterrun.remote.shared import protocol


def receive(path, size, stdin):
    """The shipped binary, written beside its place then renamed: never half a file."""
    hostio.make_private_dir(os.path.dirname(path))
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "wb") as out:
        left = size
        while left:
            block = stdin.read(min(left, 1 << 20))
            if not block:
                raise EOFError("py-spy's copy ended early")
            out.write(block)
            left -= len(block)
    os.chmod(tmp, 0o700)
    os.replace(tmp, path)


def main(stdin):
    req = json.loads(stdin.readline())
    path = req["path"]
    receive(path, int(req["size"]), stdin)
    hostio.reply({protocol.KIND: protocol.TOOLS, "path": path, "runs": os.access(path, os.X_OK)})


if __name__ == "__main__":
    main(sys.stdin.buffer)
