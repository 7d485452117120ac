"""The stall watchdog inside a node's supervisor, what its roles share (stdlib only, Python
3.6+); the rule is remote/shared/stallrule.py, the measuring progress.py.

Every supervisor measures its node and says its quiet time every 2 s. One supervisor decides
for the whole run, the master's (stallhub.py: the rule, the stacks, the report, the stop): its
peers send their quiet times and stacks over the gang on a detached run (stallpeer.py
``Peer``); on an attached run every node reports to the controller, which passes the quiet
times on to the master, fetches what the master asks for, and shows what it decided
(stallpeer.py ``Reporter``). Each node's role is chosen once, by lineup.py's ``standard``.
The report (stallreport.py) goes into the master's node.log (so `logs` shows it) and its
state.json (``stall``, and ``state: stalled`` while it lasts, for `ps`). With
``--on-stall stop`` the stall becomes the blamed node's own failure with exit status 7, so the
run ends everywhere and a restart (`--max-restarts`) counts it as a failure.
"""

import os
import time

from clusterrun.remote.hostlib import hostio, pystack
from clusterrun.remote.node import progress, watchbase
from clusterrun.remote.shared import layout, protocol, stallreport, stallrule, timing


def report(ranks_by_node, timeout, missing=()):
    """The report (remote/shared/stallreport.py) from the stacks the peers sent:
    ``(lines, record)``. ``missing``: the connected hosts that sent none in time."""
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


def note(rundir, lines):
    """Into node.log, so `logs` shows the report with the run's other lines."""
    text = stallreport.noted(lines)
    try:
        fd = os.open(os.path.join(rundir, layout.NODE_LOG),
                     os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


class Watch(watchbase.Watcher):
    """For --stall-timeout: this node's own progress, measured and said every REPORT seconds
    (``tell``, where its role sends it), and the role's own part of each tick (``turn``)."""

    def __init__(self, node, req):
        self.node = node
        self.req = req
        self.timeout = float(req.get("stall_timeout") or 0)
        self.stop_run = req.get("on_stall") == protocol.STALL_STOP
        pyspy = (pystack.host_pyspy(req.get("python") or (req.get("argv") or [None])[0])
                 or shipped(node.rundir))
        self.progress = progress.Progress(node.rundir, node.roots, pyspy,
                                          self.timeout or protocol.STALL_TIMEOUT)
        self.reported = None  # when this node's quiet time was last said
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
            self.tell(round(self.progress.quiet(now), 1))
        self.turn(now)

    def tell(self, quiet):
        """This node's quiet time, to whoever decides."""

    def turn(self, now):
        """The role's own part of a tick."""

    def stop(self, detail):
        """--on-stall stop: this node fails with status 7; the run ends everywhere."""
        # As a full disk is: its own failure.
        self.node.fail(stallrule.STATUS, "%s: %s" % (self.node.name, detail), hostio.Cause.STALLED)
