"""A detached run's stall with no odd rank out: the hub tests the hosts' links again (stdlib
only, Python 3.6+; an attached run's controller runs it with clusterrun/stacks/links.py).

Over the gang, in the supervisors' loop: the hub asks every connected peer to listen on an
ephemeral port of the address its gang connection uses (``links_listen``; the hub listens on
master_addr), then gives everyone the others' ports (``links_connect``): every host connects to
every other at once (remote/probe/meshtest.py, as `check` does), and answers its pairs
(``links_pairs``). A failed pair is put on one host, and said, by `check`'s rule and the
controller's words (linkrule.py); a peer that does not answer at all over its gang connection, which
runs on the same network, counts as a failed pair from the hub to it. ``links_close`` ends the
listeners.
"""

import threading
import time

from clusterrun.remote.probe import meshtest
from clusterrun.remote.shared import linkrule, protocol

G = protocol.Gang

LISTEN_WAIT = 3.0  # for the peers' ports
PAIR_SECONDS = 5.0  # a connect that takes longer is a broken link, as in `check`
PAIRS_WAIT = PAIR_SECONDS + 3.0  # for the peers' pairs
LISTEN_MAX = 60.0  # a peer's listener ends by itself if the hub never says so


class Side:
    """One host's listener and connects, for either role."""

    def __init__(self, addr):
        self.addr = addr
        self.listener = meshtest.EphemeralListener(addr)
        self.until = time.monotonic() + LISTEN_MAX
        self.pairs = None  # set by the connecting thread
        self.sent = False

    def connect(self, targets):
        def run():
            self.pairs = meshtest.connect_many(targets, self.addr, PAIR_SECONDS)

        threading.Thread(target=run, daemon=True, name="clusterrun-links").start()

    def close(self):
        self.listener.sock.close()


class HubTest:
    """The hub's test, ticked by its loop: listen, connect, judge. ``done`` once judged."""

    def __init__(self, hub, addr, now):
        self.hub = hub
        self.me = hub.name
        self.want = {p for p, s in hub.peers.items() if s == "connected"}
        self.side = Side(addr)
        self.ports = {self.me: (addr, self.side.listener.port)}
        self.pairs = {}
        self.untested = {}  # peers that could not listen, and why: neither tested nor blamed
        self.phase, self.deadline = "listen", now + LISTEN_WAIT
        self.result = None
        hub.broadcast({protocol.OP: G.LINKS_LISTEN})

    def on_message(self, peer, msg):
        op = msg.get(protocol.OP)
        if op == G.LINKS_PORT and self.phase == "listen" and msg.get("port"):
            self.ports[peer] = (str(msg.get("addr")), int(msg["port"]))
        elif op == G.LINKS_PORT and self.phase == "listen":
            self.untested[peer] = str(msg.get("error"))
        elif op == G.LINKS_PAIRS and self.phase == "connect":
            self.pairs[peer] = msg.get("pairs") or {}

    def tick(self, now):
        answered = set(self.ports) | set(self.untested)
        if self.phase == "listen" and (self.want <= answered or now > self.deadline):
            targets = [[n, a, p] for n, (a, p) in sorted(self.ports.items())]
            for peer in self.ports:
                if peer != self.me and peer in self.hub.conns:
                    self.hub.conns[peer].send({protocol.OP: G.LINKS_CONNECT, "targets": [
                        t for t in targets if t[0] != peer]})
            self.side.connect([t for t in targets if t[0] != self.me])
            self.phase, self.deadline = "connect", now + PAIRS_WAIT
        elif self.phase == "connect":
            if self.side.pairs is not None:
                self.pairs[self.me] = self.side.pairs
            if set(self.ports) <= set(self.pairs) or now > self.deadline:
                self._judge()

    def _judge(self):
        self.hub.broadcast({protocol.OP: G.LINKS_CLOSE})
        self.side.close()
        hosts = [h for h in self.ports if h in self.pairs]
        blocked = [(s, t, str(r.get("error"))) for s in hosts
                   for t, r in sorted(self.pairs[s].items()) if not r.get("ok") and t in hosts]
        # A peer silent over its gang connection (same network) fails the hub's pair to it.
        addresses = {n: a for n, (a, _p) in self.ports.items()}
        for peer in sorted(self.want - set(hosts) - set(self.untested)):
            hosts.append(peer)
            blocked.append((self.me, peer, "no answer over its connection to the master"))
            addresses[peer] = _peer_address(self.hub.conns.get(peer))
        self.result = linkrule.judge(hosts, blocked, addresses, self.untested)
        self.phase = "done"


def _peer_address(conn):
    """The address a peer's gang connection comes from (the hub's view of it)."""
    try:
        return conn.sock.getpeername()[0]
    except (AttributeError, OSError):
        return "?"


class PeerSide:
    """A peer's part: answers the hub's links_* messages; ``tick`` sends its pairs when ready."""

    def __init__(self):
        self.side = None

    def on_message(self, peer_link, msg):
        op = msg.get(protocol.OP)
        if op == G.LINKS_LISTEN:
            self.close()
            conn = peer_link.conn
            addr = conn.sock.getsockname()[0] if conn is not None else None
            if addr:
                try:
                    self.side = Side(addr)
                except OSError as exc:
                    peer_link.send({protocol.OP: G.LINKS_PORT, "error": "cannot listen on an "
                                    "ephemeral port of %s: %s" % (addr, exc)})
                    return
                peer_link.send({protocol.OP: G.LINKS_PORT, "addr": addr,
                                "port": self.side.listener.port})
        elif op == G.LINKS_CONNECT and self.side is not None:
            self.side.connect(msg.get("targets") or [])
        elif op == G.LINKS_CLOSE:
            self.close()

    def tick(self, peer_link, now):
        side = self.side
        if side is None:
            return
        if side.pairs is not None and not side.sent:
            side.sent = True
            peer_link.send({protocol.OP: G.LINKS_PAIRS, "pairs": side.pairs})
        if now > side.until:
            self.close()

    def close(self):
        if self.side is not None:
            self.side.close()
            self.side = None
