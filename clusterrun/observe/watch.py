"""One connection and one sampler (remote/tools/sampler.py) per host of a run, kept across
refreshes.

Each refresh writes one request line to every host's sampler and waits, at most a refresh
interval, for the answers; a host that has not answered for two intervals, or whose connection
closed, is lost, and is connected again in the background now and then (a host that comes back
is shown again). Nothing here waits on one host for another's sake.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, Optional

from clusterrun.errors import ClusterrunError
from clusterrun.inventory import HostSpec
from clusterrun.observe.frame import CONNECTING, LOST, OK, Frame, HostSample, RankSample, flag_ranks
from clusterrun.remote.shared import protocol, timing
from clusterrun.runs import attempts, lifecycle
from clusterrun.runs import remote as remote_runs
from clusterrun.runs.records import PlanNode
from clusterrun.runs.store import RunDir
from clusterrun.transport import Process, SshOptions, Transport, connect, shell
from clusterrun.transport.programs import drain, read_lines, send

RECONNECT = 5.0  # seconds between tries to reach a lost host again


class Link:
    """One host: its connection, its sampler, and the last answer it gave."""

    def __init__(self, spec: HostSpec, node: PlanNode, ssh: SshOptions) -> None:
        self.spec = spec
        self.node = node
        self.ssh = ssh
        self.transport: Optional[Transport] = None
        self.proc: Optional[Process] = None
        self.latest: Optional[dict[str, Any]] = None
        self.answered_at: Optional[float] = None  # monotonic
        self.opened_at = time.monotonic()
        self.down: Optional[str] = None  # why it is not connected, once it failed
        self.tried_at: Optional[float] = None  # when a connection was last tried (None: never)
        self.busy = False  # connecting right now
        self.stderr = bytearray()  # the sampler's last words, for a lost host's reason
        self.answered = threading.Condition()
        self.closed = False  # for good: an open() under way when it closed ends what it made

    @property
    def name(self) -> str:
        return self.spec.name

    def open(self) -> None:
        """Connect and start the sampler (on a thread of its own: a dead host's connect
        timeout delays nothing else)."""
        self.busy, self.tried_at = True, time.monotonic()
        try:
            self.transport = connect(self.spec, self.ssh)
            proc = self.transport.run(shell.remote_python(self.spec, site=False))
            _, self.stderr = drain(proc, 4096)
            send(proc, "sampler.py", {"rundir": self.node.rundir,
                                      "interface": self.node.interface,
                                      "ranks": self.node.ranks})
            self.proc, self.down = proc, None
            threading.Thread(target=self.read, args=(proc,), daemon=True,
                             name=f"top-{self.name}").start()
        except (ClusterrunError, OSError) as exc:
            self._disconnect()
            self.down = getattr(exc, "message", None) or str(exc)
        finally:
            self.busy = False
        if self.closed:  # `top` quit, or moved to a restart's hosts, while this connected
            self._disconnect()

    def read(self, proc: Process) -> None:
        for line in read_lines(proc):
            self.take(line.strip())
        if self.proc is proc:
            said = bytes(self.stderr).decode("utf-8", "replace").strip().splitlines()
            self.down = "connection closed" + (f": {said[-1]}" if said else "")
            self.proc = None

    def take(self, line: bytes) -> None:
        if not line.startswith(protocol.EVENT):
            return
        with contextlib.suppress(ValueError):
            reply = json.loads(line[len(protocol.EVENT):])
            if isinstance(reply, dict) and reply.get(protocol.KIND) == protocol.SAMPLE:
                with self.answered:
                    self.latest, self.answered_at = reply, time.monotonic()
                    self.answered.notify_all()

    def ask(self, seq: int, window: Optional[float] = None) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            proc.write(json.dumps({"seq": seq, "window": window}).encode() + b"\n")
        except OSError as exc:
            self.down = f"connection closed ({exc})"
            self.proc = None

    def has(self, seq: int) -> bool:
        return self.latest is not None and self.latest.get("seq") == seq

    def close(self) -> None:
        """For good: a connection still being made is ended as soon as it is made."""
        self.closed = True
        self._disconnect()

    def _disconnect(self) -> None:
        proc, transport, self.proc, self.transport = self.proc, self.transport, None, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.close_stdin()  # the sampler's EOF: it exits
            with contextlib.suppress(OSError):
                proc.close()
        if transport is not None:
            with contextlib.suppress(OSError):
                transport.close()


class Watch:
    """Every host of a run's current attempt, sampled together."""

    def __init__(self, run: RunDir, ssh: SshOptions, interval: float) -> None:
        self.run = run
        self.interval = interval
        self.ssh = ssh
        self.current = attempts.current(run)
        self.links = [Link(spec, node, ssh) for spec, node in remote_runs.host_specs(self.current)]
        self.seq = 0

    def follow_restart(self) -> None:
        """A restarted run's new attempt runs on its own hosts and folders: watch those."""
        current = attempts.current(self.run)
        if current.path == self.current.path:
            return
        self.close()
        self.current = current
        self.links = [Link(spec, node, self.ssh) for spec, node in remote_runs.host_specs(current)]
        self.start()

    def start(self) -> None:
        for link in self.links:
            threading.Thread(target=link.open, daemon=True, name=f"top-open-{link.name}").start()

    def wait_connected(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                link.proc is None and link.down is None for link in self.links):
            time.sleep(0.05)

    def refresh(self, wait: Optional[float] = None, window: Optional[float] = None) -> Frame:
        """Ask every connected host for a sample; wait for the answers at most ``wait``
        seconds (default: one interval); the frame holds what each host said last.
        ``window``: a sampler's first answer has rates over at least that many seconds (from
        what the run's supervisor kept, or it waits them out)."""
        self.follow_restart()
        self.seq += 1
        for link in self.links:
            if link.proc is None and not link.busy and link.down is not None \
                    and timing.due(time.monotonic(), link.tried_at, RECONNECT):
                threading.Thread(target=link.open, daemon=True).start()
            link.ask(self.seq, window)
        deadline = time.monotonic() + (self.interval if wait is None else wait)
        for link in self.links:
            with link.answered:
                while link.proc is not None and not link.has(self.seq):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    link.answered.wait(min(left, 0.1))
        return self.frame()

    def host_status(self, link: Link) -> tuple[str, str]:
        now = time.monotonic()
        stale = 2 * self.interval
        if link.answered_at is not None and now - link.answered_at < stale + 0.05 and (
                link.proc is not None or link.down is None):
            return OK, ""
        if link.down is not None:
            return LOST, link.down
        if link.answered_at is not None:
            return LOST, f"no answer for {now - link.answered_at:.0f} s"
        if timing.over(now, link.opened_at, self.ssh.connect_timeout + stale):
            return LOST, f"no answer for {now - link.opened_at:.0f} s"
        return CONNECTING, ""

    def frame(self) -> Frame:
        hosts, ranks = [], []
        for link in self.links:
            status, why = self.host_status(link)
            interface = link.node.interface or ""
            reply = link.latest if status == OK else None
            if reply is not None:
                host = HostSample.from_reply(link.name, interface, reply["host"])
                ranks += [RankSample.from_reply(link.name, r) for r in reply["ranks"]]
            else:
                host = HostSample(node=link.name, status=status, reason=why, interface=interface)
                first, last = link.node.ranks or (0, -1)
                ranks += [RankSample(rank=r, node=link.name) for r in range(first, last + 1)]
            hosts.append(host)
        ranks.sort(key=lambda r: r.rank)
        flag_ranks(ranks)
        recorded = lifecycle.recorded(self.run)
        state = recorded.value if recorded is not None else "unknown"
        if state == "running" and any(h.node_state == "stalled" for h in hosts):
            state = "stalled"  # the master's supervisor found it (remote/node/stallhub.py)
        return Frame(run=self.run.id, run_state=state, interval=self.interval, hosts=hosts,
                     ranks=ranks)

    def close(self) -> None:
        for link in self.links:
            link.close()
