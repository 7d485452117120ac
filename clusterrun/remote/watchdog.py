"""The stall watchdog inside a node's supervisor (stdlib only, Python 3.6+); the rule and the
measuring are in stall.py.

Every supervisor measures its node and reports its quiet time every 2 s: attached, to the
controller (a "progress" event; the controller decides and sends back "stall"/"resumed");
detached, to the hub over the gang. The hub decides with the same ``stall.stalled``, gathers
every node's stacks over the gang, and writes the report: into its node.log (so `logs` shows
it), and into its state.json (``stall``, and ``state: stalled`` while it lasts, for `ps`). No
rank out of line: it tests the hosts' links first (linkwatch.py) and blames a failing host. With
``--on-stall stop`` the stall becomes the node's own failure with exit status 7, so the gang's
usual teardown ends the run everywhere and a restart (`--max-restarts`) counts it as a failure.
"""

import os
import time

from clusterrun.remote import common, linkwatch, protocol, pystack, stall, watcher

PROGRESS = protocol.PROGRESS  # the event (attached) and the gang message (detached)


def stop_detail(lines):
    """The failure a stopped stall records: its odd rank out, or the report's first line."""
    odd = [x for x in lines if "odd one out" in x]
    return ("stalled, %s" % (odd[0] if odd else lines[0] if lines else "no progress")
            ).replace("stall: ", "", 1)


def spans(numbers):
    """[0, 1, 2, 5] -> "0-2,5"."""
    out = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in out)


def _lines(ranks_by_node, timeout):
    """The report: odd ranks out first (node, rank, frame, last line), then the waiting group."""
    ranks = [dict(r, node=n) for n, found in ranks_by_node.items() for r in found]
    if not [r for r in ranks if not r.get("error")]:
        return blind(ranks, timeout), None
    groups = {}
    # A rank whose stack could not be read is no odd one out: not seeing it names no host.
    for rank in [r for r in ranks if not r.get("error")]:
        main = [t for t in rank.get("threads") or [] if t.get("name") == "MainThread"]
        frames = (main or rank.get("threads") or [{}])[0].get("frames") or []
        key = (rank.get("error"), rank.get("state") == "T",
               tuple((f["function"], f["file"], f["line"]) for f in frames))
        active = (main or rank.get("threads") or [{}])[0].get("active")
        groups.setdefault(key, []).append((rank, frames, active))
    # Ranks outside any collective first (the likelier cause), then the smallest groups.
    ordered = sorted(groups.values(), key=lambda g: (
        pystack.peer_wait(g[0][1], g[0][2]) is not None, len(g), g[0][0]["rank"]))
    out = ["stall: no rank made progress for %d s; %d ranks, %d different stacks"
           % (timeout, len(ranks), len(ordered))]
    odd_node = None
    for index, members in enumerate(ordered):
        rank, frames, active = members[0]
        wait = pystack.peer_wait(frames, active)
        where = rank.get("error") or ("%s (%s:%d)" % (frames[-1]["function"], frames[-1]["file"],
                                                       frames[-1]["line"]) if frames else "?")
        numbers = sorted(m[0]["rank"] for m in members)
        nodes = sorted({m[0]["node"] for m in members})
        if index < len(ordered) - 1 or (len(ordered) == 1 and len(members) == 1):
            for member in sorted((m[0] for m in members), key=lambda m: m["rank"]):
                odd_node = odd_node or member["node"]
                stopped = " STOPPED (SIGSTOP)" if member.get("state") == "T" else ""
                out.append("stall: odd one out: rank %d on %s (pid %d)%s in %s; last line: %r"
                           % (member["rank"], member["node"], member["pid"], stopped,
                              "the collective " + wait if wait else where,
                              member.get("last_line", "")))
                if member.get("where"):  # its own line, and its DataLoader workers'
                    out.append("stall:   %s" % member["where"])
        else:
            out.append("stall: ranks %s (%s) wait in %s" % (
                spans(numbers), ",".join(nodes), wait or where))
    for rank in sorted((r for r in ranks if r.get("error")), key=lambda r: r["rank"]):
        out.append("stall: no stack from rank %d on %s (pid %d): %s" % (
            rank["rank"], rank["node"], rank["pid"], rank["error"]))
    return out, odd_node


def blind(ranks, timeout):
    """No rank's stack could be read (no py-spy there, no permission): say so per rank, and
    name no rank or host as the cause."""
    out = ["stall: no rank made progress for %d s; no rank's stack could be read, so no rank or "
           "host can be named as the cause" % timeout]
    for rank in sorted(ranks, key=lambda r: (r["node"], r["rank"])):
        out.append("stall: rank %d on %s (pid %d): %s; last line: %r" % (
            rank["rank"], rank["node"], rank["pid"], rank.get("error") or "no stack",
            rank.get("last_line", "")))
    if not ranks:
        out.append("stall: no rank was found on any host")
    return out


def shipped(rundir):
    """A py-spy `clusterrun stacks` shipped to this host before (<workdir>/runs/.tools)."""
    parts = rundir.rstrip("/").split("/")[:-1]
    if parts and parts[-1].startswith("attempt-"):
        parts.pop()
    tools = "/".join([*parts[:-1], ".tools"])
    try:
        found = sorted(n for n in os.listdir(tools) if n.startswith("py-spy-") and "." not in n)
    except OSError:
        return None
    return os.path.join(tools, found[-1]) if found else None


