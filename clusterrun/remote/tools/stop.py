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
from clusterrun.remote.shared import protocol


def end_cgroup(path):
    """Whatever is left in the run's cgroup (a supervisor that was killed left it behind):
    only a directory clusterrun named, inside a cgroup v2 hierarchy."""
    mount = cgroup.mount_point()
    if (not path or mount is None or not path.startswith(mount.rstrip("/") + "/")
            or not os.path.basename(path).startswith("clusterrun-") or not os.path.isdir(path)):
        return
    cgroup.end(path, 5)


def main(req):
    path = os.path.join(req["rundir"], "state.json")
    state = hostio.read_json(path)
    result = {protocol.KIND: protocol.STOPPED, "found": state is not None, "was": None,
              "state": None}
    if state is not None:
        result["was"] = procs.observed(state).get("state")
        deadline = time.monotonic() + float(req.get("grace", protocol.GRACE)) + 10
        if not state.get("ended_at") and procs.alive(state):
            sig = procs.FORCE_SIGNAL if req.get("force") else signal.SIGTERM
            os.kill(state["supervisor_pid"], sig)
            while time.monotonic() < deadline and procs.alive(state):
                time.sleep(0.2)
            if procs.alive(state):
                os.kill(state["supervisor_pid"], procs.FORCE_SIGNAL)
                time.sleep(2)
        torchrun = state.get("torchrun_pid")
        if torchrun and procs.start_time(torchrun) == state.get("torchrun_start"):
            procs.signal_all([*procs.descendants(torchrun), torchrun], signal.SIGKILL)
        end_cgroup(state.get("cgroup"))
        result["state"] = procs.observed(hostio.read_json(path))
    hostio.reply(result)


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
