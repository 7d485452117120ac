"""clusterrun's node supervisor for one node of a run (stdlib only, Python 3.6+).

Starts torchrun in its own session; the ranks write their output to rank-<R>.log on this host
and their exit status to rank-<R>.exit (through rank.sh), and the Writer streams those files to
the controller by byte offset, so a slow or paused controller never slows the ranks. stdin is
the lifeline (heartbeats and stop requests); EOF or a missed lease ends the run here. As a
child subreaper it ends exactly its own tree (SIGTERM, grace, SIGKILL): never a `pkill -f`.

Detached (``detach``), it is a daemon with no controller: the master's supervisor is the gang's
hub and every worker's supervisor a peer of it (clusterrun/remote/node/gang.py), so a failure or a
lost host anywhere still ends the run everywhere, and the root cause is recorded here.
"""

import contextlib
import json
import os
import signal
import time

from clusterrun.remote.hostlib import cgroup, hostio, mainloop, procs
from clusterrun.remote.hostlib.hostio import Cause, Phase
from clusterrun.remote.node import gang, lineup, spawn, watchbase
from clusterrun.remote.shared import exits, jsonfile, layout, nodestate, protocol, timing

# After a rank of this node failed, torchrun stops the others itself; if it has not exited by
# then, the supervisor does it.
FAILURE_TEARDOWN = 5.0
# A worker whose job ended before it had reached the hub keeps trying this long to report it,
# so the hub does not wait out a whole lease for a node that has already failed.
PEER_REPORT = 10.0

def outcome(own, cause, code):
    """This node's own outcome: (state, exit_code). A node whose rank failed on its own is
    "failed" with that rank's status, whatever stop request came after; a node the controller
    lost touch with is "lost"; one ended from outside is "stopped"."""
    if own is not None:
        return "failed", own["code"]
    if cause is not None and code != 0:
        return ("lost" if cause in hostio.CONTROLLER_GONE else "stopped"), code
    return ("succeeded", 0) if code == 0 else ("failed", code)


