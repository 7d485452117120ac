"""`clusterrun ps`: one run's state on this host (stdlib only, Python 3.6+)."""

import json
import sys

from clusterrun.remote.hostlib import hostio, procs
from clusterrun.remote.shared import nodestate, protocol


def main(req):
    state = procs.observed(nodestate.read(req["rundir"]))
    hostio.reply({protocol.KIND: protocol.STATUS,
                  "state": state.raw if state is not None else None})


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
