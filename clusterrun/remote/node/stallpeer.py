"""The stall watchdog's role on every node but the master (stdlib only, Python 3.6+): it says
its quiet time, hands over its stacks, and fails when the decider (stallhub.py, on the master's
supervisor) puts the stall on it.
"""

from clusterrun.remote.node import linkwatch, progress, stallwatch
from clusterrun.remote.shared import protocol

G = protocol.Gang


class Peer(stallwatch.Watch):
    """A detached run's worker: its quiet time and, when asked, its stacks go to the hub over
    the gang; it takes part in the hub's link test (linkwatch.py)."""

    gang = (G.STACKS, G.STALL_STOP, *G.LINKS)

    def __init__(self, node, req):
        super().__init__(node, req)
        self.dumper = progress.Dumper()
        self.links = linkwatch.PeerSide()

    def tell(self, quiet):
        self.node.peer.send({protocol.OP: G.PROGRESS, "quiet": quiet})

    def turn(self, now):
        self.links.tick(self.node.peer, now)
        ready = self.dumper.take()
        if ready is not None:
            self.node.peer.send({protocol.OP: G.STACKS, "ranks": ready})

    def on_gang(self, peer, msg):
        op = msg.get(protocol.OP)
        if op == G.STACKS:
            self.dumper.start(self.progress)
        elif op == G.STALL_STOP:  # the hub: our rank is the stall's cause
            self.stop(str(msg.get("detail") or "stalled"))
        elif op in G.LINKS:  # the hub tests the links
            self.links.on_message(self.node.peer, msg)


class Reporter(stallwatch.Watch):
    """An attached run's worker: its quiet time goes to the controller (a ``progress`` event),
    which passes it on to the master and collects the stacks over SSH; the controller passes
    on the master's stop too."""

    ops = (protocol.Lifeline.STALL,)

    def tell(self, quiet):
        self.node.event(protocol.PROGRESS, quiet=quiet)

    def on_op(self, msg):
        if msg.get("fail") and self.stop_run:  # fails with 7
            self.stop(str(msg.get("detail") or "stalled"))
