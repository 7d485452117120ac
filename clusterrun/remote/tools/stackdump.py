"""`clusterrun stacks`: the Python stacks of one run's ranks on this host (stdlib only, 3.6+).

Request: ``{"rundir", "python", "tools", "ranks": [R...] or null, "pyspy": {"sha", "size"}}``.
py-spy is the host's own (next to its Python or on PATH), else the copy clusterrun shipped
before (``<tools>/py-spy-<sha>``). With neither, the answer is ``need_pyspy``; the controller
then asks again with the binary (``send``: its ``size`` bytes follow the request on stdin),
which is kept for next time. The ranks are read, never stopped (py-spy --nonblocking).
"""

import json
import os
import sys

from clusterrun.remote.hostlib import flightpipe, hostio, procs, pystack
from clusterrun.remote.shared import flight, nodestate, protocol
from clusterrun.remote.tools import profiler, toolcache


def cached(req):
    spy = req.get("pyspy") or {}
    if not spy.get("sha") or not req.get("tools"):
        return None
    return os.path.join(req["tools"], "py-spy-%s" % spy["sha"][:16])


def pick_pyspy(req, stdin):
    found = pystack.host_pyspy(req.get("python") or sys.executable)
    if found:
        return found
    path = cached(req)
    if path and req.get("send"):
        toolcache.receive(path, int(req["pyspy"]["size"]), stdin)
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


def main(stdin):
    req = json.loads(stdin.readline())
    rundir = req["rundir"]
    state = nodestate.read(rundir)
    # uname's system and CPU: the controller ships its py-spy only where both match the binary.
    answer = {protocol.KIND: protocol.STACKS, "found": state is not None, "ranks": [],
              "system": os.uname()[0], "machine": os.uname()[4],
              "scope": pystack.ptrace_scope(), "uid": os.getuid(), "need_pyspy": False}
    state = procs.observed(state)
    answer["state"] = state.state if state is not None else None
    roots = procs.rank_roots(state) if state is not None and not state.ended else []
    ranks = pystack.find_ranks(rundir, roots) if roots else {}
    wanted = req.get("ranks")
    if wanted is not None:
        ranks = {r: p for r, p in ranks.items() if r in wanted}
    if ranks:
        pyspy = pick_pyspy(req, stdin)
        if pyspy is None:
            answer["need_pyspy"] = True
        else:
            answer["pyspy"] = pyspy
            # --profile: the window first, so the stacks shown are the latest.
            shares = profiler.record_all(pyspy, ranks, float(req["profile"])) \
                if req.get("profile") else {}
            answer["ranks"] = pystack.dump_all(pyspy, ranks, rundir)
            for entry in answer["ranks"]:
                entry["profile"] = shares.get(entry["rank"])
    if ranks:  # a live run: ranks with a Flight Recorder pipe (NCCL) dump it now
        answer["flight_asked"] = flightpipe.request(rundir)
    answer["flight"] = flight.flight(rundir)  # torch's Flight Recorder, if it dumped
    hostio.reply(answer)


if __name__ == "__main__":
    main(sys.stdin.buffer)