class Watch(watcher.Watcher):
    """The supervisor's watcher for --stall-timeout: it sees its node through ``node``
    (watcher.Node), and the gang's hub or peer there on a detached run."""

    ops = ("stall", "resumed")  # the controller's verdict (attached)
    gang = (PROGRESS, "stacks", "stall_stop", "links_port", "links_pairs", "links_listen",
            "links_connect", "links_close")

    def __init__(self, node, req):
        self.node = node
        self.req = req
        self.timeout = float(req.get("stall_timeout") or 0)
        self.stop_run = req.get("on_stall") == protocol.STALL_STOP
        pyspy = (pystack.host_pyspy(req.get("python") or (req.get("argv") or [None])[0])
                 or shipped(node.rundir))
        self.progress = stall.Progress(node.rundir, node.roots, pyspy,
                                       self.timeout or protocol.STALL_TIMEOUT)
        self.reported = 0.0
        self.quiet = {}  # hub: node -> (seconds quiet, when heard)
        self.fired = False
        self.gathering = None  # hub: (deadline, {node: ranks})
        self.dumper = stall.Dumper()
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
        if self.progress.pyspy is None and now - self.spy_looked > stall.FIND_EVERY:
            self.spy_looked = now  # a `clusterrun stacks` may have shipped one since
            self.progress.pyspy = shipped(self.node.rundir)
        self.progress.look(now)
        if now - self.reported >= stall.REPORT:
            self.reported = now
            quiet = round(self.progress.quiet(now), 1)
            if self.node.peer is not None:
                self.node.peer.send({"op": PROGRESS, "quiet": quiet})
            elif self.node.hub is None:
                self.node.event(PROGRESS, quiet=quiet)
        if self.node.hub is not None:
            self._hub(now)
        elif self.node.peer is not None:
            self.link_peer.tick(self.node.peer, now)
        ready = self.dumper.take()
        if ready is not None and self.node.peer is not None:
            self.node.peer.send({"op": "stacks", "ranks": ready})
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
        stalled_now = stall.stalled(quiet, self.timeout)
        if stalled_now:
            if not self.fired:
                self.fired = True
                self.gathering = (now + stall.STACKS_WAIT, {})
                self.node.hub.broadcast({"op": "stacks"})
                self.dumper.start(self.progress)
        elif self.fired and self.gathering is None and self.links is None:
            self.resumed()
        if self.gathering is not None:
            deadline, got = self.gathering
            want = {p for p, s in self.node.hub.peers.items() if s == "connected"}
            want.add(self.node.name)
            if want <= set(got) or now > deadline:
                self.gathering = None
                lines, odd_node = _lines(got, self.timeout)
                if odd_node is None and self.node.hub.peers:  # none stands out: the links?
                    self.links = self._link_test(now)
                    self.pending = (lines, got)
                if self.links is None:
                    self.stalled(lines, {"nodes": got, "odd_node": odd_node}, stalled_now)
        if self.links is not None:
            self.links.tick(now)
            if self.links.result is not None:
                more, record, blamed = self.links.result
                lines, got = self.pending  # type: ignore[misc]  # set with self.links
                self.links = self.pending = None
                self.stalled(lines + more, {"nodes": got, "odd_node": blamed, "links": record},
                             stalled_now)

    def _link_test(self, now):
        try:
            return linkwatch.HubTest(self.node.hub, self.node.hub.listener.getsockname()[0], now)
        except OSError:  # it cannot listen itself: the report goes out without the test
            return None

    def on_gang(self, peer, msg):
        """A gang message: a peer's quiet time or its stacks (hub), a request for ours (peer)."""
        op = msg.get("op")
        if op == PROGRESS and peer is not None:
            self.quiet[peer] = (float(msg.get("quiet") or 0), time.monotonic())
        elif op == "stacks" and peer is not None and self.gathering is not None:
            self.gathering[1][peer] = msg.get("ranks") or []
        elif op == "stacks" and peer is None:
            self.dumper.start(self.progress)
        elif op == "stall_stop" and peer is None:  # the hub: our rank is the stall's cause
            self.stop(str(msg.get("detail") or "stalled"))
        elif str(op).startswith("links_") and peer is None:  # the hub tests the links
            self.link_peer.on_message(self.node.peer, msg)
        elif str(op).startswith("links_") and self.links is not None:
            self.links.on_message(peer, msg)

    def on_op(self, msg):
        """The controller decided (attached): the report to keep here, or the run moves again."""
        if msg.get("op") != "stall":
            self.resumed()
        elif msg.get("lines"):  # the master keeps the report
            self.stall_here(list(msg["lines"]), msg.get("report") or {}, stop=False)
        if msg.get("op") == "stall" and msg.get("fail") and self.stop_run:  # fails with 7
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
        blamed = (report.get("links") or {}).get("blamed") or []
        detail = (linkwatch.stop_detail(next(x for x in lines if x.startswith(
            "stall: root cause: %s's" % blamed[0]))) if blamed else stop_detail(lines))
        target = report.get("odd_node")
        conn = self.node.hub.conns.get(target) if self.node.hub is not None and target else None
        if blamed and target != self.node.name and self.node.hub is not None:
            # Its link is what failed, the gang's to it likely too: the hub records the failure
            # as that host's own (the root cause) and stops the others.
            self.node.hub.record({"node": target, "rank": None, "code": stall.STATUS,
                                 "signal": None, "lost": False,
                                 "detail": "%s: %s" % (target, detail)})
        elif conn is not None:  # the hub: the node of the odd rank out fails, as its own failure
            conn.send({"op": "stall_stop", "detail": detail})
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
        self.node.fail(stall.STATUS, "%s: %s" % (self.node.name, detail), common.Cause.STALLED)

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