class Supervisor:
    def __init__(self, req, loop, writer, clock):
        self.req = req
        self.name = req.get("node", "")
        self.rundir = req["rundir"]
        self.loop = loop
        self.writer = writer
        self.clock = clock
        self.grace = float(req.get("grace", protocol.GRACE))
        # Tests shorten it: their stand-in torchrun never stops the other ranks itself.
        self.failure_teardown = float(req.get("failure_teardown", FAILURE_TEARDOWN))
        self.lease = float(req.get("lease", protocol.LEASE))
        self.detached = bool(req.get("detach"))
        self.phase = Phase.STARTING
        self.cause = None  # why the run is being ended from outside (None: it was not)
        self.detail = None
        self.stop_wall = None  # when (this host's wall clock) the stop began
        self.own = None  # this node's own failure
        self.root_cause = None  # detached: the gang's root cause, as the hub decided
        self.failed_at = None
        self.rank_exits = {}
        self.group, self.group_why = cgroup.for_job(req.get("env") or {}, self.name)
        self.tree = procs.Tree(self.group)
        # What runs the ranks: torchrun, or (``ranks``, --no-torchrun) remote/node/spawn.py.
        self.launcher_name = "launcher" if req.get("ranks") else "torchrun"
        self.cleaning = False
        self.lifeline = None
        self.hub = None
        self.peer = None
        self.settle_by = None
        self.report_by = None
        # What else watches the node (NCCL, the disk, stalls, the gang): they see only Node.
        self.watchers = lineup.standard(watchbase.Node(self), req)

    # -- state ---------------------------------------------------------------------------

    def state(self, **fields):
        """``fields`` (remote/shared/nodestate.py names them) into the node's state.json."""
        # A full disk: the events still tell the controller, and the run is stopped.
        with contextlib.suppress(OSError):
            nodestate.write(self.rundir, **fields)

    def start(self):
        log = os.open(os.path.join(self.rundir, layout.NODE_LOG),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        env = dict(os.environ)
        env.update(self.req["env"])
        env["CLUSTERRUN_RUNDIR"] = self.rundir
        for each in self.watchers:
            env.update(each.rank_env(env))  # ptrace_scope 1: ranks py-spy may read
        ranks = self.req.get("ranks")
        if ranks:  # --no-torchrun: clusterrun's own launcher, in torchrun's place
            pid = self.tree.start_function(
                self.launcher_name, lambda: spawn.run(ranks, self.rundir, env),
                self.req["cwd"], log, log)
        else:
            pid = self.tree.start(self.req["argv"], env, self.req["cwd"], log, log)
        os.close(log)
        self.phase = Phase.RUNNING
        me = os.getpid()
        self.state(state="running", supervisor_pid=me, supervisor_start=procs.start_time(me),
                   torchrun_pid=pid, torchrun_start=procs.start_time(pid),
                   started_at=self.clock.wall, detached=self.detached,
                   subreaper=self.tree.subreaper, cgroup=self.group)
        return self.writer.stamp(protocol.STARTED, {
            "pid": me, "torchrun_pid": pid, "hostname": os.uname()[1],
            "subreaper": self.tree.subreaper, "cgroup": self.group,
            "cgroup_why": self.group_why,
            "hub_port": self.hub.port if self.hub is not None else None})

    # -- what happens to it --------------------------------------------------------------

    def stop(self, cause, detail, force=False):
        """SIGTERM to torchrun (it passes it to the ranks), SIGKILL to everything left after
        the grace period; ``force`` skips the grace period. The first cause is kept."""
        if self.cause is None and self.phase is not Phase.ENDED:
            self.cause, self.detail = cause, detail
            self.stop_wall = time.time()
            self.phase = Phase.STOPPING
            self.state(cause=cause.value, reason=detail)
            self.tree.terminate(self.grace)
            if self.hub is not None and cause in (Cause.SIGNAL, Cause.PEER_STOPPED):
                self.hub.stopped(detail)
        if force:
            self.tree.kill_now()

    def on_op(self, msg):
        op = msg.get(protocol.OP)
        if op in (protocol.Lifeline.STOP, protocol.Lifeline.KILL):
            why = msg.get("reason") or "stopped by the controller"
            self.stop(Cause.CONTROLLER, why, force=op == protocol.Lifeline.KILL)
        for each in self.watchers:
            if op in each.ops:
                each.on_op(msg)

    def on_gang(self, peer, msg):
        """A gang message for a watcher (gang.py passes on those it does not handle itself)."""
        for each in self.watchers:
            if msg.get(protocol.OP) in each.gang:
                each.on_gang(peer, msg)

    def on_eof(self):
        if not self.detached:
            self.stop(Cause.LIFELINE_EOF, "lifeline lost: the controller's connection closed")

    def gang_failure(self, root):
        """The gang's root cause is elsewhere (or the hub is lost): stop this node's part."""
        if self.root_cause is None:
            self.root_cause = root
            self.state(root_cause=root)
        if root.get("node") != self.name:
            cause = Cause.PEER_LOST if root.get("lost") else Cause.PEER_FAILED
            self.stop(cause, "stopped after %s" % root.get("detail"))

    def gang_stop(self, root, stopped):
        if root:
            self.gang_failure(root)
        else:
            self.stop(Cause.PEER_STOPPED, "stopped with the master (%s)" % (stopped or "stop"))

    def fail(self, code, detail, cause, force=False):
        """A watcher's verdict (a full disk, a stall with --on-stall stop): this node's own
        failure with exit status ``code``, reported, and its job stopped."""
        elapsed = self.clock.elapsed()
        self.writer.event(protocol.FAILURE, code=code, detail=detail, elapsed=elapsed)
        self._failed(None, code, elapsed, detail)
        self.stop(cause, detail, force=force)

    def _failed(self, rank, code, elapsed, detail=None):
        """This node's own failure (not caused by a stop): the first one is what it reports."""
        if self.own is not None:
            return
        what = ("%s rank %d" % (self.name, rank) if rank is not None
                else "%s: %s" % (self.name, self.launcher_name))
        sig = code - 128 if code > 128 else None
        self.own = {"node": self.name, "rank": rank, "code": code, "signal": sig, "e": elapsed,
                    "detail": detail or "%s %s" % (what, exits.describe(code))}
        self.failed_at = time.monotonic()
        if self.hub is not None:
            self.hub.record(self.own)
        elif self.peer is not None:
            self.root_cause = self.root_cause or self.own
            self.peer.send({protocol.OP: protocol.Gang.FAILED, "root_cause": self.own})

    # -- the loop ------------------------------------------------------------------------

    def _check_ranks(self):
        found = []
        for name in os.listdir(self.rundir):
            rank = layout.rank_of(name, layout.EXIT)
            if rank is None or rank in self.rank_exits:
                continue
            path = os.path.join(self.rundir, name)
            try:
                with open(path) as handle:
                    text = handle.read()
                when = os.path.getmtime(path)
            except OSError:
                continue
            if text.endswith("\n"):
                words = text.split()
                found.append((when, rank, int(words[0]) if words else -1, "stopped" in words))
        # In the order they exited: one look can see a failure and the exits (143) of the
        # local peers torchrun then ended, which rank.sh marks "stopped".
        for when, rank, code, ended in sorted(found):
            self.rank_exits[rank] = code
            stopping = ended or (self.stop_wall is not None and when >= self.stop_wall)
            elapsed = self.clock.since_wall(when)
            self.writer.event(protocol.RANK_EXIT, rank=rank, code=code, elapsed=elapsed,
                              stopping=stopping)
            if code != 0 and not stopping:
                self._failed(rank, code, elapsed)

    def _torchrun_exited(self):
        code = self.tree.code
        self.writer.event(protocol.TORCHRUN_EXIT, code=code, stopping=self.cause is not None)
        if code != 0 and self.cause is None:
            self._failed(None, code, self.clock.elapsed())

    def tick(self):
        for sig in self.loop.take_signals():
            force = sig == procs.FORCE_SIGNAL
            self.stop(Cause.SIGNAL, "stopped by %s (%s)" % (
                signal.Signals(sig).name, "clusterrun stop --force" if force
                else "clusterrun stop, or the scheduler: scancel, a time limit"), force=force)
        if (self.lifeline is not None and not self.detached
                and self.lifeline.lapsed(self.lease)):
            self.stop(Cause.LEASE_EXPIRED, "lifeline lost: no heartbeat from the "
                      "controller for %d s" % self.lifeline.quiet())
        self._check_ranks()
        if self.tree.reap():
            self._torchrun_exited()
        now = time.monotonic()
        if (self.own is not None and self.failed_at is not None and self.tree.code is None
                and timing.over(now, self.failed_at, self.failure_teardown)):
            self.stop(Cause.RANK_FAILED, self.own["detail"])
        if self.tree.code is not None and not self.cleaning and self.tree.left():
            self.cleaning = True  # torchrun has gone, a daemon a rank forked has not
            self.tree.terminate(self.grace)
        self.tree.tick()
        for each in self.watchers:
            each.tick(now)
        if self.tree.done:
            self._maybe_end(now)

    def _maybe_end(self, now):
        if self.settle_by is None:
            # The hub stays until every worker has ended or is lost (bounded by the lease).
            self.settle_by = now + self.grace + self.lease + 10
            self.report_by = now + PEER_REPORT
        if self.peer is not None and self.peer.undelivered() and now < self.report_by:
            return  # a job that ended before the hub connection was up: tell the hub first
        if self.hub is None or self.hub.settled() or now > self.settle_by:
            self.phase = Phase.ENDED

    def run(self):
        while self.phase is not Phase.ENDED:
            self.loop.once(mainloop.TICK)
            self.tick()
        self._check_ranks()
        for each in self.watchers:
            each.finish()
        return self.finish()

    def finish(self):
        code = self.tree.code
        state, exit_code = outcome(self.own, self.cause, code)
        reason = self.own["detail"] if self.own is not None else self.detail
        fields = {"state": state, "exit_code": exit_code, "torchrun_exit_code": code,
                  "ended_at": time.time(), "reason": reason,
                  "cause": self.cause.value if self.cause is not None else None,
                  "ranks": self.rank_exits, "checksums": hostio.checksums(self.rundir)}
        if self.detached:
            fields["root_cause"] = self.root_cause
            if self.hub is not None:
                fields["peers"] = self.hub.summary()
        self.tree.release()
        self.state(**fields)
        if self.peer is not None:
            self.peer.finish({"state": state, "cause": fields["cause"], "reason": reason})
        self.writer.end(**fields)
        return fields


def prepare(req):
    hostio.make_private_dir(req["rundir"])
    wrapper = os.path.join(req["rundir"], layout.RANK_SH)
    fd = os.open(wrapper, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as handle:
        handle.write(spawn.RANK_WRAPPER)
    jsonfile.write(os.path.join(req["rundir"], layout.SPEC), req.get("public", {}))


def daemonize(hold=False):
    """Detach from the SSH session: the run must outlive it. Returns in the daemon a pipe for
    its first event; the original process relays that event and exits. With ``hold`` (a Slurm
    job step, which Slurm ends with all its processes once its first one exits) it relays the
    event and then stays until the daemon ends, holding the step open; the daemon keeps the
    pipe until then."""
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.readline() if hold else pipe.read()
            out = os.fdopen(1, "wb")
            out.write(data)
            out.flush()
            if hold and data:
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
                pipe.read()  # until the daemon exits
        os._exit(0 if data else 1)
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    return write_end


def main(req):
    clock = hostio.Clock()
    umask = os.umask(0o077)
    prepare(req)
    detached = bool(req.get("detach"))
    hold = bool(req.get("hold_step"))
    pipe = daemonize(hold) if detached else None
    writer = hostio.Writer(clock, req["rundir"], heartbeat=float(req.get("heartbeat", 2)))
    loop = mainloop.Loop()
    loop.catch((*procs.STOP_SIGNALS, procs.FORCE_SIGNAL))
    sup = Supervisor(req, loop, writer, clock)
    try:
        gang.join(sup, req.get("gang"), loop)
    except OSError as exc:
        first = writer.stamp(protocol.END, {"state": "failed",
                                            "reason": "cannot join the gang: %s" % exc})
        os.write(pipe if pipe is not None else 1, protocol.event_frame(first))
        return
    os.umask(umask)
    first = sup.start()
    if pipe is not None:
        os.write(pipe, protocol.event_frame(first))
        if not hold:
            os.close(pipe)
        writer.broken = True  # nobody is listening; `clusterrun logs -f` reads the files
    else:
        writer.events.put(first)
        writer.start()
        sup.lifeline = mainloop.Lifeline(loop, sup.on_op, sup.on_eof)
    sup.run()
    if pipe is None:
        # The controller gets the logs' last bytes and the final event. Unless it is the very
        # reason the run ended: then nobody may be reading, and the job is already gone.
        writer.finished.wait(5 if sup.cause in hostio.CONTROLLER_GONE else 600)


if __name__ == "__main__":
    import sys

    main(json.loads(sys.stdin.buffer.readline()))
    # Not sys.exit: flushing stdout at shutdown would block for good if the controller stopped
    # reading (partitioned away); everything meant for it has been written or given up on.
    os._exit(0)
