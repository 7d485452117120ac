"""The run's one stall decider, in the master's supervisor (stdlib only, Python 3.6+), for
attached and detached runs alike.

It applies ``stallrule.stalled`` to every node's quiet time; when the run is stalled it gathers
every rank's stack, builds the report (stallreport.py), and when no rank stands out it has the
hosts' links tested again, so that a host whose links fail is the root cause. What it cannot do
itself it asks of its *reach* (stallreach.py): the gang on a detached run, the controller on an
attached one, which also shows what was decided. One report per stall: the run must move again
(``resumed``) before another one.
"""

import time

from clusterrun.remote.node import stallwatch
from clusterrun.remote.shared import stallreport, stallrule


class Decider(stallwatch.Watch):
    """The master's role: decides, keeps the report (node.log, state.json), and stops the
    blamed node with --on-stall stop."""

    def __init__(self, node, req, reach):
        super().__init__(node, req)
        self.reach = reach
        self.ops = reach.ops
        self.gang = reach.gang
        self.fired = False
        self.step = None  # while a stall's report is made: "stacks", then maybe "links"
        self.found = None  # the report (lines, record) waiting for the link test

    def tell(self, quiet):
        self.reach.own(quiet)

    def turn(self, now):
        quiet = dict(self.reach.quiet(now))
        quiet[self.node.name] = self.progress.quiet(now)
        still = stallrule.stalled(quiet, self.timeout)
        if still and not self.fired:
            self.fired = True
            self.step = "stacks"
            self.reach.gather(now, self.progress)
        elif not still and self.fired and self.step is None:
            self.resumed()
        if self.step == "stacks":
            got = self.reach.gathered(now)
            if got is not None:
                self.step = None
                # No rank stands out (all wait in one collective, or none could be seen):
                # the hosts' data path is tested again first.
                if stallreport.odd_node(got[1]) is None and self.reach.test_links(now):
                    self.step, self.found = "links", got
                else:
                    self.stalled(got[0], got[1], still)
        made = self.found
        if self.step == "links" and made is not None:
            tested = self.reach.tested(now)
            if tested is not None:
                self.found = self.step = None
                more, record = tested
                self.stalled(made[0] + more, dict(made[1], **record), still)

    def on_op(self, msg):
        self.reach.on_op(msg)

    def on_gang(self, peer, msg):
        self.reach.on_gang(peer, msg)

    def stalled(self, lines, report, still=True):
        self.fired = True
        stallwatch.note(self.node.rundir, lines)
        self.node.state(state="stalled", stall=dict(report, lines=lines, at=time.time()))
        # The host to stop and its failure's detail (stallreport.stop): the odd rank's host, or
        # the one whose links failed; neither (None): the master, whose failure's detail says
        # that no host is blamed (wire.RootCause).
        stop = stallreport.stop(lines, report) if self.stop_run else None
        if not self.reach.decided(lines, report, stop) and stop is not None:
            self.stop(stop[1])
        if not still:
            self.resumed()

    def resumed(self):
        if self.fired:
            self.fired = False
            stallwatch.note(self.node.rundir, [stallreport.MOVES_AGAIN])
            self.node.state(state="running")
            self.reach.resumed()
