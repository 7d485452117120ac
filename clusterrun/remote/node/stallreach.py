"""How the stall decider (stallhub.py) reaches the run's other nodes (stdlib only, Python
3.6+): the gang on a detached run, the controller on an attached one.

A reach hears the other nodes' quiet times (``quiet``), gathers every rank's stack (``gather``,
then ``gathered``: the report, or None while it waits), tests the hosts' links (``test_links``,
then ``tested``), and carries out a decision elsewhere (``decided``: whether it stopped the
blamed node there; ``resumed``).
"""

import time

from clusterrun.remote.node import linkwatch, progress, stallwatch
from clusterrun.remote.shared import linkrule, protocol, stallreport, stallrule

TYPE_CHECKING = False  # mypy takes it as true; hosts skip importing typing
if TYPE_CHECKING:
    from typing import Any, Optional  # noqa: F401 - used in type comments

G = protocol.Gang
L = protocol.Lifeline


def collected(got, timeout):
    """The report from the stacks an attached run's controller collected (its ``stacks`` op:
    the ranks as the hosts sent them, what it could not see, torch's Flight Recorder)."""
    return stallreport.build(got.get("ranks") or [], timeout, got.get("problems") or {},
                             records=got.get("flight") or ())


class ByGang:
    """A detached run: the peers' quiet times and stacks come over the gang (stallpeer.py
    ``Peer``), the link test runs over it (linkwatch.py), and the report stays on this host
    (state.json, node.log) for `ps` and `logs`."""

    ops = ()
    gang = (G.PROGRESS, G.STACKS, *G.LINKS)

    def __init__(self, node, timeout):
        self.node = node
        self.timeout = timeout
        self.heard = {}  # peer -> (seconds quiet, when heard)
        self.dumper = progress.Dumper()
        self.got = None  # type: Optional[dict[str, Any]]  # while gathering: {node: ranks}
        self.deadline = 0.0
        self.links = None  # type: Optional[linkwatch.HubTest]

    @property
    def hub(self):
        return self.node.hub

    def own(self, quiet):
        pass  # the decider is here

    def quiet(self, now):
        out = {}  # type: dict[str, Optional[float]]
        for peer, status in self.hub.summary().items():
            heard = self.heard.get(peer)
            if status == "ended":
                out[peer] = float("inf")  # its ranks have all finished: no progress there
            else:
                out[peer] = heard[0] + (now - heard[1]) if heard else None
        return out

    def on_op(self, msg):
        pass

    def on_gang(self, peer, msg):
        op = msg.get(protocol.OP)
        if op == G.PROGRESS and peer is not None:
            self.heard[peer] = (float(msg.get("quiet") or 0), time.monotonic())
        elif op == G.STACKS and peer is not None and self.got is not None:
            self.got[peer] = msg.get("ranks") or []
        elif op in G.LINKS and self.links is not None:
            self.links.on_message(peer, msg)

    def gather(self, now, measured):
        self.got, self.deadline = {}, now + stallrule.STACKS_WAIT
        self.hub.broadcast({protocol.OP: G.STACKS})
        self.dumper.take()  # one the last stall waited no longer for
        self.dumper.start(measured)

    def gathered(self, now):
        got = self.got
        if got is None:
            return None
        ready = self.dumper.take()
        if ready is not None:
            got[self.node.name] = ready
        want = self.hub.connected() | {self.node.name}
        if not (want <= set(got) or now > self.deadline):
            return None
        self.got = None
        return stallwatch.report(got, self.timeout, want - set(got))

    def test_links(self, now):
        if not self.hub.summary():
            return False  # one host: its ranks talk over loopback, no link to test
        try:
            self.links = linkwatch.HubTest(self.hub, self.hub.address(), now)
        except OSError:  # it cannot listen itself: the report goes out without the test
            return False
        return True

    def tested(self, now):
        test = self.links
        if test is None:
            return None
        test.tick(now)
        if test.result is None:
            return None
        more, record, blamed = test.result
        self.links = None
        return more, {"odd_node": blamed, "links": record}

    def decided(self, lines, report, stop):
        if stop is None or stop[0] in (None, self.node.name):
            return False
        target, detail = stop
        if not report.get("odd"):
            # Its link is what failed, the gang's to it likely too: the hub records the failure
            # as that host's own (the root cause) and stops the others.
            self.hub.record({"node": target, "rank": None, "code": stallrule.STATUS,
                             "signal": None, "lost": False,
                             "detail": "%s: %s" % (target, detail)})
            return True
        # The node of the odd rank out fails, as its own failure.
        return self.hub.tell(target, {protocol.OP: G.STALL_STOP, "detail": detail})

    def resumed(self):
        pass


class ByController:
    """An attached run: the controller passes the other nodes' quiet times on (their
    ``progress`` events), collects the stacks and tests the links over SSH when asked
    (``stall_ask``), and shows, records and carries out what was decided (``stalled``,
    ``resumed``): clusterrun/stacks/stallview.py."""

    ops = (L.PROGRESS, L.STACKS, L.LINKS)
    gang = ()

    def __init__(self, node, timeout, nodes):
        self.node = node
        self.timeout = timeout
        self.heard = dict.fromkeys(n for n in nodes if n != node.name)
        self.stacks = None  # the controller's answer to "stacks"
        self.links = None  # and to "links"

    def own(self, quiet):
        self.node.event(protocol.PROGRESS, quiet=quiet)  # for watch.json, as every node's

    def quiet(self, now):
        return {n: (h[0] + now - h[1]) if h else None for n, h in self.heard.items()}

    def on_op(self, msg):
        op = msg.get(protocol.OP)
        if op == L.PROGRESS and msg.get("node") in self.heard:
            self.heard[msg["node"]] = (float(msg.get("quiet") or 0), time.monotonic())
        elif op == L.STACKS:
            self.stacks = msg
        elif op == L.LINKS:
            self.links = msg

    def on_gang(self, peer, msg):
        pass

    def gather(self, now, measured):
        self.stacks = None
        self.node.event(protocol.STALL_ASK, what=L.STACKS)

    def gathered(self, now):
        got = self.stacks
        if got is None:
            return None
        self.stacks = None
        return collected(got, self.timeout)

    def test_links(self, now):
        self.links = None
        self.node.event(protocol.STALL_ASK, what=L.LINKS)
        return True

    def tested(self, now):
        got = self.links
        if got is None:
            return None
        self.links = None
        more, record, _blamed = linkrule.judge(
            got.get("hosts") or [], [tuple(b) for b in got.get("blocked") or []],
            got.get("addresses") or {}, got.get("untested") or {})
        return more, {"links": record}

    def decided(self, lines, report, stop):
        target, detail = stop if stop is not None else (None, None)
        elsewhere = target not in (None, self.node.name)
        self.node.event(protocol.STALLED, lines=lines, report=report,
                        stop=target if elsewhere else None, detail=detail)
        return elsewhere

    def resumed(self):
        self.node.event(protocol.RESUMED)
