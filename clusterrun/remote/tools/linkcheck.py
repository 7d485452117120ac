"""A stalled run's data path, tested again between its hosts (stdlib only, 3.6+).

When every rank of a stalled run waits in the same collective, no rank stands out, and a host
whose data path broke (a NIC or switch port flapping, SSH still up) is the likely cause. The
controller runs this on every host of the run at once, as preflight's all-pairs test does
(remote/probe/meshtest.py): the request ``{"addr"}`` (the address the run's ranks use there); it
listens on an ephemeral port of that address and answers ``{"port"}``; the next line on stdin is
``{"targets": [[name, addr, port], ...], "timeout"}``, every other host's listener; it connects
to all of them at once and answers ``{"pairs": {name: {"ok", "error", "seconds"}}}``. Its
listener stays open until stdin ends (the controller closes it once every host has answered):
a host that finished first must not refuse one still connecting to it.
"""

import json
import sys

from clusterrun.remote.hostlib import hostio
from clusterrun.remote.probe import meshtest


def main(stdin):
    request = json.loads(stdin.readline() or b"{}")
    try:
        listener = meshtest.EphemeralListener(request["addr"])
    except (OSError, KeyError) as exc:
        hostio.reply({"error": "cannot listen on an ephemeral port of %s: %s"
                       % (request.get("addr"), exc)})
        return
    hostio.reply({"port": listener.port})
    line = stdin.readline()
    if not line:  # the controller gave up on the test: nothing to connect to
        listener.sock.close()
        return
    asked = json.loads(line)
    pairs = meshtest.connect_many(asked.get("targets") or [], request["addr"],
                              float(asked.get("timeout") or 5))
    hostio.reply({"pairs": pairs})
    stdin.readline()  # EOF: every host has answered
    listener.sock.close()


if __name__ == "__main__":
    main(sys.stdin.buffer)
