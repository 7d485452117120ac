"""The watchers of every node's supervisor, in the order it ticks them (stdlib only, Python
3.6+; the protocol is in watchbase.py). The supervisor (run.py) dispatches to what ``standard``
returns and knows none of them: a new concern of a running node is a watcher added here.
"""

import time

from clusterrun.remote.hostlib import counters, hostio
from clusterrun.remote.node import diskwatch, nccllog, stallhub, stallpeer, stallreach, watchbase
from clusterrun.remote.shared import diskfloor, protocol


class Nccl(watchbase.Watcher):
    """What NCCL chose here, from the files NCCL_DEBUG_FILE names (none on a gloo run)."""

    def __init__(self, node, req):
        self.node = node
        self.files = nccllog.Watcher(node.rundir, req.get("public", {}).get("world_size"))

    def tick(self, now, force=False):
        found = self.files.poll(now, force)
        if found is not None:
            self.node.state(nccl=found)  # for `ps`/`logs` of a detached run: nobody hears the event
            self.node.event(protocol.NCCL, **found)

    def finish(self):
        self.tick(time.monotonic(), force=True)


class Disk(watchbase.Watcher):
    """A run whose host can no longer keep its output is stopped, with the host named, before
    lines go missing (docs/reliability.md: a full disk)."""

    def __init__(self, node):
        self.node = node
        self.watch = diskwatch.Watch(node.rundir)

    def tick(self, now):
        full = self.watch.check(now)
        if full is None or not self.node.running():
            return
        # At once, not after --grace: ranks printing flat out would fill the margin meanwhile,
        # and the supervisor's own final state must still fit.
        self.node.fail(diskfloor.STATUS, "%s: %s" % (self.node.name, full), hostio.Cause.DISK_FULL,
                       force=True)


class Gang(watchbase.Watcher):
    """A detached run's link between the supervisors (gang.py): heartbeats, leases, and what
    waits to be sent."""

    def __init__(self, node):
        self.node = node

    def tick(self, now):
        for link in (self.node.hub, self.node.peer):
            if link is not None:
                link.tick()


class Counters(watchbase.Watcher):
    """The readings `top` starts its rates at (hostlib/counters.py), kept while the job runs."""

    def __init__(self, node, req):
        public = req.get("public") or {}
        first, last = public.get("ranks") or (0, -1)
        self.node = node
        self.keeper = counters.Keeper(node.rundir, public.get("interface"), node.roots,
                                      last - first + 1)
        self.keeping = True

    def tick(self, now):
        if self.keeping and self.node.running():
            try:
                self.keeper.tick(now)
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                # A /proc this parser does not know: `top` waits its window again and the
                # run goes on (a reading is an aid to a view, never a cause to end a job).
                self.keeping = False
                self.keeper.forget()

    def finish(self):
        self.keeper.forget()


def stall_role(node, req):
    """This node's part in the stall watchdog: the master's supervisor decides for the run
    (stallhub.py), reaching the others over the gang (detached) or through the controller
    (attached: ``stall_nodes``, the run's nodes, in the master's request only); every other
    node reports to it (stallpeer.py)."""
    link = req.get("gang") or {}
    timeout = float(req.get("stall_timeout") or 0)
    if link.get("role") == "hub":
        return stallhub.Decider(node, req, stallreach.ByGang(node, timeout))
    if link:
        return stallpeer.Peer(node, req)
    if req.get("stall_nodes"):
        return stallhub.Decider(node, req, stallreach.ByController(node, timeout,
                                                                    req["stall_nodes"]))
    return stallpeer.Reporter(node, req)


def standard(node, req):
    """Every supervisor's watchers, for the run ``req`` asks for."""
    return [Nccl(node, req), Disk(node), stall_role(node, req), Gang(node), Counters(node, req)]
