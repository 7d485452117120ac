"""The stall watchdog inside a node's supervisor (stdlib only, Python 3.6+); the rule is
remote/shared/stallrule.py, the measuring progress.py.

Every supervisor measures its node and reports its quiet time every 2 s: attached, to the
controller (a "progress" event; the controller decides and sends back "stall"/"resumed");
detached, to the hub over the gang. The hub decides with the same ``stallrule.stalled``, gathers
every node's stacks over the gang, and writes the report (stallreport.py: the controller's
rule and words too): into its node.log (so `logs` shows
it), and into its state.json (``stall``, and ``state: stalled`` while it lasts, for `ps`). No
rank out of line: it tests the hosts' links first (linkwatch.py) and blames a failing host. With
``--on-stall stop`` the stall becomes the node's own failure with exit status 7, so the gang's
usual teardown ends the run everywhere and a restart (`--max-restarts`) counts it as a failure.
"""

import os
import time

from clusterrun.remote.hostlib import hostio, pystack
from clusterrun.remote.node import linkwatch, progress, watchbase
from clusterrun.remote.shared import layout, protocol, stallreport, stallrule, timing

PROGRESS = protocol.PROGRESS  # the event (attached) and the gang message (detached)
G = protocol.Gang


def report(ranks_by_node, timeout, missing=()):
    """The report (remote/shared/stallreport.py, the controller's too) from the stacks the peers
    sent: ``(lines, record)``. ``missing``: the connected hosts that sent none in time."""
    ranks = [dict(r, node=n) for n, found in ranks_by_node.items() for r in found]
    problems = {n: "%s: no stacks within %g s" % (n, stallrule.STACKS_WAIT) for n in missing}
    lines, record = stallreport.build(ranks, timeout, problems)
    return lines, dict(record, nodes=ranks_by_node, odd_node=stallreport.odd_node(record))


def shipped(rundir):
    """A py-spy `clusterrun stacks` shipped to this host before (<workdir>/runs/.tools)."""
    tools = layout.tools_dir(rundir)
    try:
        found = sorted(n for n in os.listdir(tools) if n.startswith("py-spy-") and "." not in n)
    except OSError:
        return None
    return os.path.join(tools, found[-1]) if found else None


