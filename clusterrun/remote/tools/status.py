"""`clusterrun ps`: one run's state on this host (stdlib only, Python 3.6+)."""

import json
import os
import sys

from clusterrun.remote.hostlib import hostio, procs
from clusterrun.remote.shared import protocol


def main(req):
    state = hostio.read_json(os.path.join(req["rundir"], "state.json"))
    hostio.reply({protocol.KIND: protocol.STATUS, "state": procs.observed(state)})


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
