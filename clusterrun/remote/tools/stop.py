"""`clusterrun stop`: end one run on this host from a new controller (stdlib only, 3.6+).

Asks the run's supervisor (SIGTERM: graceful; SIGUSR2: at once) and waits for it. If the
supervisor itself is gone, kills what it recorded, checking each process's identity (pid and
start time) first: never a name pattern; and whatever is left in the run's cgroup.
"""

import json
import os
import signal
import sys
import time

from clusterrun.remote.hostlib import cgroup, hostio, procs
from clusterrun.remote.shared import nodestate, protocol


def end_cgroup(path):
    """Whatever is left in the run's cgroup (a supervisor that was killed left it behind):
    only a directory clusterrun named, inside a cgroup v2 hierarchy."""
    mount = cgroup.mount_point()
    if (not path or mount is None or not path.startswith(mount.rstrip("/") + "/")
            or not os.path.basename(path).startswith("clusterrun-") or not os.path.isdir(path)):
        return
    cgroup.end(path, 5)


def main(req):
    rundir = req["rundir"]
    state = nodestate.read(rundir)
    result = {protocol.KIND: protocol.STOPPED, "found": state is not None, "was": None,
              "state": None}
    if state is not None:
        result["was"] = procs.observed(state).state
        deadline = time.monotonic() + float(req.get("grace", protocol.GRACE)) + 10
        supervisor = state.supervisor_pid
        if supervisor and not state.ended and procs.alive(state):
            sig = procs.FORCE_SIGNAL if req.get("force") else signal.SIGTERM
            os.kill(supervisor, sig)
            while time.monotonic() < deadline and procs.alive(state):
                time.sleep(0.2)
            if procs.alive(state):
                os.kill(supervisor, procs.FORCE_SIGNAL)
                time.sleep(2)
        torchrun = state.torchrun_pid
        if torchrun and procs.launcher_alive(state):
            procs.signal_all([*procs.descendants(torchrun), torchrun], signal.SIGKILL)
        end_cgroup(state.cgroup)
        after = procs.observed(nodestate.read(rundir))
        result["state"] = after.raw if after is not None else None
    hostio.reply(result)


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
