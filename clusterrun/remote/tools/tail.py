"""`clusterrun logs -f`: stream one run's files on this host by byte offset (stdlib only, 3.6+).

From the offsets the controller already has; with ``follow``, until the run has ended here and
everything is sent. Ends at once when the follower goes away (EOF on stdin).
"""

import json
import os
import sys

from clusterrun.remote.hostlib import hostio, mainloop, procs
from clusterrun.remote.shared import nodestate, protocol


def main(req):
    rundir = req["rundir"]
    if not os.path.isdir(rundir):
        hostio.reply({protocol.KIND: protocol.END, "state": "missing"})
        return
    writer = hostio.Writer(hostio.Clock(), rundir, req.get("offsets"),
                           heartbeat=float(req.get("heartbeat", 2)))
    writer.start()
    loop = mainloop.Loop()
    gone = []
    mainloop.Lifeline(loop, lambda _msg: None, lambda: gone.append(True))
    told = None  # the run's state as last told: a detached hub's stall comes and goes
    while req.get("follow") and not writer.broken and not gone:
        state = nodestate.read(rundir)
        if state is None or state.ended or not procs.alive(state):
            break
        now = {"state": state.state, "stall": state.stall}
        if now != told:
            told = now
            writer.event(protocol.STATUS, state=now)
        loop.once(0.2)
    state = procs.observed(nodestate.read(rundir)) or nodestate.Snapshot({})
    final = state.final()
    final["checksums"] = hostio.checksums(rundir)
    writer.end(**final)
    while not gone and not writer.finished.is_set():
        loop.once(0.2)
    return bool(gone)


if __name__ == "__main__":
    if main(json.loads(sys.stdin.buffer.readline())):
        os._exit(0)  # never block on flushing stdout to a follower that is gone
    # else return: the follower may run its next program in this interpreter (chained)
