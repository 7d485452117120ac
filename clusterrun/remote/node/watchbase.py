"""What the node supervisor dispatches to (stdlib only, Python 3.6+): a *watcher*, one concern of
a running node (what NCCL chose, the disk, the stall watchdog, the gang's link), and ``Node``, the
narrow side of the supervisor a watcher sees.

As ClusterShell's event handlers are: a watcher overrides only what it needs and says what it
listens to, ``ops`` from the controller and ``gang`` messages from the other supervisors. The
supervisor calls ``tick`` on every turn of its loop, in the order the watchers were registered
(remote/node/lineup.py), and ``finish`` once the job has ended, for a last look.
"""

from clusterrun.remote.hostlib import cgroup, hostio


class Watcher:
    ops = ()  # type: tuple[str, ...]  # the controller's ops handed to on_op
    gang = ()  # type: tuple[str, ...]  # the gang messages handed to on_gang

    def rank_env(self, env):
        """What the ranks' environment needs from this watcher (``env``: as it stands)."""
        return {}

    def tick(self, now):
        pass

    def on_op(self, msg):
        pass

    def on_gang(self, peer, msg):
        """``peer``: the worker it came from (on the hub); None: from the hub (on a worker)."""

    def finish(self):
        pass


class Node:
    """What a watcher sees of its node's supervisor, and all it may do there."""

    def __init__(self, sup):
        self._sup = sup
        self.name = sup.name
        self.rundir = sup.rundir

    @property
    def hub(self):
        """The gang's hub (gang.Hub) on a detached run's master, else None."""
        return self._sup.hub

    @property
    def peer(self):
        """The link to the hub (gang.Peer) on a detached run's worker, else None."""
        return self._sup.peer

    def running(self):
        """The job runs: not starting, stopping or ended."""
        return self._sup.phase is hostio.Phase.RUNNING

    def roots(self):
        """The job's processes: torchrun (or the launcher), and its cgroup's members."""
        roots = [self._sup.tree.pid] if self._sup.tree.pid else []
        if self._sup.group:
            roots.extend(cgroup.members(self._sup.group))
        return roots

    def event(self, kind, **fields):
        """An event for the controller (nobody reads it on a detached run)."""
        self._sup.writer.event(kind, **fields)

    def state(self, **fields):
        """Into the node's state.json (what `ps` and `logs` read)."""
        return self._sup.state(**fields)

    def fail(self, code, detail, cause, force=False):
        """The node fails on its own with exit status ``code``: Supervisor.fail."""
        self._sup.fail(code, detail, cause, force)