class Watch(watchbase.Watcher):
    """The supervisor's watcher for --stall-timeout: it sees its node through ``node``
    (watchbase.Node), and the gang's hub or peer there on a detached run."""

    ops = (protocol.Lifeline.STALL, protocol.Lifeline.RESUMED)  # the controller's verdict
    gang = (G.PROGRESS, G.STACKS, G.STALL_STOP, *G.LINKS)

    def __init__(self, node, req):
        self.node = node
        self.req = req
        self.timeout = float(req.get("stall_timeout") or 0)
        self.stop_run = req.get("on_stall") == protocol.STALL_STOP
        pyspy = (pystack.host_pyspy(req.get("python") or (req.get("argv") or [None])[0])
                 or shipped(node.rundir))
        self.progress = progress.Progress(node.rundir, node.roots, pyspy,
                                          self.timeout or protocol.STALL_TIMEOUT)
        self.reported = None  # when this node's quiet time was last reported
        self.quiet = {}  # hub: node -> (seconds quiet, when heard)
        self.fired = False
        self.gathering = None  # hub: (deadline, {node: ranks})
        self.dumper = progress.Dumper()
        self.links = None  # hub: the link test of a stall with no odd rank out (linkwatch)
        self.pending = None  # hub: that stall's report, until the test has judged
        self.link_peer = linkwatch.PeerSide()  # peer: its part in the hub's link test
        self.spy_looked = time.monotonic()

    def rank_env(self, env):
        """Where Yama's ptrace_scope is 1 and we are not root, the ranks opt in to be read by
        this user's py-spy (rank.sh: PR_SET_PTRACER_ANY); scope 2 and 3 need CAP_SYS_PTRACE,
        which `check` names. A value the user set is kept (a test can force the path)."""
        if env.get("CLUSTERRUN_PTRACER") or pystack.ptrace_scope() != 1 or os.geteuid() == 0:
            return {}
        python = self.req.get("python") or (self.req.get("argv") or ["python3"])[0]
        return {"CLUSTERRUN_PTRACER": python}

    def tick(self, now):
        if self.timeout <= 0 or not self.node.running():
            return
        if self.progress.pyspy is None and timing.over(now, self.spy_looked, progress.FIND_EVERY):
            self.spy_looked = now  # a `clusterrun stacks` may have shipped one since
            self.progress.pyspy = shipped(self.node.rundir)
        self.progress.look(now)
        if timing.due(now, self.reported, stallrule.REPORT):
            self.reported = now
            quiet = round(self.progress.quiet(now), 1)
            if self.node.peer is not None:
                self.node.peer.send({protocol.OP: G.PROGRESS, "quiet": quiet})
            elif self.node.hub is None:
                self.node.event(PROGRESS, quiet=quiet)
        if self.node.hub is not None:
            self._hub(now)
        elif self.node.peer is not None:
            self.link_peer.tick(self.node.peer, now)
        ready = self.dumper.take()
        if ready is not None and self.node.peer is not None:
            self.node.peer.send({protocol.OP: G.STACKS, "ranks": ready})
        elif ready is not None and self.gathering is not None:
            self.gathering[1][self.node.name] = ready

    def _hub(self, now):
        quiet = {self.node.name: self.progress.quiet(now)}
        for peer, status in self.node.hub.peers.items():
            heard = self.quiet.get(peer)
            if status == "ended":
                quiet[peer] = float("inf")  # its ranks have all finished: no progress there
            else:
                quiet[peer] = heard[0] + (now - heard[1]) if heard else None
        stalled_now = stallrule.stalled(quiet, self.timeout)
        if stalled_now:
            if not self.fired:
                self.fired = True
                self.gathering = (now + stallrule.STACKS_WAIT, {})
                self.node.hub.broadcast({protocol.OP: G.STACKS})
                self.dumper.start(self.progress)
        elif self.fired and self.gathering is None and self.links is None:
            self.resumed()
        if self.gathering is not None:
            deadline, got = self.gathering
            want = {p for p, s in self.node.hub.peers.items() if s == "connected"}
            want.add(self.node.name)
            if want <= set(got) or now > deadline:
                self.gathering = None
                lines, found = report(got, self.timeout, want - set(got))
                if found["odd_node"] is None and self.node.hub.peers:  # none stands out: links?
                    self.links = self._link_test(now)
                    self.pending = (lines, found)
                if self.links is None:
                    self.stalled(lines, found, stalled_now)
        if self.links is not None:
            self.links.tick(now)
            if self.links.result is not None:
                more, record, blamed = self.links.result
                lines, found = self.pending  # type: ignore[misc]  # set with self.links
                self.links = self.pending = None
                self.stalled(lines + more, dict(found, odd_node=blamed, links=record),
                             stalled_now)

    def _link_test(self, now):
        try:
            return linkwatch.HubTest(self.node.hub, self.node.hub.listener.getsockname()[0], now)
        except OSError:  # it cannot listen itself: the report goes out without the test
            return None

    def on_gang(self, peer, msg):
        """A gang message: a peer's quiet time or its stacks (hub), a request for ours (peer)."""
        op = msg.get(protocol.OP)
        if op == G.PROGRESS and peer is not None:
            self.quiet[peer] = (float(msg.get("quiet") or 0), time.monotonic())
        elif op == G.STACKS and peer is not None and self.gathering is not None:
            self.gathering[1][peer] = msg.get("ranks") or []
        elif op == G.STACKS and peer is None:
            self.dumper.start(self.progress)
        elif op == G.STALL_STOP and peer is None:  # the hub: our rank is the stall's cause
            self.stop(str(msg.get("detail") or "stalled"))
        elif op in G.LINKS and peer is None:  # the hub tests the links
            self.link_peer.on_message(self.node.peer, msg)
        elif op in G.LINKS and self.links is not None:
            self.links.on_message(peer, msg)

    def on_op(self, msg):
        """The controller decided (attached): the report to keep here, or the run moves again."""
        op = msg.get(protocol.OP)
        if op != protocol.Lifeline.STALL:
            self.resumed()
        elif msg.get("lines"):  # the master keeps the report
            self.stall_here(list(msg["lines"]), msg.get("report") or {}, stop=False)
        if op == protocol.Lifeline.STALL and msg.get("fail") and self.stop_run:  # fails with 7
            self.stop(str(msg.get("detail") or "stalled"))

    def stalled(self, lines, report, still=True):
        self.stall_here(lines, report)
        if not still:
            self.resumed()

    def stall_here(self, lines, report, stop=True):
        self.fired = True
        self._note(lines)
        self.node.state(state="stalled", stall=dict(report, lines=lines, at=time.time()))
        if not (stop and self.stop_run):
            return
        # The host to stop and its failure's detail, by the controller's rule (stallreport).
        target, detail = stallreport.stop(lines, report)
        by_links = target is not None and not report.get("odd")
        conn = self.node.hub.conns.get(target) if self.node.hub is not None and target else None
        if by_links and target != self.node.name and self.node.hub is not None:
            # Its link is what failed, the gang's to it likely too: the hub records the failure
            # as that host's own (the root cause) and stops the others.
            self.node.hub.record({"node": target, "rank": None, "code": stallrule.STATUS,
                                 "signal": None, "lost": False,
                                 "detail": "%s: %s" % (target, detail)})
        elif conn is not None:  # the hub: the node of the odd rank out fails, as its own failure
            conn.send({protocol.OP: G.STALL_STOP, "detail": detail})
        else:
            self.stop(detail)

    def resumed(self):
        if self.fired:
            self.fired = False
            self._note(["the run moves again: running"])
            self.node.state(state="running")

    def stop(self, detail):
        """--on-stall stop: this node fails with status 7; the gang ends the run everywhere."""
        # As a full disk is: its own failure.
        self.node.fail(stallrule.STATUS, "%s: %s" % (self.node.name, detail), hostio.Cause.STALLED)

    def _note(self, lines):
        """Into node.log, so `logs` shows the report with the run's other lines."""
        text = "".join("clusterrun: %s\n" % line for line in lines)
        try:
            fd = os.open(os.path.join(self.node.rundir, "node.log"),
                         os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            try:
                os.write(fd, text.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            pass
